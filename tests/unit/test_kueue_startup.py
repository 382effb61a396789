"""Kueue pod groups and why a job cannot start, decided by the pure planner.

The labels and gate a queued job's pods carry; Queued until Kueue lifts the gate from every pod;
a resize re-queues the group; pod waiting reasons (ErrImagePull, CrashLoopBackOff with log lines,
Unschedulable, CreateContainerConfigError) in status.message, the StartupBlocked condition and one
Event per change; startupDeadlineSeconds counted from admission. The real-container runs are in
test_e2e_startup.py.
"""

from __future__ import annotations

import pytest
from kuberl.api.job import Phase
from kuberl.api.load import InvalidJob, parse_job
from kuberl.operator import kueue, startup
from test_operator_lifecycle import ALL, Sim, running

QUEUE = "team-a"


@pytest.fixture
def queued(job_dict) -> Sim:
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 2
    job_dict["spec"]["queueName"] = QUEUE
    return Sim(job_dict)


def lift_gates(sim: Sim) -> None:
    """What Kueue does on admission: remove its gate from every pod of the group."""
    for pod in sim.pods.values():
        pod["spec"]["schedulingGates"] = [g for g in pod["spec"].get("schedulingGates", [])
                                          if g["name"] != kueue.ADMISSION_GATE]


def test_every_pod_of_a_queued_job_is_one_gated_pod_group(queued):
    plan = queued.step()
    assert sorted(m["metadata"]["name"] for m in plan.create) == ALL
    for pod in plan.create:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == QUEUE
        assert labels["kueue.x-k8s.io/pod-group-name"] == "cartpole-ppo-g0-n4"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "4"  # head + learner + 2 workers
        assert annotations["kueue.x-k8s.io/retriable-in-group"] == "false"  # over once none is running
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    assert queued.phase == Phase.QUEUED
    admitted = queued.condition("Admitted")
    assert admitted.status == "False" and admitted.reason == "WaitingForKueue"
    assert "LocalQueue team-a" in queued.status.message and "4 of 4 pods gated" in queued.status.message
    assert [(e.reason) for e in plan.events] == ["Queued"]


def test_the_queue_label_on_the_job_works_like_spec_queue_name(job_dict):
    job_dict["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-b"}
    sim = Sim(job_dict)
    plan = sim.step()
    assert {m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for m in plan.create} == {"team-b"}
    job_dict["spec"]["queueName"] = "team-c"
    with pytest.raises(InvalidJob, match="spec.queueName 'team-c' and the job's label kueue.x-k8s.io/queue-name"):
        parse_job(job_dict)


def test_a_job_without_a_queue_is_not_gated(sim_plain):
    plan = sim_plain.step()
    assert all("schedulingGates" not in m["spec"] and "kueue.x-k8s.io/queue-name" not in m["metadata"]["labels"]
               for m in plan.create)
    assert sim_plain.phase == Phase.STARTING and sim_plain.condition("Admitted") is None


@pytest.fixture
def sim_plain(job_dict) -> Sim:
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 2
    return Sim(job_dict)


def test_queued_until_kueue_lifts_every_gate_then_starts_and_runs(queued):
    queued.step()
    queued.step(seconds=600)  # ten minutes in the queue: nothing changes, no startup deadline counts
    assert queued.phase == Phase.QUEUED
    lift_gates(queued)
    plan = queued.step()
    assert queued.phase == Phase.STARTING and queued.status.message is None
    assert queued.condition("Admitted").status == "True"
    assert "cartpole-ppo-g0-n4" in queued.condition("Admitted").message
    assert [e.reason for e in plan.events] == ["Starting"]
    queued.run_all()
    queued.step()
    assert queued.phase == Phase.RUNNING


def test_a_resize_of_a_queued_job_requeues_a_group_of_the_new_size(queued):
    queued.step()
    lift_gates(queued)
    queued.run_all()
    queued.step()
    assert queued.phase == Phase.RUNNING
    queued.job_dict["spec"]["rolloutWorkers"]["replicas"] = 3
    plan = queued.step()
    assert sorted(p.name for p in plan.delete) == ALL and not plan.create
    assert [e.reason for e in plan.events] == ["Requeued", "Starting"]
    plan = queued.step()
    assert {m["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for m in plan.create} == {"cartpole-ppo-g0-n5"}
    assert {m["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for m in plan.create} == {"5"}
    assert len(plan.create) == 5 and queued.phase == Phase.QUEUED


# -- why a pod does not start ------------------------------------------------------------------------


def waiting_pod(reason: str, message: str = "", last: dict | None = None) -> dict:
    cs = {"name": "learner", "image": "registry.example/kuberl:nope", "restartCount": 3,
          "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return {"spec": {"containers": [{"name": "learner", "image": "registry.example/kuberl:nope"}]},
            "status": {"phase": "Pending", "containerStatuses": [cs]}}


def test_pod_waiting_reasons_say_what_to_check():
    reason, message = startup.pod_waiting(waiting_pod("ImagePullBackOff", 'Back-off pulling image "x"'))
    assert reason == "ImagePullBackOff"
    assert "check spec.image: the image registry.example/kuberl:nope must exist" in message
    reason, message = startup.pod_waiting(waiting_pod(
        "CrashLoopBackOff", "back-off 20s restarting failed container=learner", {
            "exitCode": 1, "message": "line 1\nTraceback\n  File x\nRuntimeError: no CUDA device\n\n"}))
    assert reason == "CrashLoopBackOff"
    assert "exited with code 1 after 3 restarts" in message
    assert message.endswith("last log lines: line 1 | Traceback | File x | RuntimeError: no CUDA device")
    reason, message = startup.pod_waiting(waiting_pod("CreateContainerConfigError", 'secret "s" not found'))
    assert reason == "CreateContainerConfigError" and "Secret or ConfigMap" in message
    unschedulable = {"spec": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]}}
    reason, message = startup.pod_waiting(unschedulable)
    assert reason == "Unschedulable" and message.startswith("0/1 nodes are available") and "nodeSelector" in message


def test_what_is_not_a_problem_is_not_reported():
    assert startup.pod_waiting(waiting_pod("ContainerCreating")) is None
    assert startup.pod_waiting(waiting_pod("PodInitializing")) is None
    gated = waiting_pod("ImagePullBackOff")
    gated["spec"]["schedulingGates"] = [{"name": kueue.ADMISSION_GATE}]
    assert startup.pod_waiting(gated) is None  # Kueue's queue, reported as Queued
    ended = waiting_pod("ImagePullBackOff")
    ended["status"]["phase"] = "Failed"
    assert startup.pod_waiting(ended) is None  # the lifecycle counts ended pods
    assert startup.log_tail("a\n\n b \nc\n", lines=2) == "b | c"


def image_pull_error(sim: Sim, name: str) -> None:
    sim.pods[name]["status"] = waiting_pod("ErrImagePull", "image not known")["status"]


def test_waiting_reasons_reach_status_message_condition_and_one_event(sim_plain):
    sim_plain.step()
    image_pull_error(sim_plain, "cartpole-ppo-learner")
    plan = sim_plain.step()
    assert sim_plain.phase == Phase.STARTING
    assert sim_plain.status.message.startswith("cartpole-ppo-learner: ErrImagePull: container learner: image not known")
    blocked = sim_plain.condition("StartupBlocked")
    assert blocked.status == "True" and blocked.reason == "ErrImagePull"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ErrImagePull")]
    assert sim_plain.step().events == []  # the same problem: no second Event
    sim_plain.pods["cartpole-ppo-learner"]["status"] = waiting_pod("ImagePullBackOff", "back-off")["status"]
    assert sim_plain.step().events == []  # the kubelet's retry of the same pull: still no second Event
    assert sim_plain.condition("StartupBlocked").reason == "ImagePullBackOff"
    sim_plain.run_all()
    sim_plain.step()
    assert sim_plain.phase == Phase.RUNNING and sim_plain.status.message is None
    assert sim_plain.condition("StartupBlocked").status == "False"


def test_startup_deadline_fails_the_job_with_the_last_reason_and_deletes_its_pods(sim_plain):
    sim_plain.job_dict["spec"]["startupDeadlineSeconds"] = 60
    sim_plain.step()
    image_pull_error(sim_plain, "cartpole-ppo-learner")
    plan = sim_plain.step(seconds=30)
    assert sim_plain.phase == Phase.STARTING and 25 <= plan.wake_in <= 31
    plan = sim_plain.step(seconds=31)
    assert sim_plain.phase == Phase.FAILED and sim_plain.status.reason == "StartupDeadlineExceeded"
    assert sim_plain.status.message.startswith("the job was not Running within startupDeadlineSeconds (60 s)")
    assert "ErrImagePull" in sim_plain.status.message
    assert sorted(p.name for p in plan.delete) == ALL and not plan.create
    assert sim_plain.condition("Failed").reason == "StartupDeadlineExceeded"


def test_startup_deadline_counts_from_admission_not_from_queueing(queued):
    queued.job_dict["spec"]["startupDeadlineSeconds"] = 60
    queued.step()
    queued.step(seconds=3600)
    assert queued.phase == Phase.QUEUED
    lift_gates(queued)
    queued.step()
    queued.step(seconds=59)
    assert queued.phase == Phase.STARTING
    queued.step(seconds=2)
    assert queued.phase == Phase.FAILED and "no pod reported a problem" in queued.status.message


def test_startup_deadline_does_not_touch_a_running_job(sim_plain):
    sim_plain.job_dict["spec"]["startupDeadlineSeconds"] = 10
    running(sim_plain)
    sim_plain.step(seconds=3600)
    assert sim_plain.phase == Phase.RUNNING


def test_the_readme_queue_setup_admits_the_example_job_as_one_group():
    """deploy/kueue/queues.yaml's LocalQueue is the one the example names, and its ClusterQueue's quota holds
    the whole gang at once (Kueue admits all of it or none of it): a pod asks for its containers' requests, or
    its largest init container's when that is more."""
    import yaml
    from conftest import REPO
    from kuberl.api.kube import parse_quantity
    from kuberl.api.load import load_job_file
    from kuberl.operator import builders
    from kuberl.operator.builders import BuildOptions

    docs = {d["kind"]: d for d in yaml.safe_load_all((REPO / "deploy" / "kueue" / "queues.yaml").read_text())}
    job = load_job_file(REPO / "examples" / "cartpole-ppo-kueue.yaml")
    assert job.queue_name == docs["LocalQueue"]["metadata"]["name"]
    assert docs["LocalQueue"]["spec"]["clusterQueue"] == docs["ClusterQueue"]["metadata"]["name"]
    pods = [builders.build_head_pod(job, BuildOptions()), builders.build_learner_pod(job, BuildOptions()),
            *(builders.build_worker_pod(job, BuildOptions(), i) for i in range(job.spec.rollout_workers.replicas))]
    assert len(pods) == kueue.gang_size(job)
    quota = {r["name"]: parse_quantity(str(r["nominalQuota"]))
             for r in docs["ClusterQueue"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    for resource, limit in quota.items():
        def asks(containers: list[dict], r: str = resource) -> float:
            return sum(parse_quantity(str(c["resources"]["requests"].get(r, "0"))) for c in containers)
        need = sum(max([asks(p["spec"]["containers"]), *(asks([c]) for c in p["spec"].get("initContainers", []))])
                   for p in pods)
        assert 0 < need <= limit, (resource, need, limit)


def test_data_parallel_learner_replicas_are_members_of_the_gang(queued, job_dict):
    """learner.replicas: 2 adds a learner pod: it is gated with the rest and counted in the group."""
    job_dict["spec"]["learner"] = {**job_dict["spec"].get("learner", {}), "replicas": 2}
    sim = Sim(job_dict)
    plan = sim.step()
    assert len(plan.create) == kueue.gang_size(sim.job()[0]) == 1 + 2 + 2  # head, 2 learners, 2 workers
    for pod in plan.create:
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "5"
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "cartpole-ppo-g0-n5"
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]

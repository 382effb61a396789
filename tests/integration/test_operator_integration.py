"""The operator for real: kopf runs its handlers against a real API server, and the tests act as the kubelet.

Every test gets a namespace of its own on the session's control plane (tests/bed/real_cluster.py),
runs the operator (in a thread, or as the `kuberl-operator` command) with a token of the chart's
ServiceAccount, creates jobs the way a user would, writes pod status the way the node's kubelet
would, and asserts on what a user sees: pods, Services, status, conditions, Events, and `kubectl`.
What the operator asked of the server is read from the server's audit log.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml
from bed.real_cluster import ClusterNamespace, volume_claim
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kuberl.operator import rbac
from kuberl.operator.builders import BuildOptions
from kuberl.operator.controllers import build_registry, memo_for
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import OperatorConfig, Runtime
from kuberl.trainer.metrics import JobLabels, LearnerMetrics

JOB = "cartpole-ppo"
HEAD, LEARNER = f"{JOB}-head", f"{JOB}-learner"


def worker(i: int) -> str:
    return f"{JOB}-worker-{i}"


# ---- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def cluster(kube: ClusterNamespace) -> ClusterNamespace:
    return kube


class Operator:
    """The operator's runtime and metrics, as the test sees them."""

    def __init__(self, runtime: Runtime, metrics: OperatorMetrics):
        self.runtime, self.metrics = runtime, metrics

    def sample(self, name: str, **labels: str) -> float:
        text = generate_latest(self.metrics.registry).decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0


@pytest.fixture
def start_operator(cluster) -> Callable[..., contextlib.AbstractContextManager[Operator]]:
    @contextlib.contextmanager
    def start(metrics: OperatorMetrics | None = None, **config: Any) -> Iterator[Operator]:
        # Imported here: a module-level import would pre-empt pytest registering it as a plugin elsewhere.
        from bed.kopf_thread import run_kopf_in_thread

        config.setdefault("reconcile_interval", 0.5)
        config.setdefault("idle_interval", 0.5)
        config.setdefault("progress_interval", 0.2)
        config.setdefault("build", BuildOptions(trainer_image="kuberl-trainer:test", rollout_image="kuberl-rollout:test"))
        metrics = metrics or OperatorMetrics()
        runtime = Runtime(OperatorConfig(**config), api_client=cluster.operator_api_client(), metrics=metrics)
        with run_kopf_in_thread(build_registry(login=False), namespaces=[cluster.namespace],
                                memo=memo_for(runtime)):
            yield Operator(runtime, metrics)
    return start


@pytest.fixture
def operator(start_operator) -> Iterator[Operator]:
    with start_operator() as running:
        yield running


def job_manifest(job_dict: dict, *, replicas: int = 2, **spec: Any) -> dict:
    job_dict["spec"]["rolloutWorkers"]["replicas"] = replicas
    job_dict["spec"].update(spec)
    return job_dict


# ---- helpers -----------------------------------------------------------------------------------------


def status(cluster: ClusterNamespace, name: str = JOB) -> dict:
    return (cluster.get("rltj", name) or {}).get("status") or {}


def condition(cluster: ClusterNamespace, type_: str, name: str = JOB) -> dict:
    return next((c for c in status(cluster, name).get("conditions", []) if c["type"] == type_), {})


# Waits return as soon as their condition holds; the timeouts are generous so that a busy machine (CI,
# other tests on the same cores) slows a test down instead of failing it.
WAIT = 30  # (kubectl calls: --timeout=25s, inside ClusterNamespace.kubectl's own 30 s)


def wait_phase(cluster: ClusterNamespace, phase: str, name: str = JOB, timeout: float = WAIT) -> dict:
    return cluster.wait_for("rltj", name, lambda obj: (obj.get("status") or {}).get("phase") == phase,
                            timeout=timeout)["status"]


def wait_until(check: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}; last value {value!r}")
        time.sleep(0.05)


def pods(cluster: ClusterNamespace, job: str = JOB) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in cluster.list("pods", label_selector=f"kuberl.dev/job-name={job}")}


def wait_pods(cluster: ClusterNamespace, names: set[str], job: str = JOB, timeout: float = WAIT) -> dict[str, dict]:
    def check() -> tuple[dict[str, dict]] | None:
        found = pods(cluster, job)
        return (found,) if set(found) == names else None

    return wait_until(check, timeout, f"pods {sorted(names)}")[0]


def run_all(cluster: ClusterNamespace, job: str = JOB) -> None:
    for name, pod in pods(cluster, job).items():
        if (pod.get("status") or {}).get("phase") != "Running":
            cluster.set_pod_phase(cluster.namespace, name, "Running")


def event_reasons(cluster: ClusterNamespace, name: str = JOB) -> list[str]:
    return [e["reason"] for e in cluster.events(cluster.namespace, involved_name=name)]


def wait_event(cluster: ClusterNamespace, reason: str, name: str = JOB) -> dict:
    return wait_until(lambda: next((e for e in cluster.events(cluster.namespace, involved_name=name) if e["reason"] == reason),
                                   None), what=f"Event {reason}")


def start_running(cluster: ClusterNamespace, manifest: dict, workers: int) -> dict:
    job = cluster.create(manifest, namespace=cluster.namespace)
    wait_pods(cluster, {HEAD, LEARNER, *(worker(i) for i in range(workers))})
    run_all(cluster)
    wait_phase(cluster, "Running")
    return job


def uids(found: dict[str, dict]) -> dict[str, str]:
    return {name: pod["metadata"]["uid"] for name, pod in found.items()}


def timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def reconcile_passes(operator: Operator) -> float:
    return operator.sample("kuberl_operator_reconcile_duration_seconds_count", handler="reconcile")


def wait_passes(operator: Operator, more: int) -> None:
    """Wait until the operator has finished `more` further reconcile passes (instead of sleeping)."""
    target = reconcile_passes(operator) + more
    wait_until(lambda: reconcile_passes(operator) >= target, what=f"{more} more reconcile passes")


def made(cluster: ClusterNamespace, verb: str, resource: str | None = None, name: str | None = None) -> list[dict]:
    """The operator's requests of a verb (on a resource, an object) in this test, from the audit log;
    refused ones included, server-side dry runs not."""
    return [e for e in cluster.requests() if e["verb"] == verb and "dryRun=" not in e["requestURI"]
            and resource in (None, e["objectRef"]["resource"]) and name in (None, e["objectRef"].get("name"))]


def phases_seen(cluster: ClusterNamespace, name: str = JOB) -> list[str | None]:
    """Every status phase the job ever had, from the API's history (transient ones included)."""
    return [(version.get("status") or {}).get("phase") for version in cluster.history("rltj", name) if version]


# ---- create -> pods, services, status ------------------------------------------------------------------


def test_job_becomes_k_plus_2_pods_services_and_a_status_that_follows_the_kubelet(cluster, start_operator, job_dict):
    learner = LearnerMetrics(JobLabels(JOB, cluster.namespace, "PPO", "CartPole-v1"))
    port = learner.serve(0, addr="127.0.0.1")
    try:
        with start_operator(learner_metrics_url="http://127.0.0.1:{port}/metrics") as op:
            job = cluster.create(job_manifest(job_dict, replicas=3, metrics={"port": port}), namespace=cluster.namespace)
            found = wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1), worker(2)})
            for pod in found.values():
                (ref,) = pod["metadata"]["ownerReferences"]
                assert (ref["kind"], ref["name"], ref["uid"]) == ("RLTrainingJob", JOB, job["metadata"]["uid"])
                role = pod["metadata"]["labels"]["kuberl.dev/component"]
                assert pod["spec"]["containers"][0]["image"] == ("kuberl-trainer:test" if role == "learner"
                                                                 else "kuberl-rollout:test")
            head_svc = cluster.wait_for("services", HEAD)
            assert head_svc["spec"]["clusterIP"] == "None"
            assert head_svc["spec"]["selector"] == {"kuberl.dev/job-name": JOB, "kuberl.dev/component": "head"}
            assert {p["name"] for p in head_svc["spec"]["ports"]} == {"gcs", "raylet", "client"}
            assert cluster.get("services", f"{JOB}-metrics")["spec"]["ports"][0]["port"] == port
            assert {n["metadata"]["name"] for n in cluster.list("networkpolicies")} == {f"{JOB}-ray", f"{JOB}-learner"}
            # The disruption controller reads the budget: all pods of the job under it, one at a time.
            budget = cluster.wait_for("poddisruptionbudgets", f"{JOB}-disruptions")
            assert budget["spec"]["minAvailable"] == 4  # head, learner, 3 workers: all but one

            st = wait_phase(cluster, "Starting")
            assert st["workers"] == "0/3" and st["observedGeneration"] == job["metadata"]["generation"]
            assert st["startTime"]
            # The kubelet starts the pods one by one: Running only once every one is ready.
            cluster.set_pod_phase(cluster.namespace, HEAD, "Running")
            cluster.set_pod_phase(cluster.namespace, LEARNER, "Running")
            cluster.set_pod_phase(cluster.namespace, worker(0), "Running")
            wait_until(lambda: status(cluster).get("workers") == "1/3")
            assert status(cluster)["phase"] == "Starting"
            cluster.set_pod_phase(cluster.namespace, worker(1), "Running")
            cluster.set_pod_phase(cluster.namespace, worker(2), "Running")
            st = wait_phase(cluster, "Running")
            assert st["workers"] == "3/3"
            assert {c["type"]: c["status"] for c in st["conditions"]} == {
                "Running": "True", "Degraded": "False", "Complete": "False", "Failed": "False", "Suspended": "False"}

            # The timer reads the learner's real /metrics into status.progress.
            learner.inc("kuberl_episodes_total", 42)
            learner.inc("kuberl_env_steps_total", 5000)
            learner.set("kuberl_episodes_per_second", 3.5)
            learner.set("kuberl_episode_return_mean", 123.0)
            learner.set("kuberl_checkpoint_timestamp_seconds", 1_700_000_000)
            progress = wait_until(lambda: (p := status(cluster).get("progress", {})).get("episodes") == 42 and p)
            assert progress["envSteps"] == 5000 and progress["episodesPerSecond"] == 3.5
            assert progress["meanReturn"] == 123.0
            assert status(cluster)["lastCheckpointTime"] == "2023-11-14T22:13:20Z"

            # The learner exits 0: Succeeded, head and workers cleaned up, learner and progress kept.
            cluster.set_pod_phase(cluster.namespace, LEARNER, "Succeeded")
            st = wait_phase(cluster, "Succeeded")
            wait_pods(cluster, {LEARNER})
            assert st["progress"]["episodes"] == 42 and st["completionTime"]
            assert condition(cluster, "Complete")["status"] == "True"
            assert condition(cluster, "Running")["status"] == "False"
            wait_event(cluster, "Succeeded")
            assert {"Starting", "Running", "Succeeded"} <= set(event_reasons(cluster))
            assert op.sample("kuberl_operator_child_pods_created_total", component="rollout-worker") == 3
            assert op.sample("kuberl_operator_jobs", phase="Succeeded") == 1
            assert op.sample("kuberl_operator_phase_transitions_total", phase="Running") == 1
            assert op.sample("kuberl_operator_reconcile_duration_seconds_count", handler="reconcile") > 0
    finally:
        learner.close()


def test_invalid_spec_fails_with_invalid_spec_and_no_pod_is_ever_created(cluster, operator, job_dict):
    job_dict["spec"]["environment"]["id"] = "CartPole-v9000"
    cluster.create(job_dict, namespace=cluster.namespace)
    st = wait_phase(cluster, "Failed")
    assert st["reason"] == "InvalidSpec" and "spec.environment.id" in st["message"]
    failed = condition(cluster, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec") and "CartPole-v9000" in failed["message"]
    wait_event(cluster, "InvalidSpec")
    wait_passes(operator, 2)  # a further pass or two
    assert made(cluster, "create", "pods") == []
    assert pods(cluster) == {}
    assert set(phases_seen(cluster)) <= {None, "Failed"}  # never Pending or Starting on the way

    # Fixing the spec starts the job.
    cluster.patch("rltj", JOB, {"spec": {"environment": {"id": "CartPole-v1"}}})
    wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1)})
    assert wait_phase(cluster, "Starting").get("reason") is None  # cleared


# ---- lifecycle ---------------------------------------------------------------------------------------------


def budget_min_available(cluster) -> int:
    return cluster.get("poddisruptionbudgets", f"{JOB}-disruptions")["spec"]["minAvailable"]


def test_scale_up_and_down(cluster, operator, job_dict):
    """The job's disruption budget follows: all its pods but one stay through a drain, at every size."""
    start_running(cluster, job_manifest(job_dict, replicas=2), 2)
    assert budget_min_available(cluster) == 3  # head, learner, 2 workers: all but one
    cluster.patch("rltj", JOB, {"spec": {"rolloutWorkers": {"replicas": 4}}})
    wait_pods(cluster, {HEAD, LEARNER, *(worker(i) for i in range(4))})
    wait_until(lambda: status(cluster).get("workers") == "2/4")
    assert condition(cluster, "Degraded")["reason"] == "WorkersNotReady"
    wait_event(cluster, "ScaledUp")
    wait_until(lambda: budget_min_available(cluster) == 5, what="the budget at 6 pods")
    run_all(cluster)
    wait_until(lambda: status(cluster).get("workers") == "4/4")
    wait_until(lambda: condition(cluster, "Degraded").get("status") == "False")

    cluster.patch("rltj", JOB, {"spec": {"rolloutWorkers": {"replicas": 1}}})
    wait_pods(cluster, {HEAD, LEARNER, worker(0)})
    wait_until(lambda: status(cluster).get("workers") == "1/1")
    assert status(cluster)["phase"] == "Running"
    wait_event(cluster, "ScaledDown")
    wait_until(lambda: budget_min_available(cluster) == 2, what="the budget at 3 pods")


def test_failed_or_deleted_worker_is_replaced_and_training_goes_on(cluster, operator, job_dict):
    start_running(cluster, job_manifest(job_dict, replicas=2), 2)
    before = uids(pods(cluster))
    cluster.set_pod_phase(cluster.namespace, worker(1), "Failed", exit_code=137, reason="OOMKilled")
    replaced = wait_until(lambda: (p := pods(cluster)).get(worker(1)) and
                          p[worker(1)]["metadata"]["uid"] != before[worker(1)] and p)
    assert uids(replaced)[HEAD] == before[HEAD] and uids(replaced)[LEARNER] == before[LEARNER]
    degraded = condition(cluster, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "WorkerReplaced")
    assert "137" in degraded["message"] and status(cluster)["phase"] == "Running"
    assert wait_event(cluster, "WorkerReplaced")["type"] == "Warning"
    cluster.set_pod_phase(cluster.namespace, worker(1), "Running")
    wait_until(lambda: condition(cluster, "Degraded").get("status") == "False")

    cluster.delete("pods", worker(0))  # disappears (e.g. its node went away)
    wait_until(lambda: (p := pods(cluster)).get(worker(0)) and p[worker(0)]["metadata"]["uid"] != before[worker(0)])
    # Counted after the pass that created the replacement: wait for it, then it must be exactly 2.
    wait_until(lambda: operator.sample("kuberl_operator_child_pod_restarts_total", component="rollout-worker") >= 2)
    wait_passes(operator, 1)
    assert operator.sample("kuberl_operator_child_pod_restarts_total", component="rollout-worker") == 2


def test_learner_failure_restarts_within_backoff_limit_then_fails(cluster, operator, job_dict):
    start_running(cluster, job_manifest(job_dict, replicas=1, backoffLimit=1), 1)
    first = pods(cluster)[LEARNER]["metadata"]["uid"]
    cluster.set_pod_phase(cluster.namespace, LEARNER, "Failed", exit_code=1, message="CUDA error: out of memory")
    wait_until(lambda: (p := pods(cluster)).get(LEARNER) and p[LEARNER]["metadata"]["uid"] != first)
    st = status(cluster)
    assert st["learnerRestarts"] == 1 and st["phase"] == "Starting"
    event = wait_event(cluster, "LearnerRestarted")
    assert "restarts counted 1 of 1" in event["message"] and "emptyDir" in event["message"]
    cluster.set_pod_phase(cluster.namespace, LEARNER, "Running")
    wait_phase(cluster, "Running")

    cluster.set_pod_phase(cluster.namespace, LEARNER, "Failed", exit_code=3)
    st = wait_phase(cluster, "Failed")
    assert st["reason"] == "BackoffLimitExceeded" and "exited with code 3" in st["message"]
    wait_pods(cluster, {LEARNER})  # head and worker cleaned up; the failed learner kept for its logs
    assert condition(cluster, "Failed")["reason"] == "BackoffLimitExceeded"
    assert operator.sample("kuberl_operator_child_pod_restarts_total", component="learner") == 1


def test_a_learner_that_refuses_its_spec_fails_the_job_as_invalid_spec_without_a_restart(cluster, operator, job_dict):
    from kuberl.api.problems import InvalidJob, Problem

    start_running(cluster, job_manifest(job_dict, replicas=1), 1)
    report = InvalidJob([Problem("spec.environment.id", "cannot use the environment: module 'subprocess' has "
                                 "function 'run', not 'run'", "subprocess:run")], JOB).report()
    cluster.set_pod_phase(cluster.namespace, LEARNER, "Failed", exit_code=2, message=report)
    st = wait_phase(cluster, "Failed")
    assert (st["reason"], st["message"]) == ("InvalidSpec", report)
    assert st["learnerRestarts"] == 0
    wait_pods(cluster, {LEARNER})  # head and worker deleted; the learner kept for its log
    assert condition(cluster, "Failed")["reason"] == "InvalidSpec"
    wait_passes(operator, 2)
    assert set(pods(cluster)) == {LEARNER} and status(cluster)["phase"] == "Failed"

    # Fixing the spec starts the job over, from new pods.
    cluster.patch("rltj", JOB, {"spec": {"environment": {"id": "CartPole-v1", "kwargs": {}}}})
    wait_pods(cluster, {HEAD, LEARNER, worker(0)})
    assert wait_phase(cluster, "Starting").get("reason") is None


def test_head_failure_recreates_the_ray_cluster_never_staying_running(cluster, operator, job_dict):
    start_running(cluster, job_manifest(job_dict, replicas=2), 2)
    before = uids(pods(cluster))
    cluster.set_pod_phase(cluster.namespace, HEAD, "Failed", exit_code=1)
    wait_until(lambda: status(cluster).get("headRestarts") == 1)
    assert status(cluster)["phase"] == "Starting" and condition(cluster, "Running")["status"] == "False"
    def recreated() -> dict[str, dict] | None:
        found = pods(cluster)
        return found if set(found) == set(before) and all(uids(found)[n] != before[n] for n in found) else None

    after = wait_until(recreated, what="the whole Ray cluster recreated")
    assert {pod["metadata"]["labels"]["kuberl.dev/ray-epoch"] for pod in after.values()} == {"1"}
    wait_event(cluster, "HeadRestarted")
    run_all(cluster)
    wait_phase(cluster, "Running")


def test_suspend_deletes_pods_and_resume_recreates_them(cluster, operator, job_dict):
    start_running(cluster, job_manifest(job_dict, replicas=2), 2)
    cluster.patch("rltj", JOB, {"spec": {"suspend": True}})
    wait_phase(cluster, "Suspended")
    wait_pods(cluster, set())
    assert condition(cluster, "Suspended")["status"] == "True"
    wait_event(cluster, "Suspended")
    cluster.patch("rltj", JOB, {"spec": {"suspend": False}})
    wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1)})
    wait_phase(cluster, "Starting")
    wait_event(cluster, "Resumed")
    run_all(cluster)
    wait_phase(cluster, "Running")


def test_ttl_deletes_a_finished_job_and_its_children(cluster, operator, job_dict):
    start_running(cluster, job_manifest(job_dict, replicas=1, ttlSecondsAfterFinished=1), 1)
    cluster.set_pod_phase(cluster.namespace, LEARNER, "Succeeded")
    cluster.wait_for_absent("rltj", JOB, timeout=WAIT)
    # Succeeded lasts only the 1 s TTL: read it from the API's history rather than racing to see it live.
    history = [version for version in cluster.history("rltj", JOB) if version]
    succeeded = next(i for i, v in enumerate(history) if (v.get("status") or {}).get("phase") == "Succeeded")
    marked = next(i for i, v in enumerate(history) if v["metadata"].get("deletionTimestamp"))
    assert succeeded < marked  # it finished, then it was deleted
    finished = history[succeeded]["status"]
    assert {c["type"]: c["status"] for c in finished["conditions"]}["Complete"] == "True"
    deleted_at = timestamp(history[marked]["metadata"]["deletionTimestamp"])
    assert deleted_at - timestamp(finished["completionTime"]) >= timedelta(seconds=1)  # not before its TTL
    wait_pods(cluster, set())  # garbage-collected through the ownerReferences
    assert cluster.list("services") == []


def test_active_deadline_fails_a_job_that_runs_too_long(cluster, operator, job_dict):
    cluster.create(job_manifest(job_dict, replicas=1, activeDeadlineSeconds=1), namespace=cluster.namespace)
    st = wait_phase(cluster, "Failed")
    assert st["reason"] == "DeadlineExceeded"
    assert timestamp(st["completionTime"]) - timestamp(st["startTime"]) >= timedelta(seconds=1)
    # Its pods lived for about the 1 s deadline: the audit log shows each was created, then deleted.
    for name in (HEAD, LEARNER, worker(0)):
        assert made(cluster, "create", "pods", name), name
        wait_until(lambda name=name: made(cluster, "delete", "pods", name), what=f"{name} deleted")
    wait_pods(cluster, set())


def test_a_queued_job_waits_for_kueue_and_a_pod_that_cannot_start_says_why(cluster, operator, job_dict):
    """spec.queueName: Queued with every pod gated until the gates go; then an image pull error reaches
    status.message, StartupBlocked and one Event, and clears when the pods run. No Kueue runs on this
    control plane: the test lifts the gates itself, to check the operator's side alone (Kueue's own
    admission is tests/e2e/test_e2e_kueue.py)."""
    cluster.create(job_manifest(job_dict, replicas=1, queueName="team-a"), namespace=cluster.namespace)
    wait_pods(cluster, {HEAD, LEARNER, worker(0)})
    st = wait_phase(cluster, "Queued")
    assert condition(cluster, "Admitted")["reason"] == "WaitingForKueue" and "LocalQueue team-a" in st["message"]
    for name, pod in pods(cluster).items():
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}], name
        cluster.patch("pods", name, [{"op": "remove", "path": "/spec/schedulingGates"}], patch_type="json")
    wait_phase(cluster, "Starting")
    assert condition(cluster, "Admitted")["status"] == "True"
    cluster.patch_status("pods", LEARNER, {"phase": "Pending", "containerStatuses": [{"name": "learner", "state": {
        "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}}]}, cluster.namespace)
    wait_until(lambda: condition(cluster, "StartupBlocked").get("reason") == "ImagePullBackOff")
    assert status(cluster)["message"].startswith(f"{LEARNER}: ImagePullBackOff: container learner: Back-off")
    wait_event(cluster, "ImagePullBackOff")
    run_all(cluster)
    wait_phase(cluster, "Running")
    assert condition(cluster, "StartupBlocked")["status"] == "False" and status(cluster).get("message") is None
    wait_event(cluster, "Running")  # posted from kopf's queue, after the status that says Running
    assert event_reasons(cluster).count("ImagePullBackOff") == 1
    assert {"Queued", "Starting", "Running"} <= set(event_reasons(cluster))


def test_restarted_operator_creates_no_duplicates_and_carries_on(cluster, start_operator, job_dict):
    with start_operator():
        cluster.create(job_manifest(job_dict, replicas=2), namespace=cluster.namespace)
        before = uids(wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1)}))
        cluster.set_pod_phase(cluster.namespace, HEAD, "Running")
        wait_phase(cluster, "Starting")
    posts_before = len(made(cluster, "create", "pods"))
    with start_operator() as restarted:
        wait_until(lambda: reconcile_passes(restarted) >= 3, what="a few passes of the new operator")
        assert uids(pods(cluster)) == before
        assert len(made(cluster, "create", "pods")) == posts_before  # it saw every pod; it did not even try to create one
        run_all(cluster)
        st = wait_phase(cluster, "Running")
        assert st["learnerRestarts"] == 0 and st["headRestarts"] == 0
        assert uids(pods(cluster)) == before


def test_a_status_another_writer_overwrites_is_written_again(cluster, operator, job_dict):
    """Another client writes the job's status (a second operator, a script with kubectl): the operator's
    merge patches carry no resourceVersion, so it gets no 409 to retry; it sees the foreign status in its
    watch and writes what it knows again, without a pod of the job changing."""
    start_running(cluster, job_manifest(job_dict, replicas=1), 1)
    before = uids(pods(cluster))
    true_status = status(cluster)
    cluster.patch_status("rltj", JOB, {"phase": "Failed", "reason": "BackoffLimitExceeded",
                                       "message": "written by another client", "workersReady": 0})
    restored = wait_until(lambda: (st := status(cluster)).get("phase") == "Running"
                          and st.get("message") is None and st, what="the operator's status again")
    assert restored["workersReady"] == true_status["workersReady"] and "reason" not in restored, restored
    assert uids(pods(cluster)) == before
    assert "Failed" in phases_seen(cluster)  # the foreign write happened, and was overwritten


def test_the_operator_uses_every_permission_the_chart_grants_and_no_other(cluster, operator, job_dict):
    """RBAC is what the operator uses: one job through what a job can go through (created, scaled, a worker
    replaced, finished, deleted by its TTL) and one served after training; the audit log's requests of the operator's
    ServiceAccount, as (group, resource, verb), are exactly the chart's namespaced grants, none refused."""
    served = copy.deepcopy(job_dict)
    start_running(cluster, job_manifest(job_dict, replicas=1, ttlSecondsAfterFinished=0), 1)
    cluster.patch("rltj", JOB, {"spec": {"rolloutWorkers": {"replicas": 2}}})
    wait_event(cluster, "ScaledUp")
    cluster.set_pod_phase(cluster.namespace, worker(0), "Failed")
    wait_until(lambda: condition(cluster, "Degraded").get("reason") == "WorkerReplaced")
    cluster.set_pod_phase(cluster.namespace, LEARNER, "Succeeded")
    cluster.wait_for_absent("rltj", JOB)

    served["metadata"]["name"] = "served"
    served["spec"]["checkpointing"] = {"volume": {"claimName": "served-checkpoints"}}
    served["spec"]["serving"] = {}
    for manifest in volume_claim("served-checkpoints", cluster.namespace):
        cluster.create(manifest)
    cluster.create(job_manifest(served, replicas=1), namespace=cluster.namespace)
    wait_pods(cluster, {"served-head", "served-learner", "served-worker-0"}, job="served")
    run_all(cluster, job="served")
    wait_phase(cluster, "Running", name="served")
    cluster.set_pod_phase(cluster.namespace, "served-learner", "Succeeded")
    cluster.wait_for("deployments", "served-serving", timeout=WAIT)

    requests = cluster.requests()  # everything the operator's ServiceAccount asked, as the server saw it
    used = {(e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"] + (
        f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else ""), e["verb"])
        for e in requests}
    assert [e["requestURI"] for e in requests if e["responseStatus"]["code"] == 403] == []
    granted = {(g, r, v) for rule in rbac.RULES + rbac.SWEEP_RULES for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    cluster_wide = {(g, r, v) for rule in rbac.CLUSTER_RULES for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"]}
    assert used - granted - cluster_wide == set()
    # Granted and never a request of its own: blockOwnerDeletion on every child is authorized against
    # update of the job's finalizers (OwnerReferencesPermissionEnforcement, on in this API server). What only
    # a sweep uses (its trials' creates, its finalizer and status, the same owner check) is held to the audit
    # log by tests/integration/test_sweep_cluster.py, which runs one.
    sweep_only = {("kuberl.dev", "rltrainingjobs", "create"), ("kuberl.dev", "rlsweeps", "patch"),
                  ("kuberl.dev", "rlsweeps/status", "patch"), ("kuberl.dev", "rlsweeps/finalizers", "update")}
    assert granted - used == {("kuberl.dev", "rltrainingjobs/finalizers", "update")} | sweep_only


# ---- kubectl ------------------------------------------------------------------------------------------------


def test_kubectl_apply_get_wait_delete(cluster, operator, job_dict, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job_manifest(job_dict, replicas=2)))
    assert "created" in cluster.kubectl("apply", "-f", str(manifest)).stdout
    wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1)})

    def kubelet() -> None:
        time.sleep(0.3)
        run_all(cluster)
    threading.Thread(target=kubelet).start()
    waited = cluster.kubectl("wait", "--for=condition=Running", f"rltj/{JOB}", "--timeout=25s").stdout
    assert "condition met" in waited
    table = cluster.kubectl("get", "rltj").stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "WORKERS", "EPISODES", "EPISODES/S", "RETURN", "AGE"]
    assert table[1].split()[:3] == [JOB, "Running", "2/2"]
    wide = cluster.kubectl("get", "rltj", "-o", "wide").stdout.splitlines()
    assert wide[1].split()[-3:-1] == ["PPO", "CartPole-v1"]
    listed = cluster.kubectl("get", "pods", "-l", f"kuberl.dev/job-name={JOB}", "-o", "name").stdout.split()
    assert sorted(listed) == sorted(f"pod/{n}" for n in (HEAD, LEARNER, worker(0), worker(1)))
    phase = cluster.kubectl("get", "rltj", JOB, "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Running"

    threading.Thread(target=lambda: (time.sleep(0.3), cluster.set_pod_phase(cluster.namespace, LEARNER, "Succeeded"))).start()
    assert "condition met" in cluster.kubectl("wait", "--for=condition=Complete", f"rltj/{JOB}",
                                              "--timeout=25s").stdout
    deleted = cluster.kubectl("delete", "-f", str(manifest), "--timeout=25s").stdout
    assert f'rltrainingjob.kuberl.dev "{JOB}" deleted' in deleted
    assert cluster.get("rltj", JOB) is None  # kopf let go of its finalizer
    wait_pods(cluster, set())
    # Read with kubectl, as a user would; kopf posts Events from its own queue, so the last may still come.
    wait_until(lambda: {"Starting", "Running", "Succeeded"} <= {
        e["reason"] for e in json.loads(cluster.kubectl("get", "events", "-o", "json").stdout)["items"]},
        what="the Events Starting, Running and Succeeded")


# ---- the command ---------------------------------------------------------------------------------------------


def _stop(process) -> str:
    """SIGTERM the operator process, SIGKILL it if it has not left in 20 s; returns what it printed."""
    import subprocess

    process.terminate()
    try:
        return process.communicate(timeout=20)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http_get(url: str) -> str | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def test_kuberl_operator_command_serves_liveness_and_metrics_and_runs_jobs(cluster, job_dict):
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(sys.executable).parent / "kuberl-operator"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kuberl.operator.main"]
    metrics_port, liveness_port = _free_port(), _free_port()
    process = subprocess.Popen(
        [*command, "--namespace", cluster.namespace, "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
         "--liveness-endpoint", f"http://127.0.0.1:{liveness_port}/healthz", "--reconcile-interval", "0.5",
         "--trainer-image", "cli-image:1", "--rollout-image", "cli-rollout:1", "--log-format", "plain"],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: process.poll() is not None or _http_get(f"http://127.0.0.1:{liveness_port}/healthz"),
                   timeout=40, what="the operator's liveness endpoint")
        assert process.poll() is None, process.stdout.read()
        cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
        found = wait_pods(cluster, {HEAD, LEARNER, worker(0)}, timeout=20)
        assert found[HEAD]["spec"]["containers"][0]["image"] == "cli-rollout:1"
        assert found[LEARNER]["spec"]["containers"][0]["image"] == "cli-image:1"
        wait_phase(cluster, "Starting")
        text = wait_until(lambda: (t := _http_get(f"http://127.0.0.1:{metrics_port}/metrics"))
                          and 'kuberl_operator_jobs{phase="Starting"} 1.0' in t and t, what="operator metrics")
        assert 'kuberl_operator_child_pods_created_total{component="rollout-worker"} 1.0' in text
    finally:
        output = _stop(process)
    assert process.returncode == 0, output


def test_the_operator_process_never_imports_or_calls_what_a_job_names(cluster, job_dict, tmp_path):
    """A tenant's job names code: `subprocess:run`, `os:system`, gymnasium's `module:Env-vN` (a module that
    acts on import). The real `kuberl-operator` runs none of it: each job gets a status, the operator stays
    up, and a valid job beside them still reaches Running."""
    import copy
    import os
    import pathlib
    import subprocess
    import sys

    touched = {name: tmp_path / f"{name}.touched" for name in ("run", "system", "on-import")}
    (tmp_path / "kuberl_tenant_code.py").write_text(
        f"open({str(touched['on-import'])!r}, 'w').close()\n"
        "import gymnasium\ngymnasium.register('Evil-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    hostile = {
        "run": ("subprocess:run", {"args": ["touch", str(touched["run"])]}),
        "system": ("os:system", {"command": f"touch {touched['system']}"}),
        "on-import": ("kuberl_tenant_code:Evil-v0", {}),
        "unknown": ("CartPol-v1", {}),
    }
    script = pathlib.Path(sys.executable).parent / "kuberl-operator"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kuberl.operator.main"]
    # The tenant's module is importable from the operator's process: were anything imported, it would run.
    env = {**cluster.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([*command, "--namespace", cluster.namespace, "--reconcile-interval", "0.5", "--log-format", "plain"],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for key, (env_id, kwargs) in hostile.items():
            body = copy.deepcopy(job_dict)
            body["metadata"]["name"] = f"tenant-{key}"
            body["spec"]["environment"] = {"id": env_id, "kwargs": kwargs}
            cluster.create(job_manifest(body, replicas=1), namespace=cluster.namespace)
        cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
        wait_pods(cluster, {HEAD, LEARNER, worker(0)}, timeout=60)
        run_all(cluster)
        wait_phase(cluster, "Running", timeout=60)
        # module:... ids are the learner pod's to check: their jobs start (their pods would refuse them).
        for key in ("run", "system", "on-import"):
            assert wait_phase(cluster, "Starting", name=f"tenant-{key}", timeout=60)
        st = wait_phase(cluster, "Failed", name="tenant-unknown", timeout=60)
        assert st["reason"] == "InvalidSpec" and "did you mean CartPole-v1" in st["message"]
        assert process.poll() is None
    finally:
        output = _stop(process)
    assert process.returncode == 0, output
    assert [path.name for path in touched.values() if path.exists()] == []
    assert "Traceback" not in output, output


# ---- API failures ----------------------------------------------------------------------------------------------


def children(cluster: ClusterNamespace) -> list[str]:
    """Every object of the job in the namespace, as kind/name."""
    selector = f"kuberl.dev/job-name={JOB}"
    return [f"{resource}/{obj['metadata']['name']}"
            for resource in ("pods", "services", "secrets", "configmaps", "networkpolicies", "poddisruptionbudgets")
            for obj in cluster.list(resource, label_selector=selector)]


#: A template mistake only the API server knows: a toleration effect that does not exist.
BAD_TOLERATION = {"spec": {"tolerations": [{"key": "pool", "operator": "Exists", "effect": "Sometimes"}]}}


def test_a_child_the_api_server_refuses_fails_the_job_as_invalid_spec_and_nothing_of_it_exists(cluster, operator,
                                                                                                  job_dict):
    """A template mistake only the API server knows (a toleration effect that does not exist): the server's
    dry run refuses it before the first object of the job is written, and its message reaches the status."""
    job_dict["spec"]["rolloutWorkers"]["template"] = BAD_TOLERATION
    cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
    st = wait_phase(cluster, "Failed")
    assert st["reason"] == "InvalidSpec" and "the API server refused" in st["message"], st
    assert "Sometimes" in st["message"] and f"Pod {worker(0)}" in st["message"], st
    wait_passes(operator, 2)
    assert [e["requestURI"] for e in made(cluster, "create") if e["objectRef"]["resource"] != "events"] == []
    assert children(cluster) == []


def test_a_running_job_keeps_its_pods_when_the_server_refuses_its_scale_up(cluster, operator, job_dict):
    """A change the server refuses (a scale-up whose new pods carry a template mistake only the server knows)
    does not fail a running job: its pods keep training, a ChangeRefused condition and an Event say why, the
    tries back off, and once the spec is fixed the new pods come."""
    start_running(cluster, job_manifest(job_dict, replicas=1), 1)
    before = uids(pods(cluster))
    cluster.patch("rltj", JOB, {"spec": {"rolloutWorkers": {"replicas": 3, "template": BAD_TOLERATION}}})
    held = wait_until(lambda: (c := condition(cluster, "ChangeRefused")).get("status") == "True" and c,
                      what="ChangeRefused True")
    assert held["reason"] == "Invalid" and "Sometimes" in held["message"], held
    # Which try the first look sees depends on the machine's speed (the second comes 1 s after the first).
    assert "keeps the pods it has" in held["message"] and re.search(r"\(try \d+; next in", held["message"]), held
    assert uids(pods(cluster)) == before
    assert status(cluster)["phase"] == "Running"
    # kopf posts Events from its own queue, after the status patch that carries the condition.
    wait_event(cluster, "FailedCreate")

    cluster.patch("rltj", JOB, {"spec": {"rolloutWorkers": {"template": None}}})
    wait_pods(cluster, {HEAD, LEARNER, *(worker(i) for i in range(3))})
    cleared = wait_until(lambda: (c := condition(cluster, "ChangeRefused")).get("status") == "False" and c,
                         what="ChangeRefused False")
    assert cleared["reason"] == "Created"
    after = uids(pods(cluster))
    assert all(after[name] == uid for name, uid in before.items()), (before, after)
    assert "Failed" not in phases_seen(cluster)
    # Only the fixed pods were ever written: every refused try stopped in its dry run.
    created = [e["objectRef"]["name"] for e in made(cluster, "create", "pods") if e["responseStatus"]["code"] == 201]
    assert sorted(created) == sorted([HEAD, LEARNER, *(worker(i) for i in range(3))]), created


def test_a_pod_that_pod_security_refuses_fails_a_new_job_as_invalid_spec(cluster, start_operator, job_dict):
    """The platform team allowed privileged pods in the namespace (so the operator's own check lets the
    template through) but the namespace enforces restricted: Pod Security admission's 403 is the spec's
    fault, not something to wait out: InvalidSpec, the server's words, and nothing of the job exists."""
    from kuberl.api.tenancy import Allowance, Tenancy

    job_dict["spec"]["rolloutWorkers"]["template"] = {"spec": {"containers": [
        {"name": "miner", "image": "busybox",
         "securityContext": {"privileged": True, "allowPrivilegeEscalation": True}}]}}
    tenancy = Tenancy(namespaces={cluster.namespace: Allowance(pod_security="privileged")})
    with start_operator(tenancy=tenancy) as running:
        cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
        st = wait_phase(cluster, "Failed")
        assert st["reason"] == "InvalidSpec" and "violates PodSecurity" in st["message"], st
        assert "privileged" in st["message"], st
        wait_passes(running, 2)
    assert children(cluster) == []
    assert [e for e in made(cluster, "create") if e["objectRef"]["resource"] != "events"] == []


@pytest.mark.parametrize("template, field", [
    ({"spec": {"containers": [{"name": "miner", "image": "busybox", "securityContext": {"privileged": True}}]}},
     "spec.rolloutWorkers.template.spec.containers[0].securityContext.privileged"),
    ({"spec": {"serviceAccountName": rbac.DEFAULT_NAME, "automountServiceAccountToken": True}},
     "spec.rolloutWorkers.template.spec.serviceAccountName"),
], ids=["privileged sidecar", "the operator's ServiceAccount"])
def test_a_template_that_widens_a_pod_fails_the_job_before_any_object_exists(cluster, operator, job_dict, template,
                                                                            field):
    job_dict["spec"]["rolloutWorkers"]["template"] = template
    cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
    st = wait_phase(cluster, "Failed")
    assert st["reason"] == "InvalidSpec" and field in st["message"] and "tenancy.namespaces" in st["message"]
    wait_passes(operator, 2)
    assert [e for e in made(cluster, "create") if e["objectRef"]["resource"] != "events"] == []


def test_a_job_in_the_operators_own_namespace_is_refused(cluster, start_operator, job_dict):
    from kuberl.api.tenancy import Tenancy

    with start_operator(tenancy=Tenancy(operator_namespace=cluster.namespace)) as running:
        cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
        st = wait_phase(cluster, "Failed")
        assert st["reason"] == "InvalidSpec" and "metadata.namespace" in st["message"]
        wait_passes(running, 2)
    assert pods(cluster) == {}


def test_a_forbidden_create_keeps_the_job_waiting_with_the_reason_and_backs_off(cluster, operator, job_dict):
    """A 403 (here the namespace's ResourceQuota; Pod Security admission alike) is the namespace's doing: the
    job is not failed, it says why, and each try stops at the first refusal, at growing intervals, with
    nothing of the job written, until the server takes them."""
    cluster.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
                    "spec": {"hard": {"pods": "0"}}})
    cluster.wait_for("resourcequotas", "no-pods", lambda q: "pods" in (q.get("status") or {}).get("hard", {}),
                     timeout=WAIT)
    cluster.create(job_manifest(job_dict, replicas=1), namespace=cluster.namespace)
    refusals = 4

    def refused() -> list[dict]:
        return [e for e in cluster.requests() if e["verb"] == "create" and e["objectRef"]["resource"] == "pods"
                and e["responseStatus"]["code"] == 403]

    wait_until(lambda: len(refused()) >= refusals, what=f"{refusals} refused tries")
    assert children(cluster) == []  # each try was refused in its dry run: nothing of the job exists
    cluster.delete("resourcequotas", "no-pods")
    wait_pods(cluster, {HEAD, LEARNER, worker(0)})
    created = wait_until(lambda: (c := condition(cluster, "CreateForbidden")).get("status") == "False" and c,
                         what="CreateForbidden False")
    assert created["reason"] == "Created"
    seen = [c["message"] for version in cluster.history("rltj", JOB) if version
            for c in (version.get("status") or {}).get("conditions", []) if c["type"] == "CreateForbidden"
            and c["status"] == "True"]
    assert any(f"(try {refusals}; next in" in message for message in seen), seen
    assert all(message.startswith("Pod ") and "exceeded quota" in message for message in seen), seen
    # One refused request per try, never a whole job's worth.
    assert len({e["requestURI"] for e in refused()}) <= len(refused()) <= len(seen) + 1
    assert len([e for e in made(cluster, "create", "pods") if e["responseStatus"]["code"] == 201]) == 3
    assert "Failed" not in phases_seen(cluster)
    wait_event(cluster, "FailedCreate")

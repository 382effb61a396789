"""
Queued jobs through a real Kueue: Kueue's own controller and webhooks (tests/bed/kueue.py, built by
scripts/build-kueue) on the end-to-end bed, with the queues of deploy/kueue/queues.yaml.

A job that names a LocalQueue is one Kueue pod group whose pods the operator creates gated. Kueue, not
the test, decides: it admits a group the ClusterQueue has quota for and lifts the gate from every pod
(the job then trains to Complete), and it leaves a group that does not fit gated, its Workload not
admitted (the job stays Queued and nothing of it runs). Assertions read the API server: the job's
status and events, the pods, Kueue's Workloads, and the audit log for who lifted the gates.

Mode: the real node (a kubelet with containerd), one bed for the module (its own control plane, so Kueue's
webhooks reach no other test's pods).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bed.cluster_bed import OneNodeCluster, bed_for_tests
from bed.common import wait_until
from bed.kueue import NAMESPACE, SERVICE_ACCOUNT, kueue_bin
from test_e2e_cluster import example as example_job

REPO = Path(__file__).resolve().parents[2]
NS = "queued-jobs"
QUEUE = "team-a"
KUEUE_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
#: The scheduling gate of Kueue's plain-pod integration.
ADMISSION_GATE = "kueue.x-k8s.io/admission"

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if kueue_bin() is None:
        from tools import in_ci

        reason = "Kueue is not built: run ./scripts/build-kueue (./scripts/test does)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    with bed_for_tests(tmp_path_factory.mktemp("bed"), namespaces=(NS,), kueue=True) as running:
        queues = [doc for doc in yaml.safe_load_all((REPO / "deploy" / "kueue" / "queues.yaml").read_text()) if doc]
        for doc in queues:
            if doc["kind"] == "LocalQueue":
                doc["metadata"]["namespace"] = NS
        running.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(queues))
        running.cluster.wait_for("clusterqueues", "rl-training", timeout=60, predicate=active)
        running.cluster.wait_for("localqueues", QUEUE, namespace=NS, timeout=60, predicate=active)
        yield running


def active(queue: dict) -> bool:
    """Kueue's own verdict on a queue: its Active condition."""
    return condition(queue, "Active").get("status") == "True"


def condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def example(name: str, job_name: str, **spec_changes) -> dict:
    job = example_job(name, **spec_changes)
    job["metadata"] = {"name": job_name, "namespace": NS}
    return job


def apply(bed: OneNodeCluster, job: dict) -> None:
    bed.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))


def job_pods(bed: OneNodeCluster, job: str) -> list[dict]:
    return bed.cluster.list("pods", NS, label_selector=f"kuberl.dev/job-name={job}")


def job_containers(bed: OneNodeCluster, job: str) -> list[str]:
    """The job's running containers. An exited one stays listed until the kubelet's garbage collection
    (each minute) removes it, as on any node: what a deleted job must not leave is a container that runs."""
    return [n for n in bed.bed_containers() if f"_{job}-" in n and f"_{NS}_" in n]


def gated(pod: dict) -> bool:
    return {"name": ADMISSION_GATE} in (pod["spec"].get("schedulingGates") or [])


def workload_of(bed: OneNodeCluster, group: str) -> dict | None:
    """Kueue's Workload for a pod group (Kueue names it after the group)."""
    return bed.cluster.get("workloads", group, NS)


def pods_state(bed: OneNodeCluster, job: str) -> list[tuple]:
    """What a person would look at when a job's pods linger: phase, deletion, finalizers, gates."""
    return [(p["metadata"]["name"], (p.get("status") or {}).get("phase"), p["metadata"].get("deletionTimestamp"),
             p["metadata"].get("finalizers"), p["spec"].get("schedulingGates")) for p in job_pods(bed, job)]


def delete_and_check_nothing_left(bed: OneNodeCluster, job: str) -> None:
    bed.kubectl("delete", "rltj", job, "-n", NS, "--wait=true", "--timeout=120s")
    try:
        wait_until(lambda: not job_pods(bed, job), 120, 0.2, f"the pods of {job} to be gone")
    except AssertionError as error:
        workloads = [(w["metadata"]["name"], w["metadata"].get("finalizers"), (w.get("status") or {}).get("conditions"))
                     for w in bed.cluster.list("workloads", NS)]
        raise AssertionError(f"{error}: pods {pods_state(bed, job)}; workloads {workloads}") from None
    wait_until(lambda: not job_containers(bed, job), 120, 0.2, f"the containers of {job} to be gone")


#: Requests that fit the real node's two cores beside the operator: 3 pods, 0.6 CPU and 2.5Gi asked.
SMALL = {"head.resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
         "rolloutWorkers.resources": {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
         "learner.resources": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}}


def small_job(job_name: str, **spec_changes) -> dict:
    """cartpole-ppo with one rollout worker and a low target: a short run."""
    return example("cartpole-ppo.yaml", job_name, **{
        "queueName": QUEUE, "rolloutWorkers.replicas": 1, "startupDeadlineSeconds": 300,
        "stopping": {"targetReturn": 60, "maxEnvSteps": 20_000}, "evaluation": {"episodes": 10}, **SMALL,
        **spec_changes})


# --------------------------------------------------------------------------------------------------


def test_a_job_whose_gang_fits_is_admitted_by_kueue_which_lifts_every_gate_and_it_trains(bed):
    since = bed.plane.audit_offset()
    # Long enough to be seen Running: the operator marks it so once every pod is Ready, which the kubelet's
    # readiness probes report seconds after the containers start; a job that reached a low target before
    # that went from Starting to Succeeded on a loaded machine.
    apply(bed, small_job("fits", stopping={"targetReturn": 10_000, "maxEnvSteps": 60_000}))
    group = "fits-g0-n3"
    workload = bed.cluster.wait_for("workloads", group, namespace=NS, timeout=120,
                                    predicate=lambda w: condition(w, "Admitted").get("status") == "True")
    assert workload["status"]["admission"]["clusterQueue"] == "rl-training", workload["status"]
    assert workload["spec"]["queueName"] == QUEUE
    assert sum(p["count"] for p in workload["spec"]["podSets"]) == 3, workload["spec"]["podSets"]
    pods = {p["metadata"]["name"] for p in job_pods(bed, "fits")}
    assert len(pods) == 3, pods
    bed.wait_complete(NS, "fits", 600)

    status = bed.cluster.get("rltj", "fits", NS)["status"]
    admitted = condition({"status": status}, "Admitted")
    assert admitted["status"] == "True" and group in admitted["message"], admitted
    # (the operator posts the job's Events after it writes its status)
    wanted = {"Queued", "Starting", "Running", "Succeeded"}
    try:
        wait_until(lambda: wanted <= {e["reason"] for e in bed.cluster.events(NS, "fits")}, 60, 0.2,
                   f"the Events {wanted}")
    except AssertionError as missing:
        seen = [(e["reason"], e.get("message", "")) for e in bed.cluster.events(NS, "fits")]
        raise AssertionError(f"{missing}; seen: {seen}") from None
    # The pods were created gated, and only Kueue's ServiceAccount changed them after (the operator
    # creates and deletes them, the node writes their status): Kueue took the gate off every one.
    writes = [e for e in bed.plane.audit_events(since)
              if (e.get("objectRef") or {}).get("resource") == "pods" and e.get("stage") == "ResponseComplete"
              and e["verb"] in ("update", "patch") and not e["objectRef"].get("subresource")
              and e["objectRef"].get("name") in pods]
    assert {e["user"]["username"] for e in writes} == {KUEUE_USER}, [(e["user"]["username"], e["verb"]) for e in writes]
    assert {e["objectRef"]["name"] for e in writes} == pods, writes
    delete_and_check_nothing_left(bed, "fits")
    bed.cluster.wait_for_absent("workloads", group, NS, timeout=120)


def test_a_job_whose_gang_does_not_fit_the_quota_stays_queued_with_every_pod_gated(bed):
    """One rollout worker asks for 9 CPU: the gang's 10.5 CPU is more than the ClusterQueue's 8."""
    apply(bed, small_job("too-big", **{"rolloutWorkers.resources": {
        "requests": {"cpu": "9", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}}))
    group = "too-big-g0-n3"
    # Kueue looked at the whole group and found no quota for it.
    workload = bed.cluster.wait_for("workloads", group, namespace=NS, timeout=120,
                                    predicate=lambda w: condition(w, "QuotaReserved").get("status") == "False")
    reserved = condition(workload, "QuotaReserved")
    assert "insufficient quota" in reserved["message"] and "cpu" in reserved["message"], reserved
    assert condition(workload, "Admitted").get("status") != "True", workload["status"]
    assert not workload["status"].get("admission"), workload["status"]

    pods = job_pods(bed, "too-big")
    assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert gated(pod), pod["spec"].get("schedulingGates")
        assert not pod["spec"].get("nodeName"), pod["spec"]
        assert (pod.get("status") or {}).get("phase") == "Pending", pod.get("status")
    assert not job_containers(bed, "too-big")
    status = bed.cluster.get("rltj", "too-big", NS)["status"]
    assert status["phase"] == "Queued", status
    waiting = condition({"status": status}, "Admitted")
    assert waiting["status"] == "False" and waiting["reason"] == "WaitingForKueue", waiting
    assert f"LocalQueue {QUEUE}" in waiting["message"] and "3 of 3 pods gated" in waiting["message"], waiting
    assert "Queued" in bed.kubectl("get", "rltj", "too-big", "-n", NS).stdout
    delete_and_check_nothing_left(bed, "too-big")
    bed.cluster.wait_for_absent("workloads", group, NS, timeout=120)

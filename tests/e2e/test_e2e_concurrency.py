"""
Many jobs at once. Three real jobs train side by side on the one-node bed (tests/bed/cluster_bed.py, its
node a real kubelet with containerd) and each ends with its own status, metrics and checkpoints, nothing
crossed over; twenty jobs on the real API server alone (kopf for real, the test as the kubelet, as in
test_operator_integration.py) reconcile with no error and exactly one of each pod.

Modes: the real node under the bed's own real control plane, the operator from its chart (the three
jobs); kopf against the session's real control plane, no containers (the twenty).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
import yaml
from bed.cluster_bed import bed_for_tests
from bed.common import wait_until
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from integration.test_operator_integration import cluster, made, start_operator  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
NS = "ml-many"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with bed_for_tests(tmp_path_factory.mktemp("many"), namespaces=(NS,)) as running:
        yield running


def small_job(name: str, max_env_steps: int) -> list[dict]:
    job = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": NS}
    spec = job["spec"]
    # Requests that fit three jobs on the real node's two cores beside the operator (each job's defaults
    # alone, 2.5 CPU, would not).
    spec["rolloutWorkers"] = {"replicas": 1, "envsPerWorker": 8, "resources": {
        "requests": {"cpu": "150m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}}
    spec["learner"] = {"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}}
    spec["head"] = {"resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}}
    spec["stopping"] = {"targetReturn": 10_000, "returnWindow": 100, "maxEnvSteps": max_env_steps}
    spec["checkpointing"] = {"intervalSeconds": 5, "keepLast": 2, "volume": {"claimName": f"{name}-checkpoints"}}
    spec["evaluation"] = {"episodes": 5}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": f"{name}-checkpoints", "namespace": NS},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    return [claim, job]


@pytest.mark.slow
# Three jobs' twelve pods on two cores: each `kubectl wait` below may take up to its own 600 s.
@pytest.mark.timeout(3 * 630 + 300)
def test_three_real_jobs_at_once_each_with_its_own_status_metrics_and_checkpoints(bed):
    # Different lengths, so that a counter read from the wrong job's learner would show.
    jobs = {"many-a": 40_000, "many-b": 60_000, "many-c": 80_000}
    docs = [doc for name, steps in jobs.items() for doc in small_job(name, steps)]
    bed.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(docs))
    live_names: list[list[str]] = []
    stop = threading.Event()

    def watch_pods() -> None:
        while not stop.is_set():
            pods = bed.cluster.list("pods", NS)
            live_names.append([p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")])
            stop.wait(0.5)

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    try:
        for name in jobs:
            result = bed.kubectl("wait", "-n", NS, f"rltj/{name}", "--for=condition=Complete", "--timeout=600s",
                                 check=False, timeout=630)
            assert result.returncode == 0, (f"{name}: {result.stderr}\n"
                                            f"{json.dumps(bed.cluster.get('rltj', name, NS).get('status'), indent=1)}\n"
                                            f"{[(e.get('reason'), e.get('message')) for e in bed.cluster.events(NS)]}\n"
                                            f"{bed.operator_logs()[-3000:]}")
    finally:
        stop.set()
        watcher.join(10)
    # All three were training at the same time: some sample saw the three learners live together.
    assert any(all(f"{name}-learner" in names for name in jobs) for names in live_names), "never all at once"
    for names in live_names:
        assert len(names) == len(set(names)), names

    steps_seen = []
    for name, max_steps in jobs.items():
        status = bed.cluster.get("rltj", name, NS)["status"]
        assert status["phase"] == "Succeeded" and status["learnerRestarts"] == 0, (
                status, [(e.get("reason"), e.get("message")) for e in bed.cluster.events(NS, name)])
        run_dir = bed.node.claim_dir(NS, f"{name}-checkpoints")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        # Its own learner's counters in its status, and on its own claim.
        assert status["progress"]["envSteps"] == rows[-1]["env_steps"], (name, status["progress"], rows[-1])
        assert status["progress"]["episodes"] == rows[-1]["episodes"], (name, status["progress"], rows[-1])
        assert max_steps <= rows[-1]["env_steps"] < max_steps + 20_000, (name, rows[-1])
        assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1)), name
        ckpts = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
        assert ckpts, name
        state = torch.load(ckpts[-1], map_location="cpu", weights_only=True)
        assert state["job_name"] == name and state["counters"]["env_steps"] == rows[-1]["env_steps"], name
        summary = json.loads((run_dir / "summary.json").read_text())
        assert json.dumps(summary).count(name) >= 1, summary
        steps_seen.append(rows[-1]["env_steps"])
        # Its own Events only.
        messages = [e.get("message", "") for e in bed.cluster.events(NS, name)]
        assert not [m for m in messages for other in jobs if other != name and other in m], messages
    assert len(set(steps_seen)) == len(jobs), steps_seen

    for name in jobs:
        bed.kubectl("delete", "rltj", name, "-n", NS, "--wait=true", "--timeout=120s")
    wait_until(lambda: not bed.cluster.list("pods", NS)
               and not [c for c in bed.bed_containers() if f"_{NS}_" in c], 120, 0.5,
               "every pod of the three jobs gone and none of their containers running")


def test_twenty_jobs_on_the_real_api_server_reconcile_with_no_error_and_no_duplicate_pod(
        cluster, start_operator, job_dict):  # noqa: F811
    count = 20
    with start_operator() as op:
        for i in range(count):
            manifest = json.loads(json.dumps(job_dict))
            manifest["metadata"] = {"name": f"job-{i:02d}"}
            manifest["spec"]["rolloutWorkers"]["replicas"] = 1
            cluster.create(manifest, namespace=cluster.namespace)

        def all_pods() -> list[dict]:
            return cluster.list("pods", cluster.namespace)

        wait_until(lambda: len(all_pods()) == 3 * count, 120, 0.2, f"{3 * count} pods")
        for pod in all_pods():
            cluster.set_pod_phase(cluster.namespace, pod["metadata"]["name"], "Running")
        wait_until(lambda: all((j.get("status") or {}).get("phase") == "Running"
                               for j in cluster.list("rltj", cluster.namespace)), 120, 0.2, "every job Running")
        for i in range(count):
            cluster.set_pod_phase(cluster.namespace, f"job-{i:02d}-learner", "Succeeded")
        wait_until(lambda: all((j.get("status") or {}).get("phase") == "Succeeded"
                               for j in cluster.list("rltj", cluster.namespace)), 120, 0.2, "every job Succeeded")
        wait_until(lambda: len(all_pods()) == count, 120, 0.2, "only the finished learners left")

        created = {c: op.sample("kuberl_operator_child_pods_created_total", component=c)
                   for c in ("head", "rollout-worker", "learner")}
        assert created == {"head": count, "rollout-worker": count, "learner": count}, created
        posts = made(cluster, "create", "pods")  # from the audit log, the dry runs left out
        assert len(posts) == 3 * count, f"{len(posts)} pod creations for {3 * count} pods"
        text = generate_latest(op.metrics.registry).decode()
        # (Progress scrapes fail here: no learner serves metrics without containers.)
        errors = {tuple(s.labels.items()): s.value for f in text_string_to_metric_families(text)
                  for s in f.samples if s.name == "kuberl_operator_errors_total" and s.value
                  and s.labels.get("handler") != "progress"}
        assert not errors, errors
        for job in cluster.list("rltj", cluster.namespace):
            st = job["status"]
            assert st["learnerRestarts"] == 0 and st["headRestarts"] == 0, st
            assert st["observedGeneration"] == job["metadata"]["generation"], st
            reasons = [e["reason"] for e in cluster.events(cluster.namespace, involved_name=job["metadata"]["name"])]
            assert not {"WorkerReplaced", "LearnerRestarted", "HeadRestarted"} & set(reasons), reasons

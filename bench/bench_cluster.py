"""`kubectl apply` on the one-node cluster against `kuberl train` on the same machine, same job.

For `examples/cartpole-ppo.yaml` (seeded, 2 workers x 8 envs, stop at mean return 475) it times,
on the one-node bed the end-to-end tests use (tests/bed/cluster_bed.py, reached through
common.from_tests: the real control plane, a real node (the kubelet with containerd, kube-proxy, CoreDNS,
kube-router) pulling the real images from a registry, the operator installed with its chart and running
as its Deployment). The node has this machine's cores and the scheduler places pods by their requests,
so the job asks for what a 2-core node fits (`REQUESTS`; the example's defaults would leave it Pending):

- apply -> all pods created, head ready, all pods Running, the learner's
  /metrics up, the first env step (kuberl_env_steps_total > 0), the job Complete;
- where the time goes: container start (pod created -> running), the Ray head's start, the
  workers' and learner's wait for the head, the learner's imports and Ray join, training (the
  learner's own wall-clock), evaluation + report + exit;

and, interleaved with the cluster runs (load hits both alike), the whole `kuberl train` command.
Target: the cluster run takes at most 1.5x the local run's wall-clock time.

    .venv/bin/python bench/bench_cluster.py --runs 3      # -> bench/results/cluster_real_node.json

(bench/results/cluster.json is this benchmark's last run on the node agent, the podman stand-in for a
kubelet it ran on before.)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time
import urllib.request

import yaml
from common import EXAMPLES, REPO, RESULTS, Bench, from_tests

NS = "bench"
JOB_FILE = EXAMPLES / "cartpole-ppo.yaml"
#: What each pod asks: the end-to-end tests' requests, which two cores fit beside the operator. The
#: learner's and workers' threads are sized to one CPU either way.
REQUESTS = from_tests("bed.cluster_bed").SMALL_REQUESTS


def scrape(ip: str, port: int = 8080) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=0.5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("kuberl_") and "{" in line:
            name = line.split("{", 1)[0]
            out.setdefault(name, float(line.rsplit(" ", 1)[1]))
    return out


def cluster_run(bed, index: int) -> dict:
    """One `kubectl apply` of the job on the bed (a cluster_bed.OneNodeCluster), timed to Complete."""
    job = yaml.safe_load(JOB_FILE.read_text())
    name = f"cartpole-{index}"
    job["metadata"] = {"name": name, "namespace": NS}
    for role, resources in REQUESTS.items():
        job["spec"].setdefault(role, {})["resources"] = resources
    # A claim, so the learner's summary.json (its own time split) outlives its pod.
    claim = f"{name}-run"
    job["spec"]["checkpointing"]["volume"] = {"claimName": claim}
    bed.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": NS},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
    selector = f"kuberl.dev/job-name={name}"
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    bed.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(job))
    marks["kubectl_apply_returned"] = time.monotonic() - t0
    expected = job["spec"]["rolloutWorkers"]["replicas"] + 2
    learner_ip = None
    while True:
        now = time.monotonic() - t0
        pods = bed.cluster.list("pods", NS, label_selector=selector)
        if len(pods) == expected:
            marks.setdefault("all_pods_created", now)
        for pod in pods:
            status = pod.get("status") or {}
            component = pod["metadata"]["labels"].get("kuberl.dev/component")
            if status.get("phase") == "Running":
                marks.setdefault(f"running:{pod['metadata']['name']}", now)
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
            if component == "head" and ready:
                marks.setdefault("head_ready", now)
            if component == "learner" and status.get("podIP"):
                learner_ip = status["podIP"]
        if len([p for p in pods if (p.get("status") or {}).get("phase") == "Running"]) == expected:
            marks.setdefault("all_pods_running", now)
        if learner_ip and "first_env_step" not in marks:
            sample = scrape(learner_ip)
            if sample:
                marks.setdefault("learner_metrics_up", now)
            if sample.get("kuberl_env_steps_total", 0) > 0:
                marks["first_env_step"] = now
        body = bed.cluster.get("rltj", name, NS) or {}
        conditions = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
        if conditions.get("Complete") == "True":
            marks["complete"] = now
            break
        if conditions.get("Failed") == "True" or now > 600:
            raise RuntimeError(f"{name} did not complete: {json.dumps(body.get('status'), indent=1)}")
        time.sleep(0.05)
    status = bed.cluster.get("rltj", name, NS)["status"]
    logs = bed.kubectl("logs", "-n", NS, f"{name}-learner").stdout
    bed.kubectl("delete", "rltj", name, "-n", NS, "--wait=true", "--timeout=120s")
    while bed.cluster.list("pods", NS, label_selector=selector):
        time.sleep(0.1)
    training = status["progress"]["wallClockSeconds"]
    learner_split = json.loads((bed.node.claim_dir(NS, claim) / "summary.json").read_text()).get("time_split")
    worker_running = max(v for k, v in marks.items() if k.startswith(f"running:{name}-worker"))
    return {
        "marks_seconds_after_apply": {k: round(v, 3) for k, v in marks.items()},
        "apply_to_all_pods_running": round(marks["all_pods_running"], 3),
        "apply_to_first_env_step": round(marks.get("first_env_step", float("nan")), 3),
        "apply_to_complete": round(marks["complete"], 3),
        "training_wall_clock": round(training, 3),
        "breakdown": {
            "pod_objects_created": round(marks["all_pods_created"], 3),
            "head_container_and_ray_head_start": round(marks["head_ready"] - marks["all_pods_created"], 3),
            "workers_join_after_head_ready": round(worker_running - marks["head_ready"], 3),
            "learner_start_to_first_env_step": round(marks.get("first_env_step", marks["complete"])
                                                     - marks["all_pods_running"], 3),
            "first_env_step_to_complete": round(marks["complete"] - marks.get("first_env_step", 0), 3),
        },
        "learner_time_split": learner_split,
        "mean_return": status["progress"]["meanReturn"],
        "evaluation": status.get("evaluation"),
        "env_steps": status["progress"]["envSteps"],
        "learner_log_tail": logs.splitlines()[-3:],
    }


def local_run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}
        t0 = time.monotonic()
        result = subprocess.run([str(REPO / ".venv" / "bin" / "kuberl"), "train", str(JOB_FILE), "--run-dir", tmp,
                                 "--no-progress", "--metrics-port", "0"], env=env, capture_output=True, text=True,
                                check=False)
        whole = time.monotonic() - t0
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        summary = json.loads(pathlib.Path(tmp, "summary.json").read_text())
    return {"whole_command": round(whole, 3), "summary": summary}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "cluster_real_node.json", arguments)
    args = bench.args
    cluster_bed = from_tests("bed.cluster_bed")
    build = cluster_bed.ensure_images()
    cluster_runs, local_runs = [], []
    with (tempfile.TemporaryDirectory() as tmp,
          cluster_bed.OneNodeCluster(pathlib.Path(tmp), namespaces=(NS,)) as bed):
        for i in range(args.runs):
            local_runs.append(local_run())
            print(f"local run {i}: {local_runs[-1]['whole_command']:.1f} s", flush=True)
            cluster_runs.append(cluster_run(bed, i))
            print(f"cluster run {i}: {cluster_runs[-1]['apply_to_complete']:.1f} s "
                  f"(training {cluster_runs[-1]['training_wall_clock']:.1f} s)", flush=True)
        bed_timings = bed.timings

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    cluster_complete = med([r["apply_to_complete"] for r in cluster_runs])
    local_whole = med([r["whole_command"] for r in local_runs])
    result = {
        "job": str(JOB_FILE.relative_to(REPO)),
        "node": "a real node: the kubelet with containerd, kube-proxy, CoreDNS and kube-router",
        "requests": REQUESTS,
        "images": {"ensure_images_seconds": round(build["seconds"], 1), "note": "base from Debian (Python 3.11.2)"},
        "bed_start_seconds": bed_timings,
        "median": {
            "cluster_apply_to_all_pods_running": med([r["apply_to_all_pods_running"] for r in cluster_runs]),
            "cluster_apply_to_first_env_step": med([r["apply_to_first_env_step"] for r in cluster_runs]),
            "cluster_apply_to_complete": cluster_complete,
            "cluster_training_wall_clock": med([r["training_wall_clock"] for r in cluster_runs]),
            "local_whole_command": local_whole,
            "local_training_wall_clock": med([r["summary"]["wall_clock"] for r in local_runs]),
            "cluster_learner_process_total": med([r["learner_time_split"]["total"] for r in cluster_runs]),
            "cluster_over_local": round(cluster_complete / local_whole, 3),
            "breakdown": {key: med([r["breakdown"][key] for r in cluster_runs])
                          for key in cluster_runs[0]["breakdown"]},
        },
        "target": "cluster_apply_to_complete <= 1.5 x local_whole_command",
        "cluster_runs": cluster_runs,
        "local_runs": local_runs,
    }
    result["target_met"] = result["median"]["cluster_over_local"] <= 1.5
    bench.write(result)
    print(json.dumps(result["median"], indent=1))


if __name__ == "__main__":
    main()

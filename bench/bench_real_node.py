"""A job on the tests' real node (a kubelet, containerd, kube-proxy, CoreDNS and kube-router:
tests/bed/real_node.py) under its own real control plane with the chart's operator
(bench/results/real_node_bed.json; bench/results/real_node.json is this bench's last run beside the node agent,
the podman stand-in for a kubelet the tests ran on before).

    .venv/bin/python bench/bench_real_node.py [--repeats 1] [--cold-images]

Per repeat: the bed's start (control plane, node, chart, operator Ready: the whole `with OneNodeCluster(...)`
entry), `kubectl apply` of CartPole PPO (20,000 env steps, one worker, requests
that fit this machine's 2 CPUs) -> Succeeded as `kubectl get` sees it, the job's own time to first step, and
the bed's stop. `--cold-images` empties the bed registry and the real node's image store first, so its first
start pushes the operator, rollout and trainer images to the registry (scripts/build-images --push) and its
first job pulls them (what a first run does; later runs find them).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from common import EXAMPLES, RESULTS, Bench, from_tests

cluster_bed = from_tests("bed.cluster_bed")
real_node = from_tests("bed.real_node")

NS = "bench"
SMALL = {"rolloutWorkers": {"replicas": 1, "envsPerWorker": 4,
                            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}},
         "learner": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}}}


def arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=1, help="runs of each node, alternating")
    parser.add_argument("--cold-images", action="store_true",
                        help="empty the bed registry and the real node's image store before the first run")


def job(name: str) -> dict:
    body = yaml.safe_load((EXAMPLES / "cartpole-ppo.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"].update(SMALL, stopping={"maxEnvSteps": 20_000, "maxWallClockSeconds": 600}, evaluation={"episodes": 5})
    return body


def one_run(workdir: Path) -> dict:
    t0 = time.monotonic()
    bed = cluster_bed.OneNodeCluster(workdir, namespaces=(NS,))
    with bed:
        started = time.monotonic() - t0
        t1 = time.monotonic()
        bed.kubectl("apply", "-f", "-", input=json.dumps(job("cartpole")))
        bed.cluster.wait_for("rltj", "cartpole", lambda j: (j.get("status") or {}).get("phase") in ("Succeeded",
                                                                                                 "Failed"),
                             namespace=NS, timeout=600, interval=0.2)
        to_succeeded = time.monotonic() - t1
        status = bed.cluster.get("rltj", "cartpole", NS)["status"]
        t2 = time.monotonic()
    return {"phase": status["phase"], "bed_start_seconds": round(started, 1),
            "apply_to_succeeded_seconds": round(to_succeeded, 1),
            "time_to_first_step_seconds": status.get("timeToFirstStepSeconds"),
            "env_steps": status["progress"]["envSteps"], "bed_stop_seconds": round(time.monotonic() - t2, 1),
            "timings": {k: round(v, 1) for k, v in bed.timings.items()}}


def main() -> None:
    bench = Bench(__doc__, RESULTS / "real_node_bed.json", arguments)
    cluster_bed.ensure_images()
    if bench.args.cold_images:
        shutil.rmtree(real_node.IMAGE_STORE / "containerd", ignore_errors=True)
        shutil.rmtree(cluster_bed.REGISTRY_STORE, ignore_errors=True)
    runs = []
    for repeat in range(bench.args.repeats):
        with tempfile.TemporaryDirectory(prefix="kuberl-node-bench-", dir="/var/tmp") as tmp:
            run = one_run(Path(tmp))
        run["repeat"] = repeat
        runs.append(run)
        print(json.dumps(run), flush=True)

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in runs if r[key] is not None), 1)

    keys = ("bed_start_seconds", "apply_to_succeeded_seconds", "time_to_first_step_seconds", "bed_stop_seconds")
    medians = {key: median(key) for key in keys}
    store = real_node.IMAGE_STORE / "containerd"
    store_gb = round(sum(f.stat().st_size for f in store.rglob("*") if f.is_file() and not f.is_symlink()) / 1e9, 1)
    result = {
        "image_store_gb": store_gb,
        "command": "python bench/bench_real_node.py --repeats {}{}".format(
            bench.args.repeats, " --cold-images" if bench.args.cold_images else ""),
        "runs": runs, "medians": medians,
        "notes": [
            "one job at a time on an otherwise idle bed; after --cold-images the real node's first start includes "
            "pushing the three images to the bed registry (timings.push_seconds) and its first job pulls them",
            "CartPole PPO, 20,000 env steps, one rollout worker with 4 envs",
            "image_store_gb: containerd's store of the operator, rollout and trainer images (the layers as "
            "pulled, and unpacked), the bytes of its files",
        ],
    }
    bench.write(result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

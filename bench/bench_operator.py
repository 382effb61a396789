"""Operator latency and memory on the API emulator: job created -> all k+2 pods created.

Runs the real `kuberl-operator` command (its own process, default intervals) against the test
suite's emulated API server (in this process), watches pods with the `kubernetes` client, and
measures:
  1. for k = 1, 4, 12 rollout workers: time from a job's create request to the moment its last
     pod (head, learner, k workers) exists, over --jobs jobs created one after another;
  2. --burst jobs created at once (k = --burst-workers): time until every one has all its pods;
  3. the operator process's RSS after that (VmRSS; VmHWM is the peak).
Phase 2 runs a fresh operator process, after phase 1's jobs are deleted.

    .venv/bin/python bench/bench_operator.py [--jobs 15] [--burst 50] [--burst-workers 4] \
        [--output bench/results/operator.json]

The emulator shares the machine's cores with the operator: its HTTP handling is part of every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kmock
import kubernetes
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from k8s_emulator import ALL_VERBS, EmulatedCluster, KubernetesApiEmulator, load_crds

NS = "bench"
NETWORK_POLICIES = kmock.resource("networking.k8s.io", "v1", "networkpolicies")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PodClock:
    """Watches pods and remembers when each name was first seen."""

    def __init__(self, api: kubernetes.client.ApiClient):
        self.api = api
        self.seen: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        core = kubernetes.client.CoreV1Api(self.api)
        while not self.stop:
            watch = kubernetes.watch.Watch()
            for event in watch.stream(core.list_namespaced_pod, NS, timeout_seconds=5):
                now = time.perf_counter()
                obj = event["raw_object"] if "raw_object" in event else event["object"]
                name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                with self.cond:
                    self.seen.setdefault(name, now)
                    self.cond.notify_all()
                if self.stop:
                    break

    def wait_all(self, names: list[str], timeout: float = 120) -> float:
        deadline = time.perf_counter() + timeout
        with self.cond:
            while not all(n in self.seen for n in names):
                if not self.cond.wait(max(0.0, deadline - time.perf_counter())):
                    raise TimeoutError(f"pods {[n for n in names if n not in self.seen]} never appeared")
            return max(self.seen[n] for n in names)


def job(template: dict, name: str, workers: int) -> dict:
    body = copy.deepcopy(template)
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"]["rolloutWorkers"]["replicas"] = workers
    return body


def pod_names(name: str, workers: int) -> list[str]:
    return [f"{name}-head", f"{name}-learner", *(f"{name}-worker-{i}" for i in range(workers))]


def rss_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50_s": round(statistics.median(ordered), 4),
        "p90_s": round(ordered[max(0, round(0.9 * len(ordered)) - 1)], 4),
        "max_s": round(ordered[-1], 4),
        "min_s": round(ordered[0], 4),
    }


class _Operator:
    def __init__(self, process: subprocess.Popen, startup_s: float):
        self.process, self.pid, self.startup_s = process, process.pid, startup_s


@contextlib.contextmanager
def running_operator(cluster: EmulatedCluster, log_path: Path) -> Iterator[_Operator]:
    """The real `kuberl-operator` command, default settings, watching the benchmark's namespace."""
    liveness = free_port()
    script = Path(sys.executable).parent / "kuberl-operator"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kuberl.operator.main"]
    command += ["--namespace", NS, "--metrics-port", "0", "--log-format", "plain",
                "--liveness-endpoint", f"http://127.0.0.1:{liveness}/healthz"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = time.perf_counter()
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=1).read()
                    break
                except OSError:
                    if process.poll() is not None or time.perf_counter() - started > 60:
                        raise RuntimeError(f"the operator did not start: {log_path.read_text()}") from None
                    time.sleep(0.05)
            yield _Operator(process, round(time.perf_counter() - started, 3))
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=15, help="jobs per k, created one after another")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 12])
    parser.add_argument("--burst", type=int, default=50, help="jobs created at once")
    parser.add_argument("--burst-workers", type=int, default=4)
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "operator.json"))
    args = parser.parse_args()

    template = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
    emulator = KubernetesApiEmulator(
        crds=load_crds(), namespaces=["default", NS],
        extra_resources={NETWORK_POLICIES: kmock.ResourceInfo(
            kind="NetworkPolicy", singular="networkpolicy", namespaced=True, verbs=ALL_VERBS,
            shortnames={"netpol"}, categories=set(), subresources=set())})
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp, EmulatedCluster(emulator, Path(tmp), namespace=NS) as cluster:
        api = cluster.api_client()
        clock = PodClock(api)
        custom = kubernetes.client.CustomObjectsApi(api)

        def create(body: dict) -> float:
            t0 = time.perf_counter()
            custom.create_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rltrainingjobs", body,
                                                   _preload_content=False)
            return t0

        # 1. One job at a time, for each k.
        with running_operator(cluster, Path(tmp) / "operator-1.log") as operator:
            results["operator_startup_s"] = operator.startup_s
            results["operator_rss_idle_mb"] = round(rss_mb(operator.pid)["VmRSS"], 1)
            create(job(template, "warmup", 1))  # the first job: nothing measured
            clock.wait_all(pod_names("warmup", 1))
            results["sequential"] = {}
            for k in args.workers:
                latencies = []
                for i in range(args.jobs):
                    name = f"seq-k{k}-{i}"
                    t0 = create(job(template, name, k))
                    latencies.append(clock.wait_all(pod_names(name, k)) - t0)
                results["sequential"][f"k={k}"] = {"pods_per_job": k + 2, **quantiles(latencies)}
                print(f"k={k:2d}: {results['sequential'][f'k={k}']}", flush=True)
            results["operator_rss_after_sequential_mb"] = round(rss_mb(operator.pid)["VmRSS"], 1)
            results["jobs_after_sequential"] = len(cluster.list("rltj"))
            for body in cluster.list("rltj"):  # the operator lets go of its finalizers; pods are collected
                custom.delete_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rltrainingjobs",
                                                       body["metadata"]["name"], _preload_content=False)
            deadline = time.perf_counter() + 120
            while cluster.list("rltj") or cluster.list("pods"):
                if time.perf_counter() > deadline:
                    raise TimeoutError("the benchmark's jobs were not deleted")
                time.sleep(0.2)

        # 2. A fresh operator; --burst jobs created at once.
        with running_operator(cluster, Path(tmp) / "operator-2.log") as operator:
            names = [f"burst-{i}" for i in range(args.burst)]
            bodies = [job(template, n, args.burst_workers) for n in names]
            starts: dict[str, float] = {}
            threads = [threading.Thread(target=lambda b=b: starts.__setitem__(b["metadata"]["name"], create(b)))
                       for b in bodies]
            t_burst = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            created = time.perf_counter() - t_burst
            done = clock.wait_all([p for n in names for p in pod_names(n, args.burst_workers)], timeout=300)
            per_job = [clock.wait_all(pod_names(n, args.burst_workers)) - starts[n] for n in names]
            results["burst"] = {
                "jobs": args.burst, "workers_per_job": args.burst_workers,
                "pods": args.burst * (args.burst_workers + 2),
                "create_requests_s": round(created, 3),
                "all_pods_created_s": round(done - t_burst, 3),
                "per_job": quantiles(per_job),
            }
            print(f"burst: {results['burst']}", flush=True)
            time.sleep(2)  # let the status writes settle
            memory = rss_mb(operator.pid)
            results["operator_rss_after_burst_mb"] = round(memory["VmRSS"], 1)
            results["operator_rss_peak_mb"] = round(memory["VmHWM"], 1)
            results["jobs_in_cluster"] = len(cluster.list("rltj"))
            results["pods_in_cluster"] = len(cluster.list("pods"))
            print(f"operator RSS after the burst: {memory}", flush=True)
        clock.stop = True
    results["targets"] = {"k=12 p50 <= 0.5 s": results["sequential"].get("k=12", {}).get("p50_s", 1e9) <= 0.5,
                          "RSS <= 150 MB": results["operator_rss_after_burst_mb"] <= 150}
    results["command"] = " ".join(["python bench/bench_operator.py", *sys.argv[1:]])
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform(),
                          "note": "emulator (this process) and operator (subprocess) share the machine's cores"}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Operator latency and memory on a real API server: job created -> all k+2 pods created.

Runs the real `kuberl-operator` command (its own process, default intervals, the chart's ServiceAccount
token) against the tests' real control plane (tests/bed/real_cluster.py, reached through
common.from_tests: etcd, kube-apiserver, controller manager, scheduler, a node whose pods nothing
runs), watches pods with the `kubernetes` client, and measures:
  1. for k = 1, 4, 12 rollout workers: time from a job's create request to the moment its last
     pod (head, learner, k workers) exists, over --jobs jobs created one after another;
  2. --burst jobs created at once (k = --burst-workers): time until every one has all its pods;
  3. the operator process's RSS after that (VmRSS; VmHWM is the peak).
Phase 2 runs a fresh operator process, after phase 1's jobs are deleted.

    .venv/bin/python bench/bench_operator.py [--jobs 15] [--burst 50] [--burst-workers 4] \
        [--output bench/results/operator.json]

The control plane shares the machine's cores with the operator: its work (admission, etcd, the scheduler
binding every pod) is part of every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
from common import RESULTS, Bench, example_job, free_port, from_tests

NS = "bench"


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
def running_operator(cluster, log_path: Path, metrics_port: int = 0) -> Iterator[_Operator]:
    """The real `kuberl-operator` command, default settings, watching the benchmark's namespace of
    `cluster` (a real_cluster.ClusterNamespace) with the chart's ServiceAccount token; its own /metrics on
    `metrics_port` (0: off)."""
    liveness = free_port()
    script = Path(sys.executable).parent / "kuberl-operator"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kuberl.operator.main"]
    command += ["--namespace", NS, "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
                "--log-format", "plain",
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


class _Bench:
    """The cluster's namespace, the pod clock and the job template the two phases share."""

    def __init__(self, cluster, work: Path):
        self.cluster, self.work = cluster, work
        # The benchmark itself acts as a user with admin rights in the namespace.
        api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.clock = PodClock(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.template = example_job("cartpole-ppo")

    def create(self, name: str, workers: int) -> float:
        """Creates a job; returns when its create request went out."""
        t0 = time.perf_counter()
        self.custom.create_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rltrainingjobs",
                                                    job(self.template, name, workers), _preload_content=False)
        return t0

    def delete_all(self) -> None:
        """The operator lets go of its finalizers; the jobs' pods are collected."""
        for body in self.cluster.list("rltj"):
            self.custom.delete_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rltrainingjobs",
                                                        body["metadata"]["name"], _preload_content=False)
        deadline = time.perf_counter() + 120
        while self.cluster.list("rltj") or self.cluster.list("pods"):
            if time.perf_counter() > deadline:
                raise TimeoutError("the benchmark's jobs were not deleted")
            time.sleep(0.2)


def one_at_a_time(bench: _Bench, workers: list[int], jobs: int) -> dict:
    """Phase 1: for each k, `jobs` jobs created one after another, each timed to its last pod."""
    results: dict = {}
    with running_operator(bench.cluster, bench.work / "operator-1.log") as operator:
        results["operator_startup_s"] = operator.startup_s
        results["operator_rss_idle_mb"] = round(rss_mb(operator.pid)["VmRSS"], 1)
        bench.create("warmup", 1)  # the first job: nothing measured
        bench.clock.wait_all(pod_names("warmup", 1))
        results["sequential"] = {}
        for k in workers:
            latencies = []
            for i in range(jobs):
                name = f"seq-k{k}-{i}"
                t0 = bench.create(name, k)
                latencies.append(bench.clock.wait_all(pod_names(name, k)) - t0)
            results["sequential"][f"k={k}"] = {"pods_per_job": k + 2, **quantiles(latencies)}
            print(f"k={k:2d}: {results['sequential'][f'k={k}']}", flush=True)
        results["operator_rss_after_sequential_mb"] = round(rss_mb(operator.pid)["VmRSS"], 1)
        results["jobs_after_sequential"] = len(bench.cluster.list("rltj"))
        bench.delete_all()
    return results


def burst(bench: _Bench, jobs: int, workers: int) -> dict:
    """Phase 2: a fresh operator; `jobs` jobs created at once, timed until every one has its pods."""
    results: dict = {}
    with running_operator(bench.cluster, bench.work / "operator-2.log") as operator:
        names = [f"burst-{i}" for i in range(jobs)]
        starts: dict[str, float] = {}
        threads = [threading.Thread(target=lambda n=n: starts.__setitem__(n, bench.create(n, workers)))
                   for n in names]
        t_burst = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        created = time.perf_counter() - t_burst
        done = bench.clock.wait_all([p for n in names for p in pod_names(n, workers)], timeout=300)
        per_job = [bench.clock.wait_all(pod_names(n, workers)) - starts[n] for n in names]
        results["burst"] = {
            "jobs": jobs, "workers_per_job": workers, "pods": jobs * (workers + 2),
            "create_requests_s": round(created, 3),
            "all_pods_created_s": round(done - t_burst, 3),
            "per_job": quantiles(per_job),
        }
        print(f"burst: {results['burst']}", flush=True)
        time.sleep(2)  # let the status writes settle
        memory = rss_mb(operator.pid)
        results["operator_rss_after_burst_mb"] = round(memory["VmRSS"], 1)
        results["operator_rss_peak_mb"] = round(memory["VmHWM"], 1)
        results["jobs_in_cluster"] = len(bench.cluster.list("rltj"))
        results["pods_in_cluster"] = len(bench.cluster.list("pods"))
        print(f"operator RSS after the burst: {memory}", flush=True)
    return results


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=15, help="jobs per k, created one after another")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 12])
    parser.add_argument("--burst", type=int, default=50, help="jobs created at once")
    parser.add_argument("--burst-workers", type=int, default=4)


@contextlib.contextmanager
def real_cluster() -> Iterator[tuple[Any, str]]:
    """The tests' control plane (CRD, the chart's RBAC, a node), the benchmark's namespace on it, and a
    scratch dir."""
    clusters = from_tests("bed.real_cluster")
    with (tempfile.TemporaryDirectory() as tmp,
          clusters.cluster_session(Path(tmp) / "control-plane") as session):
        namespace = clusters.ClusterNamespace(session, NS, Path(tmp))
        namespace.create_namespace()
        yield namespace, tmp


def main() -> int:
    bench = Bench(__doc__, RESULTS / "operator.json", arguments)
    args = bench.args
    with real_cluster() as (cluster, tmp):
        bed = _Bench(cluster, Path(tmp))
        results = one_at_a_time(bed, args.workers, args.jobs)
        results.update(burst(bed, args.burst, args.burst_workers))
        bed.clock.stop = True
    results["targets"] = {"k=12 p50 <= 0.5 s": results["sequential"].get("k=12", {}).get("p50_s", 1e9) <= 0.5,
                          "RSS <= 150 MB": results["operator_rss_after_burst_mb"] <= 150}
    results["machine_notes"] = {"note": "the control plane (etcd, kube-apiserver, controller manager, scheduler) and "
                                        "the operator (subprocess) share the machine's cores"}
    bench.write(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

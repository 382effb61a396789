"""Operator scale on a real control plane with kwok nodes: jobs applied at once -> all pods created and the job
Running, the operator's API requests per job, its memory.

Starts the control plane the tests use (tests/bed/control_plane.py: etcd, kube-apiserver with RBAC, Pod
Security and an audit log, controller manager, scheduler; built by scripts/build-control-plane), kwok
(scripts/build-kwok) managing --nodes fake nodes on which the scheduler places the pods and kwok reports
them Running with no container, and the real `kuberl-operator` command, cluster-wide, with a token of the
chart's ServiceAccount. Then it creates --jobs jobs of --workers rollout workers each, one request after
another as fast as the server takes them, and measures, per job:
  1. create request -> every one of its pods exists (p50, p99, max), from a watch on pods;
  2. create request -> status.phase Running (every pod Running and ready), from a watch on the jobs;
  3. the operator's requests to the API server, from the audit log, per job and by verb;
  4. the operator process's resident memory (VmHWM, its peak).
The results also carry `emulator_burst_for_comparison`, copied from bench/results/operator.json: figures
measured against an in-process API emulator, not a real API server, so they do not compare with this
script's own.

    ./scripts/build-kwok
    .venv/bin/python bench/bench_operator_scale.py [--jobs 200] [--workers 2] [--nodes 20] [--api-threads 4]

Everything shares the machine's cores: the API server, etcd, the scheduler, kwok and the operator.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import RESULTS, REPO, Bench, example_job, free_port, from_tests

NS = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": round(statistics.median(values), 3), "p99_s": round(percentile(values, 0.99), 3),
            "max_s": round(max(values), 3), "min_s": round(min(values), 3)}


class FirstSeen:
    """Watches one resource in the namespace and remembers when each object first met a condition."""

    def __init__(self, rest: Any, resource: str, ready: Any):
        self.rest, self.resource, self.ready = rest, resource, ready
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        url = self.rest.url(self.resource, NS)
        version = ""
        while not self.stop.is_set():
            if not version:
                listed = self.rest.call("GET", url)
                version = listed["metadata"]["resourceVersion"]
                for obj in listed["items"]:
                    self._note(obj)
            params = {"watch": "1", "resourceVersion": version, "timeoutSeconds": "5", "allowWatchBookmarks": "true"}
            with self.rest.session.get(url, params=params, stream=True, timeout=30) as stream:
                for line in stream.iter_lines():
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._note(event["object"])

    def _note(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name not in self.seen and self.ready(obj):
            self.seen[name] = time.perf_counter()


def kwok_binary() -> Path:
    done = subprocess.run([str(REPO / "scripts" / "build-kwok")], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def fake_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def start_kwok(plane: Any, session: Any, nodes: int, work: Path) -> subprocess.Popen:
    """kwok managing `nodes` fake nodes, each created and untainted as the node-lifecycle controller would."""
    log = open(work / "kwok.log", "wb")  # noqa: SIM115 (the process keeps it)
    binary = kwok_binary()
    kwok = subprocess.Popen([str(binary), f"--kubeconfig={plane.admin_kubeconfig}",
                             f"--config={binary.parent / 'stages-fast.yaml'}",
                             "--manage-all-nodes=false",
                             "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                             "--cidr=10.244.0.0/16", "--node-ip=10.244.0.1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    admin = session.admin
    for i in range(nodes):
        admin.call("POST", admin.url("nodes", None), body=fake_node(f"kwok-node-{i}"))
        session.untaint(f"kwok-node-{i}")
    return kwok


def versions() -> dict[str, str]:
    """What ran, as the build scripts pin it."""
    pinned = from_tests("bed.common").pinned
    return {"kubernetes": f"{pinned('build-control-plane', 'K8S_VERSION')} (built from source)",
            "kwok": pinned("build-kwok", "KWOK_VERSION")}


def rss_mb(pid: int) -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: round(int(fields[key].split()[0]) / 1024, 1) for key in ("VmRSS", "VmHWM")}


def run(args: Any, work: Path) -> dict[str, Any]:
    real_cluster = from_tests("bed.real_cluster")
    control_plane = from_tests("bed.control_plane")
    started = time.perf_counter()
    plane = control_plane.ControlPlane(work / "control-plane").start()
    kwok = operator = None
    try:
        session = real_cluster.ClusterSession(plane).set_up(node=False)
        control_plane_s = time.perf_counter() - started
        admin = session.admin
        kwok = start_kwok(plane, session, args.nodes, work)
        admin.call("POST", admin.url("namespaces", None), body={"metadata": {
            "name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        wait(lambda: admin.call("GET", admin.url("serviceaccounts", NS, "default")), 60, "the default ServiceAccount")

        env = {**os.environ, "KUBECONFIG": str(session.operator_kubeconfig)}
        liveness = free_port()
        operator = subprocess.Popen(
            [str(Path(sys.executable).parent / "kuberl-operator"), "--metrics-port", str(free_port()),
             "--metrics-address", "127.0.0.1", "--liveness-endpoint", f"http://127.0.0.1:{liveness}/healthz",
             "--log-format", "plain", "--api-threads", str(args.api_threads)],
            env=env, stdout=open(work / "operator.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
        http_ok = from_tests("bed.common").http_ok
        wait(lambda: http_ok(f"http://127.0.0.1:{liveness}/healthz"), 60, "the operator's liveness endpoint")
        idle = rss_mb(operator.pid)

        pods = FirstSeen(admin, "pods", lambda pod: True)
        running = FirstSeen(admin, "rltrainingjobs", lambda job: (job.get("status") or {}).get("phase") == "Running")
        audit_from = plane.audit_offset()
        job = example_job("cartpole-ppo")
        job["spec"]["rolloutWorkers"]["replicas"] = args.workers
        created: dict[str, float] = {}
        burst = time.perf_counter()
        for i in range(args.jobs):
            body = copy.deepcopy(job)
            body["metadata"] = {"name": f"job-{i:03d}", "namespace": NS}
            created[body["metadata"]["name"]] = time.perf_counter()
            admin.call("POST", admin.url("rltrainingjobs", NS), body=body)
        create_requests_s = time.perf_counter() - burst
        per_job = args.workers + 2
        wait(lambda: len(pods.seen) >= args.jobs * per_job, args.timeout, f"{args.jobs * per_job} pods")
        all_pods_s = time.perf_counter() - burst
        wait(lambda: len(running.seen) >= args.jobs, args.timeout, f"{args.jobs} jobs Running")
        all_running_s = time.perf_counter() - burst
        memory = rss_mb(operator.pid)

        to_pods = [max(pods.seen[p] for p in pods.seen if p.startswith(f"{name}-")) - t
                   for name, t in created.items()]
        to_running = [running.seen[name] - t for name, t in created.items()]
        requests = [e for e in plane.audit_events(audit_from)
                    if e["user"]["username"] == session.operator_account and e.get("objectRef")
                    and e["stage"] == "ResponseComplete"]
        verbs = Counter(f"{e['verb']} {e['objectRef']['resource']}"
                        + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else "")
                        + (" (dry run)" if "dryRun=" in e["requestURI"] else "") for e in requests)
        pods.stop.set()
        running.stop.set()
        return {
            **versions(),
            "jobs": args.jobs, "workers_per_job": args.workers, "pods": args.jobs * per_job, "nodes": args.nodes,
            "operator_api_threads": args.api_threads,
            "control_plane_start_s": round(control_plane_s, 2),
            "create_requests_s": round(create_requests_s, 3),
            "all_pods_created_s": round(all_pods_s, 3), "all_jobs_running_s": round(all_running_s, 3),
            "apply_to_all_pods_created": summary(to_pods), "apply_to_running": summary(to_running),
            "operator_requests": len(requests), "operator_requests_per_job": round(len(requests) / args.jobs, 1),
            "operator_requests_by_verb_per_job": {k: round(v / args.jobs, 2) for k, v in sorted(verbs.items())},
            "operator_rss_idle_mb": idle["VmRSS"], "operator_rss_after_mb": memory["VmRSS"],
            "operator_rss_peak_mb": memory["VmHWM"],
        }
    finally:
        for process in (operator, kwok):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(20)
        plane.stop()


def wait(check: Any, timeout: float, what: str) -> None:
    print(f"bench_operator_scale: waiting for {what}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in {timeout} s")
        time.sleep(0.1)


def main() -> None:
    def arguments(parser: Any) -> None:
        parser.add_argument("--jobs", type=int, default=200)
        parser.add_argument("--workers", type=int, default=2, help="rollout workers per job")
        parser.add_argument("--nodes", type=int, default=20, help="kwok nodes (128 CPUs, 1 TiB, 110 pods each)")
        parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for every pod, every job")
        parser.add_argument("--api-threads", type=int, default=4, help="the operator's --api-threads (its default: 4)")

    bench = Bench(__doc__, RESULTS / "operator_scale.json", arguments)
    with tempfile.TemporaryDirectory(prefix="kuberl-scale-") as tmp:
        results = run(bench.args, Path(tmp))
    emulator = json.loads((RESULTS / "operator.json").read_text())["results"]["burst"]
    results["emulator_burst_for_comparison"] = {
        "source": "bench/results/operator.json", "jobs": emulator["jobs"], "workers_per_job": emulator["workers_per_job"],
        "apply_to_all_pods_created_p50_s": emulator["per_job"]["p50_s"], "all_pods_created_s": emulator["all_pods_created_s"]}
    bench.write(results, summary={
        "jobs": results["jobs"], "pods": results["pods"],
        "apply_to_all_pods_created_p50_s": results["apply_to_all_pods_created"]["p50_s"],
        "apply_to_all_pods_created_p99_s": results["apply_to_all_pods_created"]["p99_s"],
        "apply_to_running_p50_s": results["apply_to_running"]["p50_s"],
        "operator_requests_per_job": results["operator_requests_per_job"],
        "operator_rss_peak_mb": results["operator_rss_peak_mb"]})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

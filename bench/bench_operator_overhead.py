"""The operators' own overhead, KubeRL against KubeRay, on the same workload, timed from the API server's audit log.

Both run KubeRL's trainer on `bench/overhead/job.yaml` (PPO on CartPole-v1, 8 iterations, no evaluation) with the
same Ray topology, images, threads, Ray token authentication and readiness probes (`bench/overhead/rayjob.yaml`
says how the RayJob matches what KubeRL's operator builds), on one bed (tests/bed/cluster_bed.py: the real control
plane, a real node: the kubelet with containerd, kube-proxy, CoreDNS and kube-router; every pod asking for what
its two cores fit, the same in both), KubeRay v1.6.0 beside KubeRL's operator
(tests/bed/kuberay.py, with ENABLE_PROBES_INJECTION=false so that neither gets probes the other lacks).
Runs alternate ABBA. Every mark is the audit log's stageTimestamp of a request, so what is timed is what the API
server saw each party do, not a poll:
- apply -> pods created: the job object's create to the operator's last pod create (KubeRay's submitter pod is
  created by the Job controller once KubeRay made its Job: reported apart, as apply -> submitter pod created);
- learner done -> Complete: the node's status write in which the workload's end showed (KubeRL: the learner
  container terminated; KubeRay: the submitter container, which follows the driver's log to its end) to the
  operator's status write that says Complete (KubeRL: status.phase Succeeded; KubeRay: jobDeploymentStatus
  Complete);
- Complete -> pods gone: to the node's final delete of the last Ray pod (head and workers; KubeRay's learner
  node too. KubeRL keeps its finished learner pod for its logs: not counted).
Start-up, reported apart: apply -> every Ray pod Running (KubeRay's workers first run its init container), apply ->
the head Ready (Ray up: its raylet's port answers), Ray up -> the learner's first iteration (its own log line's
time, in its container on the same clock). With each run, the operator's requests from the apply to its last pod
create, in order, with their times: where the first window goes.

    .venv/bin/python bench/bench_operator_overhead.py --repeats 10   # -> bench/results/operator_overhead_real_node.json

(bench/results/operator_overhead.json is its last run on the node agent, the podman stand-in for a kubelet it ran
on before, with the manifests' former requests: a CPU for each worker and the learner.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import re
import statistics
import subprocess
import tempfile
import time
from typing import Any

import yaml
from bench_vs_kuberay import abba, one_run
from common import BENCH, REPO, RESULTS, Bench, from_tests, load_average

JOB_FILE = BENCH / "overhead" / "job.yaml"
RAYJOB_FILE = BENCH / "overhead" / "rayjob.yaml"
NS = {"kuberl": "overhead-kuberl", "kuberay": "overhead-kuberay"}
CONFIG_MAP = "overhead-job"  # the job file, for the learner node of the RayJob
POLL = 0.5  # seconds between looks: only to know when a run is over (the marks come from the audit log)
RUN_DEADLINE = 600.0
KUBERAY_ENV = {"ENABLE_PROBES_INJECTION": "false"}
#: A trainer log line's time, e.g. `2026-11-28 18:30:48,463 INFO kuberl.trainer: iteration 1: ...` (UTC).
FIRST_ITERATION = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO kuberl\.trainer: iteration 1:", re.M)
WINDOWS = ("apply_to_pods_created", "learner_done_to_complete", "complete_to_pods_gone")
STARTUP = ("apply_to_pods_running", "apply_to_ray_up", "ray_up_to_first_iteration", "apply_to_first_iteration")


def stamp(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()


def ok(event: dict[str, Any]) -> bool:
    return 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300


def dry(event: dict[str, Any]) -> bool:
    return "dryRun=" in event["requestURI"]


def ref(event: dict[str, Any]) -> tuple[str, str, str]:
    r = event.get("objectRef") or {}
    return r.get("resource", ""), r.get("subresource", ""), r.get("name", "")


class Audit:
    """One run's audit events in its namespace, and the marks read from them (unix seconds)."""

    def __init__(self, events: list[dict[str, Any]], namespace: str):
        done = [e for e in events if (e.get("objectRef") or {}).get("namespace") == namespace and ok(e)
                and e["stage"] == "ResponseComplete"]
        self.dry_runs = [e for e in done if dry(e)]
        self.events = [e for e in done if not dry(e)]

    def first(self, predicate) -> float | None:
        return min((stamp(e) for e in self.events if predicate(e)), default=None)

    def last(self, predicate) -> float | None:
        return max((stamp(e) for e in self.events if predicate(e)), default=None)

    def created(self, resource: str, name: str) -> float | None:
        return self.first(lambda e: e["verb"] == "create" and ref(e) == (resource, "", name))

    def pod_creates(self, user: str) -> list[float]:
        return sorted(stamp(e) for e in self.events
                      if e["verb"] == "create" and ref(e)[:2] == ("pods", "") and e["user"]["username"] == user)

    def requests_until(self, user: str, start: float | None, end: float | None) -> list[str]:
        """`user`'s requests from `start` to `end`, in order: "+seconds verb resource[/subresource]"."""
        if start is None or end is None:
            return []
        return [f"+{stamp(e) - start:.3f} {e['verb']} {ref(e)[0]}" + (f"/{ref(e)[1]}" if ref(e)[1] else "")
                + (" (dry run)" if dry(e) else "") for e in sorted(self.events + self.dry_runs, key=stamp)
                if e["user"]["username"] == user and start <= stamp(e) <= end]

    def pod_status(self, pod: str, predicate) -> float | None:
        """The first status write of `pod` (by its node) whose body `predicate` accepts."""
        return self.first(lambda e: ref(e) == ("pods", "status", pod) and predicate(
            ((e.get("requestObject") or {}).get("status")) or {}))

    def final_delete(self, pod: str) -> float | None:
        """The node's last word on a pod: its delete once the containers are gone."""
        return self.last(lambda e: e["verb"] == "delete" and ref(e) == ("pods", "", pod)
                         and e["user"]["username"].startswith("system:node:"))


def running(status: dict[str, Any]) -> bool:
    return status.get("phase") == "Running"


def ready(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def container_ended(name: str):
    def ended(status: dict[str, Any]) -> bool:
        return any(c.get("name") == name and "terminated" in (c.get("state") or {})
                   for c in status.get("containerStatuses") or [])
    return ended


def first_iteration(log: str) -> float | None:
    found = FIRST_ITERATION.search(log)
    if found is None:
        return None
    when = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
    return when.timestamp() + int(found.group(2)) / 1000


def windows(marks: dict[str, float | None]) -> dict[str, float | None]:
    """Seconds between the marks (None where either is missing)."""
    def between(a: str, b: str) -> float | None:
        return None if marks.get(a) is None or marks.get(b) is None else round(marks[b] - marks[a], 3)
    return {
        "apply_to_pods_created": between("apply", "pods_created"),
        "learner_done_to_complete": between("learner_done", "complete"),
        "complete_to_pods_gone": between("complete", "pods_gone"),
        "apply_to_first_pod_created": between("apply", "first_pod_created"),
        "apply_to_submitter_created": between("apply", "submitter_created"),
        "apply_to_pods_running": between("apply", "pods_running"),
        "apply_to_ray_up": between("apply", "ray_up"),
        "ray_up_to_first_iteration": between("ray_up", "first_iteration"),
        "apply_to_first_iteration": between("apply", "first_iteration"),
        "apply_to_complete": between("apply", "complete"),
    }


# ---- one run of each ------------------------------------------------------------------------------------


def wait_over(bed, look, name: str) -> None:
    """Until `look()` says the job is over (Complete, or failed: raised) and its Ray pods are gone."""
    t0 = time.monotonic()
    while not look():
        if time.monotonic() - t0 > RUN_DEADLINE:
            raise RuntimeError(f"{name}: not over within {RUN_DEADLINE:.0f} s")
        time.sleep(POLL)


def kuberl_run(bed, index: int, user: str) -> dict[str, Any]:
    ns, name = NS["kuberl"], f"overhead-{index}"
    job = yaml.safe_load(JOB_FILE.read_text())
    job["metadata"] = {"name": name}
    offset, load = bed.plane.audit_offset(), load_average()
    bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))
    ray_pods = [f"{name}-head", f"{name}-worker-0", f"{name}-worker-1"]

    def look() -> bool:
        status = (bed.cluster.get("rltj", name, ns) or {}).get("status") or {}
        if status.get("phase") == "Failed":
            raise RuntimeError(f"{name} failed: {json.dumps(status)[:2000]}")
        pods = [p for p in bed.cluster.list("pods", ns) if p["metadata"]["name"] in ray_pods]
        return status.get("phase") == "Succeeded" and not pods

    wait_over(bed, look, name)
    audit = Audit(list(bed.plane.audit_events(offset)), ns)
    learner = f"{name}-learner"
    creates = audit.pod_creates(user)
    all_pods = [*ray_pods, learner]
    marks = {
        "apply": audit.created("rltrainingjobs", name),
        "first_pod_created": creates[0] if creates else None,
        "pods_created": creates[len(all_pods) - 1] if len(creates) >= len(all_pods) else None,
        "pods_running": _latest(audit.pod_status(p, running) for p in all_pods),
        "ray_up": audit.pod_status(f"{name}-head", ready),
        "learner_done": audit.pod_status(learner, container_ended("learner")),
        "complete": audit.first(lambda e: ref(e)[:2] == ("rltrainingjobs", "status")
                                and ((e.get("responseObject") or {}).get("status") or {}).get("phase") == "Succeeded"),
        "pods_gone": _latest(audit.final_delete(p) for p in ray_pods),
        "first_iteration": first_iteration(bed.kubectl("logs", "-n", ns, learner, check=False, timeout=60).stdout),
    }
    record = {"system": "kuberl", "repeat": index, "loadavg_before": load, "pods_created": len(creates),
              "windows": windows(marks), "marks_unix": marks,
              "requests_to_pods_created": audit.requests_until(user, marks["apply"], marks["pods_created"])}
    bed.kubectl("delete", "rltj", name, "-n", ns, "--wait=true", "--timeout=300s", timeout=330)
    _wait_no_pods(bed, ns)
    return record


def kuberay_run(bed, index: int, kuberay) -> dict[str, Any]:
    ns, name = NS["kuberay"], f"overhead-{index}"
    job = yaml.safe_load(RAYJOB_FILE.read_text())
    job["metadata"] = {"name": name}
    ray = from_tests("bed.kuberay")
    offset, load = bed.plane.audit_offset(), load_average()
    bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))

    def look() -> bool:
        status = (ray.ray_object(bed.cluster, "rayjobs", ns, name) or {}).get("status") or {}
        if status.get("jobDeploymentStatus") == "Failed":
            driver = bed.kubectl("logs", "-n", ns, f"job/{name}", check=False, timeout=60)
            raise RuntimeError(f"{name} failed: {json.dumps(status)[:2000]}\nthe driver's log, through the "
                               f"submitter: {(driver.stdout + driver.stderr)[-4000:]}")
        # Gone, not only ended: a real kubelet writes a killed Ray container's Failed phase before its final
        # delete, which is the mark taken.
        ray_pods = [p for p in bed.cluster.list("pods", ns)
                    if (p["metadata"].get("labels") or {}).get("ray.io/node-type")]
        return status.get("jobDeploymentStatus") == "Complete" and not ray_pods

    wait_over(bed, look, name)
    events = list(bed.plane.audit_events(offset))
    audit = Audit(events, ns)
    # KubeRay names its pods by generateName, so a create's audit event has no name: the pods are those the
    # node wrote a status for, the Ray nodes (`<cluster>-head-*`, `<cluster>-<group>-worker-*`) and the
    # submitter (the Job's pod).
    seen = sorted({ref(e)[2] for e in audit.events if ref(e)[:2] == ("pods", "status")})
    ray_pods = [p for p in seen if "-head-" in p or "-worker-" in p]
    submitter = next((p for p in seen if p not in ray_pods), "")
    creates = audit.pod_creates(kuberay.username)
    head = next((p for p in ray_pods if "-head" in p), "")
    log = bed.kubectl("logs", "-n", ns, f"job/{name}", check=False, timeout=60).stdout
    marks = {
        "apply": audit.created("rayjobs", name),
        "first_pod_created": creates[0] if creates else None,
        "pods_created": creates[-1] if creates else None,
        "submitter_created": _submitter_created(audit, kuberay.username),
        "pods_running": _latest(audit.pod_status(p, running) for p in ray_pods),
        "ray_up": audit.pod_status(head, ready),
        "learner_done": audit.pod_status(submitter, container_ended("ray-job-submitter")) if submitter else None,
        "complete": audit.first(lambda e: ref(e)[:2] == ("rayjobs", "status") and (
            (e.get("requestObject") or {}).get("status") or {}).get("jobDeploymentStatus") == "Complete"),
        "pods_gone": _latest(audit.final_delete(p) for p in ray_pods),
        "first_iteration": first_iteration(log),
    }
    record = {"system": "kuberay", "repeat": index, "loadavg_before": load, "pods_created": len(creates),
              "ray_pods": ray_pods, "submitter_pod": submitter, "windows": windows(marks), "marks_unix": marks,
              "requests_to_pods_created": audit.requests_until(kuberay.username, marks["apply"], marks["pods_created"])}
    if marks["first_iteration"] is None:
        record["driver_log_tail"] = log[-2000:]
    bed.kubectl("delete", "rayjob", name, "-n", ns, "--wait=true", "--timeout=300s", timeout=330)
    _wait_no_pods(bed, ns)
    return record


def _submitter_created(audit: Audit, operator_user: str) -> float | None:
    """The submitter pod's create: the one pod create that is not KubeRay's (the Job controller's)."""
    return audit.first(lambda e: e["verb"] == "create" and ref(e)[:2] == ("pods", "")
                       and e["user"]["username"] != operator_user)


def _latest(values) -> float | None:
    values = list(values)
    return None if not values or any(v is None for v in values) else max(values)


def _wait_no_pods(bed, ns: str) -> None:
    t0 = time.monotonic()
    while bed.cluster.list("pods", ns):
        if time.monotonic() - t0 > 300:
            raise RuntimeError(f"pods left in {ns} 300 s after the job was deleted")
        time.sleep(POLL)


# ---- the result ----------------------------------------------------------------------------------------


def spread(values: list[float]) -> float | None:
    return round(max(values) / min(values), 2) if values and min(values) > 0 else None


def summarize(runs: dict[str, list[dict]], failures: list[dict], bed_timings: dict) -> dict[str, Any]:
    keys = [*WINDOWS, *STARTUP, "apply_to_first_pod_created", "apply_to_submitter_created", "apply_to_complete"]
    medians: dict[str, dict[str, Any]] = {}
    for system, rs in runs.items():
        medians[system] = {"runs": len(rs)}
        for key in keys:
            values = [r["windows"][key] for r in rs if r["windows"].get(key) is not None]
            if values:
                medians[system][key] = {"median": round(statistics.median(values), 3), "min": min(values),
                                        "max": max(values), "spread_max_over_min": spread(values), "n": len(values)}
    ratios = {key: round(medians["kuberl"][key]["median"] / medians["kuberay"][key]["median"], 3)
              for key in keys if key in medians.get("kuberl", {}) and key in medians.get("kuberay", {})
              and medians["kuberay"][key]["median"]}
    return {
        "files": {"job": str(JOB_FILE.relative_to(REPO)), "rayjob": str(RAYJOB_FILE.relative_to(REPO))},
        "versions": {"kuberay": from_tests("bed.kuberay").VERSION, "ray": "2.60.0"},
        "kuberay_env": KUBERAY_ENV,
        "windows": {"operator": list(WINDOWS), "start_up": list(STARTUP)},
        "medians": medians, "ratios_kuberl_over_kuberay": ratios,
        "bed_start_seconds": bed_timings, "runs": runs, "failures": failures,
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10, help="runs of each, alternating (default 10)")
    parser.add_argument("--keep-going", action="store_true", help="record a failed run and go on")


def ensure_built() -> None:
    from_tests("bed.cluster_bed").ensure_images()
    done = subprocess.run([str(REPO / "scripts" / "build-kuberay")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"scripts/build-kuberay failed ({done.returncode}):\n{done.stderr[-3000:]}")


def show(record: dict[str, Any]) -> str:
    w = record["windows"]
    parts = [f"{k} {w[k]}" for k in (*WINDOWS, *STARTUP) if w.get(k) is not None]
    return f"{record['system']} run {record['repeat']}: " + ", ".join(parts)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "operator_overhead_real_node.json", arguments)
    args = bench.args
    ensure_built()
    cluster_bed, kuberay_bed = from_tests("bed.cluster_bed"), from_tests("bed.kuberay")
    runs: dict[str, list[dict]] = {"kuberl": [], "kuberay": []}
    failures: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kuberl-overhead-") as tmp:
        work = pathlib.Path(tmp)
        with (cluster_bed.OneNodeCluster(work / "bed", namespaces=tuple(NS.values())) as bed,
              kuberay_bed.KubeRay(bed.plane, bed.cluster, work / "kuberay", env=KUBERAY_ENV) as kuberay):
            bed.kubectl("create", "configmap", CONFIG_MAP, "-n", NS["kuberay"], f"--from-file=job.yaml={JOB_FILE}")
            account = f"system:serviceaccount:{cluster_bed.OPERATOR_NAMESPACE}:"
            kuberl_user = next(e["user"]["username"] for e in bed.plane.audit_events(0)
                               if e["user"]["username"].startswith(account))

            def run(system: str, i: int) -> dict:
                return kuberl_run(bed, i, kuberl_user) if system == "kuberl" else kuberay_run(bed, i, kuberay)

            for i in range(args.repeats):
                for system in abba(i):
                    r = one_run(system, i, run, args.keep_going, failures)
                    if r is None:
                        continue
                    runs[system].append(r)
                    print(show(r), flush=True)
                bench.write(summarize(runs, failures, bed.timings))  # every repeat: an interrupted run keeps it
            bed_timings = bed.timings
    results = summarize(runs, failures, bed_timings)
    bench.write(results)
    print(json.dumps({"medians": {s: {k: v["median"] if isinstance(v, dict) else v for k, v in m.items()}
                                  for s, m in results["medians"].items()},
                      "ratios": results["ratios_kuberl_over_kuberay"]}, indent=1))


if __name__ == "__main__":
    main()

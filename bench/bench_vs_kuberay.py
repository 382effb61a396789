"""KubeRL against KubeRay + RLlib on the same one-node cluster, in the same run, alternating.

On the bed the end-to-end tests use (tests/bed/cluster_bed.py: the real control plane, a real node (the kubelet
with containerd, kube-proxy, CoreDNS, kube-router) pulling every image from the bed's registry, KubeRL's operator
from its chart), KubeRay's own operator
runs beside it (tests/bed/kuberay.py: built from the Go module proxy by scripts/build-kuberay, its CRDs and
ClusterRole, as a host process with its own ServiceAccount's token). Each repeat applies, in turn,
`examples/cartpole-ppo.yaml` (namespace bench-kuberl) and `bench/kuberay/rayjob-cartpole-ppo.yaml` (RLlib
PPO with the settings of RLlib's own CartPole PPO example, namespace bench-kuberay), both stopping at a
mean return of 475 over 100 episodes, each asking for what the node's two cores fit (bench_cluster.REQUESTS and
the same in the RayJob), and records for each: apply -> first env step, -> solved, ->
complete, -> every pod gone; env steps to solve and the 100-episode evaluation; objects created and API
requests (the audit log), operator CPU seconds and peak memory; pod start times. Once: image sizes, lines
of YAML, and what `kubectl get`/`describe` shows while it runs. `--local` adds, interleaved, the same
KubeRL file run by `kuberl train` on this machine (the cluster-vs-local target: at most 1.5x). `--fault`
adds one run each where a rollout worker's container is SIGKILLed mid-training.

Needs, built first: the images (./scripts/build-images), KubeRay (./scripts/build-kuberay) and the RLlib
image (bench/kuberay/build-image; needs the trainer image). The bench builds what is missing itself.

    .venv/bin/python bench/bench_vs_kuberay.py --repeats 5 --local --fault  # -> bench/results/vs_kuberay_real_node.json

(bench/results/vs_kuberay.json, vs_kuberay_loaded.json and vs_kuberay_one_command.json are its runs on the node
agent, the podman stand-in for a kubelet it ran on before, with the former requests.)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import yaml
from bench_cluster import JOB_FILE, REQUESTS, local_run, scrape
from common import BENCH, REPO, RESULTS, Bench, from_tests, load_average

RAYJOB_FILE = BENCH / "kuberay" / "rayjob-cartpole-ppo.yaml"
#: The RLlib image bench/kuberay/build-image makes, as the RayJob names it; the bench pushes it to the bed's
#: registry and names it there (`rayjob`).
RLLIB_IMAGE = "localhost/kuberl-bench/rllib-kuberay:2.60.0"
RLLIB_IMAGE_SCRIPT = BENCH / "kuberay" / "build-image"
NS = {"kuberl": "bench-kuberl", "kuberay": "bench-kuberay"}
TARGET = 475.0
POLL = 0.25  # seconds between looks at the cluster: the resolution of every mark below
RUN_DEADLINE = 900.0
FAULT_DEADLINE = 600.0  # a fault run that neither completes nor fails by then is recorded as it stands
LOG_EVERY = 1.0  # seconds between reads of the RayJob driver's log (through the submitter's pod)
PREFIX = "KUBERAY_BENCH "


def yaml_lines(path: pathlib.Path) -> int:
    """Lines a user writes: neither blank nor a comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def image_sizes() -> dict[str, Any]:
    def size(image: str) -> int:
        out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                             text=True, check=True).stdout
        return int(out.strip())

    cluster_bed = from_tests("bed.cluster_bed")
    rllib = subprocess.run([str(RLLIB_IMAGE_SCRIPT)], capture_output=True, text=True, check=True).stdout.split()[-1]
    trainer, operator = size(cluster_bed.TRAINER_IMAGE), size(cluster_bed.OPERATOR_IMAGE)
    rllib_size = size(rllib)
    binary = pathlib.Path(from_tests("bed.kuberay").kuberay_bin())
    return {"kuberl_trainer_image_mb": round(trainer / 1e6), "kuberl_operator_image_mb": round(operator / 1e6),
            "rllib_image": rllib, "rllib_image_mb": round(rllib_size / 1e6),
            "rllib_image_layers_beyond_trainer_mb": round((rllib_size - trainer) / 1e6),
            "kuberay_operator_binary_mb": round(binary.stat().st_size / 1e6),
            "note": "the RLlib image is FROM the trainer image: on a node holding both, the trainer's layers are "
                    "stored once; KubeRay's operator runs here as a host binary (its release image is not built)"}


def audit_summary(events, namespace: str, operator_user: str) -> dict[str, Any]:
    """From audit events: the requests of the operator (by verb, and by resource and subresource), and
    every object created in the job's namespace by the users the log records (the operator, the bench's
    apply, the node; the bed's audit policy leaves out the controller manager's and scheduler's own
    requests, so a Job's pod is not counted). A dry run creates nothing and is not counted as a create."""
    by_verb: dict[str, int] = {}
    by_resource: dict[str, int] = {}
    created: dict[str, int] = {}
    dry_runs = all_in_namespace = 0
    for event in events:
        ref = event.get("objectRef") or {}
        dry = "dryRun=" in event.get("requestURI", "")
        if event["user"]["username"] == operator_user:
            by_verb[event["verb"]] = by_verb.get(event["verb"], 0) + 1
            what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            by_resource[what] = by_resource.get(what, 0) + 1
            dry_runs += dry
        if ref.get("namespace") == namespace:
            all_in_namespace += 1
            code = (event.get("responseStatus") or {}).get("code", 0)
            if event["verb"] == "create" and not ref.get("subresource") and 200 <= code < 300 and not dry:
                created[ref["resource"]] = created.get(ref["resource"], 0) + 1
    return {"operator_requests": sum(by_verb.values()), "operator_requests_by_verb": by_verb,
            "operator_requests_by_resource": by_resource, "operator_dry_runs": dry_runs,
            "objects_created": sum(created.values()), "objects_created_by_resource": created,
            "requests_about_the_namespace_all_users": all_in_namespace}


class KubeRLOperator:
    """The KubeRL operator's process, for its CPU seconds and peak memory (it runs in a pod of the bed)."""

    def __init__(self, bed):
        self.bed = bed

    def usage(self) -> dict[str, float]:
        kuberay = from_tests("bed.kuberay")
        namespace = from_tests("bed.cluster_bed").OPERATOR_NAMESPACE
        pid = self.bed.node.containers.pid(container_of(self.bed, namespace, self.bed.operator_pod_name))
        return kuberay.process_usage(pid)


def kuberl_job() -> dict:
    """The KubeRL file, asking for what the node's two cores fit."""
    job = yaml.safe_load(JOB_FILE.read_text())
    for role, resources in REQUESTS.items():
        job["spec"].setdefault(role, {})["resources"] = resources
    return job


def rayjob(bed) -> dict:
    """The RayJob file, its RLlib image named in the bed's registry (where `push_rllib_image` put it)."""
    job = yaml.safe_load(RAYJOB_FILE.read_text())

    def rename(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("image") == RLLIB_IMAGE:
                node["image"], node["imagePullPolicy"] = f"{bed.registry.address}/{RLLIB_IMAGE.split('/', 1)[1]}", \
                    "IfNotPresent"
            for value in node.values():
                rename(value)
        elif isinstance(node, list):
            for value in node:
                rename(value)

    rename(job)
    return job


def push_rllib_image(bed) -> None:
    target = f"{bed.registry.address}/{RLLIB_IMAGE.split('/', 1)[1]}"
    subprocess.run(["podman", "push", "--tls-verify=false", RLLIB_IMAGE, f"docker://{target}"], check=True,
                   capture_output=True, timeout=1800)


def pod_marks(pods: list[dict], marks: dict[str, dict[str, float]], now: float) -> None:
    for pod in pods:
        name = pod["metadata"]["name"]
        mark = marks.setdefault(name, {"seen": now})
        status = pod.get("status") or {}
        if status.get("phase") == "Running":
            mark.setdefault("running", now)
        if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
            mark.setdefault("ready", now)


def live(pods: list[dict]) -> list[dict]:
    """Pods still holding their resources: not finished and not being deleted."""
    return [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def kubectl_text(bed, *args: str) -> str:
    done = bed.kubectl(*args, check=False, timeout=60)
    return (done.stdout + done.stderr)[-5000:]


def driver_events(bed, namespace: str, job: str) -> list[dict]:
    """The RayJob driver's KUBERAY_BENCH lines, from the submitter's log (`ray job logs --follow`)."""
    text = bed.kubectl("logs", "-n", namespace, f"job/{job}", check=False, timeout=60).stdout
    return [json.loads(line[len(PREFIX):]) for line in text.splitlines() if line.startswith(PREFIX)]


# ---- one run of each system ---------------------------------------------------------------------


class Run:
    """What one run of either system shares: the clock from the apply, pod marks, the audit offset and the
    operator's usage before, the text a person sees while it runs."""

    def __init__(self, bed, system: str, operator_usage, operator_user: str, capture: bool):
        self.bed, self.system, self.namespace = bed, system, NS[system]
        self.operator_usage, self.operator_user, self.capture = operator_usage, operator_user, capture
        self.marks: dict[str, float] = {}
        self.pods: dict[str, dict[str, float]] = {}
        self.text: dict[str, str] = {}
        self.loadavg_before = load_average()
        self.audit_from = bed.plane.audit_offset()
        self.usage_before = operator_usage()

    def start(self, manifest: dict) -> None:
        self.t0 = time.monotonic()
        self.unix0 = time.time()
        self.bed.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(manifest))
        self.marks["kubectl_apply_returned"] = self.now()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def look(self) -> list[dict]:
        pods = self.bed.cluster.list("pods", self.namespace)
        pod_marks(pods, self.pods, self.now())
        return pods

    def snapshot(self, when: str, kind: str, name: str) -> None:
        if self.capture:
            self.text[f"kubectl get {kind} ({when})"] = kubectl_text(self.bed, "get", kind, "-n", self.namespace)
            self.text[f"kubectl get pods ({when})"] = kubectl_text(self.bed, "get", "pods", "-n", self.namespace)
            if when == "while training":
                self.text[f"kubectl describe {kind} ({when})"] = kubectl_text(
                    self.bed, "describe", kind, name, "-n", self.namespace)

    def finish(self, kind: str, name: str, extra: dict) -> dict:
        usage = self.operator_usage()
        self.snapshot("after completion", kind, name)
        audit = audit_summary(self.bed.plane.audit_events(self.audit_from), self.namespace, self.operator_user)
        audit["audit_log_bytes"] = [self.audit_from, self.bed.plane.audit_offset()]
        t = time.monotonic()
        self.bed.kubectl("delete", kind, name, "-n", self.namespace, "--wait=true", "--timeout=300s", timeout=330)
        while self.bed.cluster.list("pods", self.namespace):
            if time.monotonic() - t > 300:
                raise RuntimeError(f"{self.system}: pods left in {self.namespace} 300 s after deleting {name}")
            time.sleep(POLL)
        starts = {pod: round(m["running"] - m["seen"], 3) for pod, m in self.pods.items() if "running" in m}
        return {
            "system": self.system,
            "loadavg_before": self.loadavg_before, "loadavg_after": load_average(),
            "marks_seconds_after_apply": {k: round(v, 3) for k, v in self.marks.items()},
            "pod_seen_to_running_seconds": starts,
            "operator_cpu_seconds": round(usage["cpu_seconds"] - self.usage_before["cpu_seconds"], 3),
            "operator_peak_rss_mb": round(usage["peak_rss_mb"], 1),
            "audit": audit,
            "delete_to_pod_objects_gone_seconds": round(time.monotonic() - t, 3),
            **extra,
            **({"what_a_person_sees": self.text} if self.text else {}),
        }


def kuberl_run(bed, index: int, operator: KubeRLOperator, operator_user: str, capture: bool) -> dict:
    job = kuberl_job()
    name = f"cartpole-{index}"
    job["metadata"] = {"name": name}
    run = Run(bed, "kuberl", operator.usage, operator_user, capture)
    run.start(job)
    marks = run.marks
    learner_ip, solved_steps, status = None, None, {}
    while True:
        now = run.now()
        pods = run.look()
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            if labels.get("kuberl.dev/component") == "learner" and (pod.get("status") or {}).get("podIP"):
                learner_ip = pod["status"]["podIP"]
        if learner_ip and "solved" not in marks:
            sample = scrape(learner_ip)
            if sample.get("kuberl_env_steps_total", 0) > 0 and "first_env_step" not in marks:
                marks["first_env_step"] = now
            if sample.get("kuberl_episode_return_mean", 0) >= TARGET:
                marks["solved"] = now
                solved_steps = int(sample["kuberl_env_steps_total"])
        if "first_env_step" in marks and "snapshot" not in marks and now - marks["first_env_step"] > 5:
            run.snapshot("while training", "rltj", name)
            marks["snapshot"] = run.now()
        body = bed.cluster.get("rltj", name, NS["kuberl"]) or {}
        status = body.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conditions.get("Complete") == "True":
            marks.setdefault("complete", now)
        if conditions.get("Failed") == "True" or now > RUN_DEADLINE:
            raise RuntimeError(f"{name} did not complete: {json.dumps(status, indent=1)}")
        if "complete" in marks and not live(pods):
            marks["pods_gone"] = now
            break
        time.sleep(POLL)
    return kuberl_derived(run.finish("rltj", name, {"env_steps_to_solve": solved_steps, "status": status}))


def kuberl_derived(record: dict) -> dict:
    """Fill in what the KubeRL run's final status says. The learner stops at the target, evaluates and exits
    within a second (evaluation 0.07 s, report 0.3 s: its summary.json), usually between two looks, so when
    no look saw the window mean at 475, `solved` is the first env step seen plus the learner's own
    training clock (status.progress.wallClockSeconds, from its first iteration to the stop), at most the
    Complete mark (the first env step is seen late when a look is slow), and the env steps to solve are
    those at the stop."""
    status = record["status"]
    progress = status.get("progress") or {}
    marks = record["marks_seconds_after_apply"]
    reached = (progress.get("meanReturn") or 0) >= TARGET
    if "solved" not in marks and "first_env_step" in marks and reached:
        marks["solved"] = round(min(marks["first_env_step"] + progress.get("wallClockSeconds", 0),
                                    marks.get("complete", float("inf"))), 3)
        record["solved_mark"] = "first env step seen + the learner's training clock, at most Complete"
    if record.get("env_steps_to_solve") is None and reached:
        record["env_steps_to_solve"] = progress.get("envSteps")
    record["env_steps_total"] = progress.get("envSteps")
    record["final_mean_return"] = progress.get("meanReturn")
    evaluation = (status.get("evaluation") or {}).get("deterministic") or {}
    record["evaluation"] = {"episodes": 100, "mean_return": evaluation.get("meanReturn")} if evaluation else None
    return record


def kuberay_run(bed, index: int, kuberay, capture: bool) -> dict:
    job = rayjob(bed)
    name = f"cartpole-ppo-{index}"
    job["metadata"] = {"name": name}
    run = Run(bed, "kuberay", kuberay.usage, kuberay.username, capture)
    ray = from_tests("bed.kuberay")
    run.start(job)
    marks = run.marks
    events: list[dict] = []
    last_log, status = -LOG_EVERY, {}
    while True:
        now = run.now()
        pods = run.look()
        body = ray.ray_object(bed.cluster, "rayjobs", NS["kuberay"], name) or {}
        status = body.get("status") or {}
        submitter_started = any(p["metadata"]["name"].startswith(f"{name}-") and "-head-" not in p["metadata"]["name"]
                                and "-worker-" not in p["metadata"]["name"] for p in pods)
        if submitter_started and "result" not in {e["event"] for e in events} and now - last_log >= LOG_EVERY:
            last_log = now
            events = driver_events(bed, NS["kuberay"], name)
            for event in events:
                key = {"built": "first_env_step", "solved": "solved", "started": "driver_started"}.get(event["event"])
                if key:
                    marks.setdefault(key, event["unix"] - run.unix0)
        if "first_env_step" in marks and "snapshot" not in marks and now - marks["first_env_step"] > 5:
            run.snapshot("while training", "rayjob", name)
            marks["snapshot"] = run.now()
        deployment = status.get("jobDeploymentStatus")
        if deployment == "Complete":
            marks.setdefault("complete", now)
        if deployment == "Failed" or now > RUN_DEADLINE:
            raise RuntimeError(f"{name} did not complete: {json.dumps(status, indent=1)}\n"
                               f"{kuberay.log.read_text()[-3000:]}")
        if "complete" in marks and not live(pods):
            marks["pods_gone"] = now
            break
        time.sleep(POLL)
    events = driver_events(bed, NS["kuberay"], name) or events
    result = next((e for e in events if e["event"] == "result"), {})
    solved = next((e for e in events if e["event"] == "solved"), {})
    return run.finish("rayjob", name, {
        "env_steps_to_solve": solved.get("env_steps"),
        "env_steps_total": result.get("env_steps"),
        "final_mean_return": result.get("window_mean"),
        "evaluation": result.get("evaluation"),
        "stop_reason": result.get("stop_reason"),
        "iterations": result.get("iterations"),
        "status": status,
        "note": "first_env_step is the driver's `built` event (env runners and learner made; the first "
                "iteration starts sampling at once), from its log; solved is its `solved` event",
    })


# ---- fault parity ------------------------------------------------------------------------------


def container_of(bed, namespace: str, pod_name: str) -> str:
    """The containerd id of the pod's first container, running now."""
    pod = bed.cluster.get("pods", pod_name, namespace)
    first = pod["spec"]["containers"][0]["name"]
    return next(c.id for c in bed.node.containers.list()
                if c.pod_uid == pod["metadata"]["uid"] and c.container == first and c.running)


def kuberl_fault(bed) -> dict:
    """SIGKILL one rollout worker's container once the learner is past 20,000 env steps."""
    job = kuberl_job()
    name = "fault-kuberl"
    job["metadata"] = {"name": name}
    ns = NS["kuberl"]
    t0 = time.monotonic()
    bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))
    learner_ip, killed, timeline = None, None, []
    worker = f"{name}-worker-0"
    while True:
        now = time.monotonic() - t0
        if learner_ip is None:
            learner = bed.cluster.get("pods", f"{name}-learner", ns) or {}
            learner_ip = (learner.get("status") or {}).get("podIP")
        sample = scrape(learner_ip) if learner_ip else {}
        steps = int(sample.get("kuberl_env_steps_total", 0))
        ready = sample.get("kuberl_rollout_workers_ready")
        if killed is None and steps >= 20_000:
            uid = bed.cluster.get("pods", worker, ns)["metadata"]["uid"]
            bed.node.containers.kill(container_of(bed, ns, worker))
            killed = {"at": now, "env_steps": steps, "uid": uid}
        if killed is not None and sample:
            timeline.append((now - killed["at"], steps, ready))
        if killed is not None and "replaced_after" not in killed:
            current = bed.cluster.get("pods", worker, ns)
            if current is not None and current["metadata"]["uid"] != killed["uid"]:
                killed["replaced_after"] = round(now - killed["at"], 2)
        status = (bed.cluster.get("rltj", name, ns) or {}).get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conditions.get("Complete") == "True" or conditions.get("Failed") == "True" or now > FAULT_DEADLINE:
            break
        time.sleep(POLL)
    after = [t for t in timeline if t[0] > 0]
    moved = next((t for t in after if t[1] > killed["env_steps"]), None)
    # The learner's workers-ready gauge still says 2 until it notices the death: count only after the new pod.
    replaced = killed.get("replaced_after")
    both = None if replaced is None else next((t for t in after if t[0] > replaced and t[2] == 2), None)
    events = kubectl_text(bed, "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
                          "-o", "custom-columns=REASON:.reason,MESSAGE:.message")
    bed.kubectl("delete", "rltj", name, "-n", ns, "--wait=true", "--timeout=300s", timeout=330)
    return {
        "system": "kuberl", "fault": "rollout worker: SIGKILL its container at >= 20,000 env steps",
        "killed_at_env_steps": killed["env_steps"],
        "seconds_until_env_steps_move": None if moved is None else round(moved[0], 2),
        "seconds_until_both_workers_in_an_iteration": None if both is None else round(both[0], 2),
        "min_env_steps_after": min((t[1] for t in after), default=None),
        "env_steps_lost": max(0, killed["env_steps"] - min((t[1] for t in after), default=killed["env_steps"])),
        "new_worker_pod_after_seconds": killed.get("replaced_after"),
        "outcome": status.get("phase"), "evaluation": status.get("evaluation"),
        "env_steps_total": (status.get("progress") or {}).get("envSteps"),
        "events": events,
    }


def kuberay_fault(bed, kuberay) -> dict:
    """SIGKILL one Ray worker pod's container once the driver is past 20,000 env steps."""
    ray = from_tests("bed.kuberay")
    job = rayjob(bed)
    name = "fault-kuberay"
    job["metadata"] = {"name": name}
    ns = NS["kuberay"]
    t0, unix0 = time.monotonic(), time.time()
    bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))
    killed, events, status, victim = None, [], {}, None
    while True:
        now = time.monotonic() - t0
        status = (ray.ray_object(bed.cluster, "rayjobs", ns, name) or {}).get("status") or {}
        if status.get("jobStatus") in ("RUNNING", "SUCCEEDED", "FAILED"):
            events = driver_events(bed, ns, name) or events
        steps = max((e.get("env_steps", 0) for e in events if e["event"] == "iteration"), default=0)
        if killed is None and steps >= 20_000:
            workers = [p for p in bed.cluster.list("pods", ns) if "-worker-" in p["metadata"]["name"]]
            victim = workers[0]
            bed.node.containers.kill(container_of(bed, ns, victim["metadata"]["name"]))
            killed = {"at": now, "unix": unix0 + now, "env_steps": steps,
                      "workers": {p["metadata"]["name"] for p in workers}}
        if killed is not None:
            pods = {p["metadata"]["name"]: p for p in bed.cluster.list("pods", ns)}
            mine = pods.get(victim["metadata"]["name"])
            restarts = sum(c.get("restartCount", 0) for c in ((mine or {}).get("status") or {}).get(
                "containerStatuses") or [])
            if restarts and "container_restarted_after" not in killed:
                killed["container_restarted_after"] = round(now - killed["at"], 2)
            if mine is None and "victim_pod_gone_after" not in killed:
                killed["victim_pod_gone_after"] = round(now - killed["at"], 2)
            new = [n for n in pods if "-worker-" in n and n not in killed["workers"]]
            if new and "new_worker_pod_after" not in killed:
                killed["new_worker_pod_after"] = round(now - killed["at"], 2)
        deployment = status.get("jobDeploymentStatus")
        if deployment in ("Complete", "Failed") or now > FAULT_DEADLINE:
            break
        time.sleep(LOG_EVERY)
    pods_after = kubectl_text(bed, "get", "pods", "-n", ns, "-o", "wide")
    victim_now = bed.cluster.get("pods", victim["metadata"]["name"], ns) if victim else None
    events = driver_events(bed, ns, name) or events
    iterations = [e for e in events if e["event"] == "iteration"]
    after = [e for e in iterations if killed and e["unix"] > killed["unix"]]
    moved = next((e for e in after if e["env_steps"] > killed["env_steps"]), None)
    both = next((e for e in after if e.get("env_runners_healthy") == 2 and e["env_steps"] > killed["env_steps"]), None)
    result = next((e for e in events if e["event"] == "result"), {})
    k8s_events = kubectl_text(bed, "get", "events", "-n", ns, "-o", "custom-columns=OBJECT:.involvedObject.name,"
                              "REASON:.reason,MESSAGE:.message")
    operator_log = [line for line in kuberay.log.read_text(errors="replace").splitlines()
                    if name in line and any(word in line.lower() for word in ("delete", "restart", "create"))]
    bed.kubectl("delete", "rayjob", name, "-n", ns, "--wait=true", "--timeout=300s", timeout=330)
    return {
        "system": "kuberay", "fault": "Ray worker pod: SIGKILL its container at >= 20,000 env steps",
        "killed_at_env_steps": None if killed is None else killed["env_steps"],
        "seconds_until_env_steps_move": None if moved is None else round(moved["unix"] - killed["unix"], 2),
        "seconds_until_both_env_runners_in_an_iteration":
            None if both is None else round(both["unix"] - killed["unix"], 2),
        "env_runners_healthy_after": [e.get("env_runners_healthy") for e in after],
        "env_steps_lost": 0 if not after else max(0, killed["env_steps"] - min(e["env_steps"] for e in after)),
        "pod_level": {k: killed.get(k) for k in ("container_restarted_after", "victim_pod_gone_after",
                                                  "new_worker_pod_after")} if killed else None,
        "victim_pod_after": None if victim_now is None else {
            "same_pod": victim_now["metadata"]["uid"] == victim["metadata"]["uid"],
            "restarts": [c.get("restartCount")
                         for c in (victim_now.get("status") or {}).get("containerStatuses") or []]},
        "outcome": status.get("jobDeploymentStatus"), "job_status": status.get("jobStatus"),
        "reason": status.get("reason"), "message": status.get("message"),
        "evaluation": result.get("evaluation"), "env_steps_total": result.get("env_steps"),
        "stop_reason": result.get("stop_reason"),
        "pods_after": pods_after, "events": k8s_events, "operator_log_lines": operator_log[-20:],
    }


# ---- the benchmark ------------------------------------------------------------------------------


def ensure_built() -> dict[str, Any]:
    """Images, KubeRay and the RLlib image; each step a no-op when it is up to date."""
    cluster_bed = from_tests("bed.cluster_bed")
    times = {"images_seconds": round(cluster_bed.ensure_images()["seconds"], 1)}
    for key, cmd in (("kuberay_seconds", [str(REPO / "scripts" / "build-kuberay")]),
                     ("rllib_image_seconds", [str(RLLIB_IMAGE_SCRIPT)])):
        t = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        times[key] = round(time.monotonic() - t, 1)
    return times


def median(runs: list[dict], *path: str) -> float | None:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(value)
    return round(statistics.median(values), 3) if values else None


def summarize(runs: dict[str, list[dict]], failures: list[dict], local_runs: list[dict], faults: list[dict],
              built: dict, sizes: dict, bed_timings: dict) -> dict[str, Any]:
    """The result: every run in full, medians and KubeRL/KubeRay ratios of the medians."""
    keys = ("first_env_step", "solved", "complete", "pods_gone")
    medians = {system: {f"apply_to_{k}": median(rs, "marks_seconds_after_apply", k) for k in keys}
               | {"env_steps_to_solve": median(rs, "env_steps_to_solve"),
                  "operator_cpu_seconds": median(rs, "operator_cpu_seconds"),
                  "operator_requests": median(rs, "audit", "operator_requests"),
                  "objects_created": median(rs, "audit", "objects_created"),
                  "operator_peak_rss_mb": max((r["operator_peak_rss_mb"] for r in rs), default=None),
                  "pod_start_seconds": round(statistics.median(
                      [v for r in rs for v in r["pod_seen_to_running_seconds"].values()]), 3) if rs else None,
                  "runs": len(rs)}
               for system, rs in runs.items()}
    ratios = {key: round(medians["kuberl"][key] / medians["kuberay"][key], 3)
              for key in medians["kuberl"] if key != "runs" and isinstance(medians["kuberl"][key], (int, float))
              and isinstance(medians["kuberay"][key], (int, float)) and medians["kuberay"][key]}
    results: dict[str, Any] = {
        "files": {"kuberl": str(JOB_FILE.relative_to(REPO)), "kuberay": str(RAYJOB_FILE.relative_to(REPO))},
        "yaml_lines_written": {"kuberl": yaml_lines(JOB_FILE), "kuberay": yaml_lines(RAYJOB_FILE)},
        "versions": {"kuberay": from_tests("bed.kuberay").VERSION, "ray": "2.60.0", "rllib_hyperparameters_source":
                     "ray-project/ray rllib/examples/algorithms/ppo/cartpole_ppo.py @ 4d5432002e1d"},
        "build_seconds": built, "images": sizes, "bed_start_seconds": bed_timings,
        "medians": medians, "ratios_kuberl_over_kuberay": ratios,
        "runs": runs, "failures": failures,
    }
    if local_runs:
        cluster = medians["kuberl"]["apply_to_complete"]
        local = round(statistics.median([r["whole_command"] for r in local_runs]), 3)
        results["cluster_vs_local"] = {
            "kuberl_cluster_apply_to_complete": cluster, "kuberl_local_whole_command": local,
            "cluster_over_local": round(cluster / local, 3) if cluster else None, "target": 1.5,
            "local_runs": local_runs}
    if faults:
        results["fault_parity"] = faults
    return results


def abba(repeat: int) -> tuple[str, str]:
    """The order of one repeat: each system goes first in every other one, so a drift in load hits both alike."""
    return ("kuberl", "kuberay") if repeat % 2 == 0 else ("kuberay", "kuberl")


def one_run(system: str, repeat: int, run: Callable[[str, int], dict], keep_going: bool,
            failures: list[dict]) -> dict | None:
    """`run(system, repeat)`'s record; with `keep_going`, a run that failed is recorded in `failures` and gives
    None."""
    try:
        return run(system, repeat)
    except RuntimeError as error:
        if not keep_going:
            raise
        failures.append({"system": system, "repeat": repeat, "error": str(error)[-3000:]})
        print(f"{system} run {repeat} FAILED: {str(error)[:300]}", flush=True)
        return None


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="runs of each system, alternating (default 5)")
    parser.add_argument("--local", action="store_true", help="also run the KubeRL file with `kuberl train` "
                        "on this machine once per repeat (cluster vs local)")
    parser.add_argument("--fault", action="store_true", help="also one run each with a rollout worker killed")
    parser.add_argument("--keep-going", action="store_true", help="record a failed run and go on")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "vs_kuberay_real_node.json", arguments)
    args = bench.args
    built = ensure_built()
    cluster_bed = from_tests("bed.cluster_bed")
    kuberay_bed = from_tests("bed.kuberay")
    sizes = image_sizes()
    runs: dict[str, list[dict]] = {"kuberl": [], "kuberay": []}
    failures: list[dict] = []
    local_runs: list[dict] = []
    faults: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kuberl-vs-kuberay-") as tmp:
        work = pathlib.Path(tmp)
        with (cluster_bed.OneNodeCluster(work / "bed", namespaces=tuple(NS.values())) as bed,
              kuberay_bed.KubeRay(bed.plane, bed.cluster, work / "kuberay") as kuberay):
            push_rllib_image(bed)
            kuberl_operator = KubeRLOperator(bed)
            account = f"system:serviceaccount:{cluster_bed.OPERATOR_NAMESPACE}:"
            kuberl_user = next(e["user"]["username"] for e in bed.plane.audit_events(0)
                               if e["user"]["username"].startswith(account))

            def run(system: str, i: int) -> dict:
                if system == "kuberl":
                    return kuberl_run(bed, i, kuberl_operator, kuberl_user, capture=i == 0)
                return kuberay_run(bed, i, kuberay, capture=i == 0)

            for i in range(args.repeats):
                for system in abba(i):
                    r = one_run(system, i, run, args.keep_going, failures)
                    if r is None:
                        continue
                    r["repeat"] = i
                    runs[system].append(r)
                    m = r["marks_seconds_after_apply"]
                    evaluation = r["evaluation"] or {}
                    print(f"{system} run {i}: first step {m.get('first_env_step')} s, solved {m.get('solved')} s, "
                          f"complete {m.get('complete')} s, pods gone {m.get('pods_gone')} s, "
                          f"steps {r['env_steps_to_solve']}, "
                          f"eval {evaluation.get('meanReturn', evaluation.get('mean_return'))}, "
                          f"load {r['loadavg_before']}", flush=True)
                if args.local:
                    local = local_run()
                    local["loadavg_after"] = load_average()
                    local_runs.append(local)
                    print(f"local run {i}: {local['whole_command']:.1f} s", flush=True)
                # after every repeat, so an interrupted run keeps what it measured
                bench.write(summarize(runs, failures, local_runs, faults, built, sizes, bed.timings))
            if args.fault:
                for system, fault in (("kuberl", lambda: kuberl_fault(bed)),
                                      ("kuberay", lambda: kuberay_fault(bed, kuberay))):
                    try:
                        faults.append(fault())
                    except (RuntimeError, AssertionError, KeyError, TypeError) as error:
                        faults.append({"system": system, "error": repr(error)[-3000:]})
                    shown = {k: v for k, v in faults[-1].items() if k not in ("events", "pods_after")}
                    print(f"{system} fault: {json.dumps(shown)}", flush=True)
            bed_timings = bed.timings

    results = summarize(runs, failures, local_runs, faults, built, sizes, bed_timings)
    bench.write(results)
    local = {k: v for k, v in (results.get("cluster_vs_local") or {}).items() if k != "local_runs"}
    print(json.dumps({"medians": results["medians"], "ratios": results["ratios_kuberl_over_kuberay"],
                      "cluster_vs_local": local}, indent=1))


if __name__ == "__main__":
    main()

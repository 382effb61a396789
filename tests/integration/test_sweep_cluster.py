"""RLSweeps on the real control plane: kopf runs the operator's handlers with the chart ServiceAccount's token, the
tests act as the node's kubelet and as each trial's learner (its real /metrics), and assert on what a user sees:
the trial jobs, the sweep's status, `kubectl get rlsweep`, the garbage collector, and the API server's audit log.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from bed.real_cluster import ApiError, ClusterNamespace
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tools import REPO

from kuberl.api.crd import sweep_crd_yaml
from kuberl.operator import rbac
from kuberl.operator.builders import BuildOptions
from kuberl.operator.controllers import build_registry, memo_for
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import OperatorConfig, Runtime
from kuberl.trainer.metrics import JobLabels, LearnerMetrics

SWEEP = "lr"
LR = "algorithm.ppo.learningRate"
TRIALS = [f"{SWEEP}-t{n:04d}" for n in range(3)]
WAIT = 60  # generous: a busy machine slows a test down instead of failing it


@pytest.fixture
def cluster(kube: ClusterNamespace) -> ClusterNamespace:
    """The session's control plane has both CRDs (tests/bed/real_cluster.py), as the chart installs them."""
    path = REPO / "crds" / "rlsweep.yaml"
    assert path.read_text() == sweep_crd_yaml(), "crds/rlsweep.yaml is stale: run `kuberl crd --kind RLSweep`"
    return kube


class Learners:
    """One real learner /metrics server per trial job, served on this machine; the operator reads each trial's
    progress from it as from a learner pod."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.servers: dict[str, tuple[LearnerMetrics, int]] = {}
        self.lock = threading.Lock()  # the operator's thread and the test's ask for the same trial's

    def server(self, job: str) -> tuple[LearnerMetrics, int]:
        with self.lock:
            if job not in self.servers:
                learner = LearnerMetrics(JobLabels(job, self.namespace, "PPO", "CartPole-v1"))
                self.servers[job] = (learner, learner.serve(0, addr="127.0.0.1"))
            return self.servers[job]

    def __getitem__(self, job: str) -> LearnerMetrics:
        return self.server(job)[0]

    def url(self, job: Any, pod: Any) -> str:
        return f"http://127.0.0.1:{self.server(job.metadata.name)[1]}/metrics"

    def close(self) -> None:
        for learner, _port in self.servers.values():
            learner.close()


@pytest.fixture
def start_operator(cluster: ClusterNamespace) -> Iterator[Callable[[], Any]]:
    """Start the operator (kopf in a thread, the chart ServiceAccount's token) as often as a test asks: each
    start is a new process's state, with only what the API server holds."""
    from bed.kopf_thread import run_kopf_in_thread

    learners = Learners(cluster.namespace)

    @contextlib.contextmanager
    def start() -> Iterator[tuple[OperatorMetrics, Learners]]:
        metrics = OperatorMetrics()
        config = OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                                build=BuildOptions(trainer_image="kuberl-trainer:test"),
                                learner_metrics_url=learners.url)
        runtime = Runtime(config, api_client=cluster.operator_api_client(), metrics=metrics)
        with run_kopf_in_thread(build_registry(login=False), namespaces=[cluster.namespace],
                                memo=memo_for(runtime)):
            yield metrics, learners

    try:
        yield start
    finally:
        learners.close()


@pytest.fixture
def operator(start_operator) -> Iterator[tuple[OperatorMetrics, Learners]]:
    with start_operator() as running:
        yield running


def sweep_manifest(job_dict: dict, **spec: Any) -> dict:
    template = copy.deepcopy(job_dict["spec"])
    template["rolloutWorkers"]["replicas"] = 1
    template["stopping"] = {"maxEnvSteps": 100_000}
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep", "metadata": {"name": SWEEP},
            "spec": {"template": template,
                     "parameters": [{"path": "algorithm.ppo.learningRate", "values": [0.001, 0.01, 0.1]}],
                     "seeds": 1, "maxTrials": 3, "parallelism": 2,
                     "earlyStopping": {"pruner": "median", "startupTrials": 1, "minEnvSteps": 1000,
                                       "everyEnvSteps": 1000},
                     **spec}}


# ---- helpers -----------------------------------------------------------------------------------------------


def wait_until(check: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(0.05)
    return value


def sweep_status(cluster: ClusterNamespace, name: str = SWEEP) -> dict:
    return (cluster.get("rlsweeps", name) or {}).get("status") or {}


def trial(cluster: ClusterNamespace, number: int) -> dict:
    return trial_of(cluster, SWEEP, number)


def trial_of(cluster: ClusterNamespace, sweep: str, number: int) -> dict:
    return next((t for t in sweep_status(cluster, sweep).get("trials", []) if t["number"] == number), {})


def trial_jobs(cluster: ClusterNamespace) -> dict[str, dict]:
    return {j["metadata"]["name"]: j for j in cluster.list("rltj", label_selector=f"kuberl.dev/sweep={SWEEP}")}


def job_phase(cluster: ClusterNamespace, name: str) -> str | None:
    return ((cluster.get("rltj", name) or {}).get("status") or {}).get("phase")


def run_trial(cluster: ClusterNamespace, learners: Learners, name: str, env_steps: int, mean_return: float) -> None:
    """The kubelet starts the trial's pods; its learner reports `env_steps` at `mean_return`."""
    pods = wait_until(lambda: (found := cluster.list("pods", label_selector=f"kuberl.dev/job-name={name}"))
                      and len(found) == 3 and found, what=f"{name}'s pods")
    for pod in pods:
        cluster.set_pod_phase(cluster.namespace, pod["metadata"]["name"], "Running")
    learner = learners[name]
    # The return first: the operator scrapes at any moment, and a scrape between the two writes must not
    # see the new step count beside the gauge's default return (the engine keeps a step's first report).
    learner.set("kuberl_episode_return_mean", mean_return)
    learner.inc("kuberl_env_steps_total", env_steps)
    wait_until(lambda: ((cluster.get("rltj", name) or {}).get("status") or {}).get("progress", {}).get(
        "envSteps") == env_steps, what=f"{name}'s progress")


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


# ---- a sweep's trials, run to the end ------------------------------------------------------------------------


def test_a_sweep_runs_its_trials_as_owned_jobs_prunes_ranks_completes_and_goes_with_its_trials(
        cluster, operator, job_dict):
    metrics, learners = operator
    sweep = cluster.create(sweep_manifest(job_dict), namespace=cluster.namespace)
    uid = sweep["metadata"]["uid"]

    # At most parallelism (2) trials at once, each a job the sweep owns, with its value and seed.
    wait_until(lambda: set(trial_jobs(cluster)) == set(TRIALS[:2]), what="two trial jobs")
    for number, name in enumerate(TRIALS[:2]):
        job = trial_jobs(cluster)[name]
        (ref,) = job["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
            "RLSweep", SWEEP, uid, True, True)
        recorded = wait_until(lambda: trial(cluster, number), what=f"trial {number} in the status")  # noqa: B023
        assert job["spec"]["algorithm"]["ppo"]["learningRate"] == recorded["parameters"][LR]
        assert job["spec"]["seed"] == recorded["seed"] == job_dict["spec"].get("seed", 0)
    status = wait_until(lambda: (s := sweep_status(cluster)).get("progress") == "0/3" and s, what="the status")
    assert status["phase"] == "Running" and status["trialsByState"]["running"] == 2

    # Trial 0 reports and finishes: it scores its final mean return, and the third trial starts.
    run_trial(cluster, learners, TRIALS[0], 5000, 200.0)
    wait_until(lambda: trial(cluster, 0).get("reports") == {"5000": 200.0}, what="trial 0's report")
    cluster.set_pod_phase(cluster.namespace, f"{TRIALS[0]}-learner", "Succeeded")
    wait_until(lambda: trial(cluster, 0).get("state") == "Succeeded", what="trial 0 scored")
    assert trial(cluster, 0)["objective"] == 200.0
    wait_until(lambda: TRIALS[2] in trial_jobs(cluster), what="the third trial")
    assert len([j for j in trial_jobs(cluster).values() if job_phase(cluster, j["metadata"]["name"]) != "Succeeded"
                ]) <= 2

    # Trial 1 is far below the median at the same step: the pruner stops it; its job is suspended, kept.
    run_trial(cluster, learners, TRIALS[1], 5000, 10.0)
    wait_until(lambda: trial(cluster, 1).get("state") == "Stopped", what="trial 1 stopped")
    assert "pruner" in trial(cluster, 1)["message"]
    wait_until(lambda: job_phase(cluster, TRIALS[1]) == "Suspended", what="trial 1's job Suspended")
    assert cluster.get("rltj", TRIALS[1])["spec"]["suspend"] is True
    wait_until(lambda: not cluster.list("pods", label_selector=f"kuberl.dev/job-name={TRIALS[1]}"),
               what="trial 1's pods gone")

    # Trial 2 does best; the sweep completes with the ranking and a Complete condition.
    run_trial(cluster, learners, TRIALS[2], 5000, 300.0)
    cluster.set_pod_phase(cluster.namespace, f"{TRIALS[2]}-learner", "Succeeded")
    status = wait_until(lambda: (s := sweep_status(cluster)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert status["progress"] == "3/3"
    assert status["trialsByState"] == {"running": 0, "succeeded": 2, "stopped": 1, "failed": 0}
    lr = {t["number"]: t["parameters"][LR] for t in status["trials"]}
    assert sorted(lr.values()) == [0.001, 0.01, 0.1]  # the grid, each point once
    assert [(r["rank"], r["parameters"], r["iqm"], r["runs"]) for r in status["ranking"]] == [
        (1, {LR: lr[2]}, 300.0, 1), (2, {LR: lr[0]}, 200.0, 1)]
    assert status["best"]["summary"] == f"learningRate={lr[2]:g} IQM 300"
    complete = next(c for c in status["conditions"] if c["type"] == "Complete")
    assert complete["status"] == "True" and complete["reason"] == "TrialsFinished"
    assert job_phase(cluster, TRIALS[1]) == "Suspended"  # the job's own phase, while the sweep says Stopped
    assert cluster.kubectl("wait", "--for=condition=Complete", f"rlsweep/{SWEEP}", "--timeout=25s").returncode == 0

    # kubectl get shows progress and the best configuration.
    table = cluster.kubectl("get", "rlsweep").stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "TRIALS", "RUNNING", "STOPPED", "BEST", "AGE"]
    assert table[1].split()[:8] == [SWEEP, "Succeeded", "3/3", "0", "1", f"learningRate={lr[2]:g}", "IQM", "300"]

    # Prometheus: trials by state, and the best objective.
    assert sample(metrics, "kuberl_operator_sweep_trials", state="succeeded") == 2
    assert sample(metrics, "kuberl_operator_sweep_trials", state="stopped") == 1
    assert sample(metrics, "kuberl_operator_sweep_trials", state="running") == 0
    assert sample(metrics, "kuberl_operator_sweep_best_objective", namespace=cluster.namespace, sweep=SWEEP) == 300.0

    # Deleting the sweep deletes its trials: the garbage collector follows their ownerReferences.
    cluster.delete("rlsweeps", SWEEP)
    for name in TRIALS:
        cluster.wait_for_absent("rltj", name, timeout=WAIT)
    cluster.wait_for_absent("rlsweeps", SWEEP, timeout=WAIT)

    # RBAC is what the sweep's loop uses: every grant of SWEEP_RULES requested, none refused.
    requests = cluster.requests()
    assert [e["requestURI"] for e in requests if e["responseStatus"]["code"] == 403] == []
    used = {(e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"] + (
        f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else ""), e["verb"])
        for e in requests}
    granted = {(g, r, v) for rule in rbac.SWEEP_RULES for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    everything = granted | {(g, r, v) for rule in rbac.RULES + rbac.CLUSTER_RULES for g in rule["apiGroups"]
                            for r in rule["resources"] for v in rule["verbs"]}
    assert used - everything == set()
    # Granted and never a request of its own: blockOwnerDeletion on each trial is authorized against update
    # of the sweep's finalizers.
    assert granted - used == {("kuberl.dev", "rlsweeps/finalizers", "update")}


# ---- bad sweeps ---------------------------------------------------------------------------------------------


def _set(manifest: dict, path: str, value: Any) -> dict:
    node = manifest
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(leaf) if isinstance(node, list) else leaf] = value
    return manifest


#: (what, path in the manifest, value, the field the refusal names): the API server refuses these (the
#: CRD's schema and CEL rules)...
REFUSED_BY_THE_API_SERVER = [
    ("no parameters", "spec.parameters", [], "spec.parameters"),
    ("too many trials", "spec.maxTrials", 5000, "spec.maxTrials"),
    ("no seeds", "spec.seeds", 0, "spec.seeds"),
    ("a grid and a distribution", "spec.parameters.0", {"path": "algorithm.ppo.learningRate",
                                                        "grid": {"low": 0.001, "high": 0.1},
                                                        "distribution": {"type": "uniform", "low": 0.001, "high": 0.1}},
     "spec.parameters[0]"),
    ("an empty range", "spec.parameters.0", {"path": "algorithm.ppo.learningRate",
                                             "distribution": {"type": "uniform", "low": 1, "high": 1}},
     "spec.parameters[0].distribution"),
    ("an unknown algorithm in the template", "spec.template.algorithm.name", "XYZ", "spec.template.algorithm.name"),
    ("a name too long for its trials", "metadata.name", "s" * 60, "metadata.name"),
]
#: ...and the operator these, with the same checks as `kuberl sweep`, before any trial exists.
REFUSED_BY_THE_OPERATOR = [
    ("an unknown path", "spec.parameters.0.path", "algorithm.ppo.learningRat", "spec.parameters[0].path"),
    ("values and a grid", "spec.parameters.0.grid", {"low": 0.001, "high": 0.1}, "spec.parameters[0]"),
    ("an int distribution on a float field", "spec.parameters.0",
     {"path": "algorithm.ppo.learningRate", "distribution": {"type": "int", "low": 1, "high": 3}},
     "spec.parameters[0].distribution.type"),
    ("a value outside the field's bounds", "spec.parameters.0.values", [0.01, -1.0], "spec.parameters[0].values[1]"),
    ("a grid larger than maxTrials", "spec.maxTrials", 2, "spec.maxTrials"),
    ("an environment nobody registered", "spec.template.environment.id", "CartPole-v9000",
     "spec.template.environment.id"),
]


def test_bad_sweeps_are_refused_naming_the_field_before_any_trial_exists(cluster, operator, job_dict):
    for number, (what, path, value, field) in enumerate(REFUSED_BY_THE_API_SERVER):
        manifest = _set(sweep_manifest(job_dict), path, value)
        if path != "metadata.name":
            manifest["metadata"]["name"] = f"bad-api-{number}"
        with pytest.raises(ApiError) as refused:
            cluster.create(manifest, namespace=cluster.namespace)
        assert refused.value.status == 422, what
        assert field in refused.value.body["message"], (what, refused.value.body["message"])
    names = []
    for number, (what, path, value, field) in enumerate(REFUSED_BY_THE_OPERATOR):
        manifest = _set(sweep_manifest(job_dict), path, value)
        manifest["metadata"]["name"] = f"bad-{number}"
        if path == "spec.parameters.0":
            manifest["spec"]["search"] = {"sampler": "random"}
        cluster.create(manifest, namespace=cluster.namespace)
        names.append((manifest["metadata"]["name"], what, field))
    for name, what, field in names:
        status = wait_until(lambda: (s := sweep_status(cluster, name)).get("phase") == "Failed" and s,  # noqa: B023
                            what=what)
        assert status["reason"] == "InvalidSpec" and field in status["message"], (what, status["message"])
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and field in failed["message"]
    assert cluster.list("rltj") == []
    assert [e for e in cluster.requests() if e["verb"] == "create" and e["objectRef"]["resource"] == "rltrainingjobs"
            ] == []
    with contextlib.suppress(ApiError):
        for name, _what, _field in names:
            cluster.delete("rlsweeps", name)


# ---- the example file, and an operator restarted half-way ---------------------------------------------------


def test_the_example_sweep_file_applied_with_kubectl_runs_its_trials_to_the_end_across_an_operator_restart(
        cluster, start_operator, tmp_path):
    """examples/sweeps/cartpole-ppo-lr.yaml, shrunk to one seed (3 trials), applied as a user would; the
    operator stops after the first trial and a new one, knowing only what the API server holds, goes on."""
    manifest = yaml.safe_load((REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml").read_text())
    name = manifest["metadata"]["name"]
    manifest["spec"].update(seeds=1, maxTrials=3)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(manifest))
    trials = [f"{name}-t{n:04d}" for n in range(3)]

    def finish(learners: Learners, job: str, mean_return: float) -> None:
        run_trial(cluster, learners, job, 30_000, mean_return)
        cluster.set_pod_phase(cluster.namespace, f"{job}-learner", "Succeeded")
        wait_until(lambda: job_phase(cluster, job) == "Succeeded", what=f"{job} Succeeded")

    with start_operator() as (_metrics, learners):
        assert "created" in cluster.kubectl("apply", "-f", str(path)).stdout
        wait_until(lambda: {j["metadata"]["name"] for j in cluster.list("rltj")} == set(trials[:2]),
                   what="two trials")
        finish(learners, trials[0], 100.0)
        wait_until(lambda: trial_of(cluster, name, 0).get("state") == "Succeeded", what="trial 0 recorded")
        wait_until(lambda: trials[2] in {j["metadata"]["name"] for j in cluster.list("rltj")}, what="trial 2")
    recorded = sweep_status(cluster, name)["trials"]

    with start_operator() as (_metrics, learners):
        finish(learners, trials[1], 200.0)
        finish(learners, trials[2], 300.0)
        status = wait_until(lambda: (s := sweep_status(cluster, name)).get("phase") == "Succeeded" and s,
                            what="the sweep Succeeded")
    # The new operator kept the first one's record and started nothing twice.
    assert [(t["number"], t["parameters"]) for t in status["trials"]] == [
        (t["number"], t["parameters"]) for t in recorded]
    assert sorted(t["parameters"][LR] for t in status["trials"]) == [0.0003, 0.0025, 0.01]
    assert [j["metadata"]["name"] for j in cluster.list("rltj")] == trials
    assert status["progress"] == "3/3" and status["best"]["iqm"] == 300.0
    created = [e for e in cluster.requests() if e["verb"] == "create"
               and e["objectRef"]["resource"] == "rltrainingjobs" and e["responseStatus"]["code"] == 201]
    assert len(created) == 3

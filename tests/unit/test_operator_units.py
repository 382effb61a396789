"""RBAC manifests, operator metrics, progress parsing, the command line, and what the operator imports."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kuberl.api.job import RLTrainingJobStatus
from kuberl.operator import main as operator_main
from kuberl.operator import rbac
from kuberl.operator import status as job_status
from kuberl.operator.metrics import METRICS, OperatorMetrics
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

# ---- RBAC ---------------------------------------------------------------------------------------


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_rules_grant_exactly_what_the_operator_does_and_only_create_on_secrets():
    """The list the audit log of the integration tests shows the operator using (a test there compares
    them); rltrainingjobs/finalizers is an authorization check on each child's blockOwnerDeletion."""
    assert _granted(rbac.RULES) == {
        ("kuberl.dev", "rltrainingjobs", "list"), ("kuberl.dev", "rltrainingjobs", "watch"),
        ("kuberl.dev", "rltrainingjobs", "patch"), ("kuberl.dev", "rltrainingjobs", "delete"),
        ("kuberl.dev", "rltrainingjobs/status", "patch"), ("kuberl.dev", "rltrainingjobs/finalizers", "update"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "create"), ("", "pods", "delete"),
        ("", "services", "create"), ("", "secrets", "create"), ("", "configmaps", "create"),
        ("networking.k8s.io", "networkpolicies", "create"), ("policy", "poddisruptionbudgets", "create"),
        ("policy", "poddisruptionbudgets", "patch"),
        ("apps", "deployments", "create"),
        ("", "events", "create"),
    }
    everything = rbac.RULES + rbac.CLUSTER_RULES + rbac.PEERING_RULES
    assert not [r for r in everything if "*" in r["resources"] or "*" in r["verbs"] or "*" in r["apiGroups"]]
    # Each job's Ray token Secret is created, never read: no get, list or watch on any Secret.
    assert {v for g, r, v in _granted(everything) if r == "secrets"} == {"create"}


def test_cluster_wide_manifests():
    role, binding = rbac.cluster_wide()
    assert role["kind"] == "ClusterRole" and binding["kind"] == "ClusterRoleBinding"
    assert role["rules"] == rbac.RULES + rbac.SWEEP_RULES + rbac.CLUSTER_RULES
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "kuberl-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl-operator",
                                    "namespace": "kuberl-system"}]
    for manifest in (role, binding):
        kubernetes_validate.validate(manifest, "1.31", strict=True)
    peering_role, _ = rbac.cluster_wide(peering=True)
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in _granted(peering_role["rules"])


def test_single_namespace_manifests_hold_only_namespaced_rules():
    role, binding = rbac.single_namespace("team-a", service_account="op", service_account_namespace="ops")
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "team-a")
    assert role["rules"] == rbac.RULES + rbac.SWEEP_RULES
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    for manifest in (role, binding):
        kubernetes_validate.validate(manifest, "1.31", strict=True)


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert operator_main.main(list(argv)) == 0
    return out.getvalue()


def test_rbac_command_prints_the_same_manifests():
    assert list(yaml.safe_load_all(_cli("rbac"))) == rbac.cluster_wide()
    assert list(yaml.safe_load_all(_cli("rbac", "--namespace", "team-a"))) == rbac.single_namespace("team-a")


# ---- operator metrics --------------------------------------------------------------------------


def test_operator_metrics_match_their_table():
    metrics = OperatorMetrics()
    metrics.reconcile_duration.labels("reconcile").observe(0.01)
    for counter in (metrics.pods_created, metrics.pod_restarts):
        counter.labels("learner").inc()
    metrics.transitions.labels("Running").inc()
    metrics.errors.labels("reconcile", "http_500").inc()
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    for name, (kind, help_text) in METRICS.items():
        assert name.startswith("kuberl_operator_")
        family = families[name.removesuffix("_total")]
        assert (family.type, family.documentation) == (kind, help_text)
    assert set(METRICS) >= {"kuberl_operator_jobs", "kuberl_operator_reconcile_duration_seconds",
                            "kuberl_operator_child_pod_restarts_total", "kuberl_operator_errors_total"}


def test_jobs_gauge_counts_jobs_by_phase():
    metrics = OperatorMetrics()
    metrics.job_phase("a", "Running")
    metrics.job_phase("b", "Running")
    metrics.job_phase("c", "Failed")
    metrics.job_phase("b", "Succeeded")
    metrics.job_phase("c", None)  # deleted
    values = {s.labels["phase"]: s.value for s in metrics.jobs.collect()[0].samples}
    assert values == {"Pending": 0, "Queued": 0, "Starting": 0, "Running": 1, "Succeeded": 1, "Failed": 0,
                      "Suspended": 0}


# ---- progress from the learner's metrics ---------------------------------------------------------


def test_progress_is_read_from_the_learners_real_metrics():
    learner = LearnerMetrics(JobLabels("cartpole-ppo", "rl", "PPO", "CartPole-v1"))
    learner.inc("kuberl_episodes_total", 321)
    learner.inc("kuberl_env_steps_total", 45_000)
    learner.set("kuberl_episodes_per_second", 12.5)
    learner.set("kuberl_env_steps_per_second", 1800.0)
    learner.set("kuberl_episode_return_mean", 199.5)
    learner.set("kuberl_training_wall_clock_seconds", 25.0)
    learner.inc("kuberl_gradient_updates_total", 96)
    learner.inc("kuberl_iterations_total", 6)
    learner.set("kuberl_checkpoint_timestamp_seconds", 1_700_000_000)
    text = generate_latest(learner.registry).decode()
    report = job_status.parse_learner_metrics(text, job_name="cartpole-ppo")
    p = report.progress
    assert (p.episodes, p.env_steps, p.gradient_updates, p.iterations) == (321, 45_000, 96, 6)
    assert (p.episodes_per_second, p.env_steps_per_second, p.wall_clock_seconds) == (12.5, 1800.0, 25.0)
    assert p.mean_return == 199.5
    assert report.last_checkpoint_time.timestamp() == 1_700_000_000
    assert report.finished is False
    assert report.evaluation is None  # gauges before the learner finished are not results


def test_status_numbers_are_rounded_for_a_person():
    """`kubectl get rltj` shows rates to 0.1 and returns to 0.1 or 3 significant figures; the learner's
    metrics keep every digit."""
    learner = LearnerMetrics(JobLabels("autoscaling-dqn", "rl", "DQN", "kuberl/Autoscaling-v0"))
    learner.inc("kuberl_episodes_total", 1234)
    learner.inc("kuberl_iterations_total", 6)
    learner.set("kuberl_episodes_per_second", 311.8905519378761)
    learner.set("kuberl_env_steps_per_second", 62378.11038757522)
    learner.set("kuberl_episode_return_mean", -207.77500000000003)
    learner.set("kuberl_training_wall_clock_seconds", 61.23456)
    learner.set("kuberl_evaluation_return_mean", 0.93456)
    learner.set_win_rate("vs-random-first", 0.98765)
    learner.set("kuberl_job_finished", 1)
    text = generate_latest(learner.registry).decode()
    assert "kuberl_episodes_per_second" in text and "311.8905519378761" in text
    report = job_status.parse_learner_metrics(text, job_name="autoscaling-dqn")
    status = job_status.dump(RLTrainingJobStatus(progress=report.progress, evaluation=report.evaluation))
    assert status["progress"] == {
        "episodes": 1234, "envSteps": 0, "episodesPerSecond": 311.9, "envStepsPerSecond": 62378.1,
        "meanReturn": -207.8, "returnsByPolicy": None, "wallClockSeconds": 61.2, "gradientUpdates": 0,
        "iterations": 6}  # a single-policy job: None, so a merge patch clears the field
    assert status["evaluation"] == {
        "deterministic": {"meanReturn": 0.935}, "vs-random-first": {"winRate": 0.988}}


def test_checkpoint_name_and_final_evaluation_reach_the_status():
    learner = LearnerMetrics(JobLabels("ttt", "rl", "DQN", "kuberl/TicTacToe-v0"))
    learner.inc("kuberl_episodes_total", 10)
    learner.set("kuberl_checkpoint_timestamp_seconds", 1_700_000_000)
    learner.set("kuberl_checkpoint_iteration", 42)
    learner.set("kuberl_evaluation_return_mean", 0.93)
    learner.set_win_rate("vs-random-first", 0.99)
    learner.set("kuberl_job_finished", 1)
    report = job_status.parse_learner_metrics(generate_latest(learner.registry).decode(), job_name="ttt")
    assert report.last_checkpoint == "ckpt-000000042.pt"
    assert report.evaluation == {"deterministic": {"meanReturn": 0.93}, "vs-random-first": {"winRate": 0.99}}


def test_no_checkpoint_yet_and_nan_return_are_left_empty():
    learner = LearnerMetrics(JobLabels("j", "ns", "DQN", "CartPole-v1"))
    learner.set("kuberl_episode_return_mean", math.nan)
    report = job_status.parse_learner_metrics(generate_latest(learner.registry).decode())
    assert report.last_checkpoint_time is None and report.progress.mean_return is None


def test_a_page_without_kuberl_metrics_is_refused():
    with pytest.raises(ValueError, match="no kuberl_"):
        job_status.parse_learner_metrics("# HELP up x\n# TYPE up gauge\nup 1\n")


# ---- command line and imports ----------------------------------------------------------------------


def test_run_flags_become_the_config():
    parser = operator_main._parser()
    args = parser.parse_args(["run", "--trainer-image", "img:1", "--rollout-image", "img:2", "--no-network-policies",
                              "--reconcile-interval", "2", "--progress-interval", "3",
                              "--learner-metrics-url", "http://{metrics_service}.{namespace}.svc:{port}/metrics"])
    config = operator_main.config_from_args(args)
    assert config.build.trainer_image == "img:1" and config.build.network_policies is False
    assert config.build.rollout_image == "img:2"
    assert (config.reconcile_interval, config.progress_interval) == (2.0, 3.0)
    defaults = parser.parse_args(["run"])
    assert defaults.peering is None and defaults.metrics_port == 8080
    assert defaults.liveness_endpoint == "http://0.0.0.0:8081/healthz"
    assert parser.parse_args(["run", "--peering"]).peering == "kuberl-operator"
    assert parser.parse_args(["run", "-n", "a", "-n", "b"]).namespace == ["a", "b"]
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "-n", "a", "--all-namespaces"])


def test_scope_peering_and_liveness_flags_become_kopf_options():
    parser = operator_main._parser()
    options = operator_main.kopf_options(parser.parse_args(["run"]))
    assert options == {"standalone": True, "clusterwide": True, "namespaces": [],
                       "liveness_endpoint": "http://0.0.0.0:8081/healthz"}
    options = operator_main.kopf_options(parser.parse_args(["run", "-n", "a", "-n", "b", "--liveness-endpoint", "",
                                                            "--peering"]))
    assert options == {"standalone": False, "clusterwide": False, "namespaces": ["a", "b"],
                       "liveness_endpoint": None, "peering_name": "kuberl-operator"}


def test_metrics_url_template_resolves_per_learner(job_dict):
    from kuberl.api.load import parse_job
    from kuberl.operator.names import Component
    from kuberl.operator.pods import PodView
    from kuberl.operator.runtime import url_from_template

    job = parse_job(job_dict)
    pod = PodView("cartpole-ppo-learner", Component.LEARNER, ip="10.1.2.3")
    assert url_from_template("http://{pod_ip}:{port}/metrics")(job, pod) == "http://10.1.2.3:8080/metrics"
    assert url_from_template("http://{pod_ip}:{port}/metrics")(job, PodView("x", Component.LEARNER)) is None
    assert (url_from_template("http://{metrics_service}.{namespace}.svc:{port}/metrics")(job, pod)
            == "http://cartpole-ppo-metrics.default.svc:8080/metrics")


def test_the_operator_imports_neither_torch_nor_ray_nor_the_trainer():
    """Nor, until a sweep's first pass, Optuna, SciPy or NumPy: an operator that runs no sweep never holds
    them (about 90 MB)."""
    code = (
        "import sys, json\n"
        "import kuberl.operator.main as m, kuberl.operator.controllers, kuberl.operator.lifecycle\n"
        "import kuberl.operator.rbac, kuberl.operator.metrics, kuberl.operator.status, kuberl.operator.runtime\n"
        "m._preload_validation()\n"
        "from kuberl.api.load import parse_job\n"
        "import yaml; from kuberl.api.semantics import check_registered\n"
        "parse_job(yaml.safe_load(open('examples/cartpole-ppo.yaml')), check=check_registered)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'ray', 'optuna', 'scipy', 'numpy')\n"
        "                        or n.startswith('kuberl.trainer'))))\n"
    )
    from conftest import REPO

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_console_script_prints_rbac():
    script = Path(sys.executable).parent / "kuberl-operator"
    if not script.exists():
        pytest.skip("the console script is not installed in this environment")
    result = subprocess.run([str(script), "rbac", "-n", "ns1"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)] == ["Role", "RoleBinding"]


def test_committed_rbac_manifests_are_the_generated_ones():
    from conftest import REPO

    for filename in rbac.DEPLOY_FILES:
        committed = (REPO / "deploy" / "rbac" / filename).read_text()
        assert committed == rbac.deploy_file_text(filename), (
            f"deploy/rbac/{filename} is stale: regenerate with "
            "python -c \"from kuberl.operator import rbac; rbac.write_deploy_files('deploy/rbac')\"")

"""The Grafana dashboard: built from metrics the code exports, and not empty against a real Prometheus.

Fast tests read dashboards/kuberl.json: the variables a user picks, the panels the issue asks
for, and every metric name in every query checked against the learner's and the operator's
prometheus_client registries. The slow test starts Debian's Prometheus on loopback, scrapes a
real `kuberl train` run and a real `kuberl-operator` (on the real control plane, with the chart's
ServiceAccount token), and
evaluates every panel query through Prometheus's HTTP API, as Grafana would.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from kuberl.operator.metrics import METRICS as OPERATOR_METRICS
from kuberl.operator.metrics import OperatorMetrics
from kuberl.trainer.metrics import METRICS as LEARNER_METRICS
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from tools import REPO, prometheus_binary

DASHBOARD = REPO / "dashboards" / "kuberl.json"
JOB_FILE = REPO / "tests" / "data" / "dashboard-job.yaml"
METRIC_NAME = re.compile(r"\bkuberl_[a-z0-9_]+\b")

#: What the issue asks the dashboard to show -> the metric whose panel shows it.
REQUIRED_PANELS = {
    "episodes/s": "kuberl_episodes_per_second",
    "env steps/s": "kuberl_env_steps_per_second",
    "wall-clock": "kuberl_training_wall_clock_seconds",
    "mean return": "kuberl_episode_return_mean",
    "gradient updates/s": "kuberl_gradient_updates_total",
    "rollout workers ready": "kuberl_rollout_workers_ready",
    "learner loss": "kuberl_learner_loss",
    "checkpoint age": "kuberl_checkpoint_timestamp_seconds",
    "preference head accuracy": "kuberl_preference_accuracy",
    "preference pairs used": "kuberl_preference_pairs_used",
    "operator jobs by phase": "kuberl_operator_jobs",
    "operator reconcile latency": "kuberl_operator_reconcile_duration_seconds_bucket",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for panel in dash["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dash) for t in p["targets"]]


def variables(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def exported_names() -> set[str]:
    """Every sample name the learner's and operator's registries expose, as Prometheus scrapes them."""
    registries = [
        LearnerMetrics(JobLabels("j", "ns", "PPO", "CartPole-v1")).registry,
        OperatorMetrics().registry,
    ]
    found = set()
    for registry in registries:
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                        "summary": ["_sum", "_count"]}.get(family.type, [""])
            found.update(family.name + s for s in suffixes)
    return found


def allowed_names() -> set[str]:
    """The METRICS tables (the documented names), each as it may appear in PromQL."""
    names = set()
    for name, (kind, _help) in {**LEARNER_METRICS, **OPERATOR_METRICS}.items():
        names.add(name)
        if kind == "histogram":
            names.update(name + s for s in ("_bucket", "_sum", "_count"))
    return names


# --------------------------------------------------------------------------------------------
# The JSON itself
# --------------------------------------------------------------------------------------------


def test_dashboard_has_a_fixed_uid_and_datasource_namespace_and_job_variables():
    dash = dashboard()
    assert dash["uid"] == "kuberl-training"
    assert "id" not in dash or dash["id"] is None, "a provisioned dashboard must not carry a database id"
    vars_ = variables(dash)
    assert vars_["datasource"]["type"] == "datasource" and vars_["datasource"]["query"] == "prometheus"
    for name, label in (("namespace", "namespace"), ("job_name", "job_name")):
        var = vars_[name]
        assert var["type"] == "query"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert re.fullmatch(rf"label_values\((.+), {label}\)", var["definition"]), var["definition"]
        assert var["includeAll"] and var["multi"]
    assert '$namespace' in vars_["job_name"]["definition"], "the job list follows the chosen namespace"


def test_every_panel_reads_from_the_datasource_variable():
    for panel in panels(dashboard()):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]


def test_panel_ids_and_positions_are_unique():
    dash = dashboard()
    ids = [p["id"] for p in dash["panels"]] + [p["id"] for p in panels(dash)]
    assert len({p["id"] for p in panels(dash)}) == len(panels(dash))
    assert all(isinstance(i, int) for i in ids)
    for panel in panels(dash):
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24


def test_the_issues_panels_are_all_there():
    used = {name for _title, expr in queries(dashboard()) for name in METRIC_NAME.findall(expr)}
    missing = {what: metric for what, metric in REQUIRED_PANELS.items() if metric not in used}
    assert not missing, f"no panel shows {missing}"


def test_every_query_uses_only_metric_names_the_code_exports():
    dash = dashboard()
    exported, documented = exported_names(), allowed_names()
    exprs = [(t, e) for t, e in queries(dash)] + [
        (f"variable {v['name']}", v["definition"]) for v in variables(dash).values() if v["type"] == "query"
    ]
    for where, expr in exprs:
        for name in METRIC_NAME.findall(expr):
            assert name in documented, f"{where}: {name} is not in any METRICS table"
            assert name in exported, f"{where}: {name} is not exposed by the code's registries"


def test_learner_panels_follow_the_namespace_and_job_variables():
    for title, expr in queries(dashboard()):
        if any(name.startswith("kuberl_operator_") for name in METRIC_NAME.findall(expr)):
            continue  # the operator's metrics are per operator, not per job
        assert 'namespace=~"$namespace"' in expr and 'job_name=~"$job_name"' in expr, f"{title}: {expr}"


def test_no_label_is_named_job():
    """Prometheus renames a scraped `job` label to `exported_job`: the code must use job_name."""
    for title, expr in queries(dashboard()):
        assert not re.search(r"[{,(]\s*job\s*[=!~]", expr), f"{title}: {expr}"


def test_chart_ships_the_same_dashboard():
    chart_copy = REPO / "charts" / "kuberl-operator" / "dashboards" / "kuberl.json"
    assert chart_copy.read_text() == DASHBOARD.read_text()


# --------------------------------------------------------------------------------------------
# Against a real Prometheus
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until(check, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def running(cmd: list[str], log: Path, env: dict | None = None, stop_timeout: float = 20):
    """A process for the duration of a block; stopped with SIGTERM (then SIGKILL), its output in `log`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: Ray's helpers go with it
                proc.wait(10)


class Prometheus:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = http_json(url)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        url = f"{self.base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match})
        return http_json(url)["data"]

    def targets_up(self) -> dict[str, str]:
        targets = http_json(f"{self.base}/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in targets}


def grafana_expr(expr: str, selected: dict[str, str], rate_interval: str) -> str:
    """The query Grafana sends: variables replaced by the user's selection."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", "1s")
    for name, value in selected.items():
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def has_finite_value(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


@contextlib.contextmanager
def operator_on_cluster(kube, job: dict, port: int):
    """The real `kuberl-operator` on the session's control plane (tests/bed/real_cluster.py) with the
    chart's ServiceAccount token, reconciling `job` in the test's namespace, /metrics on `port`.

    Yields the namespace. No kubelet runs the pods: the caller marks them Running as their node would.
    """
    namespace = kube.namespace
    cmd = [str(Path(sys.executable).parent / "kuberl-operator"), "run", f"--namespace={namespace}",
           f"--metrics-port={port}", "--metrics-address=127.0.0.1",
           f"--liveness-endpoint=http://127.0.0.1:{free_port()}/healthz",
           "--reconcile-interval=1", "--no-network-policies"]
    with running(cmd, kube.workdir / "operator.log", env=kube.env):
        wait_until(lambda: http_json_text(f"http://127.0.0.1:{port}/metrics"), 30, "the operator's /metrics")
        kube.create(job)
        yield kube


def http_json_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read().decode()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_every_panel_returns_data_from_a_real_prometheus_scraping_a_real_run(tmp_path, kube):
    prometheus = prometheus_binary()
    job = yaml.safe_load(JOB_FILE.read_text())
    # The test's namespace, for the operator's job and the learner's metric labels alike.
    job["metadata"]["namespace"] = kube.namespace
    job_file = tmp_path / JOB_FILE.name
    job_file.write_text(yaml.safe_dump(job))
    selected = {"namespace": job["metadata"]["namespace"], "job_name": job["metadata"]["name"],
                "datasource": "prometheus"}
    learner_port, operator_port, prom_port = free_port(), free_port(), free_port()

    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "kuberl-learner", "static_configs": [{"targets": [f"127.0.0.1:{learner_port}"]}]},
            {"job_name": "kuberl-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom_cmd = [str(prometheus), f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn"]
    train_cmd = [str(Path(sys.executable).parent / "kuberl"), "train", str(job_file),
                 "--metrics-port", str(learner_port), "--run-dir", str(tmp_path / "run"), "--no-progress"]
    # RAY_ADDRESS=local: a local run starts its own Ray even when a `ray start` cluster runs on this
    # machine (Ray would otherwise join the one in /tmp/ray/ray_current_cluster).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local"}

    with operator_on_cluster(kube, job, operator_port) as cluster, \
            running(prom_cmd, tmp_path / "prometheus.log") as prom_proc, \
            running(train_cmd, tmp_path / "train.log", env=env) as train_proc:
        api = Prometheus(prom_port)
        wait_until(lambda: http_json_text(f"{api.base}/-/ready"), 20, "Prometheus to be ready")

        def kubelet() -> None:
            """Pods the operator created would be running on a real cluster: say so, as a kubelet would."""
            for pod in cluster.list("pods"):
                if pod.get("status", {}).get("phase") != "Running" and pod["spec"].get("nodeName"):
                    cluster.set_pod_phase(None, pod["metadata"]["name"], "Running")

        # Grafana's $__rate_interval is at least four scrape intervals; a minute (4 x a 15 s
        # scrape) also covers the operator's slower timer.
        exprs = [(title, grafana_expr(e, selected, "1m")) for title, e in queries(dashboard())]
        empty: dict[str, str] = {}

        def all_panels_have_data() -> bool:
            assert train_proc.poll() is None, (f"kuberl train exited early; panels without data: {json.dumps(empty)}\n"
                                               f"{(tmp_path / 'train.log').read_text()[-3000:]}")
            kubelet()
            empty.clear()
            for title, expr in exprs:
                if not has_finite_value(api.query(expr)):
                    empty[title] = expr
            return not empty

        try:
            wait_until(all_panels_have_data, 90, "every panel to return data", interval=1)
        except TimeoutError:
            pytest.fail(
                f"panels without data: {json.dumps(empty, indent=1)}\ntargets: {api.targets_up()}\n"
                f"train log:\n{(tmp_path / 'train.log').read_text()[-2000:]}"
            )

        # The operator panel shows this job as Running once its pods run, as a user would see it.
        wait_until(lambda: api.query('sum(kuberl_operator_jobs{phase="Running"}) == 1'), 30,
                   "the operator's jobs-by-phase to show the job Running")

        # The variables' drop-downs offer the job, as Grafana's label_values() would list them.
        for name, var in variables(dashboard()).items():
            if var["type"] != "query":
                continue
            inner = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            match = grafana_expr(inner.group(1), {"namespace": selected["namespace"]}, "1m")
            assert selected[inner.group(2)] in api.label_values(inner.group(2), match), name
        assert api.targets_up() == {"kuberl-learner": "up", "kuberl-operator": "up"}
    assert prom_proc.returncode is not None and train_proc.returncode is not None

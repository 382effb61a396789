"""spec.tracking.mlflow: the field's checks (as the model and the API server's schema take them), the
learner pod's credentials straight from the Secret, what the tracker sends (parameters cut to MLflow's
sizes, metrics named as in TensorBoard), a run directory's run file as hostile data, and the job's
TrackerReachable condition from the learner's /metrics. The tracker against a real MLflow server:
tests/integration/test_mlflow_tracking.py."""

from __future__ import annotations

import base64
import json
import time

import pytest
from prometheus_client import generate_latest

from kuberl.api.load import parse_job
from kuberl.api.problems import InvalidJob
from kuberl.operator import builders, lifecycle
from kuberl.operator import status as job_status
from kuberl.operator.builders import BuildOptions
from kuberl.operator.lifecycle import JobMeta, PodView
from kuberl.operator.names import Component
from kuberl.trainer import tracking
from kuberl.trainer.metrics import JobLabels, LearnerMetrics


def with_tracking(job_dict: dict, **mlflow) -> dict:
    job_dict["spec"]["tracking"] = {"mlflow": {"trackingUri": "http://mlflow.tracking.svc:5000", **mlflow}}
    return job_dict


@pytest.mark.parametrize("uri", ["ftp://mlflow:5000", "http://user:secret@mlflow:5000", "mlflow:5000",
                                 "http://mlflow:5000/a b", "http://mlflow\n:5000"])
def test_a_tracking_uri_that_is_no_plain_http_url_is_refused_naming_the_field(job_dict, uri):
    with pytest.raises(InvalidJob) as err:
        parse_job(with_tracking(job_dict, trackingUri=uri))
    assert [p.path for p in err.value.problems] == ["spec.tracking.mlflow.trackingUri"], err.value.problems


def test_an_experiment_name_with_a_control_character_is_refused(job_dict):
    with pytest.raises(InvalidJob) as err:
        parse_job(with_tracking(job_dict, experiment="bad\x1bname"))
    assert [p.path for p in err.value.problems] == ["spec.tracking.mlflow.experiment"]


def test_the_learner_gets_the_credentials_from_the_secret_and_no_other_pod_does(job_dict):
    job = parse_job(with_tracking(job_dict, credentialsSecret="mlflow-creds"))
    learner = builders.build_learner_pod(job, BuildOptions())
    env = {e["name"]: e for e in learner["spec"]["containers"][0]["env"]}
    for var, key in (("MLFLOW_TRACKING_TOKEN", "token"), ("MLFLOW_TRACKING_USERNAME", "username"),
                     ("MLFLOW_TRACKING_PASSWORD", "password")):
        assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": "mlflow-creds", "key": key,
                                                                         "optional": True}}}
    for pod in (builders.build_head_pod(job, BuildOptions()), builders.build_worker_pod(job, BuildOptions(), 0)):
        names = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env", [])}
        assert not names & set(builders.TRACKING_SECRET_KEYS), names
    # Without a Secret, nothing: the tracker is open, or its credentials come from elsewhere.
    plain = builders.build_learner_pod(parse_job(with_tracking(job_dict)), BuildOptions())
    assert not {e["name"] for e in plain["spec"]["containers"][0]["env"]} & set(builders.TRACKING_SECRET_KEYS)


def test_credentials_become_mlflows_own_headers(monkeypatch):
    for var in builders.TRACKING_SECRET_KEYS:
        monkeypatch.delenv(var, raising=False)
    assert tracking.MLflowREST("http://x").headers == {}
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw:1")
    assert tracking.MLflowREST("http://x").headers == {
        "Authorization": "Basic " + base64.b64encode(b"ann:pw:1").decode()}
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok")  # a token, where given, is what MLflow's client sends
    assert tracking.MLflowREST("http://x").headers == {"Authorization": "Bearer tok"}


def test_parameters_are_the_jobs_fields_dotted_and_cut_to_mlflows_size():
    params = tracking.flat_params({"algorithm": {"name": "PPO", "ppo": {"learningRate": 0.005}},
                                   "environment": {"id": "X", "kwargs": {"big": "a" * 7000, "none": None},
                                                   "list": [1, 2]},
                                   "empty": {}})
    assert params["algorithm.name"] == "PPO" and params["algorithm.ppo.learningRate"] == "0.005"
    assert params["environment.list"] == "[1,2]" and params["environment.kwargs.none"] == "null"
    assert params["empty"] == "{}"
    assert tracking.flat_params({"kwargs": {"a:b\u00e9": 1}}) == {"kwargs.a_b_": "1"}  # MLflow's name characters
    cut = params["environment.kwargs.big"]
    assert len(cut) == tracking.PARAM_VALUE_MAX and cut.endswith("... (cut here)")


def test_metrics_are_named_as_in_tensorboard_and_only_finite_numbers_go():
    row = {"iteration": 2, "env_steps": 4096, "mean_return": None, "loss": float("nan"), "approx_kl": 0.01,
           "note": "text", "flag": True}
    assert tracking.row_metrics(row) == {"run/iteration": 2.0, "rollout/env_steps": 4096.0,
                                         "train/approx_kl": 0.01}
    summary = {"evaluation": {"deterministic": {"mean_return": 500.0, "episodes": 3}}, "mean_return": 480.5}
    assert tracking.final_metrics(summary) == {"eval/deterministic/mean_return": 500.0,
                                               "eval/deterministic/episodes": 3.0}


@pytest.mark.parametrize("content", ["not json", "[1]", json.dumps({"tracking_uri": "http://other", "run_id": "abc"}),
                                     json.dumps({"tracking_uri": "http://x", "run_id": "../../etc"}),
                                     json.dumps({"tracking_uri": "http://x", "run_id": "a" * 65}),
                                     json.dumps({"tracking_uri": "http://x", "run_id": 7})])
def test_a_run_file_that_is_not_this_servers_run_starts_a_new_run(tmp_path, content):
    path = tmp_path / tracking.RUN_FILE
    path.write_text(content)
    assert tracking._earlier_run(path, "http://x") is None


def test_a_run_file_of_this_server_is_the_run_a_resume_continues(tmp_path):
    path = tmp_path / tracking.RUN_FILE
    path.write_text(json.dumps({"tracking_uri": "http://x", "run_id": "0123abcd"}))
    assert tracking._earlier_run(path, "http://x") == "0123abcd"
    assert tracking._earlier_run(tmp_path / "absent.json", "http://x") is None


def test_the_reachable_metric_is_absent_until_set():
    metrics = LearnerMetrics(JobLabels("j", "ns", "PPO", "CartPole-v1"))
    assert b"kuberl_tracker_reachable{" not in generate_latest(metrics.registry)
    assert job_status.parse_learner_metrics(generate_latest(metrics.registry).decode()).tracker_reachable is None
    metrics.set("kuberl_tracker_reachable", 0)
    text = generate_latest(metrics.registry).decode()
    assert 'kuberl_tracker_reachable{algorithm="PPO",environment="CartPole-v1",job_name="j",namespace="ns"} 0.0' in text
    assert job_status.parse_learner_metrics(text, job_name="j").tracker_reachable is False


def _pass(job, reachable: bool | None, status=None):
    metrics = LearnerMetrics(JobLabels("cartpole-ppo", "default", "PPO", "CartPole-v1"))
    metrics.inc("kuberl_iterations_total", 3)
    if reachable is not None:
        metrics.set("kuberl_tracker_reachable", float(reachable))
    report = job_status.parse_learner_metrics(generate_latest(metrics.registry).decode(), job_name="cartpole-ppo")
    return lifecycle.plan(meta=JobMeta("cartpole-ppo", "default", "uid-1", 1), job=job, problems=[],
                          status=status or job_status.load({"phase": "Running"}),
                          pods=[PodView("cartpole-ppo-learner", Component.LEARNER, phase="Running", ip="10.0.0.9")],
                          now=job_status.now(), options=BuildOptions(), report=report).status


def test_the_jobs_status_says_whether_the_learner_reaches_its_tracker(job_dict):
    job = parse_job(with_tracking(job_dict))
    down = _pass(job, False)
    condition = job_status.get_condition(down, job_status.TRACKER_REACHABLE)
    assert (condition.status, condition.reason) == ("False", "Unreachable")
    assert "spec.tracking.mlflow.trackingUri" in condition.message and "sent once" in condition.message
    up = _pass(job, True, status=down)
    assert job_status.get_condition(up, job_status.TRACKER_REACHABLE).status == "True"
    # A job without a tracker has no such condition.
    assert job_status.get_condition(_pass(parse_job(job_dict), None), job_status.TRACKER_REACHABLE) is None


def test_a_redirect_is_refused_not_followed_with_the_credentials(monkeypatch):
    """A tracker answering 302 to elsewhere: the request fails (and is tried again later); nothing goes
    to the other address."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append(self.path)
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok")
    try:
        with pytest.raises(tracking.TrackerError) as err:
            tracking.MLflowREST(f"http://127.0.0.1:{server.server_port}").call("GET", "experiments/get-by-name")
    finally:
        server.shutdown()
    assert err.value.status == 302 and seen == ["/api/2.0/mlflow/experiments/get-by-name"]


class _Answering:
    """An HTTP server on loopback answering every request with `code`; counts the requests."""

    def __init__(self, code: int):
        import http.server
        import threading

        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.requests += 1
                self.send_response(code)
                self.end_headers()

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_closing_run_tries_a_failing_tracker_at_a_pace_and_its_thread_ends_when_close_gives_up():
    server = _Answering(503)
    tracker = tracking.Tracker(server.uri, "e", "r", flush_seconds=3.0)
    try:
        tracker.log_metrics(1, {"x": 1.0})
        assert tracker.close() is False
        tracker._thread.join(30)  # at most one request in flight when close() gave up
        assert not tracker._thread.is_alive()
    finally:
        server.server.shutdown()
    # Tries at most every CLOSING_RETRY_SECONDS while closing, not a loop: 3 s give a handful, never hundreds.
    assert 1 <= server.requests <= 3 / tracking.CLOSING_RETRY_SECONDS + 3, server.requests
    assert tracker.reachable is False and not tracker.credentials_refused


def test_credentials_the_tracker_refuses_are_said_and_the_end_does_not_wait_for_them(monkeypatch, caplog):
    server = _Answering(401)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "wrong")
    tracker = tracking.Tracker(server.uri, "e", "r", flush_seconds=120.0)
    try:
        tracker.log_metrics(1, {"x": 1.0})
        started = time.monotonic()
        with caplog.at_level("WARNING", logger=tracking.log.name):
            assert tracker.close() is False
        # Waiting does not change refused credentials: close() gives them a last try, not its 120 s.
        assert time.monotonic() - started < 60
    finally:
        server.server.shutdown()
    assert tracker.credentials_refused and "HTTP 401" in tracker.last_error
    assert "spec.tracking.mlflow.credentialsSecret" in caplog.text, caplog.text

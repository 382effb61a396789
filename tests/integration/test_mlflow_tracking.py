"""Runs in a real MLflow tracking server (`mlflow server` from PyPI, SQLite backend, its artifact proxy on
loopback), read back with MLflow's own client: a run's job as parameters, every iteration's metrics at its
env steps, the run's files and its exported policy as artifacts; a sweep as a parent run with a child per
trial; a tracker that is down while a run trains, which slows nothing and loses nothing; a server behind
MLflow's basic-auth app, which takes the run's credentials and refuses wrong ones.

The server lives in a virtualenv of its own (tools.tool_venv, every package pinned in
tests/data/mlflow-constraints.txt), installed from PyPI on first use.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time

import pytest
import yaml
from tcp_faults import TcpFaults
from tools import MLflowServer

from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train
from kuberl.trainer.tracking import RUN_FILE

pytestmark = [pytest.mark.slow]

@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mlflow_auth_server(tmp_path_factory):
    server = MLflowServer(tmp_path_factory.mktemp("mlflow-auth"), admin_password="kuberl-Admin-4-tests")
    server.start()
    yield server
    server.stop()


def tracked_job(job_dict: dict, uri: str, name: str, max_env_steps: int = 8192) -> dict:
    job_dict["metadata"]["name"] = name
    job_dict["spec"]["stopping"] = {"maxEnvSteps": max_env_steps}
    job_dict["spec"]["evaluation"] = {"episodes": 3}
    job_dict["spec"]["tracking"] = {"mlflow": {"trackingUri": uri, "experiment": "kuberl-tests"}}
    return job_dict


RUN_QUERY = """
exp = client.get_experiment_by_name("kuberl-tests")
runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`kuberl.job` = '{job}'")
run = runs[0]
history = client.get_metric_history(run.info.run_id, "rollout/env_steps")
files = []
def walk(path=None):
    for f in client.list_artifacts(run.info.run_id, path):
        walk(f.path) if f.is_dir else files.append(f.path)
walk()
summary = json.load(open(client.download_artifacts(run.info.run_id, "summary.json", dst_path=dst)))
log = open(client.download_artifacts(run.info.run_id, "learner.log", dst_path=dst)).read()
out = {"runs": len(runs), "run_id": run.info.run_id, "status": run.info.status, "name": run.info.run_name,
       "params": run.data.params, "tags": run.data.tags, "metrics": run.data.metrics,
       "steps": [[p.step, p.value] for p in history], "files": sorted(files), "summary": summary, "log": log}
"""


def test_a_run_logs_its_job_every_iteration_its_files_and_its_policy(mlflow_server, local_ray, job_dict, tmp_path):
    job = parse_job(tracked_job(job_dict, mlflow_server.uri, "tracked"))
    result = train(job, TrainOptions(run_dir=tmp_path / "run", workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert result.ok
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    seen = mlflow_server.query(RUN_QUERY, job="tracked", dst=str(tmp_path / "downloaded"))
    assert seen["runs"] == 1 and seen["status"] == "FINISHED" and seen["name"] == "tracked", seen
    # The resolved job, defaults filled in, as parameters.
    assert seen["params"]["algorithm.name"] == "PPO" and seen["params"]["environment.id"] == "CartPole-v1"
    assert seen["params"]["algorithm.ppo.learningRate"] == "0.005" and seen["params"]["stopping.maxEnvSteps"] == "8192"
    assert seen["tags"]["kuberl.algorithm"] == "PPO"
    # Every iteration, at its env steps, named as in TensorBoard.
    assert seen["steps"] == [[r["env_steps"], float(r["env_steps"])] for r in rows]
    assert seen["metrics"]["eval/deterministic/mean_return"] == pytest.approx(
        result.evaluation["deterministic"]["mean_return"])
    # The run's files and the policy `kuberl serve` runs; summary.json as the run directory has it.
    assert {"job.yaml", "summary.json", "evaluation.json", "metrics.csv", "learning_curve.svg",
            "policy/policy.json", "policy/weights.npz"} <= set(seen["files"]), seen["files"]
    assert seen["summary"] == json.loads((tmp_path / "run" / "summary.json").read_text())
    # The learner's last log lines: what happened, once the pods and their logs are gone.
    assert "training stopped: max_env_steps" in seen["log"], seen["log"][-2000:]
    # A resumed run goes on in the same MLflow run.
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["run_id"] == seen["run_id"]


def _until(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_tracker_down_while_the_run_trains_loses_nothing_and_says_so(mlflow_server, local_ray, job_dict, tmp_path):
    # Down (every connection refused) until iteration 3, then carried through.
    switch = TcpFaults(int(mlflow_server.uri.rsplit(":", 1)[1]))
    switch.always = ("refuse",)
    job = parse_job(tracked_job(job_dict, switch.endpoint, "tracked-down", max_env_steps=12_288))
    said: dict[int, float | None] = {}

    def reachable_metric(loop) -> float | None:
        for family in loop.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "kuberl_tracker_reachable":
                    return sample.value
        return None

    def on_iteration(row, loop) -> None:
        tracker = loop.report.tracker
        said[row["iteration"]] = reachable_metric(loop)
        if row["iteration"] == 1:
            # Down from the start: the tracker has tried and failed before the switch goes up.
            _until(lambda: tracker.reachable is False, 120, "the tracker to find MLflow unreachable")
        elif row["iteration"] == 3:
            assert tracker.run_id is None, "a run was made while the tracker was down"
            switch.always = None
            _until(lambda: tracker.reachable is True, 120, "the tracker to reach MLflow once it is up")

    try:
        result = train(job, TrainOptions(run_dir=tmp_path / "run", workers=2, metrics_port=0, progress=False,
                                         shutdown_ray=False, on_iteration=on_iteration))
    finally:
        switch.close()
    assert result.ok and switch.refused >= 1
    # What /metrics said, and so the job's status on a cluster: unreachable while down, then reachable.
    assert said[2] == 0.0 and said[3] == 0.0 and said[4] == 1.0, said
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    seen = mlflow_server.query(RUN_QUERY, job="tracked-down", dst=str(tmp_path / "downloaded"))
    # Nothing lost: the iterations from while it was down are there, in order, at their env steps.
    assert seen["status"] == "FINISHED" and seen["steps"] == [[r["env_steps"], float(r["env_steps"])] for r in rows]
    assert len(rows) >= 5


SWEEP_QUERY = """
exp = client.get_experiment_by_name("kuberl-tests")
parents = client.search_runs([exp.experiment_id], filter_string="tags.`kuberl.sweep` = 'tracked-sweep'")
parent = parents[0]
children = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
out = {"parents": len(parents), "status": parent.info.status, "params": parent.data.params,
       "files": sorted(f.path for f in client.list_artifacts(parent.info.run_id)),
       "children": sorted([c.info.run_name, c.info.status, c.data.params.get("seed")] for c in children)}
"""


def test_a_sweep_is_a_parent_run_with_a_child_run_per_trial(mlflow_server, tmp_path):
    sweep = {
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep", "metadata": {"name": "tracked-sweep"},
        "spec": {
            "template": {
                "algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
                "rolloutWorkers": {"replicas": 1, "envsPerWorker": 4},
                "stopping": {"maxEnvSteps": 2048}, "evaluation": {"enabled": False},
                "tracking": {"mlflow": {"trackingUri": mlflow_server.uri, "experiment": "kuberl-tests"}},
            },
            "parameters": [{"path": "algorithm.ppo.learningRate", "values": [0.0003]}],
            "seeds": 2, "maxTrials": 2, "parallelism": 1,
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(path), "--dir",
                           str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = mlflow_server.query(SWEEP_QUERY)
    assert seen["parents"] == 1 and seen["status"] == "FINISHED", seen
    assert seen["params"]["seeds"] == "2" and "template.algorithm.name" not in seen["params"], seen["params"]
    assert {"results.csv", "ranking.json"} <= set(seen["files"]), seen["files"]
    # One child per trial, each with its seed (the trial's job as its parameters).
    assert [c[1] for c in seen["children"]] == ["FINISHED", "FINISHED"], seen["children"]
    assert sorted(c[2] for c in seen["children"]) == ["0", "1"], seen["children"]


def test_a_tracker_behind_basic_auth_logs_with_the_runs_credentials_and_says_when_they_are_refused(
        mlflow_auth_server, local_ray, job_dict, tmp_path, monkeypatch):
    server = mlflow_auth_server
    trackers = []

    def keep_tracker(row, loop) -> None:
        trackers.append(loop.report.tracker)

    def run(name: str, password: str):
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", server.ADMIN)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        job = parse_job(tracked_job(copy.deepcopy(job_dict), server.uri, name, max_env_steps=4096))
        return train(job, TrainOptions(run_dir=tmp_path / name, workers=2, metrics_port=0, progress=False,
                                       shutdown_ray=False, on_iteration=keep_tracker))

    refused = run("refused", "not-the-password")
    # Training is not held up by a tracker that refuses it; the tracker says why, and stops waiting at the end.
    assert refused.ok and trackers[-1].credentials_refused and trackers[-1].reachable is False
    assert "HTTP 401" in trackers[-1].last_error, trackers[-1].last_error
    trackers[-1]._thread.join(300)  # at most one request in flight when close() gave up
    assert not trackers[-1]._thread.is_alive()
    accepted = run("accepted", server.admin_password)
    # The basic-auth app checks a password hash on every request: under load a run's requests can outlast
    # the end's 30 s wait, and a tracker that is answered goes on sending until all is there.
    trackers[-1]._thread.join(300)
    assert accepted.ok and trackers[-1].reachable is True and not trackers[-1].credentials_refused
    rows = [json.loads(line) for line in (tmp_path / "accepted" / "metrics.jsonl").read_text().splitlines()]
    seen = server.query(RUN_QUERY, job="accepted", dst=str(tmp_path / "downloaded"))
    assert seen["status"] == "FINISHED" and seen["steps"] == [[r["env_steps"], float(r["env_steps"])] for r in rows]
    assert server.query(COUNT_QUERY, job="refused") == 0


COUNT_QUERY = """
exp = client.get_experiment_by_name("kuberl-tests")
out = len(client.search_runs([exp.experiment_id], filter_string=f"tags.`kuberl.job` = '{job}'"))
"""

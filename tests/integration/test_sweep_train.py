"""`kuberl sweep` for real: a tiny PPO sweep on CartPole through the command, its trials on the embedded Ray,
the ranking and results.csv against the trials' own summaries, and a sweep interrupted then resumed without
redoing its finished trials."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from kuberl.sweep.statistics import iqm

pytestmark = [pytest.mark.integration]

SWEEP = {
    "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep", "metadata": {"name": "tiny-sweep"},
    "spec": {
        "template": {
            "algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
            "rolloutWorkers": {"replicas": 1, "envsPerWorker": 4},
            "stopping": {"maxEnvSteps": 4000}, "evaluation": {"enabled": False},
        },
        "parameters": [{"path": "algorithm.ppo.learningRate", "values": [0.0003, 0.01]}],
        "seeds": 2, "maxTrials": 4, "parallelism": 2,
    },
}


def sweep_command(path: Path, directory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(path), "--dir", str(directory), "--no-progress",
            *extra]


# A cap on a hung sweep, not a time the sweep must keep: beside a CPU hog and the rest of the suite its four
# trials took over 300 s.
@pytest.mark.timeout(1500)
def test_a_sweep_ranks_its_configurations_from_its_trials_own_summaries(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "out"
    proc = subprocess.run(sweep_command(path, out), capture_output=True, text=True, timeout=1200, cwd=tmp_path,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and {r["state"] for r in rows} == {"Succeeded"}
    assert sorted((r["algorithm.ppo.learningRate"], r["seed"]) for r in rows) == [
        ("0.0003", "0"), ("0.0003", "1"), ("0.01", "0"), ("0.01", "1")]
    for row in rows:
        run_dir = Path(row["run_dir"])
        summary = json.loads((run_dir / "summary.json").read_text())
        job = yaml.safe_load((run_dir / "job.yaml").read_text())
        # Each trial is one run of the template with its value and seed; the table is its own summary.
        assert job["spec"]["algorithm"]["ppo"]["learningRate"] == float(row["algorithm.ppo.learningRate"])
        assert job["spec"]["seed"] == int(row["seed"])
        assert float(row["mean_return"]) == summary["mean_return"] == float(row["objective"])
        assert int(row["env_steps"]) == summary["env_steps"] >= 4000
    ranking = json.loads((out / "ranking.json").read_text())["configurations"]
    assert [c["rank"] for c in ranking] == [1, 2]
    for entry in ranking:
        lr = entry["params"]["algorithm.ppo.learningRate"]
        values = [float(r["objective"]) for r in rows if float(r["algorithm.ppo.learningRate"]) == lr]
        assert sorted(entry["values"]) == sorted(values)
        assert entry["iqm"]["estimate"] == pytest.approx(iqm(values))
        assert entry["iqm"]["low"] <= entry["iqm"]["estimate"] <= entry["iqm"]["high"]
    assert ranking[0]["iqm"]["estimate"] >= ranking[1]["iqm"]["estimate"]
    assert sorted(p.name for p in (out / "curves").iterdir()) == ["configuration-0.svg", "configuration-1.svg"]
    assert "<polyline" in (out / "curves" / "configuration-0.svg").read_text()
    # The table a person reads: rounded, the best marked.
    assert "IQM" in proc.stdout and "best" in proc.stdout


# Its waits (the gate, the interrupted sweep's exit, the resumed sweep) are each capped; together they may
# outlast the suite's 600 s default on a loaded machine.
@pytest.mark.timeout(1500)
def test_resume_continues_an_interrupted_sweep_without_redoing_finished_trials(tmp_path):
    # The interrupt must find a trial running, however fast the machine: the first trial's rollout worker
    # goes through the gate, the second's waits at it (only rollout workers reset the env, each trial's
    # worker is a process of its own), so the sweep is held with one trial finished and one started.
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "pass").touch()
    data = json.loads(json.dumps(SWEEP))
    data["spec"].update(parallelism=1)
    template = data["spec"]["template"]
    template["stopping"]["maxEnvSteps"] = 3000
    template["environment"] = {"id": "user_envs:GatedCartPole", "kwargs": {"gate": str(gate)},
                               "maxEpisodeSteps": 500}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    # The sweep's Ray hands its sys.path to the rollout workers: they import user_envs too.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                                      os.environ.get("PYTHONPATH")]))}
    # A file, not a pipe nobody reads while the sweep runs: a full pipe would hold the sweep up.
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("wb") as stderr_file:
        proc = subprocess.Popen(sweep_command(path, out), stdout=subprocess.DEVNULL, stderr=stderr_file,
                                cwd=tmp_path, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not (gate / "waiting").exists():
            time.sleep(0.2)
        assert (gate / "waiting").exists(), stderr_path.read_text(errors="replace")[-3000:]
        assert (out / "trials" / "t0000" / "summary.json").exists(), stderr_path.read_text(errors="replace")[-3000:]
        os.kill(proc.pid, signal.SIGINT)
        # The sweep stops its Ray (every process of it) before it exits: under the rest of the suite's load
        # that took longer than 2 minutes once, so the cap is generous; a sweep that works exits in seconds.
        proc.wait(timeout=420)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        (gate / "release").touch()
    stderr = stderr_path.read_bytes()
    assert proc.returncode == 130, stderr[-3000:]
    assert b"--resume" in stderr
    first = (out / "trials" / "t0000" / "summary.json").stat().st_mtime_ns

    again = subprocess.run(sweep_command(path, out), capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=env, check=False)
    assert again.returncode == 2 and "--resume" in again.stderr  # the directory holds a sweep already
    # Three trials, each starting processes of its own: minutes on a busy machine.
    resumed = subprocess.run(sweep_command(path, out, "--resume"), capture_output=True, text=True, timeout=480,
                             cwd=tmp_path, env=env, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and {r["state"] for r in rows} == {"Succeeded"}
    assert sorted((r["algorithm.ppo.learningRate"], r["seed"]) for r in rows) == [
        ("0.0003", "0"), ("0.0003", "1"), ("0.01", "0"), ("0.01", "1")]
    assert "0" in {r["trial"] for r in rows}  # the finished trial is kept, not run again
    assert (out / "trials" / "t0000" / "summary.json").stat().st_mtime_ns == first
    assert "t0001" not in {Path(r["run_dir"]).name for r in rows}  # the interrupted one ran again as a new trial

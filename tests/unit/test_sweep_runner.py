"""The parts of `kuberl sweep` that need no training: reading a growing metrics.jsonl, the deadline, a fresh
directory against --resume, and the files written at the end (results.csv, ranking.json, the curve plots)."""

from __future__ import annotations

import csv
import json
import time

import pytest
import yaml
from conftest import REPO

from kuberl.api.sweep import parse_sweep
from kuberl.api.sweep import TrialState
from kuberl.sweep.statistics import curve_band
from kuberl.trainer.sweep import SweepOptions, SweepRun, _new_rows
from kuberl.trainer.sweep_report import TrialRow, band_svg, write_results

LR = "algorithm.ppo.learningRate"


def sweep(**spec):
    data = yaml.safe_load((REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml").read_text())
    data["spec"].update(spec)
    return parse_sweep(data)


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert _new_rows(path, 0) == ([], 0)
    path.write_text('{"env_steps": 512}\n{"env_st')
    rows, offset = _new_rows(path, 0)
    assert rows == [{"env_steps": 512}] and offset == len('{"env_steps": 512}\n')
    path.write_text('{"env_steps": 512}\n{"env_steps": 1024}\n')
    assert _new_rows(path, offset) == ([{"env_steps": 1024}], len(path.read_text()))


def test_a_sweep_directory_is_not_reused_without_resume(tmp_path):
    SweepRun(sweep(), SweepOptions(directory=tmp_path))
    with pytest.raises(FileExistsError, match="--resume"):
        SweepRun(sweep(), SweepOptions(directory=tmp_path))
    SweepRun(sweep(), SweepOptions(directory=tmp_path, resume=True))


def test_past_the_deadline_nothing_starts(tmp_path):
    run = SweepRun(sweep(activeDeadlineSeconds=1), SweepOptions(directory=tmp_path, parallel=1))
    assert run.concurrency == 1
    run.started = time.monotonic() - 2
    assert run.past_deadline()
    run.start_trials(remote=None)  # never reaches Ray
    assert run.running == {} and run.engine.trials() == []


def test_the_files_at_the_end_hold_every_trial_at_full_precision(tmp_path, capsys):
    run = SweepRun(sweep(), SweepOptions(directory=tmp_path))
    returns = {0.0003: [150.123456789, 141.2, 160.5, 152.25, 149.0], 0.0025: [230.0, 220.5, 250.0, 199.0, 260.0],
               0.01: [270.0, 265.5, 280.25, 190.0, 275.0]}
    while (info := run.engine.next_trial()) is not None:
        value = returns[info.params[LR]][info.seed]
        row = TrialRow(info, run.trial_dir(info), env_steps=30208, mean_return=value, state=TrialState.SUCCEEDED.value,
                       summary={"env_steps": 30208, "mean_return": value, "stopped_by": "max_env_steps"},
                       objective=value)
        row.run_dir.mkdir(parents=True)
        (row.run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"env_steps": step, "mean_return": value * step / 30208}) + "\n"
            for step in range(1024, 30209, 1024)))
        run.engine.finish(info.number, TrialState.SUCCEEDED, value)
        row.info = run.engine.trials()[info.number]
        run.rows[info.number] = row
    ranking = write_results(run)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 15 and rows[0]["objective"] in {repr(v) for vs in returns.values() for v in vs}
    assert "150.123456789" in (tmp_path / "results.csv").read_text()
    saved = json.loads((tmp_path / "ranking.json").read_text())
    assert [c["params"][LR] for c in saved["configurations"]] == [0.01, 0.0025, 0.0003] == \
        [r.params[LR] for r in ranking]
    assert saved["configurations"][2]["significant"] is True
    assert sorted(p.name for p in (tmp_path / "curves").iterdir()) == [f"configuration-{i}.svg" for i in range(3)]
    printed = capsys.readouterr().out
    assert "learningRate=0.01" in printed and "best" in printed and "150.123456789" not in printed


def test_the_band_plot_draws_the_mean_and_its_interval():
    band = curve_band([[(0.0, 0.0), (100.0, 10.0)], [(0.0, 2.0), (100.0, 14.0)]], points=5, resamples=200)
    svg = band_svg(band, "lr 0.01", runs=2)
    assert svg.startswith("<svg") and "<polygon" in svg and "<polyline" in svg and "2 run(s)" in svg

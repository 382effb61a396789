"""The summary table `kuberl train` prints: every number rounded for a person, each evaluation suite on one
line beside the policy's own; summary.json and evaluation.json keep every digit."""

from __future__ import annotations

import json
from pathlib import Path

from kuberl.api.job import RLTrainingJob
from kuberl.trainer.report import RunReport, _print_summary, summary_rows

RUN_DIR = Path("/runs/autoscaling-dqn")


def summary(evaluation: dict, mean_return: float | None = -181.80500000000004) -> dict:
    return {"job": "autoscaling-dqn", "stopped_by": "max_env_steps", "mean_return": mean_return,
            "ray_start_seconds": 1.2345, "wall_clock": 48.87654, "env_steps": 60_000, "episodes": 300,
            "gradient_updates": 14_500, "worker_restarts": 0, "evaluation": evaluation}


def episodes(mean: float, std: float, count: int = 20) -> dict:
    """A suite's episode summary as `evaluation.episodes.summarize` writes it."""
    return {"episodes": count, "mean_return": mean, "std_return": std, "min_return": mean - std,
            "max_return": mean + std, "mean_length": 200.0}


AUTOSCALING = {
    "deterministic": episodes(-150.21234567, 2.0999999),
    "threshold": {"baseline": "threshold", "params": {"upper": 0.7, "lower": 0.6},
                  **episodes(-207.77500000000003, 3.317510361701993),
                  "tuning_seeds": [40, 44], "tuning_mean_return": -205.12345678},
    "random": {"baseline": "random", "params": {"seed": 0}, **episodes(-310.55000000000007, 8.04123456)},
}

TICTACTOE = {
    "deterministic": episodes(0.5900000000000001, 0.7219999, count=100),
    "vs-random-first": {"opponent": "random", "agent_first": True, "games": 1000, "wins": 987, "draws": 13,
                        "losses": 0, "win_rate": 0.987, "draw_rate": 0.013, "loss_rate": 0.0},
    "vs-random-second": {"opponent": "random", "agent_first": False, "games": 1000, "wins": 912, "draws": 71,
                         "losses": 17, "win_rate": 0.912, "draw_rate": 0.071, "loss_rate": 0.017},
    "self-play": {"opponent": "self", "agent_first": True, "games": 1000, "wins": 0, "draws": 1000,
                  "losses": 0, "win_rate": 0.0, "draw_rate": 1.0, "loss_rate": 0.0, "x_wins": 0, "o_wins": 0},
}


def test_baseline_suites_read_as_a_line_each_beside_the_policys():
    rows = summary_rows(summary(AUTOSCALING), RUN_DIR)
    assert rows == [
        ("stopped by", "max_env_steps"),
        ("wall-clock", "48.9 s (Ray start 1.2 s)"),
        ("env steps", "60,000 (1,228/s)"),
        ("episodes", "300 (6.1/s)"),
        ("gradient updates", "14,500"),
        ("mean training return", "-181.8"),
        ("evaluation", "-150.2 ± 2.1 over 20 episodes"),
        ("eval: threshold", "threshold (upper 0.7, lower 0.6): -207.8 ± 3.3 over 20 episodes"),
        ("eval: random", "random (seed 0): -310.6 ± 8.0 over 20 episodes"),
        ("worker restarts", "0"),
        ("run directory", "/runs/autoscaling-dqn"),
    ]


def test_tictactoe_returns_keep_three_significant_figures_and_games_read_as_counts():
    rows = dict(summary_rows(summary(TICTACTOE, mean_return=0.9071428571428571), RUN_DIR))
    assert rows["mean training return"] == "0.907"
    assert rows["evaluation"] == "0.590 ± 0.722 over 100 episodes"
    assert rows["eval: vs-random-first"] == (
        "against random, moving first: 987 won, 13 drawn, 0 lost of 1,000 games (98.7% won)")
    assert rows["eval: vs-random-second"] == (
        "against random, moving second: 912 won, 71 drawn, 17 lost of 1,000 games (91.2% won)")
    assert rows["eval: self-play"] == (
        "against itself, as X: 0 won, 1,000 drawn, 0 lost of 1,000 games (0.0% won)")


def test_cartpole_without_suites_and_a_run_without_evaluation():
    cartpole = summary({"deterministic": episodes(500.0, 0.0, count=100)}, mean_return=487.35)
    rows = dict(summary_rows(cartpole, RUN_DIR))
    assert (rows["mean training return"], rows["evaluation"]) == ("487.4", "500.0 ± 0.0 over 100 episodes")
    assert not any(name.startswith("eval: ") for name in rows)
    rows = dict(summary_rows(summary({}, mean_return=None), RUN_DIR))
    assert (rows["mean training return"], rows["evaluation"]) == ("-", "-")


def test_the_printed_table_has_no_raw_floats(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal's width; none here
    _print_summary(summary(AUTOSCALING), RUN_DIR)
    out = capsys.readouterr().out
    cells = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines()
             if line.startswith("│")}
    assert cells["eval: threshold"] == "threshold (upper 0.7, lower 0.6): -207.8 ± 3.3 over 20 episodes"
    assert cells["eval: random"] == "random (seed 0): -310.6 ± 8.0 over 20 episodes"
    assert cells["evaluation"] == "-150.2 ± 2.1 over 20 episodes"
    assert "-207.775" not in out and "3.3175" not in out and "mean_return" not in out


def test_the_files_keep_full_precision(tmp_path, job_dict, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    job_dict["metadata"]["name"] = "autoscaling-dqn"
    report = RunReport(tmp_path, RLTrainingJob.model_validate(job_dict), progress=False)
    report.open(resumed=False)
    counters = {k: summary({})[k] for k in ("wall_clock", "env_steps", "episodes", "gradient_updates",
                                             "worker_restarts")}
    report.finish(counters, -181.80500000000004, AUTOSCALING, "max_env_steps", 1.2345)
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["threshold"]["mean_return"] == -207.77500000000003
    assert evaluation["threshold"]["std_return"] == 3.317510361701993
    assert json.loads((tmp_path / "summary.json").read_text())["mean_return"] == -181.80500000000004
    out = capsys.readouterr().out
    assert "threshold (upper 0.7, lower 0.6): -207.8 ± 3.3 over 20 episodes" in out and "-181.8 " in out

"""Tic-Tac-Toe DQN through real Ray: the example job, cut short, runs with self-play and writes its
opponent suites to evaluation.json and metrics; a slow run checks it learns to beat random play."""

from __future__ import annotations

import copy
import json

import pytest
import ray
import yaml

from conftest import REPO
from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train

EXAMPLE = yaml.safe_load((REPO / "examples" / "tictactoe-dqn.yaml").read_text())
SUITES = ("vs-random-first", "vs-random-second", "self-play")


def example(max_episodes: int, games: int | None = None, seed: int = 0) -> dict:
    job = copy.deepcopy(EXAMPLE)
    job["spec"]["stopping"] = {"maxEpisodes": max_episodes}
    job["spec"]["seed"] = seed
    if games is not None:
        for suite in job["spec"]["evaluation"]["suites"]:
            suite["episodes"] = games
    return job


def _opponent_state(worker) -> tuple:
    frozen = worker.self_play_opponent
    return (frozen.version, frozen.calls) if frozen is not None else (None, 0)


@pytest.fixture
def fresh_ray():
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_short_example_run_plays_self_play_and_reports_opponent_suites(fresh_ray, tmp_path):
    job = example(max_episodes=3_000, games=100)
    job["spec"]["rolloutWorkers"].update(replicas=2, envsPerWorker=32)
    job["spec"]["algorithm"]["dqn"].update(learningStarts=500, trainFrequency=256, batchSize=256)
    job["spec"]["environment"]["kwargs"]["opponent_refresh_updates"] = 2
    seen: dict = {"opponents": []}

    def observe(row, loop):
        seen["metrics"] = loop.metrics
        if row["gradient_updates"] > 0 and row["iteration"] % 4 == 0:
            handles = loop.workers.ready()
            seen["opponents"].append(ray.get([h.actor.run.remote(_opponent_state) for h in handles]))

    result = train(parse_job(job), TrainOptions(run_dir=tmp_path, metrics_port=0, progress=False,
                                                on_iteration=observe))
    assert result.ok and result.reason == "max_episodes"
    # Both workers hold a frozen copy, refreshed after learning began, and it has been playing.
    last = seen["opponents"][-1]
    assert len(last) == 2
    for version, calls in last:
        assert version is not None and version >= 2 and calls > 0

    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert set(SUITES) <= set(evaluation)
    for name, agent_first in zip(SUITES, (True, False, True), strict=True):
        res = evaluation[name]
        assert res["games"] == 100 and res["wins"] + res["draws"] + res["losses"] == 100, name
        assert res["agent_first"] is agent_first
        labels = {"job_name": "tictactoe-dqn", "namespace": "default", "algorithm": "DQN",
                  "environment": "kuberl/TicTacToe-v0", "suite": name}
        registry = seen["metrics"].registry
        assert registry.get_sample_value("kuberl_evaluation_win_rate", labels) == res["win_rate"]
    mirror = evaluation["self-play"]
    assert mirror["x_wins"] + mirror["draws"] + mirror["o_wins"] == 100
    assert max(mirror["x_wins"], mirror["draws"], mirror["o_wins"]) == 100  # greedy: one game, 100 times


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_third_of_the_example_budget_never_loses_moving_first(fresh_ray, tmp_path, seed):
    """30k episodes, with exploration and update rate scaled to the shorter budget (epsilon decays over
    50k env steps instead of 100k; an update per 64 env steps instead of 128)."""
    job = example(max_episodes=30_000, seed=seed)
    job["spec"]["algorithm"]["dqn"].update(explorationSteps=50_000, trainFrequency=64)
    job["spec"]["evaluation"]["suites"] = [s for s in job["spec"]["evaluation"]["suites"]
                                           if s["name"] == "vs-random-first"]
    result = train(parse_job(job), TrainOptions(run_dir=tmp_path, metrics_port=0, progress=False))
    first = result.evaluation["vs-random-first"]
    assert first["games"] == 1000
    assert first["losses"] == 0, first
    assert first["win_rate"] >= 0.95, first

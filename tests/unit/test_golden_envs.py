"""Today's envs play the golden episodes (tests/golden_envs.py) bit for bit: each single env replaying
the recorded actions, and the numpy-batched env running all of a scenario's seeds side by side
(autoreset in the same step). The recording was made with the per-env classes as they were before
the single and the batched envs shared one implementation of the rules; every single env
also passes gymnasium's env checker."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from golden_envs import SCENARIOS, ScoringOpponent, load, make_single, play
from gymnasium.utils.env_checker import check_env
from kuberl.trainer.rollout import make_vector_env


def _assert_same(recorded: dict[str, np.ndarray], replayed: dict[str, np.ndarray], where: str) -> None:
    assert sorted(replayed) == sorted(recorded), where
    for key, want in recorded.items():
        got = replayed[key]
        assert got.dtype == want.dtype, (where, key, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"{where} {key}")


@pytest.mark.parametrize("name", SCENARIOS)
def test_single_env_replays_the_golden_episodes(name):
    scenario = SCENARIOS[name]
    for seed in scenario.seeds:
        recorded = load(name, seed)
        actions = recorded["actions"]
        replayed = play(make_single(scenario), seed, scenario.steps, lambda t, _info, a=actions: a[t])
        _assert_same(recorded, replayed, f"{name} seed {seed}")


def _obs_row(obs, i: int, prefix: str) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {f"{prefix}_{k}": v[i] for k, v in obs.items()}
    return {prefix: obs[i]}


def _recorded_obs(recorded: dict[str, np.ndarray], prefix: str, row: int) -> dict[str, np.ndarray]:
    return {k: v[row] for k, v in recorded.items() if k == prefix or k.startswith(prefix + "_")}


def _assert_info_row(info: dict, i: int, rec: dict[str, np.ndarray], prefix: str, row: int, where: str) -> None:
    """The batched info's values for copy `i` equal the recorded ones; the batched env leaves out
    the per-game strings and agent_first after an autoreset, so only the keys it has are compared
    (at least one: the action mask or the autoscaling accounting)."""
    keys = [k for k in info if not k.startswith("_") and f"{prefix}_{k}" in rec]
    assert keys, where
    for key in keys:
        np.testing.assert_array_equal(info[key][i], rec[f"{prefix}_{key}"][row], err_msg=f"{where} {key}")


@pytest.mark.parametrize("name", SCENARIOS)
def test_batched_env_replays_the_golden_episodes(name):
    """Every seed of the scenario is one copy of the batched env: step t of copy i is step t of
    seed i's recording, an episode's end puts the recorded step in final_obs and the recorded next
    reset in obs."""
    scenario = SCENARIOS[name]
    seeds = list(scenario.seeds)
    recorded = [load(name, seed) for seed in seeds]
    env = make_vector_env(scenario.env_id, scenario.kwargs, len(seeds))
    assert not isinstance(env, gym.vector.SyncVectorEnv), "the kwargs should fit the batched env"
    if scenario.opponent:
        env.set_opponent_policy(ScoringOpponent())
    obs, info = env.reset(seed=seeds)
    episode = [0] * len(seeds)
    for i, rec in enumerate(recorded):
        for key, want in _recorded_obs(rec, "reset_obs", 0).items():
            np.testing.assert_array_equal(_obs_row(obs, i, "reset_obs")[key], want, err_msg=f"{name} reset {i}")
        _assert_info_row(info, i, rec, "reset_info", 0, f"{name} reset {i}")
    for t in range(scenario.steps):
        obs, reward, terminated, truncated, info = env.step(np.stack([rec["actions"][t] for rec in recorded]))
        for i, rec in enumerate(recorded):
            where = f"{name} seed {seeds[i]} step {t}"
            assert (reward[i], terminated[i], truncated[i]) == (
                rec["reward"][t], rec["terminated"][t], rec["truncated"][t]), where
            step_obs = _recorded_obs(rec, "obs", t)
            if rec["terminated"][t] or rec["truncated"][t]:
                episode[i] += 1
                for key, want in step_obs.items():
                    np.testing.assert_array_equal(_obs_row(info["final_obs"], i, "obs")[key], want, err_msg=where)
                for key, want in _recorded_obs(rec, "reset_obs", episode[i]).items():
                    np.testing.assert_array_equal(_obs_row(obs, i, "reset_obs")[key], want, err_msg=where)
                _assert_info_row(info, i, rec, "reset_info", episode[i], where)
                _assert_info_row(info["final_info"], i, rec, "info", t, where)
            else:
                for key, want in step_obs.items():
                    np.testing.assert_array_equal(_obs_row(obs, i, "obs")[key], want, err_msg=where)
                _assert_info_row(info, i, rec, "info", t, where)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_single_env_passes_gymnasiums_env_checker(name):
    scenario = SCENARIOS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(make_single(scenario))


@pytest.mark.parametrize("name", ["autoscaling_spike_bounds", "multi_two_tiers_four_weights", "tictactoe_mix"])
def test_single_env_returns_python_numbers(name):
    """The single env's reward, flags and info are plain Python values (numpy scalars would leak
    into user code and compare differently, e.g. `is True`), as before the rewrite."""
    scenario = SCENARIOS[name]
    recorded = load(name, scenario.seeds[0])
    env = make_single(scenario)
    _, info = env.reset(seed=scenario.seeds[0])
    for t in range(20):
        _, reward, terminated, truncated, info = env.step(recorded["actions"][t])
        assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
        for key, value in info.items():
            assert not isinstance(value, np.generic), (key, type(value))
        if terminated or truncated:
            _, info = env.reset()

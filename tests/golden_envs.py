"""Golden episodes of KubeRL's envs: the scenarios, the loop that plays them, and the recorder.

tests/data/golden_envs.npz holds what the per-env classes played before the per-env and the
numpy-batched implementations became one; tests/unit/test_golden_envs.py replays the recorded
actions on today's envs and asserts every observation, reward, flag and info value is the same, bit
for bit. Regenerate only when a rule changes on purpose:

    .venv/bin/python tests/golden_envs.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import kuberl.trainer.envs  # noqa: F401  (importing registers the ids)
import numpy as np

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_envs.npz"

TTT, AUTO, MULTI = "kuberl/TicTacToe-v0", "kuberl/Autoscaling-v0", "kuberl/AutoscalingMulti-v0"


@dataclass(frozen=True)
class Scenario:
    env_id: str
    kwargs: dict[str, Any]
    seeds: tuple[int, ...]
    steps: int
    opponent: bool = False
    """Tic-Tac-Toe: install ScoringOpponent before the first reset."""


SCENARIOS = {
    "autoscaling_default": Scenario(AUTO, {}, (0, 7), 210),
    "autoscaling_spike_bounds": Scenario(AUTO, {
        "load_pattern": "SPIKE", "startup_delay": 0, "max_queue": 30.0, "episode_length": 40,
        "min_instances": 2, "max_instances": 8}, (3, 4), 100),
    "autoscaling_random_walk": Scenario(AUTO, {
        "load_pattern": "RANDOM", "initial_instances": 4, "episode_length": 30,
        "load_params": {"base_load": 80.0, "period": 12}}, (5,), 70),
    "autoscaling_poisson": Scenario(AUTO, {"load_pattern": "POISSON", "episode_length": 25}, (6,), 60),
    "autoscaling_sinusoidal": Scenario(AUTO, {
        "load_pattern": "SINUSOIDAL", "episode_length": 25, "startup_delay": 1, "instance_cost": 0.3,
        "slo_violation_penalty": 2.0, "drop_penalty": 0.1}, (8,), 60),
    "autoscaling_steady_no_queue": Scenario(AUTO, {
        "load_pattern": "STEADY", "load_params": {"noise": 0.0}, "max_queue": 0.0, "episode_length": 20,
        "max_instances": 6}, (9,), 45),
    "autoscaling_long_boot": Scenario(AUTO, {"startup_delay": 70, "episode_length": 80, "max_instances": 40},
                                      (1,), 170),
    "multi_default": Scenario(MULTI, {}, (0, 1), 210),
    "multi_flat": Scenario(MULTI, {
        "observation_split": False, "startup_delay": 0, "initial_instances": 3, "episode_length": 25},
        (2, 3), 60),
    "multi_two_tiers_four_weights": Scenario(MULTI, {
        "load_pattern": "SPIKE", "tiers": [[1, 1], [3, 2.5]], "priority_weights": [0.0, 0.3, 0.7, 1.0],
        "low_priority_fraction": 0.6, "max_instances": 6, "episode_length": 30}, (4, 5), 70),
    "multi_long_boot": Scenario(MULTI, {"startup_delay": 64, "episode_length": 80, "max_instances": 30},
                                (3,), 170),
    "multi_free_tiers": Scenario(MULTI, {"tiers": [[1, 0], [2, 0]], "instance_cost": 0.0,
                                         "episode_length": 30}, (5,), 70),
    "tictactoe_random": Scenario(TTT, {}, (0, 1), 120),
    "tictactoe_alternate": Scenario(TTT, {"agent_first": "alternate"}, (2,), 80),
    "tictactoe_mix": Scenario(TTT, {
        "agent_first": "random", "opponent": "mix", "opponent_mix": 0.4, "opponent_epsilon": 0.3},
        (3, 4), 150, opponent=True),
    "tictactoe_self_second": Scenario(TTT, {
        "agent_first": False, "opponent": "self", "opponent_epsilon": 0.5, "illegal_move_reward": -2.0},
        (5,), 100, opponent=True),
    "tictactoe_self_fallback": Scenario(TTT, {"opponent": "self"}, (6,), 60),
    "tictactoe_self_alternate": Scenario(TTT, {"agent_first": "alternate", "opponent": "self"}, (7,), 60,
                                         opponent=True),
}


class ScoringOpponent:
    """A deterministic "self" opponent: the free cell with the highest fixed score (nudged by the
    opponent's own marks), one game per call or all games at once (`batch`)."""

    SCORES = np.array([3.0, 1.0, 3.5, 1.5, 4.0, 0.5, 2.5, 2.0, 3.2])

    def __call__(self, obs, mask):
        return int(np.argmax(np.where(mask, self.SCORES + obs[:9] * 0.1, -np.inf)))

    def batch(self, obs, mask):
        return np.argmax(np.where(mask, self.SCORES + obs[:, :9] * 0.1, -np.inf), axis=1)


def make_single(scenario: Scenario):
    env = gym.make(scenario.env_id, **scenario.kwargs).unwrapped
    if scenario.opponent:
        env.set_opponent_policy(ScoringOpponent())
    return env


def _flat_obs(prefix: str, obs) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {f"{prefix}_{k}": np.asarray(v) for k, v in obs.items()}
    return {prefix: np.asarray(obs)}


def play(env, seed: int, steps: int, choose: Callable[[int, dict], Any]) -> dict[str, np.ndarray]:
    """`steps` steps of one env: reset(seed) first, reset() after every episode end (as a vector env
    autoresets). Returns stacked arrays: actions, obs, reward, terminated, truncated, info_<key>,
    and reset_obs / reset_info_<key> for each reset."""
    rows: dict[str, list] = {}

    def add(values: dict[str, Any]) -> None:
        for k, v in values.items():
            rows.setdefault(k, []).append(v)

    obs, info = env.reset(seed=seed)
    add({**_flat_obs("reset_obs", obs), **{f"reset_info_{k}": v for k, v in info.items()}})
    for t in range(steps):
        action = choose(t, info)
        obs, reward, terminated, truncated, info = env.step(action)
        add({"actions": np.asarray(action), **_flat_obs("obs", obs), "reward": reward,
             "terminated": terminated, "truncated": truncated, **{f"info_{k}": v for k, v in info.items()}})
        if terminated or truncated:
            obs, info = env.reset()
            add({**_flat_obs("reset_obs", obs), **{f"reset_info_{k}": v for k, v in info.items()}})
    return {k: np.asarray(v) for k, v in rows.items()}


def random_actions(scenario: Scenario, env, seed: int) -> Callable[[int, dict], Any]:
    """What the recorder plays: uniform actions; Tic-Tac-Toe mostly over free cells, ~3% of moves on
    any cell (so illegal moves are recorded too)."""
    rng = np.random.default_rng(1000 + seed)

    def choose(t: int, info: dict):
        if scenario.env_id == TTT:
            scores = rng.random(9) + np.where(info["action_mask"], 1.0, 0.0) * (rng.random() > 0.03)
            return int(np.argmax(scores))
        space = env.action_space
        if isinstance(space, gym.spaces.MultiDiscrete):
            return rng.integers(0, space.nvec)
        return int(rng.integers(0, space.n))

    return choose


def record() -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for name, scenario in SCENARIOS.items():
        arrays[f"{name}/kwargs"] = np.array(json.dumps(scenario.kwargs, sort_keys=True))
        for seed in scenario.seeds:
            env = make_single(scenario)
            episode = play(env, seed, scenario.steps, random_actions(scenario, env, seed))
            for k, v in episode.items():
                arrays[f"{name}/{seed}/{k}"] = v
    return arrays


def load(name: str, seed: int) -> dict[str, np.ndarray]:
    """The recorded arrays of one scenario's seed, keyed as `play` returns them."""
    prefix = f"{name}/{seed}/"
    with np.load(GOLDEN, allow_pickle=False) as data:
        recorded_kwargs = json.loads(str(data[f"{name}/kwargs"]))
        if recorded_kwargs != json.loads(json.dumps(SCENARIOS[name].kwargs, sort_keys=True)):
            raise ValueError(f"scenario {name!r}: kwargs differ from the recording ({recorded_kwargs})")
        return {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    out = record()
    np.savez_compressed(GOLDEN, **out)
    print(f"wrote {GOLDEN}: {len(out)} arrays, {GOLDEN.stat().st_size} bytes")

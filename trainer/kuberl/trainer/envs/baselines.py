"""Non-learning policies to compare learners against: threshold autoscalers, random, Tic-Tac-Toe opponents.

Autoscaling policies are callables `policy(obs) -> action`; Tic-Tac-Toe policies are callables
`policy(obs, mask) -> cell`, the same shape as the env's opponent and the learner's frozen copy.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import gymnasium as gym
import numpy as np

import kuberl.trainer.envs  # noqa: F401  (registers the env ids)
from kuberl.trainer.envs.autoscaling import (
    ACTION_ADD,
    ACTION_KEEP,
    ACTION_REMOVE,
    MICRO_NAMES,
    MICRO_UTILISATION,
    OBS_UTILISATION,
)
from kuberl.trainer.envs.tictactoe import LINES, RandomMovePolicy, winner

AUTOSCALING_ID = "kuberl/Autoscaling-v0"
AUTOSCALING_MULTI_ID = "kuberl/AutoscalingMulti-v0"


class ThresholdPolicy:
    """Scale out above `upper` utilisation, in below `lower`, else keep (Autoscaling-v0).

    Reads `obs[OBS_UTILISATION]`: demand over the capacity of running AND booting instances, so
    one burst of load asks for capacity once instead of once per step of the boot delay, the way
    a step-scaling policy with a cooldown behaves.
    """

    def __init__(self, upper: float = 0.8, lower: float = 0.3) -> None:
        if not lower < upper:
            raise ValueError(f"lower={lower!r}: must be below upper={upper!r}")
        self.upper, self.lower = float(upper), float(lower)

    def decide(self, utilisation: float) -> int:
        if utilisation > self.upper:
            return ACTION_ADD
        if utilisation < self.lower:
            return ACTION_REMOVE
        return ACTION_KEEP

    def __call__(self, obs: np.ndarray) -> int:
        return self.decide(float(obs[OBS_UTILISATION]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(upper={self.upper}, lower={self.lower})"


class MultiThresholdPolicy(ThresholdPolicy):
    """ThresholdPolicy for AutoscalingMulti-v0: instances by threshold, tier and priority fixed.

    Reads the micro part's utilisation (`MICRO_UTILISATION`), from a Dict or a flat observation.
    """

    def __init__(self, upper: float = 0.8, lower: float = 0.3, tier: int = 0, priority: int = 0) -> None:
        super().__init__(upper, lower)
        self.tier, self.priority = int(tier), int(priority)

    def __call__(self, obs: Any) -> np.ndarray:
        if isinstance(obs, Mapping):
            utilisation = obs["micro"][MICRO_UTILISATION]
        else:  # flat: macro then micro, so count from the end
            utilisation = obs[MICRO_UTILISATION - len(MICRO_NAMES)]
        return np.array([self.decide(float(utilisation)), self.tier, self.priority], dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(upper={self.upper}, lower={self.lower}, "
            f"tier={self.tier}, priority={self.priority})"
        )


class RandomPolicy:
    """Uniformly random actions from `action_space`, reproducible under `seed`."""

    def __init__(self, action_space: gym.Space, seed: int | None = None) -> None:
        self.action_space = action_space
        self.action_space.seed(seed)

    def __call__(self, obs: Any) -> Any:
        return self.action_space.sample()


def run_episode(env: gym.Env, policy: Callable[[Any], Any], seed: int | None) -> tuple[float, dict[str, float]]:
    """Play one episode; returns (return, totals of the numeric per-step info entries)."""
    obs, _ = env.reset(seed=seed)
    total = 0.0
    totals: dict[str, float] = {}
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        total += float(reward)
        for key in ("served", "dropped", "cost_instances", "cost_slo", "cost_dropped", "slo_violation"):
            if key in info:
                totals[key] = totals.get(key, 0.0) + float(info[key])
        if terminated or truncated:
            return total, totals


def evaluate_policy(
    env_id: str, env_kwargs: Mapping[str, Any] | None, policy: Callable[[Any], Any], seeds: Iterable[int]
) -> float:
    """Mean episode return of `policy`, one episode per seed (the env is reset with that seed)."""
    env = gym.make(env_id, disable_env_checker=True, **dict(env_kwargs or {}))
    try:
        returns = [run_episode(env, policy, seed)[0] for seed in seeds]
    finally:
        env.close()
    if not returns:
        raise ValueError("seeds is empty: evaluate_policy needs at least one seed")
    return float(np.mean(returns))


def grid_search_thresholds(
    env_kwargs: Mapping[str, Any] | None,
    uppers: Sequence[float],
    lowers: Sequence[float],
    seeds: Sequence[int],
    env_id: str = AUTOSCALING_ID,
) -> tuple[float, float, float]:
    """Best (upper, lower, mean_return) over the grid, each pair evaluated on every seed.

    Pairs with lower >= upper are skipped. On AutoscalingMulti-v0 the MultiThresholdPolicy keeps
    tier 0 and priority level 0.
    """
    make = MultiThresholdPolicy if env_id == AUTOSCALING_MULTI_ID else ThresholdPolicy
    best: tuple[float, float, float] | None = None
    for upper, lower in itertools.product(uppers, lowers):
        if lower >= upper:
            continue
        score = evaluate_policy(env_id, env_kwargs, make(upper, lower), seeds)
        if best is None or score > best[2]:
            best = (float(upper), float(lower), score)
    if best is None:
        raise ValueError(f"no pair in uppers={list(uppers)!r} x lowers={list(lowers)!r} has lower < upper")
    return best

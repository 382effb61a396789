"""Non-learning policies to compare learners against: threshold autoscalers, random, Tic-Tac-Toe opponents.

Autoscaling policies are callables `policy(obs) -> action`; Tic-Tac-Toe policies are callables
`policy(obs, mask) -> cell`, the same shape as the env's opponent and the learner's frozen copy.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from kuberl.trainer.envs import AUTOSCALING_ID, AUTOSCALING_MULTI_ID  # importing registers the ids
from kuberl.trainer.envs.autoscaling import (
    ACTION_ADD,
    ACTION_KEEP,
    ACTION_REMOVE,
    MICRO_NAMES,
    MICRO_UTILISATION,
    OBS_UTILISATION,
)
from kuberl.trainer.envs.tictactoe import RandomMovePolicy, winner


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


def run_episode(
    env: gym.Env, policy: Callable[[Any], Any], seed: int | None
) -> tuple[float, dict[str, float]]:
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


def grid_search_multi_thresholds(
    env_kwargs: Mapping[str, Any] | None,
    uppers: Sequence[float],
    lowers: Sequence[float],
    seeds: Sequence[int],
    tiers: Sequence[int] = (0,),
    priorities: Sequence[int] = (0,),
) -> tuple[float, float, int, int, float]:
    """Best (upper, lower, tier, priority, mean_return) of MultiThresholdPolicy on AutoscalingMulti-v0.

    Searching tiers and priorities too gives the fair baseline for a multi-dimensional learner:
    the best fixed tier and priority setting with threshold-driven instance counts.
    """
    best: tuple[float, float, int, int, float] | None = None
    for upper, lower, tier, priority in itertools.product(uppers, lowers, tiers, priorities):
        if lower >= upper:
            continue
        policy = MultiThresholdPolicy(upper, lower, tier=tier, priority=priority)
        score = evaluate_policy(AUTOSCALING_MULTI_ID, env_kwargs, policy, seeds)
        if best is None or score > best[4]:
            best = (float(upper), float(lower), int(tier), int(priority), score)
    if best is None:
        raise ValueError(f"no pair in uppers={list(uppers)!r} x lowers={list(lowers)!r} has lower < upper")
    return best


# --- Tic-Tac-Toe opponents: callables (obs, mask) -> cell ---------------------------------------


class MinimaxPolicy:
    """Perfect play by exhaustive search (memoised over the 5,478 reachable boards): never loses.

    Among equally good cells it takes the lowest one, or a random one when `seed` is given, so
    that games against it differ.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed) if seed is not None else None

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> int:
        # The observation is from the mover's side: plane 0 its marks (+1), plane 1 the opponent's.
        board = tuple(int(obs[i] > 0.5) - int(obs[9 + i] > 0.5) for i in range(9))
        best = _best_cells(board)
        if self._rng is None:
            return best[0]
        return self._rng.choice(best)


@functools.cache
def _value(board: tuple[int, ...]) -> int:
    """Game value for the player to move (+1 win, 0 draw, -1 loss); that player marks +1."""
    result = winner(board)
    if result is not None:
        return result  # the opponent just moved, so a line can only be theirs (-1), or a draw
    flipped = tuple(-c for c in board)
    return max(-_value(flipped[:i] + (-1,) + flipped[i + 1 :]) for i in range(9) if board[i] == 0)


@functools.cache
def _best_cells(board: tuple[int, ...]) -> tuple[int, ...]:
    flipped = tuple(-c for c in board)
    scores = {i: -_value(flipped[:i] + (-1,) + flipped[i + 1 :]) for i in range(9) if board[i] == 0}
    top = max(scores.values())
    return tuple(i for i, v in scores.items() if v == top)


__all__ = [
    "AUTOSCALING_ID",
    "AUTOSCALING_MULTI_ID",
    "MinimaxPolicy",
    "MultiThresholdPolicy",
    "RandomMovePolicy",
    "RandomPolicy",
    "ThresholdPolicy",
    "evaluate_policy",
    "grid_search_multi_thresholds",
    "grid_search_thresholds",
    "run_episode",
]

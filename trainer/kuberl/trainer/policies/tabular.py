"""Tabular Q-learning's acting policy and the `Discretiser` both it and the learner
(`algorithms/qlearning.py`) use to turn an observation into a Q-table row."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kuberl.trainer.policies.numpy_ops import Params, masked_argmax, random_legal
from kuberl.trainer.spaces import SpaceInfo

#: Largest Q-table (states x actions) the tabular learner allocates: 80 MB of float64.
MAX_TABLE_ENTRIES = 10_000_000


class Discretiser:
    """Flat observations -> Q-table rows: a Discrete observation's index (from its one-hot), or a Box
    cut into `bins` equal-width cells per dimension between `low` and `high` (values outside are
    clipped into the edge cells). A dimension with one bin is ignored."""

    def __init__(self, bins: Sequence[int] = (), low: Sequence[float] = (), high: Sequence[float] = (),
                 discrete_n: int | None = None):
        self.discrete_n = discrete_n
        self.bins = np.asarray(bins, np.int64)
        self.low = np.asarray(low, np.float64)
        self.high = np.asarray(high, np.float64)
        self.n_states = int(discrete_n) if discrete_n is not None else int(np.prod(self.bins))

    @classmethod
    def from_spec(cls, info: SpaceInfo, bins: Sequence[int], low: Sequence[float], high: Sequence[float],
                  field: str = "spec.algorithm.qLearning") -> Discretiser:
        """Resolve a QLearningConfig's bins/low/high against the observation space; every error names
        the field, its value and what is allowed."""
        if info.obs_discrete_n is not None:
            return cls(discrete_n=info.obs_discrete_n)
        if info.obs_parts or not info.obs_low:
            raise ValueError(f"QLearning needs a Discrete or 1-D Box observation; this env's is neither "
                             f"({len(info.obs_parts)} Dict parts)")
        dims = info.obs_dim
        resolved_bins = _per_dimension(f"{field}.bins", list(bins), dims, None)
        space_low, space_high = np.asarray(info.obs_low), np.asarray(info.obs_high)
        lo = np.asarray(_per_dimension(f"{field}.low", list(low), dims, space_low), np.float64)
        hi = np.asarray(_per_dimension(f"{field}.high", list(high), dims, space_high), np.float64)
        unbounded = [i for i in range(dims) if resolved_bins[i] > 1 and not (math.isfinite(lo[i])
                                                                             and math.isfinite(hi[i]))]
        if unbounded:
            raise ValueError(
                f"{field}.low/high: observation dimensions {unbounded} have infinite bounds in the "
                f"env's Box (low={space_low[unbounded].tolist()}, high={space_high[unbounded].tolist()}); "
                "give finite low and high (one entry for all dimensions, or one per dimension) or 1 bin "
                "for those dimensions")
        bad = [i for i in range(dims) if resolved_bins[i] > 1 and not lo[i] < hi[i]]
        if bad:
            raise ValueError(f"{field}.low/high: low must be below high in dimensions {bad}, got "
                             f"low={lo[bad].tolist()}, high={hi[bad].tolist()}")
        return cls(resolved_bins, np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 1.0))

    def config(self) -> dict[str, Any]:
        return {"bins": self.bins.tolist(), "low": self.low.tolist(), "high": self.high.tolist(),
                "discrete_n": self.discrete_n}

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Row index per observation, int64 [batch]."""
        obs = np.asarray(obs)
        if self.discrete_n is not None:
            return obs.reshape(len(obs), -1).argmax(axis=1).astype(np.int64)
        width = np.maximum(self.high - self.low, 1e-12)
        cells = np.floor((obs.astype(np.float64) - self.low) / width * self.bins).astype(np.int64)
        cells = np.clip(cells, 0, self.bins - 1)
        return np.ravel_multi_index(cells.T, self.bins).astype(np.int64)


def _per_dimension(field: str, values: list, dims: int, default) -> list:
    if not values:
        if default is None:
            raise ValueError(f"{field}: a Box observation needs bins, 1 entry or {dims} (one per dimension), "
                             "got []")
        return list(default)
    if len(values) == 1:
        return values * dims
    if len(values) != dims:
        raise ValueError(f"{field}: needs 1 entry or {dims} (one per observation dimension), got "
                         f"{len(values)}: {values}")
    return values


class TabularQPolicy:
    """Epsilon-greedy over a Q-table indexed by the discretised observation."""

    kind = "tabular"

    def __init__(self, info: SpaceInfo, cfg: dict[str, Any]):
        self.info = info
        self.discretise = Discretiser(cfg["bins"], cfg["low"], cfg["high"], cfg["discrete_n"])
        self.n_actions = info.action_dims[0]
        self.table = np.zeros((self.discretise.n_states, self.n_actions), np.float32)

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> TabularQPolicy:
        return cls(info, cfg)

    def load(self, params: Params) -> None:
        self.table = params["q"]

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.table[self.discretise(obs)]

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        greedy = masked_argmax(self.q_values(obs), mask)
        if epsilon <= 0.0:
            return greedy
        explore = rng.random(len(obs)) < epsilon
        return np.where(explore, random_legal(rng, self.n_actions, len(obs), mask), greedy)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return self.act(None, obs, mask, epsilon=0.0)

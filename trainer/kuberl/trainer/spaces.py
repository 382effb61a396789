"""Observation and action space helpers shared by rollout workers (numpy) and the learner (torch).

Observations are flattened to float32 rows; a Dict observation keeps its parts in key order so a
network can encode them separately (BDQ's macro/micro split). Imports numpy and gymnasium only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class SpaceInfo:
    """What a network needs to know about an environment's spaces."""

    obs_dim: int
    obs_parts: tuple[tuple[str, int], ...] = ()  # (key, width) per Dict part, in flattening order
    action_kind: str = "Discrete"  # Discrete | MultiDiscrete | Box
    action_dims: tuple[int, ...] = ()  # Discrete: (n,); MultiDiscrete: nvec; Box: shape
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    obs_discrete_n: int | None = None  # Discrete observations (tabular methods)
    obs_low: tuple[float, ...] = field(default=())
    obs_high: tuple[float, ...] = field(default=())

    @property
    def n_actions(self) -> int:
        """Number of joint discrete actions (Discrete n, or the product of a MultiDiscrete's nvec)."""
        return int(np.prod(self.action_dims)) if self.action_kind != "Box" else 0


def _flat_width(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    raise TypeError(f"unsupported observation space {space}")


def space_info(observation_space: gym.Space, action_space: gym.Space) -> SpaceInfo:
    parts: tuple[tuple[str, int], ...] = ()
    obs_low: tuple[float, ...] = ()
    obs_high: tuple[float, ...] = ()
    discrete_n = None
    if isinstance(observation_space, gym.spaces.Dict):
        parts = tuple((key, _flat_width(sub)) for key, sub in observation_space.spaces.items())
        obs_dim = sum(w for _, w in parts)
    else:
        obs_dim = _flat_width(observation_space)
        if isinstance(observation_space, gym.spaces.Discrete):
            discrete_n = int(observation_space.n)
        if isinstance(observation_space, gym.spaces.Box):
            obs_low = tuple(float(x) for x in np.asarray(observation_space.low, dtype=np.float64).ravel())
            obs_high = tuple(float(x) for x in np.asarray(observation_space.high, dtype=np.float64).ravel())
    if isinstance(action_space, gym.spaces.Discrete):
        kind, dims = "Discrete", (int(action_space.n),)
        low = high = ()
    elif isinstance(action_space, gym.spaces.MultiDiscrete):
        kind, dims = "MultiDiscrete", tuple(int(n) for n in np.asarray(action_space.nvec).ravel())
        low = high = ()
    elif isinstance(action_space, gym.spaces.Box):
        kind, dims = "Box", tuple(int(d) for d in action_space.shape)
        low = tuple(float(x) for x in np.asarray(action_space.low).ravel())
        high = tuple(float(x) for x in np.asarray(action_space.high).ravel())
    else:
        raise TypeError(f"unsupported action space {action_space}")
    return SpaceInfo(obs_dim, parts, kind, dims, low, high, discrete_n, obs_low, obs_high)


def _flatten_part(space: gym.Space, x: np.ndarray, batch: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        out = np.zeros((batch, int(space.n)), dtype=np.float32)
        out[np.arange(batch), np.asarray(x, dtype=np.int64).reshape(batch) - int(space.start)] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiDiscrete):
        cols = []
        x = np.asarray(x, dtype=np.int64).reshape(batch, -1)
        for j, n in enumerate(np.asarray(space.nvec).ravel()):
            col = np.zeros((batch, int(n)), dtype=np.float32)
            col[np.arange(batch), x[:, j]] = 1.0
            cols.append(col)
        return np.concatenate(cols, axis=1)
    return np.asarray(x, dtype=np.float32).reshape(batch, -1)


def flatten_obs(space: gym.Space, obs, batch: int) -> np.ndarray:
    """A batch of observations from a vector env (array, or dict of arrays) as float32 [batch, obs_dim]."""
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([_flatten_part(sub, obs[key], batch) for key, sub in space.spaces.items()], axis=1)
    return _flatten_part(space, obs, batch)

"""A grid to cross: start in one corner, +1 on reaching the opposite one, -0.01 for every other step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

#: Actions 0-3: right, up, left, down, as (dx, dy).
MOVES = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]])


class GridGoal(gym.Env):
    """`size` x `size` cells; the observation is the agent's (x, y) scaled to [0, 1]. The shortest path
    takes 2 * (size - 1) steps, so the best return is 1 - 0.01 * (2 * (size - 1) - 1)."""

    def __init__(self, size: int = 4):
        if not 2 <= int(size) <= 64:
            raise ValueError(f"size must be 2 to 64 cells [given: {size!r}]")
        self.size = int(size)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.pos = np.zeros(2, dtype=np.int64)

    def _obs(self) -> np.ndarray:
        return (self.pos / (self.size - 1)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, dtype=np.int64)
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + MOVES[int(action)], 0, self.size - 1)
        done = bool((self.pos == self.size - 1).all())
        return self._obs(), 1.0 if done else -0.01, done, False, {}

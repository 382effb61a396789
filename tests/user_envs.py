"""A user's own environment, referenced from a job as `user_envs:Corridor` (module:Class)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right along a corridor of `length` cells; +1 at the end, -0.01 per step."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= self.length
        return (np.array([self.pos / self.length], np.float32), 1.0 if done else -0.01, done,
                False, {})

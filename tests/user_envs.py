"""Users' own environments, referenced from a job as `user_envs:Corridor` (module:Class); `GatedCartPole`
lets a test hold a run at a point it chooses."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


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


#: The gates this process has passed: a vector env resets each of its copies, and the first one decides.
_PASSED: set[str] = set()


class GatedCartPole(CartPoleEnv):
    """CartPole whose first reset in a process goes through a gate, the directory `gate`, that a test holds.

    The test leaves one `pass` file there: the first process to reset takes it (a rename, so only one
    can) and runs on. A process that finds none writes `waiting` and waits until the test creates
    `release`; after `wait_seconds` it raises instead, so a test that died leaves no process waiting."""

    def __init__(self, gate: str, wait_seconds: float = 600.0, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.gate = Path(gate)
        self.wait_seconds = wait_seconds

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if str(self.gate) not in _PASSED:
            _go_through(self.gate, self.wait_seconds)
            _PASSED.add(str(self.gate))
        return super().reset(seed=seed, options=options)


def _go_through(gate: Path, wait_seconds: float) -> None:
    if (gate / "release").exists():
        return
    try:
        os.rename(gate / "pass", gate / f"passed-{os.getpid()}")
        return
    except FileNotFoundError:
        pass
    (gate / "waiting").write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + wait_seconds
    while not (gate / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate}: no release within {wait_seconds:g}s")
        time.sleep(0.05)

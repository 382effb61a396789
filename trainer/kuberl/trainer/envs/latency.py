"""An environment whose step waits a configurable time, as a remote simulator or a game server does.

With it, rollout-worker counts far above the machine's cores can be measured (bench/bench_scaling.py):
a worker waiting on its simulator leaves its core to others. `LatencyEnv` is the per-env reference;
`LatencyBatch` is the same envs stepped as one batch: one request to the simulator per step of the
whole batch (one wait), as a simulator serving many envs per call answers.

Use it as `environment.id: kuberl.trainer.envs.latency:LatencyEnv` with kwargs `step_seconds` and
`episode_steps`.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


def _wait(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class LatencyEnv(gym.Env):
    """4 observations drawn from the env's generator, 2 actions, reward 1 per step, `episode_steps`
    steps per episode (terminated), every step waiting `step_seconds`."""

    metadata: dict[str, Any] = {}

    def __init__(self, step_seconds: float = 0.01, episode_steps: int = 100):
        self.step_seconds, self.episode_steps = float(step_seconds), int(episode_steps)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        _wait(self.step_seconds)
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, self.t >= self.episode_steps, False, {}


class LatencyBatch(VectorEnv):
    """`num_envs` LatencyEnvs, one wait per batch step; same observations as the per-env reference
    reset with the same seeds (SAME_STEP autoreset, like the rollout workers' SyncVectorEnv)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, step_seconds: float = 0.01, episode_steps: int = 100):
        self.num_envs = num_envs
        self.step_seconds, self.episode_steps = float(step_seconds), int(episode_steps)
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.t = np.zeros(num_envs, np.int64)
        self.rngs = [np.random.default_rng() for _ in range(num_envs)]

    def _obs(self, i: int) -> np.ndarray:
        return self.rngs[i].uniform(-1, 1, 4).astype(np.float32)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed)
            self.rngs = [gym.utils.seeding.np_random(s)[0] for s in seeds]
        self.t[:] = 0
        return np.stack([self._obs(i) for i in range(self.num_envs)]), {}

    def step(self, actions):
        _wait(self.step_seconds)
        self.t += 1
        obs = np.stack([self._obs(i) for i in range(self.num_envs)])
        terminated = self.t >= self.episode_steps
        truncated = np.zeros(self.num_envs, bool)
        info: dict[str, Any] = {}
        if terminated.any():
            info["final_obs"] = obs.copy()
            info["_final_obs"] = terminated.copy()
            info["final_info"] = {}
            info["_final_info"] = terminated.copy()
            for i in np.nonzero(terminated)[0]:
                obs[i] = self._obs(i)  # the reset observation: the reference's reset draws next
                self.t[i] = 0
        return obs, np.ones(self.num_envs), terminated, truncated, info

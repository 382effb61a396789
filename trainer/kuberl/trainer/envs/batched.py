"""Numpy-batched environments: N copies stepped with array operations instead of N Python objects.

Each one behaves as gymnasium's `SyncVectorEnv` over its per-env reference does, with
`AutoresetMode.SAME_STEP` (what the rollout workers use): an env whose episode ends is reset in the
same step, its last observation in `info["final_obs"]`. Each copy has its own random generator,
seeded as `SyncVectorEnv` seeds its copies (`seed + i`, or one seed per copy), so a batched run
and the reference run the same episodes step for step (tests/unit/test_batched_envs.py checks it).

Gymnasium's own `CartPoleVectorEnv` (`make_vec(..., vectorization_mode="vector_entry_point")`) is
as fast, but it resets an ended episode on the *next* step (a step that returns reward 0 for a
transition that never happened) and draws every copy's start from one generator, so its episodes
are not those of `CartPole-v1` reset with the same seeds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from kuberl.trainer.envs.autoscaling import AutoscalingConfig, AutoscalingMultiConfig
from kuberl.trainer.envs.seeding import per_env_seeds
from kuberl.trainer.envs.tictactoe import TicTacToeConfig


class CartPoleBatch(VectorEnv):
    """`num_envs` copies of gymnasium's CartPole-v1 (same physics, bounds, rewards, time limit)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, max_episode_steps: int = 500, sutton_barto_reward: bool = False):
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.sutton_barto_reward = sutton_barto_reward
        self.gravity, self.masscart, self.masspole = 9.8, 1.0, 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self.theta_threshold_radians = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        self.single_observation_space = CartPoleEnv().observation_space
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = np.zeros((num_envs, 4))
        self.steps = np.zeros(num_envs, np.int64)
        self._seed_all([None] * num_envs)

    # Each copy's start states come from its own generator, drawn RESET_BLOCK at a time: a generator
    # gives the same numbers in one draw of (B, 4) as in B draws of (4,), so episodes are those of the
    # reference, and an ended episode's reset is an array lookup, not a Python call per env.
    RESET_BLOCK = 64

    def _seed_all(self, seeds: list[int | None]) -> None:
        self.rngs = [gym.utils.seeding.np_random(s)[0] for s in seeds]
        self._starts = np.stack([rng.uniform(-0.05, 0.05, size=(self.RESET_BLOCK, 4)) for rng in self.rngs])
        self._next = np.zeros(self.num_envs, np.int64)

    def _reset_envs(self, idx: np.ndarray) -> None:
        # CartPoleEnv.reset: uniform(-0.05, 0.05, size=(4,)) from the env's own generator.
        self.state[idx] = self._starts[idx, self._next[idx]]
        self.steps[idx] = 0
        self._next[idx] += 1
        for i in idx[self._next[idx] == self.RESET_BLOCK]:
            self._starts[i] = self.rngs[i].uniform(-0.05, 0.05, size=(self.RESET_BLOCK, 4))
            self._next[i] = 0

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._seed_all(per_env_seeds(seed, self.num_envs))
        self._reset_envs(np.arange(self.num_envs))
        return self.state.astype(np.float32), {}

    def step(self, actions):
        actions = np.asarray(actions)
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(actions == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.stack((x, x_dot, theta, theta_dot), axis=1)
        self.steps += 1
        terminated = ((x < -self.x_threshold) | (x > self.x_threshold)
                      | (theta < -self.theta_threshold_radians) | (theta > self.theta_threshold_radians))
        truncated = self.steps >= self.max_episode_steps  # as TimeLimit: set even when terminated too
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0)
        else:
            reward = np.ones(self.num_envs)
        obs = self.state.astype(np.float32)
        info: dict[str, Any] = {}
        done = terminated | truncated
        if done.any():
            info["final_obs"] = obs.copy()
            info["_final_obs"] = done.copy()
            info["final_info"] = {}
            info["_final_info"] = done.copy()
            self._reset_envs(np.nonzero(done)[0])
            obs[done] = self.state[done].astype(np.float32)
        return obs, reward, terminated, truncated, info


def _latency(num_envs: int, max_episode_steps: int | None, **kwargs):
    from kuberl.trainer.envs.latency import LatencyBatch

    return None if max_episode_steps is not None else LatencyBatch(num_envs, **kwargs)


def _cartpole(num_envs: int, max_episode_steps: int | None, **kwargs):
    steps = max_episode_steps if max_episode_steps is not None else gym.spec("CartPole-v1").max_episode_steps
    return CartPoleBatch(num_envs, max_episode_steps=steps, **kwargs)


def _tictactoe(num_envs: int, max_episode_steps: int | None, **kwargs):
    from kuberl.trainer.envs.tictactoe import TicTacToeBatch

    return None if max_episode_steps is not None else TicTacToeBatch(num_envs, **kwargs)


_TICTACTOE_KWARGS = {f.name for f in dataclasses.fields(TicTacToeConfig)}


def _autoscaling(multi: bool):
    def factory(num_envs: int, max_episode_steps: int | None, **kwargs):
        from kuberl.trainer.envs.autoscaling import AutoscalingBatch

        return None if max_episode_steps is not None else AutoscalingBatch(num_envs, multi=multi, **kwargs)

    return factory

#: env id -> (factory of the batched version, kwargs it takes); used when the job's kwargs fit.
BATCHED = {
    "CartPole-v1": (_cartpole, {"sutton_barto_reward"}),
    "kuberl.trainer.envs.latency:LatencyEnv": (_latency, {"step_seconds", "episode_steps"}),
    "kuberl/TicTacToe-v0": (_tictactoe, _TICTACTOE_KWARGS),
    "kuberl.trainer.envs.tictactoe:TicTacToeEnv": (_tictactoe, _TICTACTOE_KWARGS),
    "kuberl/Autoscaling-v0": (_autoscaling(False), {f.name for f in dataclasses.fields(AutoscalingConfig)}),
    "kuberl/AutoscalingMulti-v0": (_autoscaling(True), {f.name for f in dataclasses.fields(AutoscalingMultiConfig)}),
}


def make_batched(env_id: str, kwargs: dict[str, Any], num_envs: int, max_episode_steps: int | None) -> VectorEnv | None:
    """The batched version of `env_id` when there is one that takes `kwargs`; else None."""
    entry = BATCHED.get(env_id)
    if entry is None or not set(kwargs) <= entry[1]:
        return None
    factory, _ = entry
    return factory(num_envs, max_episode_steps, **kwargs)

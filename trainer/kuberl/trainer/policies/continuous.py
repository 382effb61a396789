"""Acting in a bounded Box: SAC's tanh-squashed Gaussian and TD3's deterministic actor with Gaussian
noise, the numpy twins of `networks.SquashedGaussianActor` and `networks.DeterministicActor`.

`epsilon` is, as for the Q-policies, each env's chance of a uniformly random action: the learner sends
1 until learningStarts (the random warm-up), then 0. Actions come back inside the Box, so the
replay stores what the env was given."""

from __future__ import annotations

from typing import Any

import numpy as np

from kuberl.trainer.policies.numpy_ops import Params, mlp
from kuberl.trainer.spaces import SpaceInfo

#: SAC's log std range, the squashed Gaussian's (CleanRL's sac_continuous_action.py, after SpinUp); the
#: learner's `networks.SquashedGaussianActor` imports it from here (this side imports no torch).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class _BoxActor:
    kind = ""

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str):
        self.info, self.n_layers, self.activation = info, n_layers, activation
        self.low = np.asarray(info.action_low, np.float32)
        self.high = np.asarray(info.action_high, np.float32)
        self.scale, self.bias = (self.high - self.low) / 2.0, (self.high + self.low) / 2.0
        self.params: Params = {}

    def load(self, params: Params) -> None:
        self.params = params

    def with_random(self, rng: np.random.Generator, actions: np.ndarray, epsilon: float) -> np.ndarray:
        if epsilon <= 0.0:
            return actions
        uniform = rng.uniform(self.low, self.high, size=actions.shape).astype(np.float32)
        if epsilon >= 1.0:
            return uniform
        return np.where((rng.random(len(actions)) < epsilon)[:, None], uniform, actions)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError


class SquashedGaussianPolicy(_BoxActor):
    """SAC: a ~ tanh(N(mean(s), std(s))) scaled onto the Box; greedy: tanh(mean(s)) scaled."""

    kind = "sac"

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> SquashedGaussianPolicy:
        return cls(info, cfg["n_layers"], cfg["activation"])

    def mean_log_std(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = self.params
        h = mlp(p, "trunk", obs, self.n_layers, self.activation, final_act=True)
        log_std = np.tanh(h @ p["log_std.weight"].T + p["log_std.bias"])
        return h @ p["mean.weight"].T + p["mean.bias"], LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        if epsilon >= 1.0:
            return self.with_random(rng, np.empty((len(obs), len(self.low)), np.float32), epsilon)
        mean, log_std = self.mean_log_std(obs)
        u = mean + np.exp(log_std) * rng.standard_normal(mean.shape)
        return self.with_random(rng, (np.tanh(u) * self.scale + self.bias).astype(np.float32), epsilon)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        mean, _ = self.mean_log_std(obs)
        return (np.tanh(mean) * self.scale + self.bias).astype(np.float32)


class NoisyDeterministicPolicy(_BoxActor):
    """TD3: a = clip(mu(s) + N(0, explorationNoise * half range), low, high); greedy: mu(s)."""

    kind = "td3"

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str, exploration_noise: float):
        super().__init__(info, n_layers, activation)
        self.noise_std = exploration_noise * self.scale

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> NoisyDeterministicPolicy:
        return cls(info, cfg["n_layers"], cfg["activation"], float(cfg["exploration_noise"]))

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        if epsilon >= 1.0:
            return self.with_random(rng, np.empty((len(obs), len(self.low)), np.float32), epsilon)
        mu = self.greedy(obs, mask)
        noisy = np.clip(mu + rng.normal(0.0, 1.0, mu.shape) * self.noise_std, self.low, self.high)
        return self.with_random(rng, noisy.astype(np.float32), epsilon)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        out = mlp(self.params, "mu", obs, self.n_layers, self.activation)
        return (np.tanh(out) * self.scale + self.bias).astype(np.float32)

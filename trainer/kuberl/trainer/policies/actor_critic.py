"""PPO's acting policy: the numpy twin of `networks.ActorCritic`."""

from __future__ import annotations

from typing import Any

import numpy as np

from kuberl.trainer.policies.numpy_ops import Params, masked_argmax, mlp, sample_categorical
from kuberl.trainer.spaces import SpaceInfo


class ActorCriticPolicy:
    """An actor MLP producing logits (or a Gaussian mean) and a critic MLP."""

    kind = "ppo"

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str):
        self.info = info
        self.n_layers = n_layers
        self.activation = activation
        self.params: Params = {}

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> ActorCriticPolicy:
        return cls(info, cfg["n_layers"], cfg["activation"])

    def load(self, params: Params) -> None:
        self.params = params

    def value(self, obs: np.ndarray) -> np.ndarray:
        return mlp(self.params, "critic", obs, self.n_layers + 1, self.activation)[:, 0]

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, deterministic: bool = False):
        """Returns (actions, log_probs, values)."""
        out = mlp(self.params, "actor", obs, self.n_layers + 1, self.activation)
        value = self.value(obs)
        kind = self.info.action_kind
        if kind == "Discrete":
            if deterministic:
                return masked_argmax(out, mask), np.zeros(len(obs), np.float32), value
            actions, logp = sample_categorical(rng, out, mask)
            return actions, logp, value
        if kind == "MultiDiscrete":
            actions, logps, start = [], np.zeros(len(obs)), 0
            for n in self.info.action_dims:
                logits = out[:, start : start + n]
                if deterministic:
                    actions.append(logits.argmax(axis=-1))
                else:
                    a, lp = sample_categorical(rng, logits, None)
                    actions.append(a)
                    logps = logps + lp
                start += n
            return np.stack(actions, axis=1), logps, value
        # Box: diagonal Gaussian with a state-independent log std.
        log_std = self.params["log_std"]
        if deterministic:
            return out, np.zeros(len(obs)), value
        std = np.exp(log_std)
        noise = rng.standard_normal(out.shape)
        actions = out + std * noise
        logp = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(axis=-1)
        return actions, logp, value

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """The most likely action (the Gaussian's mean for a Box); draws nothing."""
        return self.act(None, obs, mask, deterministic=True)[0]

"""Epsilon-greedy acting over Q-networks, the numpy twins of `networks.QNetwork` (DQN: plain or
dueling) and `networks.BranchingQNetwork` (BDQ: one advantage branch per action dimension)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kuberl.trainer.policies.numpy_ops import Params, masked_argmax, mlp, random_legal
from kuberl.trainer.spaces import SpaceInfo


class QPolicy:
    """Epsilon-greedy over a Q-network (plain or dueling) for DQN; masked when the env gives masks."""

    kind = "dqn"

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str, dueling: bool):
        self.info = info
        self.n_layers = n_layers
        self.activation = activation
        self.dueling = dueling
        self.params: Params = {}

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> QPolicy:
        return cls(info, cfg["n_layers"], cfg["activation"], cfg["dueling"])

    def load(self, params: Params) -> None:
        self.params = params

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h = mlp(self.params, "trunk", obs, self.n_layers, self.activation, final_act=True)
        if not self.dueling:
            return h @ self.params["q.weight"].T + self.params["q.bias"]
        value = h @ self.params["value.weight"].T + self.params["value.bias"]
        adv = h @ self.params["advantage.weight"].T + self.params["advantage.bias"]
        return value + adv - adv.mean(axis=-1, keepdims=True)

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        greedy = masked_argmax(self.q_values(obs), mask)
        if epsilon <= 0.0:
            return greedy
        explore = rng.random(len(obs)) < epsilon
        if not explore.any():
            return greedy
        random_actions = random_legal(rng, self.info.action_dims[0], len(obs), mask)
        return np.where(explore, random_actions, greedy)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return self.act(None, obs, mask, epsilon=0.0)


class BranchingQPolicy:
    """BDQ's acting half: per-part encoders, trunk, value head and one advantage branch per action
    dimension; each branch takes its own argmax, and explores on its own with probability epsilon."""

    kind = "bdq"

    def __init__(self, info: SpaceInfo, cfg: dict[str, Any]):
        self.info = info
        self.parts = [(key, int(width)) for key, width in cfg["parts"]]
        self.trunk_layers = int(cfg["trunk_layers"])
        self.activation = cfg["activation"]
        self.branches = [int(n) for n in cfg["branches"]]
        self.params: Params = {}

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any]) -> BranchingQPolicy:
        return cls(info, cfg)

    def load(self, params: Params) -> None:
        self.params = params

    def q_values(self, obs: np.ndarray) -> list[np.ndarray]:
        params, act = self.params, self.activation
        if self.parts:
            pieces, start = [], 0
            for key, width in self.parts:
                pieces.append(mlp(params, f"encoders.{key}", obs[:, start : start + width], 1, act, final_act=True))
                start += width
            obs = np.concatenate(pieces, axis=1)
        h = mlp(params, "trunk", obs, self.trunk_layers, act, final_act=True)
        z = h @ params["heads.hidden.weight"].T + params["heads.hidden.bias"]
        z = np.tanh(z) if act == "tanh" else np.maximum(z, 0.0)
        z = z.reshape(len(h), len(self.branches) + 1, -1)
        out = np.einsum("bkh,khn->bkn", z, params["heads.out_weight"]) + params["heads.out_bias"]
        value = out[:, 0, :1]
        advantages = [out[:, d + 1, :n] for d, n in enumerate(self.branches)]
        return [value + adv - adv.mean(axis=1, keepdims=True) for adv in advantages]

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        """[batch] actions for a Discrete space (one branch), else [batch, branches]."""
        q = self.q_values(obs)
        columns = []
        for d, (q_d, n) in enumerate(zip(q, self.branches, strict=False)):
            branch_mask = mask if d == 0 and len(self.branches) == 1 else None
            choice = masked_argmax(q_d, branch_mask)
            if epsilon > 0.0:
                explore = rng.random(len(obs)) < epsilon
                if explore.any():
                    choice = np.where(explore, random_legal(rng, n, len(obs), branch_mask), choice)
            columns.append(choice)
        if self.info.action_kind == "Discrete":
            return columns[0]
        return np.stack(columns, axis=1)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return self.act(None, obs, mask, epsilon=0.0)

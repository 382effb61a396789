"""Tabular Q-learning over a discretised observation, on the same runtime as the deep learners.

Rollout workers act epsilon-greedily from a copy of the table (`policies.tabular.TabularQPolicy`)
and send one-step transitions; the learner applies them in the order they were collected:

    Q[s, a] += alpha * (r + gamma * (1 - done) * max_a' Q[s', a'] - Q[s, a])

A Discrete observation indexes the table directly; a Box is cut into `bins` cells per dimension
(`policies.tabular.Discretiser`). `gradient_updates` counts table updates (one per transition).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kuberl.api.job import QLearningConfig
from kuberl.trainer.algorithms.base import Algorithm, LearnStats, linear_schedule
from kuberl.trainer.policies.tabular import MAX_TABLE_ENTRIES, Discretiser

_FIELDS = ("states", "actions", "rewards", "next_states", "dones", "discounts")


class QLearning(Algorithm):
    name = "QLearning"
    on_policy = False

    def __init__(self, cfg: QLearningConfig, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        if info.action_kind != "Discrete":
            raise ValueError(f"QLearning acts in a Discrete action space, got {info.action_kind}")
        self.discretise = Discretiser.from_spec(info, cfg.bins, cfg.low, cfg.high)
        entries = self.discretise.n_states * info.action_dims[0]
        if entries > MAX_TABLE_ENTRIES:
            raise ValueError(f"spec.algorithm.qLearning.bins: {self.discretise.n_states} states x "
                             f"{info.action_dims[0]} actions = {entries} table entries, more than "
                             f"{MAX_TABLE_ENTRIES}; use fewer bins (1 ignores a dimension)")
        self.table = np.zeros((self.discretise.n_states, info.action_dims[0]), np.float64)
        # Transitions held back by the async staleness bound, applied first on the next call.
        self.pending = {k: np.zeros(0) for k in _FIELDS}

    def policy_config(self) -> dict[str, Any]:
        return {"kind": "tabular", **self.discretise.config()}

    def weights(self) -> dict[str, np.ndarray]:
        return {"q": self.table.astype(np.float32)}

    def exploration(self, env_steps: int) -> float:
        cfg = self.cfg
        duration = int(cfg.exploration_fraction * (self.total_env_steps or 100_000))
        return linear_schedule(cfg.exploration_initial, cfg.exploration_final, duration, env_steps)

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        parts = [self.pending] + [self._transitions(b) for b in batches]
        data = {k: np.concatenate([p[k] for p in parts]) for k in _FIELDS}
        n = len(data["states"]) if max_updates is None else min(len(data["states"]), max_updates)
        self.pending = {k: v[n:] for k, v in data.items()}
        sq_errors = self._apply({k: v[:n] for k, v in data.items()})
        self.gradient_updates += n
        return LearnStats(loss=float(np.mean(sq_errors)) if n else float("nan"), gradient_updates=n,
                          extra={"epsilon": self.exploration(env_steps),
                                 "states_visited": float(np.count_nonzero(self.table.any(axis=1)))})

    @property
    def updates_held_back(self) -> int:
        """Transitions the staleness bound (async collection) postponed; the next learn() applies them first."""
        return len(self.pending["states"])

    def _transitions(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        if len(batch["rewards"]) == 0:
            return {k: np.zeros(0) for k in _FIELDS}
        return {"states": self.discretise(batch["obs"]), "actions": np.asarray(batch["actions"], np.int64),
                "rewards": np.asarray(batch["rewards"], np.float64),
                "next_states": self.discretise(batch["next_obs"]),
                "dones": np.asarray(batch["dones"], np.float64),
                "discounts": np.asarray(batch["discounts"], np.float64)}

    def _apply(self, data: dict[str, np.ndarray]) -> list[float]:
        """One update per transition, in order (a later one sees an earlier one's effect)."""
        q, alpha, errors = self.table, self.cfg.learning_rate, []
        columns = [data[k].tolist() for k in _FIELDS]
        for s, a, r, s2, done, discount in zip(*columns, strict=False):
            s, a, s2 = int(s), int(a), int(s2)
            target = r if done else r + discount * q[s2].max()
            td = target - q[s, a]
            q[s, a] += alpha * td
            errors.append(td * td)
        return errors

    def state_dict(self) -> dict[str, Any]:
        return {"table": torch.from_numpy(self.table.copy()), "gradient_updates": self.gradient_updates,
                "pending": {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in self.pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table = state["table"].numpy().astype(np.float64)
        self.gradient_updates = int(state["gradient_updates"])
        self.pending = {k: state["pending"][k].numpy() for k in _FIELDS}

"""DQN: double Q-learning targets, dueling head, n-step returns, hard or Polyak target updates.

Workers act epsilon-greedily and send n-step transitions; the learner stores them in a replay
buffer preallocated on its device and, per `trainFrequency` env steps, samples `batchSize`
transitions and minimises the Huber (or MSE) TD error against

    y = R_n + gamma^k * (1 - done) * Q_target(s', argmax_a' Q_online(s', a'))   (double DQN)

with illegal actions (when the env gives an action mask) excluded from the argmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kuberl.api.job import DQNConfig
from kuberl.trainer.algorithms.base import Algorithm, LearnStats, linear_schedule, make_adam
from kuberl.trainer.buffers import ReplayBuffer
from kuberl.trainer.networks import QNetwork, numpy_params


def td_targets(q_online_next: torch.Tensor, q_target_next: torch.Tensor, rewards: torch.Tensor,
               dones: torch.Tensor, discounts: torch.Tensor, double_q: bool,
               next_masks: torch.Tensor | None = None) -> torch.Tensor:
    """n-step TD targets from next-state Q values [B, A] of the online and target networks."""
    if next_masks is not None:
        q_online_next = q_online_next.masked_fill(~next_masks, -torch.inf)
        q_target_next = q_target_next.masked_fill(~next_masks, -torch.inf)
    if double_q:
        best = q_online_next.argmax(dim=1, keepdim=True)
        next_value = q_target_next.gather(1, best).squeeze(1)
    else:
        next_value = q_target_next.max(dim=1).values
    # A terminal successor may have no legal action; its value is never used.
    next_value = torch.where(dones > 0, torch.zeros_like(next_value), next_value)
    return rewards + discounts * next_value


class DQN(Algorithm):
    name = "DQN"
    on_policy = False

    def __init__(self, cfg: DQNConfig, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        torch.manual_seed(seed)
        hidden, act = cfg.network.hidden_sizes, cfg.network.activation
        self.q = self._make_network(info, hidden, act).to(device)
        self.q_target = self._make_network(info, hidden, act).to(device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.optimizer = make_adam([*self.q.parameters(), *self.aux_parameters()], device, lr=cfg.learning_rate)
        self.buffer = self._make_buffer(info, device)
        self._steps_since_train = 0
        self._held_back = 0  # updates owed but held back by async collection's staleness bound

    def _make_network(self, info, hidden, act):
        return QNetwork(info, hidden, act, self.cfg.dueling)

    def _make_buffer(self, info, device) -> ReplayBuffer:
        return ReplayBuffer(self.cfg.buffer_size, info.obs_dim, (), device, n_actions_mask=info.action_dims[0])

    def policy_config(self) -> dict[str, Any]:
        return {"kind": "dqn", "n_layers": len(self.cfg.network.hidden_sizes),
                "activation": self.cfg.network.activation, "dueling": self.cfg.dueling}

    def weights(self) -> dict[str, np.ndarray]:
        return numpy_params(self.q)

    def exploration(self, env_steps: int) -> float:
        cfg = self.cfg
        duration = cfg.exploration_steps or int(cfg.exploration_fraction * (self.total_env_steps or 100_000))
        return linear_schedule(cfg.exploration_initial, cfg.exploration_final, duration, env_steps)

    @property
    def n_step(self) -> int:
        return self.cfg.n_step

    def updates_due(self, new_env_steps: int, env_steps: int, buffer_size: int | None = None) -> int:
        """Gradient updates owed for `new_env_steps` fresh steps (none before learningStarts, nor while a
        replay shard (`buffer_size`, this learner's own by default) holds less than one batch)."""
        buffer_size = self.buffer.size if buffer_size is None else buffer_size
        if env_steps < self.cfg.learning_starts or buffer_size < self.cfg.batch_size:
            return 0
        self._steps_since_train += new_env_steps
        calls, self._steps_since_train = divmod(self._steps_since_train, self.cfg.train_frequency)
        return calls * self.cfg.gradient_steps

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        new_steps = self.store(batches)
        updates = self.updates_owed(new_steps, env_steps, max_updates)
        return self.stats(self.apply_updates(updates), updates, env_steps)

    # learn()'s three steps; data-parallel learners (`ddp.py`) run them on every rank, with the update
    # count decided once, by rank 0, for all.
    def store(self, batches: list[dict[str, Any]]) -> int:
        """The batches into this learner's replay; returns their env steps."""
        new_steps = 0
        for b in batches:
            self.buffer.add(b)
            new_steps += int(b["env_steps"])
        return new_steps

    def updates_owed(self, new_steps: int, env_steps: int, max_updates: int | None = None,
                     buffer_size: int | None = None) -> int:
        """This call's gradient updates: those due plus those held back, capped by `max_updates`
        (async collection's staleness bound); the rest stay owed, so trainFrequency holds."""
        updates = self.updates_due(new_steps, env_steps, buffer_size) + self._held_back
        self._held_back = 0
        if max_updates is not None and updates > max_updates:
            updates, self._held_back = max_updates, updates - max_updates
        return updates

    def apply_updates(self, updates: int) -> list[float]:
        return [self.update() for _ in range(updates)]

    def stats(self, losses: list[float], updates: int, env_steps: int) -> LearnStats:
        return LearnStats(loss=float(np.mean(losses)) if losses else float("nan"), gradient_updates=updates,
                          extra={"epsilon": self.exploration(env_steps), "buffer_size": float(self.buffer.size)})

    @property
    def updates_held_back(self) -> int:
        """Updates the staleness bound (async collection) postponed; the next learn() applies them first."""
        return self._held_back

    def q_values_taken(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.q(obs).gather(1, actions.long().unsqueeze(1)).squeeze(1)

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            q_target_next = self.q_target(batch["next_obs"])
            q_online_next = self.q(batch["next_obs"]) if self.cfg.double_q else q_target_next
            return td_targets(q_online_next, q_target_next, batch["rewards"], batch["dones"],
                              batch["discounts"], self.cfg.double_q, batch.get("next_masks"))

    def update(self) -> float:
        """One gradient update on `batchSize` transitions sampled from this learner's replay."""
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, self.generator)
        target = self.targets(batch)
        predicted = self.q_values_taken(batch["obs"], batch["actions"])
        loss = F.smooth_l1_loss(predicted, target) if cfg.loss == "huber" else F.mse_loss(predicted, target)
        aux = self.aux_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        (loss if aux is None else loss + aux).backward()  # the TD loss reported is the critic's alone
        self.average_gradients([*self.q.parameters(), *self.aux_parameters()])
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.gradient_updates += 1
        self._update_target()
        return loss.item()

    def aux_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters of auxiliary heads the optimizer also steps (BDQ's preference head)."""
        return []

    def aux_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """An auxiliary loss added to the TD loss in the same backward pass (None: none)."""
        return None

    def _update_target(self) -> None:
        if self.cfg.target_update == "hard":
            if self.gradient_updates % self.cfg.target_update_interval == 0:
                self.q_target.load_state_dict(self.q.state_dict())
            return
        with torch.no_grad():
            torch._foreach_lerp_(list(self.q_target.parameters()), list(self.q.parameters()), self.cfg.tau)

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "gradient_updates": self.gradient_updates,
                "generator": self.generator.get_state(), "buffer": self.buffer.state_dict(),
                "steps_since_train": self._steps_since_train, "held_back": self._held_back}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.gradient_updates = int(state["gradient_updates"])
        self.generator.set_state(state["generator"])
        self.buffer.load_state_dict(state["buffer"])
        self._steps_since_train = int(state["steps_since_train"])
        self._held_back = int(state.get("held_back", 0))  # a checkpoint without the count owes no updates

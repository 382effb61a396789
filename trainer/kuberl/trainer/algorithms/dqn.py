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
from kuberl.trainer.algorithms.base import linear_schedule, make_adam
from kuberl.trainer.algorithms.replay import ReplayAlgorithm
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


class DQN(ReplayAlgorithm):
    name = "DQN"

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

    def extra_stats(self, env_steps: int) -> dict[str, float]:
        return {"epsilon": self.exploration(env_steps)}

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
                "optimizer": self.optimizer.state_dict(), **self.replay_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_replay_state(state)

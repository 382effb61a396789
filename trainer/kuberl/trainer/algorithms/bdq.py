"""BDQ: Branching Dueling Q-Network (Tavakoli, Pardo & Kormushev, AAAI 2018) on DQN's runtime.

A MultiDiscrete action [a_1 .. a_D] is not flattened into prod(n_d) joint actions: the network has a
shared trunk, a state value V(s) and one advantage branch per dimension, and every branch is a
small DQN head Q_d(s, a_d) = V(s) + A_d(s, a_d) - mean A_d(s, .). Targets follow the paper, double-Q
style (the online net picks each branch's action, the target net values it):

    q_d' = Q_target_d(s', argmax_a Q_online_d(s', a))
    mean:        y   = R_n + gamma^k (1 - done) * (1/D) sum_d q_d'     (the paper's choice)
    max:         y   = R_n + gamma^k (1 - done) * max_d q_d'
    independent: y_d = R_n + gamma^k (1 - done) * q_d'

and the loss is the TD loss averaged over branches (and the batch). Replay, n-step returns,
epsilon schedule (per branch, in the workers) and target updates are DQN's. A Discrete action
space is one branch: a dueling DQN with a deeper head.
"""

from __future__ import annotations

from typing import Any

import torch

from kuberl.api.job import BDQConfig
from kuberl.trainer.algorithms.dqn import DQN
from kuberl.trainer.buffers import ReplayBuffer
from kuberl.trainer.networks import BranchingQNetwork, branch_sizes, encoded_parts, trunk_width
from kuberl.trainer.preferences.aligner import PreferenceAligner


def bdq_targets(q_online_next: list[torch.Tensor], q_target_next: list[torch.Tensor], rewards: torch.Tensor,
                dones: torch.Tensor, discounts: torch.Tensor, aggregation: str, double_q: bool = True,
                next_masks: torch.Tensor | None = None) -> torch.Tensor:
    """Per-branch TD targets [B, D] from each branch's next-state Q values [B, n_d].

    `next_masks` (legal next actions) applies to a single-branch (Discrete) space only.
    """
    values = []
    for _d, (q_on, q_tg) in enumerate(zip(q_online_next, q_target_next, strict=False)):
        if next_masks is not None and len(q_target_next) == 1:
            q_on = q_on.masked_fill(~next_masks, -torch.inf)
            q_tg = q_tg.masked_fill(~next_masks, -torch.inf)
        if double_q:
            values.append(q_tg.gather(1, q_on.argmax(dim=1, keepdim=True)).squeeze(1))
        else:
            values.append(q_tg.max(dim=1).values)
    per_branch = torch.stack(values, dim=1)
    if aggregation == "mean":
        next_value = per_branch.mean(dim=1, keepdim=True).expand_as(per_branch)
    elif aggregation == "max":
        next_value = per_branch.max(dim=1, keepdim=True).values.expand_as(per_branch)
    elif aggregation == "independent":
        next_value = per_branch
    else:
        raise ValueError(f"targetAggregation={aggregation!r}; allowed values: mean, max, independent")
    # A terminal successor's value is never used (and may be -inf where no action is legal).
    next_value = torch.where(dones[:, None] > 0, torch.zeros_like(next_value), next_value)
    return rewards[:, None] + discounts[:, None] * next_value


class BDQ(DQN):
    name = "BDQ"

    def __init__(self, cfg: BDQConfig, info, device, seed, total_env_steps):
        self.branches = branch_sizes(info)
        self.preference = None
        if cfg.preference is not None:  # built first: DQN's optimizer steps its parameters too
            width = trunk_width(info, cfg.network.hidden_sizes)
            self.preference = PreferenceAligner(cfg.preference, info.obs_dim, width, self.branches, device, seed)
        super().__init__(cfg, info, device, seed, total_env_steps)

    # ---- the preference head (preferences/aligner.py): its hooks into DQN's runtime ----------------

    @property
    def records_steps(self) -> bool:
        return self.preference is not None

    def attach_run_dir(self, run_dir) -> None:
        if self.preference is not None:
            self.preference.attach_run_dir(run_dir)

    def aux_parameters(self) -> list[torch.nn.Parameter]:
        return [] if self.preference is None else list(self.preference.head.parameters())

    def aux_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return None if self.preference is None else self.preference.loss(self.q.features)

    def learn(self, batches, env_steps, max_updates=None):
        if self.preference is None:
            return super().learn(batches, env_steps, max_updates)
        self.preference.ingest(batches)  # takes the batches' per-step records out
        stats = super().learn(batches, env_steps, max_updates)
        stats.extra.update(self.preference.stats(self.q.features))
        return stats

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.preference is not None:
            state["preference"] = self.preference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.preference is not None and "preference" in state:
            self.preference.load_state_dict(state["preference"])

    def _make_network(self, info, hidden, act):
        return BranchingQNetwork(info, hidden, act, self.cfg.branch_hidden_size)

    def _make_buffer(self, info, device) -> ReplayBuffer:
        mask_width = info.action_dims[0] if info.action_kind == "Discrete" else None
        return ReplayBuffer(self.cfg.buffer_size, info.obs_dim, (len(self.branches),), device,
                            n_actions_mask=mask_width)

    def policy_config(self) -> dict[str, Any]:
        hidden = self.cfg.network.hidden_sizes
        parts = encoded_parts(self.info)
        return {"kind": "bdq", "parts": [list(p) for p in parts],
                "trunk_layers": len(hidden) - 1 if parts else len(hidden),
                "activation": self.cfg.network.activation, "branches": list(self.branches)}

    def q_values_taken(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q_d(s, a_d) for every branch, [B, D]: DQN's update averages the TD loss over both axes."""
        actions = actions.long().reshape(len(obs), len(self.branches))
        return torch.stack([q_d.gather(1, actions[:, d : d + 1]).squeeze(1)
                            for d, q_d in enumerate(self.q(obs))], dim=1)

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            q_target_next = self.q_target(batch["next_obs"])
            q_online_next = self.q(batch["next_obs"]) if self.cfg.double_q else q_target_next
            rewards = batch["rewards"]
            if self.preference is not None:  # rewardShaping > 0 only
                rewards = self.preference.shaped_rewards(self.q.features, batch["obs"], batch["actions"], rewards)
            return bdq_targets(q_online_next, q_target_next, rewards, batch["dones"],
                               batch["discounts"], self.cfg.target_aggregation, self.cfg.double_q,
                               batch.get("next_masks"))

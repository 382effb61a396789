"""The Branching Dueling Q-Network (Tavakoli et al., 2018) the BDQ learner trains.

    obs -> [per-part encoders, concatenated] -> shared trunk -> value head V(s)
                                                             -> advantage branch d: A_d(s, .)
    Q_d(s, a_d) = V(s) + A_d(s, a_d) - mean_a A_d(s, a)

A Dict observation (AutoscalingMulti-v0's "macro" and "micro") gets one encoder per part, so fast
local signals are not drowned by the platform-wide ones before they meet. Parameter names match
`policy_registry.BranchingQPolicy`'s numpy twin.
"""

from __future__ import annotations

import torch
from torch import nn

from kuberl.trainer.networks import MLP
from kuberl.trainer.spaces import SpaceInfo


def branch_sizes(info: SpaceInfo) -> tuple[int, ...]:
    """Actions per branch: a MultiDiscrete's nvec, or one branch for a Discrete space."""
    if info.action_kind not in ("Discrete", "MultiDiscrete"):
        raise ValueError(f"BDQ acts in Discrete or MultiDiscrete action spaces, got {info.action_kind}")
    return tuple(info.action_dims)


def encoded_parts(info: SpaceInfo) -> tuple[tuple[str, int], ...]:
    """The observation parts that get their own encoder: every part of a Dict with more than one."""
    return info.obs_parts if len(info.obs_parts) > 1 else ()


class BranchingQNetwork(nn.Module):
    """Per-branch Q values, a list of [batch, n_d] tensors (branches may differ in size)."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str, branch_hidden: int):
        super().__init__()
        self.parts = encoded_parts(info)
        if self.parts:
            # The first hidden width is each encoder's; the trunk continues from their concatenation.
            self.encoders = nn.ModuleDict(
                {key: MLP([width, hidden[0]], activation, final_act=True) for key, width in self.parts}
            )
            trunk_sizes = [hidden[0] * len(self.parts), *hidden[1:]]
        else:
            trunk_sizes = [info.obs_dim, *hidden]
        self.trunk = MLP(trunk_sizes, activation, final_act=True)
        width = trunk_sizes[-1]
        self.value = MLP([width, branch_hidden, 1], activation, last_std=1.0)
        self.branches = nn.ModuleList(
            MLP([width, branch_hidden, n], activation, last_std=1.0) for n in branch_sizes(info)
        )

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.parts:
            pieces, start = [], 0
            for key, width in self.parts:
                pieces.append(self.encoders[key](obs[:, start : start + width]))
                start += width
            obs = torch.cat(pieces, dim=1)
        return self.trunk(obs)

    def forward(self, obs: torch.Tensor) -> list[torch.Tensor]:
        h = self.features(obs)
        value = self.value(h)
        out = []
        for branch in self.branches:
            adv = branch(h)
            out.append(value + adv - adv.mean(dim=1, keepdim=True))
        return out

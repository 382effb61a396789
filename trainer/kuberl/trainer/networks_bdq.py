"""The Branching Dueling Q-Network (Tavakoli et al., 2018) the BDQ learner trains.

    obs -> [per-part encoders, concatenated] -> shared trunk -> value head V(s)         (2 layers)
                                                             -> advantage branch d: A_d(s, .)  (2 layers)
    Q_d(s, a_d) = V(s) + A_d(s, a_d) - mean_a A_d(s, a)

A Dict observation (AutoscalingMulti-v0's "macro" and "micro") gets one encoder per part, so fast
local signals are not drowned by the platform-wide ones before they meet. Parameter names match
`policy_registry.BranchingQPolicy`'s numpy twin.
"""

from __future__ import annotations

import torch
from torch import nn

from kuberl.trainer.networks import MLP, _activation, _layer_init
from kuberl.trainer.spaces import SpaceInfo


def branch_sizes(info: SpaceInfo) -> tuple[int, ...]:
    """Actions per branch: a MultiDiscrete's nvec, or one branch for a Discrete space."""
    if info.action_kind not in ("Discrete", "MultiDiscrete"):
        raise ValueError(f"BDQ acts in Discrete or MultiDiscrete action spaces, got {info.action_kind}")
    return tuple(info.action_dims)


def encoded_parts(info: SpaceInfo) -> tuple[tuple[str, int], ...]:
    """The observation parts that get their own encoder: every part of a Dict with more than one."""
    return info.obs_parts if len(info.obs_parts) > 1 else ()


class BranchHeads(nn.Module):
    """The value head and every advantage branch, each a 2-layer MLP, computed as two batched layers:
    one Linear to all their hidden units, then each head's own output weights in one einsum (fewer,
    larger ops: a CPU learner's update was ~25% faster than with one module per head). Outputs are
    padded to the widest branch; padding never reaches a Q value, so its weights get no gradient."""

    def __init__(self, width: int, branch_hidden: int, sizes: tuple[int, ...], activation: str):
        super().__init__()
        self.sizes, self.branch_hidden = sizes, branch_hidden
        heads = (1, *sizes)  # the value head first
        self.hidden = _layer_init(nn.Linear(width, len(heads) * branch_hidden))
        self.act = _activation(activation)
        out_weight = torch.zeros(len(heads), branch_hidden, max(heads))
        for k, n in enumerate(heads):
            block = torch.empty(n, branch_hidden)
            nn.init.orthogonal_(block, 1.0)
            out_weight[k, :, :n] = block.T
        self.out_weight = nn.Parameter(out_weight)
        self.out_bias = nn.Parameter(torch.zeros(len(heads), max(heads)))

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        z = self.act(self.hidden(h)).view(-1, len(self.sizes) + 1, self.branch_hidden)  # -1: exported graphs keep a free batch
        out = torch.einsum("bkh,khn->bkn", z, self.out_weight) + self.out_bias
        value = out[:, 0, :1]
        advantages = [out[:, d + 1, :n] for d, n in enumerate(self.sizes)]
        return [value + adv - adv.mean(dim=1, keepdim=True) for adv in advantages]


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
        self.heads = BranchHeads(trunk_sizes[-1], branch_hidden, branch_sizes(info), activation)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.parts:
            pieces, start = [], 0
            for key, width in self.parts:
                pieces.append(self.encoders[key](obs[:, start : start + width]))
                start += width
            obs = torch.cat(pieces, dim=1)
        return self.trunk(obs)

    def forward(self, obs: torch.Tensor) -> list[torch.Tensor]:
        return self.heads(self.features(obs))

"""The preference head: a per-step score r(s, a) on BDQ's shared trunk features, summed over a
segment, trained with the Bradley-Terry loss on ranked pairs (Christiano et al. 2017):

    P(A > B) = sigmoid(sum_t r(s_t^A, a_t^A) - sum_t r(s_t^B, a_t^B))
    loss     = BCE(P(A > B), label)       label: 1 (A preferred), 0 (B), 0.5 (equal)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kuberl.trainer.networks import MLP


class PreferenceHead(nn.Module):
    """r(s, a) from the trunk's features and the one-hot action of every branch."""

    def __init__(self, width: int, branches: tuple[int, ...], hidden: int = 64):
        super().__init__()
        self.branches = branches
        self.net = MLP([width + sum(branches), hidden, 1], "relu", last_std=1.0)

    def step_scores(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        onehots = [F.one_hot(actions[:, d].long(), n).to(features.dtype) for d, n in enumerate(self.branches)]
        return self.net(torch.cat([features, *onehots], dim=1)).squeeze(-1)


def segment_scores(features_fn, head: PreferenceHead, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Sum of step scores per segment: obs [P, L, D], actions [P, L, branches] -> [P]."""
    p, length = obs.shape[:2]
    steps = head.step_scores(features_fn(obs.reshape(p * length, -1)), actions.reshape(p * length, -1))
    return steps.view(p, length).sum(dim=1)


def bt_loss(score_a: torch.Tensor, score_b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(score_a - score_b, labels)


def accuracy(score_a: torch.Tensor, score_b: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Share of strict pairs (not "equal") whose preferred segment scores higher, and their count."""
    strict = labels != 0.5
    n = int(strict.sum())
    if n == 0:
        return float("nan"), 0
    right = ((score_a > score_b) == (labels > 0.5))[strict]
    return float(right.float().mean()), n


class PairStore:
    """Ranked pairs (both segments' observations and actions, and the label) in a ring on the device."""

    def __init__(self, capacity: int, length: int, obs_dim: int, n_branches: int, device: torch.device):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.obs = torch.zeros((capacity, 2, length, obs_dim), dtype=torch.float32, device=device)
        self.actions = torch.zeros((capacity, 2, length, n_branches), dtype=torch.long, device=device)
        self.labels = torch.zeros(capacity, dtype=torch.float32, device=device)

    def add(self, obs: torch.Tensor, actions: torch.Tensor, labels: torch.Tensor) -> None:
        for i in range(len(labels)):
            self.obs[self.pos], self.actions[self.pos], self.labels[self.pos] = obs[i], actions[i], labels[i]
            self.pos = (self.pos + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def get(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.obs.index_select(0, idx), self.actions.index_select(0, idx), self.labels.index_select(0, idx)

    def state_dict(self) -> dict:
        n = self.size
        return {"size": n, "pos": self.pos, "obs": self.obs[:n].cpu(), "actions": self.actions[:n].cpu(),
                "labels": self.labels[:n].cpu()}

    def load_state_dict(self, state: dict) -> None:
        n = min(int(state["size"]), self.capacity)
        if state["obs"].shape[1:] != self.obs.shape[1:]:
            return  # segment length or observation changed: the old pairs do not fit this head
        self.obs[:n], self.actions[:n], self.labels[:n] = (state[k][:n].to(self.obs.device)
                                                           for k in ("obs", "actions", "labels"))
        self.size, self.pos = n, int(state["pos"]) % self.capacity

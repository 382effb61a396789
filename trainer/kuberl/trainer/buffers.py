"""Replay buffer preallocated on the learner's device; a ring that overwrites the oldest transitions."""

from __future__ import annotations

import numpy as np
import torch


class ReplayBuffer:
    """Fixed-capacity transitions (obs, action, n-step reward, next obs, done, discount[, next mask])."""

    def __init__(self, capacity: int, obs_dim: int, action_shape: tuple[int, ...], device: torch.device,
                 n_actions_mask: int | None = None, action_dtype: torch.dtype = torch.long):
        self.capacity = capacity
        self.device = device
        self.obs = torch.zeros((capacity, obs_dim), dtype=torch.float32, device=device)
        self.next_obs = torch.zeros((capacity, obs_dim), dtype=torch.float32, device=device)
        self.actions = torch.zeros((capacity, *action_shape), dtype=action_dtype, device=device)
        self.rewards = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.dones = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.discounts = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.next_masks = (torch.ones((capacity, n_actions_mask), dtype=torch.bool, device=device)
                           if n_actions_mask else None)
        self.pos = 0
        self.size = 0

    def add(self, batch: dict[str, np.ndarray]) -> int:
        """Append a batch of transitions (numpy), wrapping around; returns how many were added."""
        n = len(batch["rewards"])
        if n == 0:
            return 0
        if n > self.capacity:  # only the newest `capacity` transitions can survive anyway
            batch = {k: v[-self.capacity:] if isinstance(v, np.ndarray) else v for k, v in batch.items()}
            n = self.capacity
        idx = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        fields = [("obs", self.obs), ("next_obs", self.next_obs), ("actions", self.actions),
                  ("rewards", self.rewards), ("dones", self.dones), ("discounts", self.discounts)]
        if self.next_masks is not None and "next_masks" in batch:
            fields.append(("next_masks", self.next_masks))
        for key, store in fields:
            values = torch.as_tensor(np.array(batch[key]), device=self.device).to(store.dtype)
            store[idx] = values.reshape(n, *store.shape[1:])
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return n

    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=generator)
        # index_select, not store[idx]: the same rows, ~5x less time on a CPU (advanced indexing's
        # general path), and the sampling is ~15% of a small network's update.
        out = {"obs": self.obs.index_select(0, idx), "next_obs": self.next_obs.index_select(0, idx),
               "actions": self.actions.index_select(0, idx), "rewards": self.rewards.index_select(0, idx),
               "dones": self.dones.index_select(0, idx), "discounts": self.discounts.index_select(0, idx)}
        if self.next_masks is not None:
            out["next_masks"] = self.next_masks.index_select(0, idx)
        return out

    def state_dict(self) -> dict:
        state = {"pos": self.pos, "size": self.size, "obs": self.obs[: self.size].cpu(),
                 "next_obs": self.next_obs[: self.size].cpu(), "actions": self.actions[: self.size].cpu(),
                 "rewards": self.rewards[: self.size].cpu(), "dones": self.dones[: self.size].cpu(),
                 "discounts": self.discounts[: self.size].cpu()}
        if self.next_masks is not None:
            state["next_masks"] = self.next_masks[: self.size].cpu()
        return state

    def load_state_dict(self, state: dict) -> None:
        size = int(state["size"])
        for key in ("obs", "next_obs", "actions", "rewards", "dones", "discounts", "next_masks"):
            store = getattr(self, key)
            if store is not None and key in state:
                store[:size] = state[key].to(self.device)
        self.size, self.pos = size, int(state["pos"])

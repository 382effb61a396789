"""What SAC and TD3 share: actions in a bounded Box, uniformly random ones until learningStarts (the
warm-up both published implementations use), twin Q-networks regressed on one target with Polyak-averaged
copies, and the replay (`replay.ReplayAlgorithm`)."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F

from kuberl.api.job import algorithms_acting_in
from kuberl.trainer.algorithms.replay import ReplayAlgorithm
from kuberl.trainer.buffers import ReplayBuffer
from kuberl.trainer.networks import TwinQ


def require_bounded_box(info, algorithm: str) -> None:
    """SAC and TD3 squash their actions into the Box's bounds, so both must be finite."""
    if info.action_kind != "Box":
        raise ValueError(f"spec.algorithm.name: {algorithm} acts in Box (continuous) action spaces; this "
                         f"environment's is {info.action_kind}: choose one that can: "
                         f"{', '.join(algorithms_acting_in(info.action_kind))}")
    bounds = (*info.action_low, *info.action_high)
    if not all(math.isfinite(b) for b in bounds):
        raise ValueError(f"spec.algorithm.name: {algorithm} needs a Box action space with finite bounds (it "
                         f"squashes actions into them); this environment's are low={list(info.action_low)}, "
                         f"high={list(info.action_high)}: wrap the env to rescale its actions, or use PPO")


class ContinuousActorCritic(ReplayAlgorithm):
    """The critic half. A subclass adds the actor, `critic_optimizer`, and its `update()`."""

    critic_optimizer: torch.optim.Optimizer

    def __init__(self, cfg, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        require_bounded_box(info, self.name)
        torch.manual_seed(seed)
        self.hidden, self.activation = list(cfg.network.hidden_sizes), cfg.network.activation
        self.critic = TwinQ(info, self.hidden, self.activation).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.action_dim = len(info.action_low)
        self.buffer = ReplayBuffer(cfg.buffer_size, info.obs_dim, (self.action_dim,), device,
                                   action_dtype=torch.float32)
        self.low = torch.tensor(info.action_low, dtype=torch.float32, device=device)
        self.high = torch.tensor(info.action_high, dtype=torch.float32, device=device)

    def exploration(self, env_steps: int) -> float:
        """The workers' chance of a uniformly random action: every action until learningStarts, then none
        (the policy's own noise explores)."""
        return 1.0 if env_steps < self.cfg.learning_starts else 0.0

    def bootstrapped(self, batch: dict[str, torch.Tensor], next_value: torch.Tensor) -> torch.Tensor:
        """r + gamma^k (1 - terminated) V(s'): a time limit's cut episode still bootstraps."""
        return batch["rewards"] + batch["discounts"] * (1.0 - batch["dones"]) * next_value

    def critic_step(self, batch: dict[str, torch.Tensor], target: torch.Tensor) -> float:
        """Both Q-networks regressed on `target`; returns their mean squared error, averaged."""
        q1, q2 = self.critic(batch["obs"], batch["actions"])
        loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.average_gradients(self.critic.parameters())
        self.critic_optimizer.step()
        return loss.item() / 2.0

    def actor_step(self, optimizer: torch.optim.Optimizer, actor: torch.nn.Module, loss: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.average_gradients(actor.parameters())
        optimizer.step()

    @staticmethod
    def soft_update(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)

    def critic_state(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict(), "critic_target": self.critic_target.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(), **self.replay_state()}

    def load_critic_state(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.load_replay_state(state)

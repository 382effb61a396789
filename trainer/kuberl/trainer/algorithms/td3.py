"""TD3: Twin Delayed DDPG (Fujimoto et al. 2018), as CleanRL's td3_continuous_action.py computes it.

Workers act with the deterministic actor plus Gaussian noise (numpy, `policies/continuous.py`) and
send 1-step transitions; the learner, per `trainFrequency` env steps, samples `batchSize` of them and

    a'     = clip(actor_target(s') + clip(N(0, policyNoise), +-noiseClip) * half range, low, high)
    y      = r + gamma (1 - terminated) min_i Q_target_i(s', a')          (target policy smoothing)
    critic : sum_i (Q_i(s, a) - y)^2
    every `policyDelay` critic updates: actor -Q_1(s, actor(s)), then the targets move by tau.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from kuberl.api.job import TD3Config
from kuberl.trainer.algorithms.base import make_adam
from kuberl.trainer.algorithms.continuous import ContinuousActorCritic
from kuberl.trainer.networks import DeterministicActor, numpy_params


class TD3(ContinuousActorCritic):
    name = "TD3"

    def __init__(self, cfg: TD3Config, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        self.actor = DeterministicActor(info, self.hidden, self.activation, device).to(device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_optimizer = make_adam(self.actor.parameters(), device, lr=cfg.learning_rate)
        self.critic_optimizer = make_adam(self.critic.parameters(), device, lr=cfg.learning_rate)
        self.last_actor_loss = float("nan")

    def policy_config(self) -> dict[str, Any]:
        return {"kind": "td3", "n_layers": len(self.hidden) + 1, "activation": self.activation,
                "exploration_noise": self.cfg.exploration_noise}

    def weights(self) -> dict[str, np.ndarray]:
        return numpy_params(self.actor)

    def update(self) -> float:
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, self.generator)
        with torch.no_grad():
            noise = torch.randn(batch["actions"].shape, generator=self.generator, device=self.device)
            noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip) * self.actor.scale
            next_actions = torch.clamp(self.actor_target(batch["next_obs"]) + noise, self.low, self.high)
            q1, q2 = self.critic_target(batch["next_obs"], next_actions)
            target = self.bootstrapped(batch, torch.min(q1, q2))
        loss = self.critic_step(batch, target)
        self.gradient_updates += 1
        if self.gradient_updates % cfg.policy_delay == 0:
            self.critic.requires_grad_(False)  # the actor's loss moves the actor only
            actor_loss = -self.critic.first(batch["obs"], self.actor(batch["obs"])).mean()
            self.actor_step(self.actor_optimizer, self.actor, actor_loss)
            self.critic.requires_grad_(True)
            self.soft_update(self.actor_target, self.actor, cfg.tau)
            self.soft_update(self.critic_target, self.critic, cfg.tau)
            self.last_actor_loss = actor_loss.item()
        return loss

    def extra_stats(self, env_steps: int) -> dict[str, float]:
        return {"actor_loss": self.last_actor_loss, "random_action_rate": self.exploration(env_steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "actor_target": self.actor_target.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(), **self.critic_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.load_critic_state(state)

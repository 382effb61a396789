"""SAC: Soft Actor-Critic (Haarnoja et al. 2018, with automatic entropy tuning from Haarnoja et al.
2018b), as CleanRL's sac_continuous_action.py and SB3's SAC compute it.

Workers act with a tanh-squashed Gaussian (numpy, `policies/continuous.py`) and send 1-step transitions;
the learner, per `trainFrequency` env steps, samples `batchSize` of them and

    y      = r + gamma (1 - terminated) (min_i Q_target_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
    critic : sum_i (Q_i(s, a) - y)^2
    actor  : alpha log pi(a~|s) - min_i Q_i(s, a~),  a~ ~ pi(.|s) (reparameterised)
    alpha  : -alpha (log pi(a~|s) + target entropy)   (on log alpha)

then moves the target Q-networks by tau. CleanRL updates the actor twice every second step; once per
step, as SB3 does, is the same number of actor updates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from kuberl.api.job import SACConfig
from kuberl.trainer.algorithms.base import make_adam
from kuberl.trainer.algorithms.continuous import ContinuousActorCritic
from kuberl.trainer.networks import SquashedGaussianActor, numpy_params


class SAC(ContinuousActorCritic):
    name = "SAC"

    def __init__(self, cfg: SACConfig, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        self.actor = SquashedGaussianActor(info, self.hidden, self.activation, device).to(device)
        self.actor_optimizer = make_adam(self.actor.parameters(), device, lr=cfg.policy_learning_rate)
        self.critic_optimizer = make_adam(self.critic.parameters(), device, lr=cfg.q_learning_rate)
        self.target_entropy = -float(self.action_dim) if cfg.target_entropy is None else cfg.target_entropy
        # Tuning starts from alpha = 1 (log alpha 0), as CleanRL and SB3 start it; a fixed alpha is cfg.alpha.
        start = 0.0 if cfg.autotune_alpha else math.log(cfg.alpha)
        self.log_alpha = torch.full((1,), start, device=device, requires_grad=cfg.autotune_alpha)
        self.alpha_optimizer = make_adam([self.log_alpha], device, lr=cfg.q_learning_rate)
        self.last_actor_loss = float("nan")

    def policy_config(self) -> dict[str, Any]:
        return {"kind": "sac", "n_layers": len(self.hidden), "activation": self.activation}

    def weights(self) -> dict[str, np.ndarray]:
        return numpy_params(self.actor)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp().item())

    def update(self) -> float:
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, self.generator)
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = self.actor.sample(batch["next_obs"], self.generator)
            q1, q2 = self.critic_target(batch["next_obs"], next_actions)
            target = self.bootstrapped(batch, torch.min(q1, q2) - alpha * next_logp)
        loss = self.critic_step(batch, target)
        self.critic.requires_grad_(False)  # the actor's loss moves the actor only
        actions, logp = self.actor.sample(batch["obs"], self.generator)
        q1, q2 = self.critic(batch["obs"], actions)
        actor_loss = (alpha * logp - torch.min(q1, q2)).mean()
        self.actor_step(self.actor_optimizer, self.actor, actor_loss)
        self.critic.requires_grad_(True)
        if cfg.autotune_alpha:
            alpha_loss = -(self.log_alpha.exp() * (logp.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.average_gradients([self.log_alpha])
            self.alpha_optimizer.step()
        self.soft_update(self.critic_target, self.critic, cfg.tau)
        self.gradient_updates += 1
        self.last_actor_loss = actor_loss.item()
        return loss

    def extra_stats(self, env_steps: int) -> dict[str, float]:
        return {"alpha": self.alpha, "actor_loss": self.last_actor_loss,
                "random_action_rate": self.exploration(env_steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
                "log_alpha": self.log_alpha.detach().cpu(), "alpha_optimizer": self.alpha_optimizer.state_dict(),
                **self.critic_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"].to(self.device))
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.load_critic_state(state)

"""PPO: clipped surrogate objective, GAE, value loss, entropy bonus, minibatch epochs.

One `learn` call takes the on-policy batches of every rollout worker for one iteration:
1. GAE(lambda) advantages and returns per worker, from rewards, values and episode ends;
2. `epochs` passes over shuffled minibatches: ratio-clipped policy loss, (clipped) value loss,
   entropy bonus, global grad-norm clip; optional early stop on approximate KL;
3. learning rate annealed linearly over the env-step budget when asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kuberl.api.job import PPOConfig
from kuberl.trainer.algorithms.base import Algorithm, LearnStats, make_adam
from kuberl.trainer.networks import ActorCritic, numpy_params


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_values: np.ndarray,
                gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE over [T, N] arrays. dones[t] = 1 when the episode ended at step t (its next value is not used;
    time-limit truncations carry their bootstrap in the reward already). Returns (advantages, returns)."""
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    last_gae = np.zeros(rewards.shape[1:], dtype=np.float32)
    for t in reversed(range(steps)):
        next_values = last_values if t == steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        last_gae = delta + gamma * lam * not_done * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values


class PPO(Algorithm):
    name = "PPO"
    on_policy = True

    def __init__(self, cfg: PPOConfig, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        torch.manual_seed(seed)
        self.net = ActorCritic(info, cfg.network.hidden_sizes, cfg.network.activation).to(device)
        self.optimizer = make_adam(self.net.parameters(), device, lr=cfg.learning_rate, eps=1e-5)

    def policy_config(self) -> dict[str, Any]:
        return {"kind": "ppo", "n_layers": len(self.cfg.network.hidden_sizes),
                "activation": self.cfg.network.activation}

    def weights(self) -> dict[str, np.ndarray]:
        return numpy_params(self.net)

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        if max_updates is not None:  # the job model allows async collection for off-policy algorithms only
            raise ValueError(f"PPO learns from fresh batches only; max_updates={max_updates} needs an off-policy "
                             "algorithm (spec.collection.mode: async)")
        cfg = self.cfg
        if cfg.anneal_learning_rate and self.total_env_steps:
            frac = max(1.0 - env_steps / self.total_env_steps, 0.05)
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.learning_rate * frac

        # 1. Advantages per worker (each worker's batch is its own set of [T, N] trajectories).
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "actions", "logprobs", "advantages",
                                                               "returns", "values", "masks")}
        for b in batches:
            adv, ret = compute_gae(b["rewards"], b["values"], b["dones"], b["last_values"], cfg.gamma, cfg.gae_lambda)
            flat = b["obs"].shape[0] * b["obs"].shape[1]
            # Steps an agent sat out (gone before the others) are cut off as episodes of their own: left out.
            keep = slice(None) if "alive" not in b else b["alive"].reshape(flat)
            parts["obs"].append(b["obs"].reshape(flat, -1)[keep])
            parts["actions"].append(b["actions"].reshape(flat, *b["actions"].shape[2:])[keep])
            parts["logprobs"].append(b["logprobs"].reshape(flat)[keep])
            parts["advantages"].append(adv.reshape(flat)[keep])
            parts["returns"].append(ret.reshape(flat)[keep])
            parts["values"].append(b["values"].reshape(flat)[keep])
            if "masks" in b:
                parts["masks"].append(b["masks"].reshape(flat, -1)[keep])
        data = {k: torch.as_tensor(np.concatenate(v), device=self.device) for k, v in parts.items() if v}

        # 2. Minibatch epochs.
        size = data["obs"].shape[0]
        mb_size = max(size // cfg.minibatches, 1)
        losses, kls, clipfracs, updates = [], [], [], 0
        for _epoch in range(cfg.epochs):
            order = torch.randperm(size, device=self.device, generator=self.generator)
            epoch_kl = []
            for start in range(0, size - mb_size + 1, mb_size):
                idx = order[start : start + mb_size]
                adv = data["advantages"][idx]
                if cfg.normalize_advantages and len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                if self.world > 1:  # data-parallel: this learner's share of the minibatch (its stats are global)
                    idx, adv = idx[self.rank :: self.world], adv[self.rank :: self.world]
                new_logp, entropy, new_value = self.net.evaluate(
                    data["obs"][idx], data["actions"][idx], data["masks"][idx] if "masks" in data else None)
                log_ratio = new_logp - data["logprobs"][idx]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    epoch_kl.append(float(approx_kl))
                    clipfracs.append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))
                policy_loss = torch.max(-adv * ratio,
                                        -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                returns = data["returns"][idx]
                if cfg.clip_value_loss:
                    old_v = data["values"][idx]
                    clipped = old_v + (new_value - old_v).clamp(-cfg.clip_coef, cfg.clip_coef)
                    value_loss = 0.5 * torch.max((new_value - returns) ** 2, (clipped - returns) ** 2).mean()
                else:
                    value_loss = 0.5 * ((new_value - returns) ** 2).mean()
                loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy.mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.average_gradients(self.net.parameters())
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                losses.append(loss.item())
                updates += 1
            kls.extend(epoch_kl)
            if cfg.target_kl is not None and self.mean_across_learners(float(np.mean(epoch_kl))) > cfg.target_kl:
                break
        self.gradient_updates += updates
        return LearnStats(loss=float(np.mean(losses)) if losses else float("nan"), gradient_updates=updates,
                          extra={"approx_kl": float(np.mean(kls)) if kls else 0.0,
                                 "clip_fraction": float(np.mean(clipfracs)) if clipfracs else 0.0,
                                 "learning_rate": self.optimizer.param_groups[0]["lr"]})

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "gradient_updates": self.gradient_updates, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.gradient_updates = int(state["gradient_updates"])
        self.generator.set_state(state["generator"])

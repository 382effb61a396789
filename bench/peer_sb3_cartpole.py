"""Stable-Baselines3 PPO or DQN on CartPole-v1 with rl-baselines3-zoo's tuned hyperparameters,
timed by the shared protocol (common.py). Runs in bench/.venvs/sb3 (make_peer_venvs.sh).

    bench/.venvs/sb3/bin/python bench/peer_sb3_cartpole.py --algo ppo --seed 0
    bench/.venvs/sb3/bin/python bench/peer_sb3_cartpole.py --algo dqn --seed 0 --hold --budget-steps 300000

Prints one `BENCH_RESULT {json}` line at the end.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from common import SolveClock, emit, greedy_eval, parser
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

# rl-baselines3-zoo, hyperparams/ppo.yml, CartPole-v1 ("# Tuned"), checked against the zoo's
# main branch of 2026-04:
#   n_envs: 8, n_timesteps: 1e5, policy: MlpPolicy, n_steps: 32, batch_size: 256, gae_lambda: 0.8,
#   gamma: 0.98, n_epochs: 20, ent_coef: 0.0, learning_rate: lin_0.001, clip_range: lin_0.2
ZOO_PPO = {"n_envs": 8, "n_timesteps": 100_000, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8,
           "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2}
# rl-baselines3-zoo, hyperparams/dqn.yml, CartPole-v1, same revision:
#   n_timesteps: 5e4, policy: MlpPolicy, learning_rate: 2.3e-3, batch_size: 64, buffer_size: 100000,
#   learning_starts: 1000, gamma: 0.99, target_update_interval: 10, train_freq: 256,
#   gradient_steps: 128, exploration_fraction: 0.16, exploration_final_eps: 0.04,
#   policy_kwargs: dict(net_arch=[256, 256])
ZOO_DQN = {"n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
           "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
           "gradient_steps": 128, "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
           "net_arch": [256, 256]}


def zoo_linear(initial: float, zoo_steps: int, total_steps: int):
    """The zoo's `lin_X` over its own n_timesteps, even when we call learn() with a larger budget:
    SB3 passes progress_remaining = 1 - t / total_steps; the zoo's schedule is X * (1 - t / zoo_steps)."""
    def schedule(progress_remaining: float) -> float:
        t = (1.0 - progress_remaining) * total_steps
        return initial * max(1.0 - t / zoo_steps, 0.0)
    return schedule


class Protocol(BaseCallback):
    def __init__(self, clock: SolveClock, evaluate):
        super().__init__()
        self.clock, self.evaluate, self.seen = clock, evaluate, None

    def _on_step(self) -> bool:
        buf = self.model.ep_info_buffer  # SB3's last-100-episodes window (stats_window_size=100)
        key = (len(buf), buf[-1]["t"] if buf else None)  # Monitor's episode end time: new episode?
        due = self.num_timesteps >= self.clock.budget_steps or (
            self.clock.hold and self.num_timesteps >= self.clock.next_curve)
        if key == self.seen and not due:
            return True  # no episode ended since the last call: nothing to check
        self.seen = key
        mean = float(np.mean([e["r"] for e in buf])) if buf else None
        stop = self.clock.update(self.num_timesteps, len(buf) >= 100, mean, self.evaluate)
        return not stop


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--algo", choices=["ppo", "dqn"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-steps", type=int, default=None,
                   help="env-step cap (default: the zoo's n_timesteps, 1e5 PPO / 5e4 DQN)")
    p.add_argument("--budget-seconds", type=float, default=300.0)
    p.add_argument("--recheck-steps", type=int, default=5_000)
    p.add_argument("--hold", action="store_true", help="train to the budget, evaluating every --curve-every")
    p.add_argument("--curve-every", type=int, default=25_000)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 1 (as KubeRL's learner here): faster for these small MLPs and "
                        "immune to the OpenMP barrier stalls a busy 2-core machine causes (0 = torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    zoo = ZOO_PPO if args.algo == "ppo" else ZOO_DQN
    budget = args.budget_steps or zoo["n_timesteps"]
    # learn() never goes past the budget; schedules keep the zoo's horizon (n_timesteps) regardless.
    clock = SolveClock(budget, args.budget_seconds, args.recheck_steps, args.hold, args.curve_every)
    t_setup = time.perf_counter()
    if args.algo == "ppo":
        env = make_vec_env("CartPole-v1", n_envs=zoo["n_envs"], seed=args.seed)
        model = PPO("MlpPolicy", env, n_steps=zoo["n_steps"], batch_size=zoo["batch_size"],
                    gae_lambda=zoo["gae_lambda"], gamma=zoo["gamma"], n_epochs=zoo["n_epochs"],
                    ent_coef=zoo["ent_coef"],
                    learning_rate=zoo_linear(zoo["learning_rate"], zoo["n_timesteps"], budget),
                    clip_range=zoo_linear(zoo["clip_range"], zoo["n_timesteps"], budget),
                    seed=args.seed, device="cpu", verbose=0)
    else:
        env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed)
        # exploration_fraction is a fraction of learn()'s total_timesteps: rescale it so epsilon reaches
        # its final value at 0.16 x 5e4 = 8000 steps, as in the zoo, whatever the budget.
        fraction = zoo["exploration_fraction"] * zoo["n_timesteps"] / budget
        model = DQN("MlpPolicy", env, learning_rate=zoo["learning_rate"], batch_size=zoo["batch_size"],
                    buffer_size=zoo["buffer_size"], learning_starts=zoo["learning_starts"], gamma=zoo["gamma"],
                    target_update_interval=zoo["target_update_interval"], train_freq=zoo["train_freq"],
                    gradient_steps=zoo["gradient_steps"], exploration_fraction=fraction,
                    exploration_final_eps=zoo["exploration_final_eps"],
                    policy_kwargs={"net_arch": zoo["net_arch"]}, seed=args.seed, device="cpu", verbose=0)
    setup_seconds = time.perf_counter() - t_setup

    def act(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    def evaluate():
        return greedy_eval(act)

    clock.restart()
    model.learn(total_timesteps=budget, callback=Protocol(clock, evaluate))
    if clock.stop_reason is None:
        clock.stop_reason = "budget_steps"
    clock.finish(evaluate)
    emit({"contender": f"sb3-{args.algo}", "seed": args.seed, "workers": None, "setup_seconds": round(setup_seconds, 3),
          "torch_threads": torch.get_num_threads(), "hyperparameters": zoo, **clock.record()})


if __name__ == "__main__":
    main()

"""Stable-Baselines3 SAC or TD3 on Pendulum-v1 (or `--env InvertedDoublePendulum-v5` or `Hopper-v5`, MuJoCo) with
rl-baselines3-zoo's hyperparameters, one thread, then the same greedy evaluation KubeRL runs (seeds
10000..10019). Runs in bench/.venvs/sb3 (make_peer_venvs.sh).

    bench/.venvs/sb3/bin/python bench/peer_sb3_continuous.py --algo sac --seed 0 [--env InvertedDoublePendulum-v5]

Prints one `BENCH_RESULT {json}` line at the end.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from common import emit, greedy_eval, parser
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.noise import NormalActionNoise

# rl-baselines3-zoo, hyperparams/sac.yml, Pendulum-v1 (commit 00128b5): n_timesteps 20000, MlpPolicy,
# learning_rate 1e-3; everything else SB3's SAC defaults (buffer 1e6, learning_starts 100, batch 256,
# tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef 'auto', net_arch [256, 256]).
ZOO_SAC = {"learning_rate": 1e-3}
# rl-baselines3-zoo, hyperparams/td3.yml, Pendulum-v1: n_timesteps 20000, gamma 0.98, buffer_size 200000,
# learning_starts 10000, noise_type normal, noise_std 0.1, gradient_steps 1, train_freq 1,
# learning_rate 1e-3, net_arch [400, 300].
ZOO_TD3 = {"gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000, "gradient_steps": 1, "train_freq": 1,
           "learning_rate": 1e-3, "policy_kwargs": {"net_arch": [400, 300]}}
# rl-baselines3-zoo, hyperparams/sac.yml and td3.yml (commit 22e3ff2), "=== Mujoco Envs ===": the zoo has no
# InvertedDoublePendulum entry for MuJoCo (only for PyBullet), so its MuJoCo defaults (the &mujoco-defaults
# anchor of HalfCheetah-v4, which Ant, Hopper and Walker2d share): learning_starts 10000 and SB3's defaults
# otherwise (SAC: learning_rate 3e-4, batch 256, buffer 1e6, tau 0.005, gamma 0.99, ent_coef 'auto', net_arch
# [256, 256]). TD3's MuJoCo defaults: learning_starts 10000, normal noise of std 0.1, train_freq 1,
# gradient_steps 1, learning_rate 1e-3, batch_size 256, net_arch [400, 300].
ZOO_MUJOCO_SAC = {"learning_starts": 10_000}
ZOO_MUJOCO_TD3 = {"learning_starts": 10_000, "train_freq": 1, "gradient_steps": 1, "learning_rate": 1e-3,
                  "batch_size": 256, "policy_kwargs": {"net_arch": [400, 300]}}
SETTINGS = {"Pendulum-v1": {"sac": ZOO_SAC, "td3": ZOO_TD3},
            "InvertedDoublePendulum-v5": {"sac": ZOO_MUJOCO_SAC, "td3": ZOO_MUJOCO_TD3},
            # The zoo's Hopper-v4 entry is `*mujoco-defaults` (it has no v5 entry: the same task, newer bindings).
            "Hopper-v5": {"sac": ZOO_MUJOCO_SAC, "td3": ZOO_MUJOCO_TD3}}
EVAL_SEEDS = list(range(10_000, 10_020))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--algo", choices=["sac", "td3"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--env", choices=sorted(SETTINGS), default="Pendulum-v1")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    settings = SETTINGS[args.env][args.algo]
    if args.algo == "sac":
        model = SAC("MlpPolicy", args.env, seed=args.seed, device="cpu", **settings)
    else:
        dims = model_action_dims(args.env)
        noise = NormalActionNoise(mean=np.zeros(dims), sigma=0.1 * np.ones(dims))
        model = TD3("MlpPolicy", args.env, seed=args.seed, device="cpu", action_noise=noise, **settings)
    setup = time.perf_counter() - t0
    model.learn(total_timesteps=args.steps)
    train = time.perf_counter() - t0 - setup
    evaluation = greedy_eval(lambda obs: model.predict(obs, deterministic=True)[0], EVAL_SEEDS, args.env)
    emit({"algo": args.algo, "env": args.env, "seed": args.seed, "env_steps": args.steps,
          "setup_seconds": round(setup, 2),
          "train_seconds": round(train, 2), "evaluation_return": evaluation["mean_return"],
          "training_return_last_10": float(np.mean([e["r"] for e in list(model.ep_info_buffer)[-10:]]))})


def model_action_dims(env_id: str) -> int:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return int(np.prod(env.action_space.shape))
    finally:
        env.close()


if __name__ == "__main__":
    main()

"""RLlib PPO on CartPole-v1 with the settings of RLlib's own tuned example, timed by the shared
protocol (peers/protocol.py). Runs in bench/.venvs/rllib (peers/make_venvs.sh).

    bench/.venvs/rllib/bin/python bench/peers/rllib_cartpole.py --env-runners 1 --seed 0

Prints one `BENCH_RESULT {json}` line at the end. Ray start-up (ray.init) and building the algorithm
(env-runner actors, learner) are timed separately and are off the time-to-solve clock, which starts
at the first `algo.train()`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch
from protocol import SolveClock, emit, greedy_eval
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_RETURN_MEAN,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES_LIFETIME,
)

# ray-project/ray, rllib/tuned_examples/ppo/cartpole_ppo.py as of ray 2.60 (the version whose script
# imports add_rllib_example_script_args from ray.rllib.examples.utils, as the 2.60 wheel does):
#   .env_runners(num_env_runners=args.num_env_runners [default 4], num_envs_per_env_runner=16,
#                rollout_fragment_length=32)
#   .learners(num_learners=args.num_learners [default 1])
#   .training(train_batch_size=2048, minibatch_size=128, lr=0.0003, num_epochs=5, vf_loss_coeff=1.5,
#             entropy_coeff=0, gamma=0.99, lambda_=0.95, clip_param=0.3, vf_clip_param=10_000)
#   .rl_module(model_config=DefaultModelConfig(vf_share_layers=True, fcnet_hiddens=[32],
#                                              fcnet_activation="linear"))
# Here only the number of env runners is ours (1 or 2, KubeRL's worker counts). The learner is
# local (num_learners=0) by default: a remote learner actor needs a CPU of its own, which a 2-core
# machine running 2 env runners does not have (--learners 1 gives the example's remote learner).
EXAMPLE = {"num_envs_per_env_runner": 16, "rollout_fragment_length": 32, "train_batch_size": 2048,
           "minibatch_size": 128, "lr": 0.0003, "num_epochs": 5, "vf_loss_coeff": 1.5, "entropy_coeff": 0.0,
           "gamma": 0.99, "lambda_": 0.95, "clip_param": 0.3, "vf_clip_param": 10_000,
           "fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env-runners", type=int, default=1)
    p.add_argument("--learners", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-steps", type=int, default=300_000)
    p.add_argument("--budget-seconds", type=float, default=300.0)
    p.add_argument("--recheck-steps", type=int, default=5_000)
    p.add_argument("--threads", type=int, default=1, help="learner torch threads (0 = torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    ray.init(address="local",  # a fresh local Ray, never a cluster some other `ray start` left running
             num_cpus=max(os.cpu_count() or 1, args.env_runners + args.learners), include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    ray_start = time.perf_counter() - t0

    ex = EXAMPLE
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=ex["num_envs_per_env_runner"],
                     rollout_fragment_length=ex["rollout_fragment_length"])
        .learners(num_learners=args.learners)
        .training(train_batch_size=ex["train_batch_size"], minibatch_size=ex["minibatch_size"], lr=ex["lr"],
                  num_epochs=ex["num_epochs"], vf_loss_coeff=ex["vf_loss_coeff"], entropy_coeff=ex["entropy_coeff"],
                  gamma=ex["gamma"], lambda_=ex["lambda_"], clip_param=ex["clip_param"],
                  vf_clip_param=ex["vf_clip_param"])
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=ex["vf_share_layers"],
                                                   fcnet_hiddens=ex["fcnet_hiddens"],
                                                   fcnet_activation=ex["fcnet_activation"]))
        .debugging(seed=args.seed)
    )
    t1 = time.perf_counter()
    algo = config.build_algo() if hasattr(config, "build_algo") else config.build()
    build_seconds = time.perf_counter() - t1

    def evaluate():
        module = algo.get_module()

        def act(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(obs)})
            return out["action_dist_inputs"].argmax(dim=-1).numpy()

        return greedy_eval(act)

    clock = SolveClock(args.budget_steps, args.budget_seconds, args.recheck_steps)
    iterations = 0
    while True:
        result = algo.train()
        iterations += 1
        runners = result.get(ENV_RUNNER_RESULTS, {})
        steps = int(result.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)))
        episodes = int(runners.get(NUM_EPISODES_LIFETIME, 0))
        mean = runners.get(EPISODE_RETURN_MEAN)
        mean = None if mean is None or np.isnan(mean) else float(mean)
        # RLlib's own 100-episode window (metrics_num_episodes_for_smoothing=100, split over the runners).
        if clock.update(steps, episodes >= 100, mean, evaluate):
            break
    record = clock.record()
    algo.stop()
    ray.shutdown()
    emit({"contender": f"rllib-ppo-{args.env_runners}", "seed": args.seed, "workers": args.env_runners,
          "learners": args.learners, "ray_start_seconds": round(ray_start, 3),
          "build_seconds": round(build_seconds, 3), "iterations": iterations,
          "torch_threads": torch.get_num_threads(), "hyperparameters": ex, **record})


if __name__ == "__main__":
    main()

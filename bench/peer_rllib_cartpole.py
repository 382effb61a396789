"""RLlib PPO on CartPole-v1 with the settings of RLlib's own CartPole PPO example, timed by the shared
protocol (common.py). Runs in bench/.venvs/rllib (make_peer_venvs.sh).

    bench/.venvs/rllib/bin/python bench/peer_rllib_cartpole.py --env-runners 1 --seed 0

Prints one `BENCH_RESULT {json}` line at the end. Ray start-up (ray.init) and building the algorithm
(env-runner actors, learner) are timed separately and are off the time-to-solve clock, which starts
at the first `algo.train()`.
"""

from __future__ import annotations

import logging
import os
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch
from common import SolveClock, emit, greedy_eval, parser
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_RETURN_MEAN,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES_LIFETIME,
)

# ray-project/ray, rllib/examples/algorithms/ppo/cartpole_ppo.py at commit 4d5432002e1d (the version
# the RLlib 2.60 wheel's example-script helpers match), all of its settings:
#   PPOConfig().environment("CartPole-v1")
#     .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
#     .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
#                                                vf_share_layers=True))
# and every other setting RLlib's default (train_batch_size 4000, minibatch_size 128, lambda 1.0,
# clip_param 0.3, 1 env per env runner, ...). A later revision of that file (commit 438af5cd942b)
# adds script defaults of 4 env runners x 16 envs and 1 remote learner; the training settings are
# the same. Here only the number of env runners is ours (1 or 2, KubeRL's worker counts) and the
# learner is local (num_learners=0: a remote learner actor needs a CPU of its own, which a 2-core
# machine running 2 env runners does not have; --learners 1 gives a remote one).
EXAMPLE = {"lr": 0.0003, "num_epochs": 6, "vf_loss_coeff": 0.01,
           "fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True}
EXAMPLE_SOURCE = "ray-project/ray rllib/examples/algorithms/ppo/cartpole_ppo.py @ 4d5432002e1d"

def main() -> None:
    p = parser(__doc__)
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
        .env_runners(num_env_runners=args.env_runners)
        .learners(num_learners=args.learners)
        .training(lr=ex["lr"], num_epochs=ex["num_epochs"], vf_loss_coeff=ex["vf_loss_coeff"])
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
          "torch_threads": torch.get_num_threads(), "hyperparameters": ex,
          "hyperparameters_source": EXAMPLE_SOURCE, "train_batch_size": config.train_batch_size,
          "minibatch_size": config.minibatch_size, "lambda": config.lambda_,
          "num_envs_per_env_runner": config.num_envs_per_env_runner, **record})


if __name__ == "__main__":
    main()

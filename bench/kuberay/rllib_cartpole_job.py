"""The RayJob's entrypoint: RLlib PPO on CartPole-v1 with the settings of RLlib's own CartPole PPO example
(the ones bench/peer_rllib_cartpole.py runs), on the Ray cluster KubeRay made, to KubeRL's stopping rule:
the mean return of the last 100 training episodes at least 475, then 100 greedy evaluation episodes.

    ray job submit -- python /home/kuberl/rllib/rllib_cartpole_job.py --env-runners 2

One `KUBERAY_BENCH {json}` line per event on stdout, each with the wall-clock time (`unix`), which the
benchmark reads from the submitter's log (the pods share the host's clock): `started` (the driver runs),
`built` (env runners and learner made: sampling starts with the first iteration), `iteration`, `solved`
and `result` (the record, with the evaluation).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch
from common import TARGET, WINDOW, greedy_eval
from peer_rllib_cartpole import EXAMPLE, EXAMPLE_SOURCE
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_RETURN_MEAN,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES_LIFETIME,
)

PREFIX = "KUBERAY_BENCH "


def say(event: str, **fields: object) -> None:
    print(PREFIX + json.dumps({"event": event, "unix": time.time(), **fields}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--env-runners", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-env-steps", type=int, default=300_000, help="KubeRL's example job's maxEnvSteps")
    p.add_argument("--max-seconds", type=float, default=600.0, help="KubeRL's example's maxWallClockSeconds")
    p.add_argument("--threads", type=int, default=1, help="learner torch threads, as the peer on one machine")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    say("started")
    ray.init(logging_level=logging.WARNING)  # the job's cluster: RAY_ADDRESS is set by the job supervisor
    ex = EXAMPLE
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.env_runners)
        .learners(num_learners=0)  # the learner in the driver, on the head: KubeRL's learner pod's share
        .training(lr=ex["lr"], num_epochs=ex["num_epochs"], vf_loss_coeff=ex["vf_loss_coeff"])
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=ex["vf_share_layers"],
                                                   fcnet_hiddens=ex["fcnet_hiddens"],
                                                   fcnet_activation=ex["fcnet_activation"]))
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    say("built", hyperparameters=ex, hyperparameters_source=EXAMPLE_SOURCE,
        train_batch_size=config.train_batch_size, minibatch_size=config.minibatch_size)
    t0 = time.monotonic()
    steps, mean, iterations, reason = 0, None, 0, None
    while reason is None:
        result = algo.train()
        iterations += 1
        runners = result.get(ENV_RUNNER_RESULTS, {})
        steps = int(result.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)))
        episodes = int(runners.get(NUM_EPISODES_LIFETIME, 0))
        value = runners.get(EPISODE_RETURN_MEAN)
        mean = None if value is None or np.isnan(value) else float(value)
        say("iteration", iteration=iterations, env_steps=steps, episodes=episodes, mean_return=mean,
            env_runners_healthy=algo.env_runner_group.num_healthy_remote_env_runners())
        # RLlib's own window: metrics_num_episodes_for_smoothing=100 episodes, KubeRL's returnWindow.
        if episodes >= WINDOW and mean is not None and mean >= TARGET:
            reason = "target_return"
        elif steps >= args.max_env_steps:
            reason = "max_env_steps"
        elif time.monotonic() - t0 >= args.max_seconds:
            reason = "max_wall_clock"
    train_seconds = time.monotonic() - t0
    if reason == "target_return":
        say("solved", env_steps=steps, mean_return=mean)
    module = algo.get_module()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module.forward_inference({"obs": torch.as_tensor(obs)})
        return out["action_dist_inputs"].argmax(dim=-1).numpy()

    evaluation = greedy_eval(act)
    say("result", stop_reason=reason, env_steps=steps, iterations=iterations, window_mean=mean,
        train_seconds=round(train_seconds, 3), evaluation=evaluation, ray_version=ray.__version__)
    algo.stop()


if __name__ == "__main__":
    main()

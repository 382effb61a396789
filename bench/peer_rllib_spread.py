"""RLlib's multi-agent PPO, one policy shared by the three agents of PettingZoo's MPE simple_spread, with the
settings of RLlib's own parameter-sharing example. Runs in bench/.venvs/rllib (make_peer_venvs.sh).

    bench/.venvs/rllib/bin/python bench/peer_rllib_spread.py --seed 0 --agent-steps 156000

Trains until `--agent-steps` agent steps (RLlib counts env steps: three agent steps each), then plays the
greedy evaluation bench/bench_multiagent.py gives KubeRL's runs: one episode per seed, its return per
agent. Prints one `BENCH_RESULT {json}` line: the curve (agent steps, seconds since the first train(), mean
agent return of RLlib's 100-episode window) and the evaluation.
"""

from __future__ import annotations

import logging
import os
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch
from common import emit, parser
from mpe2 import simple_spread_v3
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN, NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.tune.registry import register_env

# ray-project/ray, rllib/examples/multi_agent/pettingzoo_parameter_sharing.py (commit 0cf79cd2bce0): one
# policy p0 for every agent, `.training(model={"vf_share_layers": True}, vf_loss_coeff=0.005)`,
# `.rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"p0": RLModuleSpec()}))`, everything else
# RLlib's PPO default (train_batch_size_per_learner 4000 env steps, minibatch 128, 30 epochs, lr 5e-5,
# lambda 1.0, clip 0.3, two 256-unit tanh layers). The example's env is sisl's Waterworld through the AEC
# wrapper; simple_spread is parallel, so RLlib's parallel wrapper. Env runners: ours (2, KubeRL's workers);
# the learner is local (a remote one needs a CPU of its own, which 2 cores running 2 env runners lack).
EXAMPLE = {"vf_share_layers": True, "vf_loss_coeff": 0.005}
EXAMPLE_SOURCE = "ray-project/ray rllib/examples/multi_agent/pettingzoo_parameter_sharing.py @ 0cf79cd2bce0"
AGENTS = 3
KWARGS = {"N": AGENTS, "max_cycles": 25}


def greedy_returns(module, seeds: list[int]) -> list[float]:
    """One episode per seed with each agent's most probable action; each agent's return."""
    returns: list[float] = []
    for seed in seeds:
        env = simple_spread_v3.parallel_env(**KWARGS)
        obs, _ = env.reset(seed=seed)
        totals = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            agents = list(env.agents)
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(np.stack([obs[a] for a in agents]))})
            actions = out["action_dist_inputs"].argmax(dim=-1).numpy()
            obs, rewards, _, _, _ = env.step(dict(zip(agents, actions.tolist(), strict=True)))
            for agent, reward in rewards.items():
                totals[agent] += float(reward)
        env.close()
        returns += list(totals.values())
    return returns


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-runners", type=int, default=2)
    p.add_argument("--agent-steps", type=int, default=156_000)
    p.add_argument("--eval-seeds", type=int, nargs=2, default=[10_000, 30], metavar=("FIRST", "COUNT"))
    p.add_argument("--threads", type=int, default=1, help="learner torch threads (0 = torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, args.env_runners), include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    register_env("spread", lambda _: ParallelPettingZooEnv(simple_spread_v3.parallel_env(**KWARGS)))
    config = (
        PPOConfig()
        .environment("spread")
        .env_runners(num_env_runners=args.env_runners)
        .learners(num_learners=0)
        .multi_agent(policies={"p0"}, policy_mapping_fn=lambda agent_id, *a, **kw: "p0")
        .training(model={"vf_share_layers": EXAMPLE["vf_share_layers"]}, vf_loss_coeff=EXAMPLE["vf_loss_coeff"])
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"p0": RLModuleSpec()}))
        .debugging(seed=args.seed)
    )
    t1 = time.perf_counter()
    algo = config.build_algo()
    build_seconds = time.perf_counter() - t1
    curve, t_train = [], time.perf_counter()
    while True:
        result = algo.train()
        runners = result.get(ENV_RUNNER_RESULTS, {})
        env_steps = int(result.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)))
        total = runners.get(EPISODE_RETURN_MEAN)  # the sum over the episode's agents
        mean = None if total is None or np.isnan(total) else float(total) / AGENTS
        curve.append([env_steps * AGENTS, round(time.perf_counter() - t_train, 3), mean])
        if env_steps * AGENTS >= args.agent_steps:
            break
    train_seconds = time.perf_counter() - t_train
    first, count = args.eval_seeds
    returns = greedy_returns(algo.get_module("p0"), list(range(first, first + count)))
    algo.stop()
    ray.shutdown()
    emit({"contender": "rllib-ppo-shared", "seed": args.seed, "env_runners": args.env_runners,
          "ray_start_seconds": round(ray_start, 3), "build_seconds": round(build_seconds, 3),
          "train_seconds": round(train_seconds, 3), "agent_steps": curve[-1][0], "curve": curve,
          "evaluation_return": float(np.mean(returns)), "evaluation_episodes": len(returns),
          "torch_threads": torch.get_num_threads(), "hyperparameters": EXAMPLE,
          "hyperparameters_source": EXAMPLE_SOURCE})


if __name__ == "__main__":
    main()

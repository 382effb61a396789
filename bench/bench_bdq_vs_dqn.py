"""BDQ against DQN on the flattened action space of AutoscalingMulti-v0: env steps to the same return.

AutoscalingMulti-v0 acts on three dimensions at once, MultiDiscrete([3, 3, 3]). BDQ learns one
advantage branch per dimension (3 + 3 + 3 outputs); DQN needs the product flattened into
Discrete(27) (`FlatActions` below) and learns 27 Q values. Three runs on the same load pattern,
seed, hyperparameters (examples/autoscaling-bdq.yaml's, with epsilon decaying over a fixed 10,000
steps so that the schedule does not decide when a target is reached) and step budget:
  - BDQ with the macro/micro observation split (the example as it is),
  - BDQ on the flat observation (observation_split: false): the branching alone,
  - DQN on the flat observation and the flattened actions.
Reported: env steps until the training return (mean of the last 32 episodes) first reaches the best
threshold autoscaler's mean return on this pattern (tier and priority searched too), and 5 and 10
better; and the greedy evaluation return at the end of the budget (20 seeds).
A second, "wide" action space (5 tiers x 6 priority weights: MultiDiscrete([3, 5, 6]), 90 joint
actions) repeats BDQ (macro/micro) against flattened DQN, where flattening costs more.

    .venv/bin/python bench/bench_bdq_vs_dqn.py [--pattern SPIKE] [--budget 60000] \
        [--output bench/results/bdq_vs_dqn.json]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from common import RESULTS, Bench, Stopwatch, autoscaling_job, best_threshold, example_job, train_job

#: The "wide" action space: 5 capacity tiers and 6 priority weights, MultiDiscrete([3, 5, 6]).
WIDE = {"tiers": [[1.0, 1.0], [1.5, 1.45], [2.0, 1.9], [3.0, 2.8], [4.0, 3.6]],
        "priority_weights": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]}


class FlatActions(gym.ActionWrapper):
    """AutoscalingMulti-v0 with its MultiDiscrete action flattened to one Discrete index (C order:
    the last dimension varies fastest). Used as `bench_bdq_vs_dqn:FlatAutoscalingMulti`."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.nvec = np.asarray(env.action_space.nvec)
        self.action_space = gym.spaces.Discrete(int(np.prod(self.nvec)))

    def action(self, action):
        return np.array(np.unravel_index(int(action), tuple(self.nvec)), dtype=np.int64)


def FlatAutoscalingMulti(**kwargs) -> gym.Env:
    from kuberl.trainer.envs.autoscaling import AutoscalingMultiEnv

    return FlatActions(AutoscalingMultiEnv(**{**kwargs, "observation_split": False}))


def run(name: str, job: dict[str, Any], targets: dict[str, float], work: Path) -> dict[str, Any]:
    curve: list[tuple[int, float]] = []

    def observe(row, loop):
        if row["mean_return"] is not None and row["episodes"] >= 32:
            curve.append((row["env_steps"], row["mean_return"]))

    out = train_job(job, work / name, on_iteration=observe)
    out["env_steps_to"] = {label: next((steps for steps, ret in curve if ret >= target), None)
                           for label, target in targets.items()}
    out["final_training_return"] = curve[-1][1] if curve else None
    print(f"{name}: {out}", flush=True)
    return out


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pattern", default="SPIKE")
    parser.add_argument("--budget", type=int, default=60_000, help="env steps per run")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/kuberl-bench-bdq-vs-dqn"))


def main() -> None:
    bench = Bench(__doc__, RESULTS / "bdq_vs_dqn.json", arguments)
    args = bench.args
    from kuberl.trainer.envs import AUTOSCALING_MULTI_ID
    from kuberl.trainer.workers import start_ray

    report: dict[str, Any] = {"pattern": args.pattern, "budget_env_steps": args.budget}
    clock = Stopwatch()

    start_ray(None, local_slots=2)
    for space, extra_kwargs in (("default", {}), ("wide", WIDE)):
        base = example_job("autoscaling-bdq")
        base["spec"]["environment"]["kwargs"].update(extra_kwargs)
        kwargs = {**base["spec"]["environment"]["kwargs"], "load_pattern": args.pattern}
        threshold = best_threshold(AUTOSCALING_MULTI_ID, kwargs)
        targets = {"threshold": threshold["mean_return"], "threshold+5": threshold["mean_return"] + 5,
                   "threshold+10": threshold["mean_return"] + 10}
        section: dict[str, Any] = {"env_kwargs": extra_kwargs, "threshold": threshold, "targets": targets}

        def job(env_id: str, algorithm: dict[str, Any], split: bool, name: str, base=base) -> dict[str, Any]:
            j = autoscaling_job(base, args.pattern, args.budget, algorithm=algorithm, name=name)
            j["spec"]["environment"]["id"] = env_id
            j["spec"]["environment"]["kwargs"]["observation_split"] = split
            j["spec"]["stopping"]["returnWindow"] = 32
            return j

        bdq = copy.deepcopy(base["spec"]["algorithm"])
        bdq["bdq"]["explorationSteps"] = 10_000
        dqn = {"name": "DQN", "dqn": {k: v for k, v in bdq["bdq"].items()
                                      if k not in ("branchHiddenSize", "targetAggregation")}}
        flat_env = "bench_bdq_vs_dqn:FlatAutoscalingMulti"
        runs = {"bdq_macro_micro": (AUTOSCALING_MULTI_ID, bdq, True), "dqn_flat_actions": (flat_env, dqn, False)}
        if space == "default":
            runs = {**runs, "bdq_flat_obs": (AUTOSCALING_MULTI_ID, bdq, False)}
        section["runs"] = {name: run(f"{space}-{name}", job(env_id, copy.deepcopy(algo), split, name.replace("_", "-")),
                                     targets, args.work_dir)
                           for name, (env_id, algo, split) in runs.items()}
        ratios = {}
        for label in targets:
            bdq_steps = section["runs"]["bdq_macro_micro"]["env_steps_to"][label]
            dqn_steps = section["runs"]["dqn_flat_actions"]["env_steps_to"][label]
            ratios[label] = round(dqn_steps / bdq_steps, 2) if bdq_steps and dqn_steps else None
        section["dqn_steps_over_bdq_steps"] = ratios
        report[space] = section
    report["total_seconds"] = clock.seconds(1)
    bench.write(report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

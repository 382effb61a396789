"""Autoscaling: learned policies against random and the best threshold autoscaler, per load pattern.

For each of the six load patterns, the mean episode return over 20 evaluation seeds (10000-10019,
the same traces for every policy) of:
  - Autoscaling-v0: random, the best ThresholdPolicy (upper/lower grid-searched ON the evaluation
    seeds: the strongest threshold there is on this grid), Q-learning, DQN and PPO;
  - AutoscalingMulti-v0 (macro/micro observation, MultiDiscrete [instances, tier, priority]):
    random, the best MultiThresholdPolicy (tier and priority searched as well) and BDQ.
Each learner trains through the real runtime (`train()`, embedded Ray, 2 rollout workers) from the
example job files (examples/autoscaling-{qlearning,dqn,bdq}.yaml; PPO's config is below) with only
the load pattern, the step budget and the evaluation changed.

    .venv/bin/python bench/bench_autoscaling.py [--patterns SPIKE RANDOM] [--algorithms dqn bdq] \
        [--output bench/results/autoscaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    RESULTS,
    Bench,
    Stopwatch,
    autoscaling_eval_seeds,
    autoscaling_job,
    best_threshold,
    example_job,
    train_job,
)

#: Env steps each learner trains for, per pattern (fit ~15 minutes for the whole benchmark on 2 cores).
BUDGETS = {"qlearning": 200_000, "dqn": 60_000, "ppo": 150_000, "bdq": 60_000}

PPO_ALGORITHM = {
    "name": "PPO",
    "ppo": {"learningRate": 0.001, "rolloutSteps": 64, "gamma": 0.95, "gaeLambda": 0.95, "epochs": 4,
            "minibatches": 4, "entropyCoef": 0.01, "network": {"hiddenSizes": [64, 64], "activation": "tanh"}},
}


def random_baseline(env_id: str, kwargs: dict[str, Any]) -> float:
    import gymnasium as gym
    from kuberl.trainer.envs.baselines import RandomPolicy, evaluate_policy

    space = gym.make(env_id, **kwargs).action_space
    return evaluate_policy(env_id, kwargs, RandomPolicy(space, seed=0), autoscaling_eval_seeds())


def bench_pattern(pattern: str, algorithms: list[str], work: Path) -> dict[str, Any]:
    from kuberl.trainer.envs import AUTOSCALING_ID, AUTOSCALING_MULTI_ID

    kwargs = {"load_pattern": pattern}
    out: dict[str, Any] = {"Autoscaling-v0": {}, "AutoscalingMulti-v0": {}}
    single, multi = out["Autoscaling-v0"], out["AutoscalingMulti-v0"]
    t0 = time.perf_counter()
    single["random"] = {"mean_return": random_baseline(AUTOSCALING_ID, kwargs)}
    single["threshold"] = best_threshold(AUTOSCALING_ID, kwargs)
    single["baseline_seconds"] = round(time.perf_counter() - t0, 2)
    for algo in ("qlearning", "dqn", "ppo"):
        if algo not in algorithms:
            continue
        base = example_job("autoscaling-dqn" if algo == "ppo" else f"autoscaling-{algo}")
        job = autoscaling_job(base, pattern, BUDGETS[algo], algorithm=PPO_ALGORITHM if algo == "ppo" else None,
                              name=f"bench-{algo}")
        single[algo] = train_job(job, work / f"{pattern}-{algo}")
        print(f"{pattern} {algo}: {single[algo]}", flush=True)
    if "bdq" in algorithms:
        t0 = time.perf_counter()
        multi_kwargs = {**example_job("autoscaling-bdq")["spec"]["environment"].get("kwargs", {}), **kwargs}
        multi["random"] = {"mean_return": random_baseline(AUTOSCALING_MULTI_ID, multi_kwargs)}
        multi["threshold"] = best_threshold(AUTOSCALING_MULTI_ID, multi_kwargs)
        multi["baseline_seconds"] = round(time.perf_counter() - t0, 2)
        multi["bdq"] = train_job(autoscaling_job(example_job("autoscaling-bdq"), pattern, BUDGETS["bdq"]),
                                 work / f"{pattern}-bdq")
        print(f"{pattern} bdq: {multi['bdq']}", flush=True)
    return out


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Which learners beat the best threshold on this pattern, by how much."""
    rows = {}
    for env_name, section in result.items():
        threshold = section.get("threshold", {}).get("mean_return")
        for algo in ("qlearning", "dqn", "ppo", "bdq"):
            if algo in section and threshold is not None:
                rows[f"{env_name}/{algo}"] = round(section[algo]["mean_return"] - threshold, 2)
    best = max(rows.values()) if rows else None
    return {"margin_over_best_threshold": rows, "a_learner_beats_threshold": bool(best is not None and best > 0)}


def arguments(parser: argparse.ArgumentParser) -> None:
    from kuberl.trainer.envs.load_patterns import LOAD_PATTERNS

    parser.add_argument("--patterns", nargs="+", default=list(LOAD_PATTERNS), choices=LOAD_PATTERNS)
    parser.add_argument("--algorithms", nargs="+", default=["qlearning", "dqn", "ppo", "bdq"],
                        choices=["qlearning", "dqn", "ppo", "bdq"])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/kuberl-bench-autoscaling"))


def main() -> None:
    bench = Bench(__doc__, RESULTS / "autoscaling.json", arguments)
    args = bench.args
    from kuberl.trainer.workers import start_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    seeds = autoscaling_eval_seeds()
    report: dict[str, Any] = {"budgets_env_steps": BUDGETS, "eval_seeds": [seeds[0], seeds[-1]], "patterns": {}}
    clock = Stopwatch()
    start_ray(None, local_slots=2)
    for pattern in args.patterns:
        result = bench_pattern(pattern, args.algorithms, args.work_dir)
        report["patterns"][pattern] = {**result, **verdict(result)}
        print(json.dumps({pattern: report["patterns"][pattern]}, indent=1), flush=True)
    report["total_seconds"] = clock.seconds(1)
    report["learner_beats_threshold_on_every_pattern"] = all(
        p["a_learner_beats_threshold"] for p in report["patterns"].values())
    bench.write(report)
    print(f"{report['total_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()

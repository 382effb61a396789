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
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EVAL_SEED, EVAL_EPISODES = 10_000, 20
THRESHOLD_UPPERS = (0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1, 1.2)
THRESHOLD_LOWERS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

#: Env steps each learner trains for, per pattern (fit ~15 minutes for the whole benchmark on 2 cores).
BUDGETS = {"qlearning": 200_000, "dqn": 60_000, "ppo": 150_000, "bdq": 60_000}

PPO_ALGORITHM = {
    "name": "PPO",
    "ppo": {"learningRate": 0.001, "rolloutSteps": 64, "gamma": 0.95, "gaeLambda": 0.95, "epochs": 4,
            "minibatches": 4, "entropyCoef": 0.01, "network": {"hiddenSizes": [64, 64], "activation": "tanh"}},
}


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def example_job(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / f"autoscaling-{name}.yaml").read_text())


def bench_job(base: dict[str, Any], pattern: str, max_env_steps: int, *, algorithm: dict | None = None,
              name: str | None = None) -> dict[str, Any]:
    """An example job with another load pattern and budget, evaluated on the benchmark's seeds only."""
    job = copy.deepcopy(base)
    spec = job["spec"]
    if algorithm is not None:
        spec["algorithm"] = algorithm
    if name is not None:
        job["metadata"]["name"] = name
    spec["environment"].setdefault("kwargs", {})["load_pattern"] = pattern
    spec["stopping"] = {"maxEnvSteps": max_env_steps}
    spec["evaluation"] = {"episodes": EVAL_EPISODES, "seed": EVAL_SEED}
    spec["checkpointing"] = {"enabled": False}
    return job


def train_job(job_dict: dict[str, Any], run_dir: Path, on_iteration=None) -> dict[str, Any]:
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    t0 = time.perf_counter()
    result = train(parse_job(job_dict), TrainOptions(run_dir=run_dir, metrics_port=0, progress=False,
                                                      shutdown_ray=False, on_iteration=on_iteration))
    ev = result.evaluation["deterministic"]
    return {"mean_return": ev["mean_return"], "std_return": ev["std_return"],
            "env_steps": result.counters.env_steps, "gradient_updates": result.counters.gradient_updates,
            "train_seconds": round(result.counters.wall_clock, 2),
            "seconds_with_evaluation": round(time.perf_counter() - t0, 2)}


def eval_seeds() -> list[int]:
    return list(range(EVAL_SEED, EVAL_SEED + EVAL_EPISODES))


def random_baseline(env_id: str, kwargs: dict[str, Any]) -> float:
    import gymnasium as gym

    from kuberl.trainer.envs.baselines import RandomPolicy, evaluate_policy

    space = gym.make(env_id, **kwargs).action_space
    return evaluate_policy(env_id, kwargs, RandomPolicy(space, seed=0), eval_seeds())


def best_threshold(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The strongest threshold autoscaler on this grid: on Autoscaling-v0 every (upper, lower) pair
    scored on the evaluation seeds; on AutoscalingMulti-v0 (x 3 tiers x 3 priorities: 450 settings)
    the 10 best on 5 other seeds, then scored on the evaluation seeds."""
    import gymnasium as gym

    from kuberl.trainer.envs import AUTOSCALING_MULTI_ID
    from kuberl.trainer.evaluation.baselines import rank_thresholds, threshold_grid

    multi = env_id == AUTOSCALING_MULTI_ID
    env = gym.make(env_id, **kwargs)
    try:
        grid = threshold_grid(env, {}, multi)
        if multi:
            tuning_seeds = list(range(EVAL_SEED + EVAL_EPISODES, EVAL_SEED + EVAL_EPISODES + 5))
            grid = [params for _, params in rank_thresholds(env, grid, tuning_seeds, multi)[:10]]
        score, params = rank_thresholds(env, grid, eval_seeds(), multi)[0]
    finally:
        env.close()
    return {"mean_return": score, **params}


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
        base = example_job("dqn") if algo == "ppo" else example_job(algo)
        job = bench_job(base, pattern, BUDGETS[algo], algorithm=PPO_ALGORITHM if algo == "ppo" else None,
                        name=f"bench-{algo}")
        single[algo] = train_job(job, work / f"{pattern}-{algo}")
        print(f"{pattern} {algo}: {single[algo]}", flush=True)
    if "bdq" in algorithms:
        t0 = time.perf_counter()
        multi_kwargs = {**example_job("bdq")["spec"]["environment"].get("kwargs", {}), **kwargs}
        multi["random"] = {"mean_return": random_baseline(AUTOSCALING_MULTI_ID, multi_kwargs)}
        multi["threshold"] = best_threshold(AUTOSCALING_MULTI_ID, multi_kwargs)
        multi["baseline_seconds"] = round(time.perf_counter() - t0, 2)
        multi["bdq"] = train_job(bench_job(example_job("bdq"), pattern, BUDGETS["bdq"]), work / f"{pattern}-bdq")
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


def main() -> None:
    from kuberl.trainer.envs.load_patterns import LOAD_PATTERNS
    from kuberl.trainer.workers import start_ray

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patterns", nargs="+", default=list(LOAD_PATTERNS), choices=LOAD_PATTERNS)
    parser.add_argument("--algorithms", nargs="+", default=["qlearning", "dqn", "ppo", "bdq"],
                        choices=["qlearning", "dqn", "ppo", "bdq"])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/kuberl-bench-autoscaling"))
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "autoscaling.json")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report: dict[str, Any] = {"machine_before": machine(), "budgets_env_steps": BUDGETS,
                              "eval_seeds": [EVAL_SEED, EVAL_SEED + EVAL_EPISODES - 1], "patterns": {}}
    t0 = time.perf_counter()
    start_ray(None, local_slots=2)
    for pattern in args.patterns:
        result = bench_pattern(pattern, args.algorithms, args.work_dir)
        report["patterns"][pattern] = {**result, **verdict(result)}
        print(json.dumps({pattern: report["patterns"][pattern]}, indent=1), flush=True)
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    report["machine_after"] = machine()
    report["learner_beats_threshold_on_every_pattern"] = all(
        p["a_learner_beats_threshold"] for p in report["patterns"].values())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output} in {report['total_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()

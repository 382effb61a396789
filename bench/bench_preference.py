"""BDQ with and without the preference-alignment head on the six autoscaling load patterns.

The job is examples/autoscaling-bdq.yaml (AutoscalingMulti-v0, macro/micro split) on each of the
six load patterns, with sync collection from 1 worker x 8 envs, the same env-step budget and the
same seeds for both contenders:
  - bdq:       the example's BDQ without its `preference` head;
  - bdq+pref:  the example as it is (its preference settings are the defaults: weight 1, 25-step
               segments, the exact synthetic teacher counting SLO-violation steps and steps above 90%
               utilisation, no reward shaping); optionally a third contender with `--shaping BETA`.
Each trained policy is scored greedily on the benchmark's 20 evaluation traces (seeds 10000-10019):
mean return, SLO-violation steps and dropped requests (high and low priority) per episode, and the
preference head's last held-out accuracy. Target: fewer SLO violations on >= 4 of 6
patterns at no more than 2% lower return.

    nice .venv/bin/python bench/bench_preference.py [--budget 20000] [--seeds 3] \
        [--output bench/results/preference_head.json]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    RESULTS,
    Bench,
    autoscaling_eval_seeds,
    autoscaling_job,
    example_job,
    read_result,
    write_json,
)

PATTERNS = ("SINE_CURVE", "SINUSOIDAL", "STEADY", "SPIKE", "POISSON", "RANDOM")


def score(algo, env_kwargs: dict[str, Any]) -> dict[str, float]:
    """Greedy episodes of the trained policy on the evaluation seeds, side by side."""
    from kuberl.trainer.policies import make_policy
    from kuberl.trainer.rollout import make_vector_env
    from kuberl.trainer.spaces import flatten_obs

    seeds = autoscaling_eval_seeds()
    env = make_vector_env("kuberl/AutoscalingMulti-v0", env_kwargs, len(seeds))
    policy = make_policy(algo.info, algo.policy_config())
    policy.load(algo.weights())
    raw, _ = env.reset(seed=seeds)
    total, slo, dropped = (np.zeros(len(seeds)) for _ in range(3))
    running = np.ones(len(seeds), bool)
    while running.any():
        obs = flatten_obs(env.single_observation_space, raw, len(seeds))
        raw, reward, terminated, truncated, info = env.step(np.asarray(policy.greedy(obs, None)))
        step = info.get("final_info", info) if truncated.any() else info
        total += np.where(running, reward, 0.0)
        slo += np.where(running, np.asarray(step["slo_violation"], float), 0.0)
        dropped += np.where(running, np.asarray(step["dropped"], float), 0.0)  # high and low priority
        running &= ~(terminated | truncated)
    env.close()
    return {"mean_return": float(total.mean()), "slo_violation_steps": float(slo.mean()),
            "dropped_requests": float(dropped.mean())}


def run_one(base: dict, pattern: str, seed: int, budget: int, preference: dict | None, work: Path) -> dict[str, Any]:
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    job = autoscaling_job(base, pattern, budget)
    spec = job["spec"]
    spec["seed"] = seed
    spec["evaluation"] = {"enabled": False}
    spec["collection"] = {"mode": "sync", "fragmentSteps": 32}
    spec["rolloutWorkers"] = {"replicas": 1, "envsPerWorker": 8}
    spec["algorithm"]["bdq"].pop("preference", None)
    if preference is not None:
        spec["algorithm"]["bdq"]["preference"] = preference
    seen: dict[str, Any] = {}

    def observe(row, loop):
        seen["algo"], seen["row"] = loop.algo, row

    t0 = time.perf_counter()
    result = train(parse_job(job), TrainOptions(run_dir=work, metrics_port=0, progress=False, shutdown_ray=False,
                                                on_iteration=observe))
    out = score(seen["algo"], spec["environment"]["kwargs"])
    out.update(seconds=round(time.perf_counter() - t0, 1), env_steps=result.counters.env_steps,
               gradient_updates=result.counters.gradient_updates)
    if preference is not None:
        out["preference_accuracy"] = seen["row"].get("preference_accuracy")
        out["preference_pairs_used"] = seen["row"].get("preference_pairs_used")
    return out


def summarise(runs: dict[str, dict[str, list[dict]]], contenders: list[str]) -> dict[str, Any]:
    table, wins = {}, 0
    for pattern, by_name in runs.items():
        row = {}
        for name in contenders:
            rs = by_name.get(name, [])
            if rs:
                row[name] = {k: round(float(np.mean([r[k] for r in rs])), 2)
                             for k in ("mean_return", "slo_violation_steps", "dropped_requests", "seconds")}
                row[name]["seeds"] = len(rs)
        if "bdq" in row and "bdq+pref" in row:
            a, b = row["bdq"], row["bdq+pref"]
            row["fewer_slo_violations"] = b["slo_violation_steps"] < a["slo_violation_steps"]
            row["return_change_pct"] = round(100 * (b["mean_return"] - a["mean_return"]) / abs(a["mean_return"]), 2)
            row["target_met"] = row["fewer_slo_violations"] and row["return_change_pct"] >= -2.0
            wins += row["target_met"]
        table[pattern] = row
    return {"patterns": table, "patterns_target_met": wins}


def markdown(summary: dict[str, Any]) -> str:
    """The summary as the README's table: per pattern, each contender's mean over seeds."""
    lines = [("| pattern | seeds | return: bdq / +pref | change | SLO-violation steps: bdq / +pref "
             "| dropped requests: bdq / +pref | wall s: bdq / +pref | target met |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for pattern, row in summary["patterns"].items():
        if "bdq" not in row or "bdq+pref" not in row:
            continue
        a, b = row["bdq"], row["bdq+pref"]
        lines.append(f"| {pattern} | {min(a['seeds'], b['seeds'])} | {a['mean_return']:.1f} / {b['mean_return']:.1f} "
                     f"| {row['return_change_pct']:+.1f}% | {a['slo_violation_steps']:.2f} / "
                     f"{b['slo_violation_steps']:.2f} | {a['dropped_requests']:.0f} / {b['dropped_requests']:.0f} "
                     f"| {a['seconds']:.0f} / {b['seconds']:.0f} | {'yes' if row['target_met'] else 'no'} |")
    lines.append(f"\nTarget (fewer SLO violations at no more than 2% lower return) met on "
                 f"{summary['patterns_target_met']} of {len(summary['patterns'])} patterns.")
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--patterns", nargs="*", default=list(PATTERNS))
    parser.add_argument("--shaping", type=float, default=None, help="also run bdq+pref with rewardShaping BETA")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kuberl-bench-preference"))
    parser.add_argument("--table", action="store_true", help="print --output's table (markdown) and exit")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "preference_head.json", arguments)
    args = bench.args
    if args.table:
        record = read_result(bench.output)  # the summary recomputed from its runs
        runs = record["results"]["runs"]
        contenders = list(dict.fromkeys(name for by_name in runs.values() for name in by_name))
        record["summary"] = summarise(runs, contenders)
        write_json(bench.output, record)
        print(markdown(record["summary"]))
        return

    from kuberl.trainer.workers import start_ray

    start_ray(None, local_slots=2)
    base = example_job("autoscaling-bdq")
    example = base["spec"]["algorithm"]["bdq"]["preference"]
    contenders: dict[str, dict | None] = {"bdq": None, "bdq+pref": example}
    if args.shaping is not None:
        contenders["bdq+pref+shaping"] = {**example, "rewardShaping": args.shaping}
    runs: dict[str, dict[str, list[dict]]] = {}
    results = {"budget_env_steps": args.budget, "seeds": args.seeds,
               "job": "examples/autoscaling-bdq.yaml, sync collection, 1 worker x 8 envs, no evaluation in train()",
               "eval_seeds": "10000-10019 (20 episodes of 200 steps)", "runs": runs}
    for seed in range(args.seeds):  # seed-major: a cut-short run still covers every pattern
        for pattern in args.patterns:
            for name, preference in contenders.items():
                out = run_one(copy.deepcopy(base), pattern, seed, args.budget, preference,
                              args.work / f"{pattern}-{name}-{seed}")
                runs.setdefault(pattern, {}).setdefault(name, []).append({"seed": seed, **out})
                print(f"{pattern} {name} seed {seed}: {out}", flush=True)
                bench.write(results, summarise(runs, list(contenders)))
    print(markdown(summarise(runs, list(contenders))))


if __name__ == "__main__":
    main()

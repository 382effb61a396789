"""Asynchronous against synchronous collection for DQN on the same env-step budget.

examples/autoscaling-dqn.yaml (Autoscaling-v0, SINE_CURVE) trained with 1 and with 2 rollout workers,
each `collection.mode: sync` then `async` (queueSize 2, maxStaleness 1000), same seed and budget. Reported
per run: learner updates per second, env steps per second, wall-clock until the training return
(mean of the last 32 episodes) first reaches the target (the best threshold autoscaler's mean
return), the greedy evaluation return, and the two wait metrics (kuberl_learner_wait_seconds_total,
kuberl_worker_weight_wait_seconds_total).

A third pair ("io_bound", 2 workers) adds 1 ms of waiting to every env step (`SlowAutoscaling`),
as an environment that calls out to a real system does: then the workers mostly wait, not compute,
and async collection overlaps that waiting with the learner's updates.

    .venv/bin/python bench/bench_async.py [--budget 40000] [--output bench/results/async.json]

On a machine with fewer free cores than learner + workers, async collection cannot add compute
throughput: the workers' env steps and the learner's updates share the same cores (see the load
average recorded).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from common import RESULTS, Bench, Stopwatch, autoscaling_job, best_threshold, example_job, train_job
from kuberl.trainer.envs.autoscaling import AutoscalingEnv


class SlowAutoscaling(AutoscalingEnv):  # used as a module:Class env id, so a gymnasium.Env subclass
    """Autoscaling-v0 whose every step also waits `step_latency_ms`, like a call to a live platform."""

    def __init__(self, step_latency_ms: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_latency_ms = step_latency_ms

    def step(self, action):
        time.sleep(self.step_latency_ms / 1000.0)
        return super().step(action)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pattern", default="SINE_CURVE")
    parser.add_argument("--budget", type=int, default=40_000, help="env steps per run")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/kuberl-bench-async"))


def main() -> None:
    bench = Bench(__doc__, RESULTS / "async.json", arguments)
    args = bench.args
    from kuberl.trainer.envs import AUTOSCALING_ID
    from kuberl.trainer.workers import start_ray

    report: dict[str, Any] = {"pattern": args.pattern, "budget_env_steps": args.budget}
    clock = Stopwatch()
    target = best_threshold(AUTOSCALING_ID, {"load_pattern": args.pattern})["mean_return"]
    report["target_return"] = target
    start_ray(None, local_slots=2)
    report["runs"] = {}
    scenarios = [("1_workers", 1, None), ("2_workers", 2, None), ("io_bound", 2, "bench_async:SlowAutoscaling")]
    for scenario, workers, env_id in scenarios:
        for mode in ("sync", "async"):
            job = autoscaling_job(example_job("autoscaling-dqn"), args.pattern, args.budget,
                                  name=f"bench-{mode}-{workers}")
            if env_id is not None:
                job["spec"]["environment"]["id"] = env_id
            job["spec"]["rolloutWorkers"]["replicas"] = workers
            job["spec"]["collection"] = {"mode": mode, "queueSize": 2, "maxStaleness": 1000, "fragmentSteps": 32}
            job["spec"]["stopping"]["returnWindow"] = 32
            seen: dict[str, Any] = {}

            def observe(row, loop, seen=seen):
                seen["row"] = row
                if "seconds_to_target" not in seen and row["mean_return"] is not None \
                        and row["mean_return"] >= target and row["episodes"] >= 32:
                    seen.update(seconds_to_target=row["wall_clock"], env_steps_to_target=row["env_steps"])

            out = train_job(job, args.work_dir / f"{scenario}-{mode}", on_iteration=observe)
            last = seen["row"]
            out.update(
                updates_per_second=round(out["gradient_updates"] / last["wall_clock"], 1),
                env_steps_per_second=round(out["env_steps"] / last["wall_clock"], 1),
                seconds_to_target=seen.get("seconds_to_target"), env_steps_to_target=seen.get("env_steps_to_target"),
                learner_wait_seconds=round(last["learner_wait"], 2),
                worker_weight_wait_seconds=round(last["worker_wait"], 2),
            )
            report["runs"][f"{scenario}_{mode}"] = out
            print(f"{scenario} {mode}: {out}", flush=True)
    report["async_over_sync_updates_per_second"] = {
        name: round(report["runs"][f"{name}_async"]["updates_per_second"]
                    / report["runs"][f"{name}_sync"]["updates_per_second"], 2) for name, _, _ in scenarios}
    report["total_seconds"] = clock.seconds(1)
    bench.write(report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Asynchronous against synchronous collection for DQN on the same env-step budget.

examples/autoscaling-dqn.yaml (Autoscaling-v0, SINE_CURVE) trained with 1 and with 2 rollout workers,
each `collection.mode: sync` then `async` (queueSize 2, maxStaleness 1000), same seed and budget. Reported
per run: learner updates per second, env steps per second, wall-clock until the training return
(mean of the last 32 episodes) first reaches the target (the best threshold autoscaler's mean
return), the greedy evaluation return, and the two wait metrics (kuberl_learner_wait_seconds_total,
kuberl_worker_weight_wait_seconds_total).

    .venv/bin/python bench/bench_async.py [--budget 40000] [--output bench/results/async.json]

On a machine with fewer cores than learner + workers, async collection cannot add throughput: the
workers' env steps and the learner's updates share the same cores (see the load average recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from bench_autoscaling import best_threshold, bench_job, example_job, machine, train_job
    from kuberl.trainer.envs import AUTOSCALING_ID
    from kuberl.trainer.workers import start_ray

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pattern", default="SINE_CURVE")
    parser.add_argument("--budget", type=int, default=40_000, help="env steps per run")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/kuberl-bench-async"))
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "async.json")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine_before": machine(), "pattern": args.pattern, "budget_env_steps": args.budget}
    t0 = time.perf_counter()
    target = best_threshold(AUTOSCALING_ID, {"load_pattern": args.pattern})["mean_return"]
    report["target_return"] = target
    start_ray(None, local_slots=2)
    report["runs"] = {}
    for workers in (1, 2):
        for mode in ("sync", "async"):
            job = bench_job(example_job("dqn"), args.pattern, args.budget, name=f"bench-{mode}-{workers}")
            job["spec"]["rolloutWorkers"]["replicas"] = workers
            job["spec"]["collection"] = {"mode": mode, "queueSize": 2, "maxStaleness": 1000, "fragmentSteps": 32}
            job["spec"]["stopping"]["returnWindow"] = 32
            seen: dict[str, Any] = {}

            def observe(row, loop, seen=seen):
                seen["row"] = row
                if "seconds_to_target" not in seen and row["mean_return"] is not None \
                        and row["mean_return"] >= target and row["episodes"] >= 32:
                    seen.update(seconds_to_target=row["wall_clock"], env_steps_to_target=row["env_steps"])

            out = train_job(job, args.work_dir / f"{mode}-{workers}", on_iteration=observe)
            last = seen["row"]
            out.update(
                updates_per_second=round(out["gradient_updates"] / last["wall_clock"], 1),
                env_steps_per_second=round(out["env_steps"] / last["wall_clock"], 1),
                seconds_to_target=seen.get("seconds_to_target"), env_steps_to_target=seen.get("env_steps_to_target"),
                learner_wait_seconds=round(last["learner_wait"], 2),
                worker_weight_wait_seconds=round(last["worker_wait"], 2),
            )
            report["runs"][f"{workers}_workers_{mode}"] = out
            print(f"{workers} workers {mode}: {out}", flush=True)
    report["async_over_sync_updates_per_second"] = {
        f"{k}_workers": round(report["runs"][f"{k}_workers_async"]["updates_per_second"]
                              / report["runs"][f"{k}_workers_sync"]["updates_per_second"], 2) for k in (1, 2)}
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    report["machine_after"] = machine()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Many agents: KubeRL's PPO with one shared policy against RLlib's multi-agent PPO with one shared policy, on
PettingZoo's MPE simple_spread (three agents), in the same run, 5 seeds each, each through its own command as
a user runs it, one seed after another.

- KubeRL: `kuberl sweep examples/sweeps/spread-ppo-seeds.yaml` (examples/spread-ppo.yaml's spec, PPO's
  defaults, 2 rollout workers x 8 env copies, 156,000 agent steps).
- RLlib 2.60: bench/peer_rllib_spread.py, the settings of RLlib's own parameter-sharing example (cited there),
  2 env runners, the same agent steps (RLlib counts env steps: 3 agent steps each).

Both are scored by the same greedy evaluation (each agent's most probable action, seeds 10000..10029, the
mean return of the 90 agent episodes): its IQM over the seeds with a 95% bootstrap interval
(kuberl.sweep.statistics). Time to the same return: each seed's seconds from its first iteration until the
mean agent return of its training window first reaches the median of RLlib's final ones (each library's
own window of recent episodes). The whole command's time is quoted beside each trial's training clock.

    bash bench/make_peer_venvs.sh rllib                 # once: RLlib's own virtualenv (with PettingZoo, MPE)
    .venv/bin/python bench/bench_multiagent.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    BENCH,
    EXAMPLES,
    REPO,
    RESULT_PREFIX,
    RESULTS,
    Bench,
    iqm_interval,
    kuberl_sweep,
    load_average,
)

SWEEP = EXAMPLES / "sweeps" / "spread-ppo-seeds.yaml"
AGENT_STEPS = 156_000


def arguments(p) -> None:
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rllib-python", default=str(BENCH / ".venvs" / "rllib" / "bin" / "python"))


def interval(values: list[float]) -> dict[str, Any]:
    return iqm_interval(values, 2)


def seconds_to(curve: list[list[Any]], target: float) -> float | None:
    """The first time (s) on a curve of [agent steps, seconds, mean return] whose return reaches `target`."""
    return next((t for _, t, mean in curve if mean is not None and mean >= target), None)


def run_kuberl(seeds: int) -> dict[str, Any]:
    with kuberl_sweep(SWEEP, "bench-multiagent-") as (rows, whole, load):
        trials = []
        for row in rows[:seeds]:
            run_dir = Path(row["run_dir"])
            summary = json.loads((run_dir / "summary.json").read_text())
            iterations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            trials.append({"seed": int(row["seed"]), "agent_steps": int(row["env_steps"]),
                           "evaluation_return": round(float(row["evaluation_return"]), 2),
                           "training_seconds": summary.get("wall_clock"),
                           "curve": [[r["env_steps"], r["wall_clock"], r.get("mean_return")] for r in iterations]})
    return {"command": f"kuberl sweep {SWEEP.relative_to(REPO)}", "whole_command_seconds": whole,
            "loadavg_start": load, "trials": trials}


def run_rllib(python: str, seeds: int) -> dict[str, Any]:
    trials, total = [], 0.0
    for seed in range(seeds):
        t0 = time.perf_counter()
        proc = subprocess.run([python, str(BENCH / "peer_rllib_spread.py"), "--seed", str(seed),
                               "--agent-steps", str(AGENT_STEPS)], cwd=BENCH, capture_output=True, text=True,
                              check=False)
        wall = time.perf_counter() - t0
        total += wall
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if not lines:
            raise SystemExit(f"RLlib seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(lines[-1][len(RESULT_PREFIX):])
        trials.append({"seed": seed, "agent_steps": result["agent_steps"],
                       "evaluation_return": round(result["evaluation_return"], 2),
                       "training_seconds": result["train_seconds"], "process_seconds": round(wall, 1),
                       "curve": result["curve"], "hyperparameters_source": result["hyperparameters_source"]})
        print(f"rllib seed {seed}: {trials[-1]['evaluation_return']} in {wall:.1f} s", file=sys.stderr, flush=True)
    return {"command": f"bench/.venvs/rllib/bin/python bench/peer_rllib_spread.py --seed N --agent-steps "
                       f"{AGENT_STEPS}, N = 0..{seeds - 1}", "whole_command_seconds": round(total, 1),
            "trials": trials}


def score(side: dict[str, Any], target: float) -> None:
    """The side's evaluation IQM and its seconds to `target`, in place."""
    side["evaluation_return"] = interval([t["evaluation_return"] for t in side["trials"]])
    for trial in side["trials"]:
        trial["seconds_to_target"] = seconds_to(trial["curve"], target)
    reached = [t["seconds_to_target"] for t in side["trials"] if t["seconds_to_target"] is not None]
    side["seeds_at_target"] = len(reached)
    side["median_seconds_to_target"] = round(statistics.median(reached), 2) if reached else None


def main() -> None:
    bench = Bench(__doc__, RESULTS / "multiagent.json", arguments)
    args = bench.args
    before = load_average()
    ours = run_kuberl(args.seeds)
    print(f"kuberl: {ours['whole_command_seconds']} s", file=sys.stderr, flush=True)
    peer = run_rllib(args.rllib_python, args.seeds)
    target = round(statistics.median(t["curve"][-1][2] for t in peer["trials"]), 2)
    score(ours, target)
    score(peer, target)
    results = {"task": "mpe2 simple_spread_v3 (N=3, max_cycles=25)", "agent_steps": AGENT_STEPS,
               "target_return": target, "target_is": "the median of RLlib's final training-window returns",
               "loadavg_before": before, "kuberl_ppo_shared": ours, "rllib_ppo_shared": peer}
    summary = {
        "kuberl_evaluation_iqm": ours["evaluation_return"], "rllib_evaluation_iqm": peer["evaluation_return"],
        "target_return": target,
        "kuberl_median_seconds_to_target": ours["median_seconds_to_target"],
        "rllib_median_seconds_to_target": peer["median_seconds_to_target"],
        "seconds_to_target_rllib_over_kuberl": (
            round(peer["median_seconds_to_target"] / ours["median_seconds_to_target"], 2)
            if ours["median_seconds_to_target"] and peer["median_seconds_to_target"] else None),
        "whole_command_rllib_over_kuberl": round(peer["whole_command_seconds"] / ours["whole_command_seconds"], 2),
    }
    bench.write(results, summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

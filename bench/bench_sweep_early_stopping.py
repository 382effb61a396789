"""What early stopping saves in a sweep: 4 PPO learning rates x 5 seeds on CartPole-v1, two of them
clearly worse, run twice with `kuberl sweep` (the whole command, trials on its embedded Ray): once with no
pruner, every trial to its env-step budget, and once with the median pruner. Reports the env steps each
sweep ran, the saving, each sweep's ranking (IQM of the final training return, 95% bootstrap CIs) and
whether both pick the same best configuration.

    .venv/bin/python bench/bench_sweep_early_stopping.py [--max-env-steps 60000] [--keep DIR]

Writes bench/results/sweep_early_stopping.json (--output).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench

#: Two learning rates that learn CartPole within the budget and two so small that they barely move.
LEARNING_RATES = [0.01, 0.0025, 3e-5, 1e-5]


def sweep_file(pruner: str, max_env_steps: int, every: int, min_steps: int, startup: int) -> dict:
    return {
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep",
        "metadata": {"name": f"lr-{pruner.lower()}"},
        "spec": {
            "template": {
                "algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
                "rolloutWorkers": {"replicas": 1, "envsPerWorker": 8},
                "stopping": {"maxEnvSteps": max_env_steps},
                "checkpointing": {"intervalSeconds": 600}, "evaluation": {"enabled": False},
            },
            "parameters": [{"path": "algorithm.ppo.learningRate", "values": LEARNING_RATES}],
            "seeds": 5, "search": {"sampler": "grid"}, "objective": {"metric": "meanReturn"},
            "earlyStopping": {"pruner": pruner, "everyEnvSteps": every, "minEnvSteps": min_steps,
                              "startupTrials": startup},
            "maxTrials": 20, "parallelism": 2,
        },
    }


def run(spec: dict, directory: Path) -> dict:
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(path), "--dir",
                           str(directory / "out"), "--no-progress"], capture_output=True, text=True, timeout=3600,
                          cwd=REPO, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"kuberl sweep failed ({proc.returncode}): {proc.stderr[-3000:]}")
    print(proc.stdout, flush=True)
    rows = list(csv.DictReader((directory / "out" / "results.csv").open()))
    ranking = json.loads((directory / "out" / "ranking.json").read_text())["configurations"]
    by_lr: dict[str, dict] = {}
    for row in rows:
        lr = row["algorithm.ppo.learningRate"]
        entry = by_lr.setdefault(lr, {"trials": 0, "pruned": 0, "env_steps": 0})
        entry["trials"] += 1
        entry["pruned"] += row["state"] == "pruned"
        entry["env_steps"] += int(row["env_steps"])
    return {
        "command_seconds": round(wall, 1),
        "env_steps": sum(int(r["env_steps"]) for r in rows),
        "states": {s: sum(r["state"] == s for r in rows) for s in sorted({r["state"] for r in rows})},
        "per_learning_rate": by_lr,
        "ranking": [{"rank": c["rank"], "learning_rate": c["params"]["algorithm.ppo.learningRate"],
                     "completed": c["completed"], "iqm": c["iqm"], "versus_best": c["versus_best"],
                     "significant": c["significant"]} for c in ranking],
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-env-steps", type=int, default=60_000, help="each trial's budget")
    parser.add_argument("--every", type=int, default=4_000, help="earlyStopping.everyEnvSteps")
    parser.add_argument("--min-env-steps", type=int, default=8_000, help="earlyStopping.minEnvSteps")
    parser.add_argument("--startup-trials", type=int, default=2, help="earlyStopping.startupTrials")
    parser.add_argument("--keep", type=Path, help="leave both sweep directories here")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "sweep_early_stopping.json", arguments)
    args = bench.args
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        results = {pruner: run(sweep_file(pruner, args.max_env_steps, args.every, args.min_env_steps,
                                          args.startup_trials), root / pruner)
                   for pruner in ("none", "median")}
    full, pruned = results["none"], results["median"]
    best = {name: next(c["learning_rate"] for c in r["ranking"] if c["rank"] == 1) for name, r in results.items()}
    summary = {
        "env_steps_without_pruner": full["env_steps"],
        "env_steps_with_median_pruner": pruned["env_steps"],
        "env_steps_saved_fraction": round(1 - pruned["env_steps"] / full["env_steps"], 4),
        "best_learning_rate": best,
        "same_best": best["none"] == best["median"],
        "command_seconds": {name: r["command_seconds"] for name, r in results.items()},
    }
    print(json.dumps(summary, indent=1))
    bench.write({"learning_rates": LEARNING_RATES, "seeds": 5, "max_env_steps": args.max_env_steps,
                 "early_stopping": {"pruner": "median", "every_env_steps": args.every,
                                    "min_env_steps": args.min_env_steps, "startup_trials": args.startup_trials},
                 **results}, summary)


if __name__ == "__main__":
    main()

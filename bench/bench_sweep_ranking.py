"""The example sweep, as a user runs it: `kuberl sweep examples/sweeps/cartpole-ppo-lr.yaml` (3 PPO learning
rates x 5 seeds on CartPole-v1), its ranking (IQM of the final training return, 95% bootstrap CIs, which
differences are significant), and a check that the ranking and results.csv are the trials' own summaries:
each row's return is its run's summary.json, and each IQM is recomputed from those summaries.

    .venv/bin/python bench/bench_sweep_ranking.py [--keep DIR]

Writes bench/results/sweep_ranking.json (--output).
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

from common import EXAMPLES, REPO, RESULTS, Bench

EXAMPLE = EXAMPLES / "sweeps" / "cartpole-ppo-lr.yaml"


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep", type=Path, help="leave the sweep directory here")


def check(directory: Path) -> dict:
    """Every row against its run's summary.json, every IQM against the summaries' own values."""
    from kuberl.sweep.statistics import iqm

    rows = list(csv.DictReader((directory / "results.csv").open()))
    returns: dict[float, list[float]] = {}
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert float(row["mean_return"]) == summary["mean_return"] == float(row["objective"]), row
        assert int(row["env_steps"]) == summary["env_steps"], row
        returns.setdefault(float(row["algorithm.ppo.learningRate"]), []).append(summary["mean_return"])
    ranking = json.loads((directory / "ranking.json").read_text())["configurations"]
    for entry in ranking:
        values = returns[entry["params"]["algorithm.ppo.learningRate"]]
        assert abs(iqm(values) - entry["iqm"]["estimate"]) < 1e-9, entry
    return {"trials": len(rows), "rows_match_summaries": True, "iqm_recomputed_from_summaries": True,
            "returns_by_learning_rate": {str(lr): sorted(v) for lr, v in returns.items()},
            "ranking": [{"rank": c["rank"], "learning_rate": c["params"]["algorithm.ppo.learningRate"],
                         "iqm": c["iqm"], "versus_best": c["versus_best"], "significant": c["significant"]}
                        for c in ranking]}


def main() -> None:
    bench = Bench(__doc__, RESULTS / "sweep_ranking.json", arguments)
    with tempfile.TemporaryDirectory() as tmp:
        directory = (bench.args.keep or Path(tmp)) / "cartpole-ppo-lr"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(EXAMPLE), "--dir",
                               str(directory), "--no-progress"], capture_output=True, text=True, timeout=3600,
                              cwd=REPO, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"kuberl sweep failed ({proc.returncode}): {proc.stderr[-3000:]}")
        print(proc.stdout, flush=True)
        results = {"command_seconds": round(wall, 1), "table": proc.stdout, **check(directory)}
    bench.write(results, {"ranking": [(c["rank"], c["learning_rate"], round(c["iqm"]["estimate"], 1))
                                      for c in results["ranking"]], "command_seconds": results["command_seconds"]})


if __name__ == "__main__":
    main()

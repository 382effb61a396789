"""The clock a user feels, before and after a change: `kuberl train examples/cartpole-ppo.yaml` as a whole
command (a fresh process each time: Python's start, imports, Ray's start, training to the example's target,
the evaluation, the exit), for this tree and for another commit, alternating, in the same run.

    .venv/bin/python bench/bench_whole_command.py --before 98093ea            # 3 runs each
    .venv/bin/python bench/bench_whole_command.py --before 98093ea --repeats 5

The other commit is checked out into a temporary worktree and run with this venv, its source first on
PYTHONPATH (so its `kuberl` modules are the ones imported; the dependencies are this venv's). Results go to
bench/results/whole_command.json: each run's seconds, the medians, and after/before.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench

EXAMPLE = "examples/cartpole-ppo.yaml"


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", required=True, help="the commit to compare this tree with")
    parser.add_argument("--repeats", type=int, default=3)


def one_run(source: Path, run_dir: Path) -> float:
    env_path = f"{source / 'operator'}:{source / 'trainer'}"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(source / EXAMPLE), "--run-dir",
                    str(run_dir), "--no-progress"], cwd=source, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path, "HOME": str(Path.home()),
                        "RAY_USAGE_STATS_ENABLED": "0"})
    return round(time.monotonic() - started, 2)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "whole_command.json", arguments)
    args = bench.args
    commit = subprocess.check_output(["git", "rev-parse", "--short", args.before], cwd=REPO, text=True).strip()
    head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
    runs: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="kuberl-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True,
                       capture_output=True)
        try:
            for i in range(args.repeats):
                for label, source in (("before", tree), ("after", REPO)):
                    seconds = one_run(source, Path(tmp) / f"{label}-{i}")
                    runs[label].append(seconds)
                    print(f"{label} ({commit if label == 'before' else head}) run {i + 1}: {seconds:.1f} s",
                          flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    medians = {label: round(statistics.median(values), 1) for label, values in runs.items()}
    bench.write({"example": EXAMPLE, "before": commit, "after": f"{head} (this tree)", "seconds": runs},
                {"median_seconds": medians, "after_over_before": round(medians["after"] / medians["before"], 2)})
    print(medians)


if __name__ == "__main__":
    main()

"""The same benchmarks on two source trees, run alternately: did a change (a refactor) cost speed?

    git worktree add /tmp/trainer-before <commit before>      # and one with the change applied
    ln -s "$PWD/.venv" /tmp/trainer-before/.venv                # each tree runs on this virtualenv
    .venv/bin/python bench/bench_trees.py --tree before=/tmp/trainer-before --tree after=/tmp/trainer-after \\
        --cartpole-seeds 0 1 2 3 4 5 6 7 8 9 --tictactoe-rounds 3 --output bench/results/trainer_refactor.json

Each run is a fresh process whose PYTHONPATH puts the tree's `trainer/` and `operator/` first (Ray's
workers inherit it), running the tree's own bench script:
  - CartPole: `bench_cartpole.py --one kuberl-cli --seed S`, the whole `kuberl train
    examples/cartpole-ppo.yaml` command timed from its process start to its exit;
  - Tic-Tac-Toe: `bench_tictactoe.py` (100k training episodes, k = 1 and 2, then its evaluation suites).
The trees take turns run by run, and which goes first alternates (A B, B A, ...), so both see the
same machine load on average; every run records the load average when it started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, RESULT_PREFIX, Bench, Stopwatch, load_average, stats


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "trainer"), str(tree / "operator")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def _python(tree: Path) -> str:
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: link the project's virtualenv there (ln -s {REPO / '.venv'} "
                         f"{tree / '.venv'})")
    return str(python)


def cartpole(tree: Path, seed: int) -> dict[str, Any]:
    load = load_average()
    proc = subprocess.run([_python(tree), str(tree / "bench" / "bench_cartpole.py"), "--one", "kuberl-cli",
                           "--seed", str(seed)], cwd=tree, env=_env(tree), capture_output=True, text=True,
                          timeout=900, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{tree}: cartpole seed {seed} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(lines[-1][len(RESULT_PREFIX):])
    keep = ("seed", "solved", "command_wall_seconds", "train_seconds_total", "time_to_solve_seconds",
            "env_steps_total", "eval_mean_return", "ray_start_seconds", "learner_wait_seconds", "time_split")
    return {**{k: res.get(k) for k in keep}, "loadavg_start": load}


def tictactoe(tree: Path) -> list[dict[str, Any]]:
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as tmp:
        output = Path(tmp) / "tictactoe.json"
        proc = subprocess.run([_python(tree), str(tree / "bench" / "bench_tictactoe.py"), "--output", str(output)],
                              cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=1800,
                              check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{tree}: tictactoe failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        data = json.loads(output.read_text())
        runs = data.get("results", data)["runs"]  # a tree older than the harness writes them at the top level
    keep = ("workers", "episodes", "training_wall_clock_seconds", "episodes_per_second", "ray_start_seconds",
            "evaluation_and_shutdown_seconds", "cpu_seconds_training", "suites", "exact_vs_random", "meets_target")
    return [{**{k: run.get(k) for k in keep}, "loadavg_start": load} for run in runs]


def summarize(runs: dict[str, dict[str, list]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, by in runs.items():
        ttt = by["tictactoe"]
        out[name] = {
            "cartpole_command_wall_seconds": stats([r["command_wall_seconds"] for r in by["cartpole"]]),
            "cartpole_train_seconds": stats([r["train_seconds_total"] for r in by["cartpole"]]),
            "cartpole_solved": f"{sum(bool(r['solved']) for r in by['cartpole'])}/{len(by['cartpole'])}",
            **{f"tictactoe_k{k}_{key}": stats([r[key] for r in ttt if r["workers"] == k])
               for k in sorted({r["workers"] for r in ttt})
               for key in ("training_wall_clock_seconds", "episodes_per_second")},
        }
    return out


def paired(runs: dict[str, dict[str, list]], reference: str, other: str) -> dict[str, Any]:
    """CartPole seed by seed: a seed trains the same way in both trees when behaviour is unchanged (same
    env steps), so the ratio of their times is the fairest single comparison."""
    ref = {r["seed"]: r for r in runs[reference]["cartpole"]}
    pairs = [(ref[r["seed"]], r) for r in runs[other]["cartpole"] if r["seed"] in ref]
    ratios = [b["command_wall_seconds"] / a["command_wall_seconds"] for a, b in pairs]
    return {"seeds": len(pairs),
            "same_env_steps": sum(a["env_steps_total"] == b["env_steps_total"] for a, b in pairs),
            f"command_wall_seconds_ratio_{other}_over_{reference}": stats(ratios)}


def report(runs: dict[str, dict[str, list]], summary: dict[str, Any], trees: dict[str, Any],
           seconds: float) -> dict:
    """The results of a comparison, `summary` (summarize(runs)) set against the first tree."""
    reference, *others = list(runs)
    ratios = {}
    for other in others:
        for key, value in summary[other].items():
            if isinstance(value, dict) and summary[reference].get(key):
                ratios[f"{key}: {other}/{reference}"] = round(value["median"] / summary[reference][key]["median"], 3)
    return {
        "trees": trees,
        "machine_notes": {"note": "cores shared with other work: each run records loadavg_start"},
        "wall_seconds": round(seconds, 1),
        "median_ratios": ratios,
        "cartpole_paired_by_seed": {other: paired(runs, reference, other) for other in others},
        "runs": runs,
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree to run (give two; the first is the reference)")
    parser.add_argument("--cartpole-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--tictactoe-rounds", type=int, default=1)


def main() -> None:
    bench = Bench(__doc__, None, arguments, output_help="the result file (required: a comparison has no default)")
    args = bench.args
    if bench.output is None:
        bench.parser.error("the following arguments are required: --output")
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in args.tree)}
    runs: dict[str, dict[str, list]] = {name: {"cartpole": [], "tictactoe": []} for name in trees}
    order = list(trees)
    clock = Stopwatch()
    for i, seed in enumerate(args.cartpole_seeds):
        for name in order if i % 2 == 0 else order[::-1]:
            runs[name]["cartpole"].append(res := cartpole(trees[name], seed))
            print(f"cartpole {name} seed {seed}: {res['command_wall_seconds']} s whole, solved {res['solved']}",
                  flush=True)
    for i in range(args.tictactoe_rounds):
        for name in order if i % 2 == 0 else order[::-1]:
            runs[name]["tictactoe"] += (res := tictactoe(trees[name]))
            print(f"tictactoe {name} round {i}: " + ", ".join(
                f"k={r['workers']} {r['training_wall_clock_seconds']} s" for r in res), flush=True)
    summary = summarize(runs)
    result = report(runs, summary, {name: str(path) for name, path in trees.items()}, clock.seconds(1))
    bench.write(result, summary)
    print(json.dumps({"summary": summary, **{k: result[k] for k in ("median_ratios", "cartpole_paired_by_seed")}},
                     indent=1))


if __name__ == "__main__":
    main()

"""The project's headline figures over 5 seeds, each from an example sweep run as a user runs it
(`kuberl sweep examples/sweeps/<file>`, one trial at a time): CartPole PPO env steps and training seconds to
a mean return of 475 over 100 episodes, Tic-Tac-Toe DQN losses against the random player, and the
autoscaling ranking (random < threshold < DQN) under two load patterns.

Per figure: the per-seed values at full precision, their IQM, median and 95% bootstrap interval
(kuberl.sweep.statistics, as `kuberl sweep` ranks), the command and how long it took, and the load
average before and after each trial. Env steps, losses and returns do not depend on the machine's load;
training seconds do: read them with the load average. The sweep's objective cannot count games, so the
losses are read from each trial's summary.json (its evaluation suites, 1,000 games a side).

The random and threshold autoscalers are no jobs to train: they are scored here on the DQN's evaluation
traces (seeds 10000-10019) with the env's kwargs from the sweep's template, the threshold autoscaler
searched on those traces as bench_autoscaling.py does (common.best_threshold; deterministic, so one value),
the random one with the trials' seeds as its own (bench_autoscaling.py's figure is its seed 0).

    .venv/bin/python bench/bench_sweep_seeds.py [--only cartpole tictactoe autoscaling-spike] [--keep DIR]
    .venv/bin/python bench/bench_sweep_seeds.py --smoke --output /tmp/smoke.json   # tiny budgets, 2 seeds

Writes bench/results/sweep_seeds.json (--output); with --only, the other figures already there are kept.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import EXAMPLES, REPO, RESULTS, Bench, autoscaling_eval_seeds, best_threshold, load_average

SWEEPS = {
    "cartpole": "cartpole-ppo-seeds.yaml",
    "tictactoe": "tictactoe-dqn-seeds.yaml",
    "autoscaling-sine-curve": "autoscaling-dqn-sine-curve.yaml",
    "autoscaling-spike": "autoscaling-dqn-spike.yaml",
}
#: --smoke: the stopping section of each template, and the seeds, cut so that every sweep runs in seconds.
SMOKE_STOPPING = {"cartpole": {"targetReturn": 475, "maxEnvSteps": 2048}, "tictactoe": {"maxEpisodes": 2000},
                  "autoscaling-sine-curve": {"maxEnvSteps": 2048}, "autoscaling-spike": {"maxEnvSteps": 2048}}
SMOKE_SEEDS = 2
POLL_SECONDS = 0.5
VERSIONS = ("kuberl", "ray", "torch", "gymnasium", "numpy", "scipy", "optuna")


def figure(values: list[float]) -> dict[str, Any]:
    """Per-seed values as measured, with the IQM, the median and the 95% bootstrap interval of the IQM."""
    from kuberl.sweep.statistics import CONFIDENCE, iqm_interval

    interval = iqm_interval(values)
    return {"values": values, "n": len(values), "iqm": interval.estimate, "median": statistics.median(values),
            "ci_low": interval.low, "ci_high": interval.high, "confidence": CONFIDENCE}


def sweep_file(name: str, smoke: bool, work: Path) -> Path:
    """The example sweep, or for --smoke a copy of it with tiny budgets."""
    path = EXAMPLES / "sweeps" / SWEEPS[name]
    if not smoke:
        return path
    import yaml

    data = yaml.safe_load(path.read_text())
    data["spec"]["template"]["stopping"] = SMOKE_STOPPING[name]
    data["spec"]["seeds"] = data["spec"]["maxTrials"] = SMOKE_SEEDS
    copy = work / f"smoke-{path.name}"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def run_sweep(path: Path, directory: Path) -> dict[str, Any]:
    """`kuberl sweep FILE --dir DIR`, timed as a whole, with the load average when each trial's run directory
    appears (its process has started) and when its summary.json does (it has finished)."""
    trials = directory / "trials"
    loads: dict[str, dict[str, list[float] | None]] = {}
    command = [sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(path), "--dir", str(directory),
               "--no-progress"]
    log = directory.parent / f"{directory.name}.log"
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, text=True)
        while proc.poll() is None:
            time.sleep(POLL_SECONDS)
            for trial in sorted(trials.glob("t*")) if trials.exists() else []:
                entry = loads.setdefault(trial.name, {"before": load_average(), "after": None})
                if entry["after"] is None and (trial / "summary.json").exists():
                    entry["after"] = load_average()
    seconds = time.perf_counter() - t0
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"kuberl sweep {path} failed ({proc.returncode}): {text[-3000:]}")
    print(text, flush=True)
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return {"command": f"kuberl sweep {shown}", "command_seconds": seconds, "output": text, "trial_loadavg": loads}


def read_trials(directory: Path) -> list[dict[str, Any]]:
    """Each trial's row of results.csv with its run's summary.json, and a check that the ranking's IQM is the
    one recomputed from those rows."""
    from kuberl.sweep.statistics import iqm

    rows = list(csv.DictReader((directory / "results.csv").open()))
    trials = [{**row, "summary": json.loads((Path(row["run_dir"]) / "summary.json").read_text())} for row in rows]
    failed = [t["trial"] for t in trials if t["state"] != "complete"]
    if failed:
        raise RuntimeError(f"{directory}: trials {failed} did not complete; see results.csv")
    ranked = json.loads((directory / "ranking.json").read_text())["configurations"][0]
    assert abs(ranked["iqm"]["estimate"] - iqm([float(t["objective"]) for t in trials])) < 1e-9, ranked
    return trials


def trial_record(trial: dict[str, Any], loads: dict[str, Any]) -> dict[str, Any]:
    summary = trial["summary"]
    return {"trial": int(trial["trial"]), "seed": int(trial["seed"]), "objective": float(trial["objective"]),
            "stopped_by": summary["stopped_by"], "env_steps": summary["env_steps"],
            "episodes": summary["episodes"], "mean_return": summary.get("mean_return"),
            "training_seconds": summary["wall_clock"], "trial_process_seconds": summary["time_split"]["total"],
            "loadavg": loads.get(Path(trial["run_dir"]).name)}


def cartpole(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Env steps to the target (the sweep's objective; a seed that misses counts its whole budget) and the
    training clock when it stopped (the seconds to the target when it got there)."""
    solved = [t["summary"]["stopped_by"] == "target_return" for t in trials]
    evaluation = [t["summary"]["evaluation"]["deterministic"]["mean_return"] for t in trials]
    return {"env_steps_to_target": figure([float(t["objective"]) for t in trials]),
            "training_seconds_to_target": figure([t["summary"]["wall_clock"] for t in trials]),
            "solved": solved, "greedy_evaluation_return": evaluation,
            "greedy_evaluation_at_least_475": [r >= 475 for r in evaluation]}


def tictactoe(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Losses against the uniform-random player per seed, moving first and second (1,000 games each)."""
    suites = [t["summary"]["evaluation"] for t in trials]
    first = [float(s["vs-random-first"]["losses"]) for s in suites]
    second = [float(s["vs-random-second"]["losses"]) for s in suites]
    return {"losses_vs_random": figure([a + b for a, b in zip(first, second, strict=True)]),
            "losses_vs_random_first": figure(first), "losses_vs_random_second": figure(second),
            "games_per_side": [s["vs-random-first"]["games"] for s in suites],
            "win_rate_first": [s["vs-random-first"]["win_rate"] for s in suites],
            "win_rate_second": [s["vs-random-second"]["win_rate"] for s in suites],
            "self_play_draws": [s["self-play"]["draws"] for s in suites],
            "evaluation_return": figure([float(t["objective"]) for t in trials]),
            "training_seconds": figure([t["summary"]["wall_clock"] for t in trials])}


def autoscaling(trials: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """The DQN's greedy evaluation return per seed beside the random autoscaler (one per trial seed) and the
    best threshold autoscaler, all on the same traces, and whether random < threshold < DQN holds."""
    import gymnasium as gym
    import yaml

    from kuberl.trainer.envs.baselines import RandomPolicy, evaluate_policy

    environment = yaml.safe_load(path.read_text())["spec"]["template"]["environment"]
    env_id, kwargs = environment["id"], environment.get("kwargs", {})
    space = gym.make(env_id, **kwargs).action_space
    seeds = [int(t["seed"]) for t in trials]
    random = figure([evaluate_policy(env_id, kwargs, RandomPolicy(space, seed=s), autoscaling_eval_seeds())
                     for s in seeds])
    threshold = best_threshold(env_id, kwargs)
    dqn = figure([float(t["objective"]) for t in trials])
    return {"load_pattern": kwargs["load_pattern"], "evaluation_seeds": autoscaling_eval_seeds(),
            "dqn": dqn, "random": {**random, "policy_seeds": seeds}, "threshold": threshold,
            "ranking_holds_on_iqm": random["iqm"] < threshold["mean_return"] < dqn["iqm"],
            "dqn_interval_above_threshold": dqn["ci_low"] > threshold["mean_return"],
            "random_interval_below_threshold": random["ci_high"] < threshold["mean_return"],
            "training_seconds": figure([t["summary"]["wall_clock"] for t in trials])}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def headline(results: dict[str, Any]) -> dict[str, str]:
    """Each figure as the docs quote it: IQM [95% CI], rounded for people (the results keep every digit)."""
    def quote(f: dict[str, Any], digits: int = 1) -> str:
        return f"{f['iqm']:.{digits}f} [{f['ci_low']:.{digits}f}, {f['ci_high']:.{digits}f}]"

    out = {}
    for name, r in results.items():
        if name == "cartpole":
            out["cartpole env steps to target"] = quote(r["env_steps_to_target"], 0)
            out["cartpole training seconds to target"] = quote(r["training_seconds_to_target"])
        elif name == "tictactoe":
            out["tictactoe losses vs random (2,000 games)"] = quote(r["losses_vs_random"])
        else:
            out[f"{name} random / threshold / dqn"] = (f"{quote(r['random'])} / {r['threshold']['mean_return']:.1f}"
                                                      f" / {quote(r['dqn'])}")
    return out


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", choices=list(SWEEPS), default=list(SWEEPS), help="these sweeps")
    parser.add_argument("--keep", type=Path, help="leave the sweep directories here")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets and 2 seeds: checks that it runs "
                        "(give --output: its figures are not the benchmark's)")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "sweep_seeds.json", arguments)
    args = bench.args
    if args.smoke and bench.output == RESULTS / "sweep_seeds.json":
        bench.parser.error("--smoke: give --output elsewhere than the benchmark's result file")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-seeds-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name in args.only:
            path = sweep_file(name, args.smoke, root)
            run = run_sweep(path, root / name)
            trials = read_trials(root / name)
            loads = run.pop("trial_loadavg")
            figures = (cartpole(trials) if name == "cartpole" else tictactoe(trials) if name == "tictactoe"
                       else autoscaling(trials, path))
            results[name] = {**run, **figures, "trials": [trial_record(t, loads) for t in trials]}
            print(json.dumps(headline({name: figures}), indent=1), flush=True)
    # Figures of sweeps not run this time are kept from the result file, each with its own trials' loads.
    kept = {name: figures for name, figures in bench.previous().items() if name in SWEEPS and name not in results}
    results = {name: (results | kept)[name] for name in SWEEPS if name in results | kept}
    summary = headline(results)
    bench.write({"versions": versions(), "smoke": args.smoke, "parallel_trials": 1,
                 "note": "2 cores shared with other work during the run: training seconds depend on the load "
                         "(see each trial's loadavg); env steps, losses and returns do not", **results}, summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""What the benchmarks share: the harness every script runs under (its command line, the machine
record, its result file), timing, the CartPole time-to-solve protocol, the autoscaling benchmark jobs,
and the one door into the tests' cluster bed.

Every script sits next to this file and imports it as `common`: Python puts a script's own folder on
sys.path, so `python bench/<script>.py` works from any directory with no path set-up. Top-level
imports are the standard library only, because the peers' virtualenvs (SB3, RLlib: numpy, gymnasium
and torch, no kuberl, no PyYAML) import the protocol from here too; what a helper needs beyond that
it imports inside.

A script's life under the harness:

    bench = Bench(__doc__, RESULTS / "x.json", arguments)   # parses --output and the script's own flags
    args = bench.args
    ...                                                      # measure
    bench.write(results, summary)                            # bench/results/x.json

and every result file has one shape: {"benchmark", "command", "machine", "results", "summary"
(optional)}, `machine` as `machine()` makes it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
EXAMPLES = REPO / "examples"

#: The keys of every result file; `summary` may be left out.
RESULT_KEYS = ("benchmark", "command", "machine", "results", "summary")


# ---- the machine ------------------------------------------------------------------------------------


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: the machine is shared, read every figure with it."""
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def torch_version() -> str | None:
    """The installed torch, without importing it (a second and more) unless the script already has."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """HEAD of this checkout, `-dirty` when tracked files differ from it; None outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def machine(loadavg_before: list[float] | None = None, **extra: Any) -> dict[str, Any]:
    """The one machine record of a result file, taken when the result is written: cores, memory (GB),
    platform, Python, torch (None where it is not installed), the load average when the run began and
    now, the date (UTC) and the commit. `extra` fields go in as they are, outside the schema that
    tests/unit/test_bench_harness.py checks: a script's own details belong in its results."""
    return {"cpus": os.cpu_count(), "memory_gb": memory_gb(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch_version(),
            "loadavg": {"before": loadavg_before, "after": load_average()}, "date": utc_now(),
            "git_commit": git_commit(), **extra}


# ---- the harness: command line, timing, result file -------------------------------------------------


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's argument parser: its docstring is the --help text, as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def describe(doc: str | None) -> str:
    """What a benchmark measures, for its result file: the docstring's first paragraph on one line."""
    first = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(first.split()).rstrip(".")


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran this script, as one pastes it from the repository root."""
    python = Path(os.path.abspath(sys.executable))  # .venv/bin/python, its symlink not followed
    script = Path(sys.argv[0])
    parts = [str(python.relative_to(REPO)) if python.is_relative_to(REPO) else "python",
             f"bench/{script.name}" if script.suffix == ".py" else str(script)]
    return shlex.join(parts + list(sys.argv[1:] if argv is None else argv))


class Stopwatch:
    """Seconds since it was made, on the monotonic clock, rounded for a result file."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self, digits: int = 3) -> float:
        return round(time.perf_counter() - self.started, digits)


def read_result(path: Path | str) -> dict[str, Any]:
    """A result file, checked to have the harness's shape."""
    record = json.loads(Path(path).read_text())
    missing = [key for key in RESULT_KEYS[:-1] if key not in record]
    unknown = [key for key in record if key not in RESULT_KEYS]
    if missing or unknown:
        raise ValueError(f"{path}: not a result file of bench/common.py: missing {missing}, unknown {unknown}; "
                         f"allowed keys: {', '.join(RESULT_KEYS)}")
    return record


class Bench:
    """One run of a benchmark script: its command line (`--output` and the script's own arguments),
    the load average when it began, and its result file.

    `output` is the default result file; None where the script picks it after parsing (then it sets
    `bench.output`). `arguments(parser)` adds the script's own flags.
    """

    def __init__(self, doc: str | None, output: Path | None,
                 arguments: Callable[[argparse.ArgumentParser], None] | None = None, *,
                 output_help: str | None = None, argv: list[str] | None = None) -> None:
        self.benchmark = describe(doc)
        self.parser = parser(doc)
        shown = output.relative_to(REPO) if output is not None and output.is_relative_to(REPO) else output
        self.parser.add_argument("--output", type=Path, default=output,
                                 help=output_help or f"the result file (default: {shown})")
        if arguments is not None:
            arguments(self.parser)
        self.args = self.parser.parse_args(argv)
        self.output: Path | None = self.args.output
        self.command = command_line(argv)
        self.loadavg_before = load_average()

    def previous(self) -> dict[str, Any]:
        """The results already in the output file ({} if there is none), for a script that merges runs."""
        if self.output is None or not self.output.exists():
            return {}
        return read_result(self.output)["results"]

    def write(self, results: dict[str, Any], summary: dict[str, Any] | None = None) -> Path:
        """The result file: {"benchmark", "command", "machine", "results", "summary" (when given)}."""
        if self.output is None:
            raise ValueError("no result file: give --output")
        record = {"benchmark": self.benchmark, "command": self.command, "machine": machine(self.loadavg_before),
                  "results": results}
        if summary is not None:
            record["summary"] = summary
        path = write_json(self.output, record)
        print(f"wrote {path}", file=sys.stderr)
        return path


def write_json(path: Path | str, data: Any, indent: int = 1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")
    return path


def stats(values: list[float]) -> dict[str, float] | None:
    """Median, min, max and count: how a result sums up repeated runs on a shared machine."""
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def example_job(stem: str) -> dict[str, Any]:
    """examples/<stem>.yaml as a dict, for a benchmark to change before it runs it."""
    import yaml

    return yaml.safe_load((EXAMPLES / f"{stem}.yaml").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- measuring in turns ----------------------------------------------------------------------------


def interleaved_rates(fns: dict[str, Callable[[], int]], seconds: float, repeats: int = 3,
                      warmup: int = 2) -> dict[str, dict[str, Any]]:
    """Each fn does some env steps and returns how many. They are measured in turns (a, b, c, a, b, c, ...)
    for `seconds` each, `repeats` rounds, so load from other jobs on this shared machine hits all of
    them alike; the median round counts."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    rates: dict[str, list[float]] = {name: [] for name in fns}
    loads = []
    for _ in range(repeats):
        for name, fn in fns.items():
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                steps += fn()
            rates[name].append(steps / (time.perf_counter() - t0))
        loads.append(load_average()[0])
    return {name: {"steps_per_second": round(statistics.median(r)), "rounds": [round(x) for x in r],
                   "loadavg_1min": loads} for name, r in rates.items()}


# ---- the CartPole time-to-solve protocol (bench_cartpole.py and its peers) -------------------------
#
# Solved = the mean of the last 100 *training* episodes is >= 475, THEN a 100-episode deterministic
# (greedy) evaluation on seeds 10000..10099 is >= 475. An evaluation that fails lets training go on;
# the check repeats once `recheck_steps` more env steps have been collected (same for everyone).
# The clock is training time: every second spent evaluating is subtracted and reported on its own.
# In `hold` mode (the DQN stability run) training does not stop when solved: it goes on to the
# env-step budget with a deterministic evaluation every `curve_every` env steps (the curve) and one
# at the end.

TARGET = 475.0
WINDOW = 100
EVAL_SEEDS = list(range(10_000, 10_100))
RESULT_PREFIX = "BENCH_RESULT "


def greedy_eval(act: Callable[[Any], Any], seeds: list[int] = EVAL_SEEDS,
                env_id: str = "CartPole-v1") -> dict[str, Any]:
    """One deterministic episode per seed, all seeds stepped together; `act(obs[B, D]) -> actions[B]`
    (actions[B, A] for a Box action space). The peers' evaluation (KubeRL evaluates through its own
    workers, on the same seeds)."""
    import gymnasium as gym
    import numpy as np

    envs = [gym.make(env_id) for _ in seeds]
    box = isinstance(envs[0].action_space, gym.spaces.Box)
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)
    returns = np.zeros(len(seeds))
    active = np.ones(len(seeds), bool)
    while active.any():
        idx = np.nonzero(active)[0]
        actions = np.asarray(act(obs[idx]))
        actions = actions.reshape(len(idx), *envs[0].action_space.shape) if box else actions.reshape(-1)
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(actions[j] if box else int(actions[j]))
            returns[i] += r
            obs[i] = o
            if term or trunc:
                active[i] = False
    for env in envs:
        env.close()
    return {"episodes": len(seeds), "mean_return": float(returns.mean()), "min_return": float(returns.min())}


class SolveClock:
    """Feed it after every training iteration; it says when to stop and keeps the record."""

    def __init__(self, budget_steps: int, budget_seconds: float, recheck_steps: int = 5_000,
                 hold: bool = False, curve_every: int = 25_000):
        self.budget_steps, self.budget_seconds = budget_steps, budget_seconds
        self.recheck_steps, self.hold, self.curve_every = recheck_steps, hold, curve_every
        self.t0 = time.perf_counter()
        self.eval_seconds = 0.0
        self.next_check = 0
        self.next_curve = curve_every
        self.solved_seconds: float | None = None
        self.solved_steps: int | None = None
        self.checks: list[dict[str, Any]] = []  # every solve-check evaluation
        self.curve: list[dict[str, Any]] = []  # hold mode: periodic evaluations
        self.env_steps = 0
        self.window_mean: float | None = None
        self.stop_reason: str | None = None
        self.last_now = 0.0  # training seconds at the last update (a contender's clock is read before evals)

    def restart(self) -> None:
        """Start the clock now (a contender calls it just before its training loop begins)."""
        self.t0 = time.perf_counter()
        self.eval_seconds = 0.0

    def train_seconds(self, external: float | None = None) -> float:
        """Training time so far: the contender's own clock when given, else ours, less evaluation."""
        raw = external if external is not None else time.perf_counter() - self.t0
        return raw - self.eval_seconds

    def _evaluate(self, evaluate: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        t = time.perf_counter()
        res = evaluate()
        spent = time.perf_counter() - t
        self.eval_seconds += spent
        return {**res, "eval_seconds": round(spent, 3)}

    def _point(self, now: float, ev: dict[str, Any]) -> dict[str, Any]:
        return {"env_steps": self.env_steps, "train_seconds": round(now, 3),
                "window_mean": None if self.window_mean is None else round(self.window_mean, 2), **ev}

    def update(self, env_steps: int, window_full: bool, window_mean: float | None,
               evaluate: Callable[[], dict[str, Any]], clock: float | None = None) -> bool:
        """Account one iteration; returns True when training should stop."""
        self.env_steps = env_steps
        self.window_mean = window_mean
        now = self.last_now = self.train_seconds(clock)
        ev = None
        if (self.solved_seconds is None and window_full and window_mean is not None
                and window_mean >= TARGET and env_steps >= self.next_check):
            ev = self._evaluate(evaluate)
            self.checks.append(self._point(now, ev))
            if ev["mean_return"] >= TARGET:
                self.solved_seconds, self.solved_steps = now, env_steps
            else:
                self.next_check = env_steps + self.recheck_steps
        if self.hold and env_steps >= self.next_curve:
            self.curve.append(self._point(now, ev or self._evaluate(evaluate)))
            while self.next_curve <= env_steps:
                self.next_curve += self.curve_every
        if self.solved_seconds is not None and not self.hold:
            self.stop_reason = "solved"
        elif env_steps >= self.budget_steps:
            self.stop_reason = "budget_steps"
        elif now >= self.budget_seconds:
            self.stop_reason = "budget_seconds"
        return self.stop_reason is not None

    def finish(self, evaluate: Callable[[], dict[str, Any]] | None, clock: float | None = None) -> None:
        """Hold mode: one last evaluation at the end of the budget (unless the curve has it already)."""
        if self.hold and evaluate is not None and (not self.curve or self.curve[-1]["env_steps"] != self.env_steps):
            now = self.last_now if clock is not None else self.train_seconds()
            self.curve.append(self._point(now, self._evaluate(evaluate)))

    def record(self, clock: float | None = None) -> dict[str, Any]:
        out = {
            "solved": self.solved_seconds is not None,
            "time_to_solve_seconds": None if self.solved_seconds is None else round(self.solved_seconds, 3),
            "env_steps_to_solve": self.solved_steps,
            "stop_reason": self.stop_reason,
            "env_steps_total": self.env_steps,
            "train_seconds_total": round(self.last_now if clock is not None else self.train_seconds(), 3),
            "eval_seconds_total": round(self.eval_seconds, 3),
            "final_window_mean": None if self.window_mean is None else round(self.window_mean, 2),
            "solve_checks": self.checks,
        }
        if self.hold:
            out["eval_curve"] = self.curve
            reached = [i for i, p in enumerate(self.curve) if p["mean_return"] >= TARGET]
            after = self.curve[reached[0]:] if reached else []
            out["hold"] = {
                "first_eval_at_target_steps": self.curve[reached[0]]["env_steps"] if reached else None,
                "final_eval": self.curve[-1]["mean_return"] if self.curve else None,
                "min_eval_after_reaching": min(p["mean_return"] for p in after) if after else None,
                "held_to_end": bool(after) and all(p["mean_return"] >= TARGET for p in after),
            }
        return out


def emit(result: dict[str, Any]) -> None:
    """The one line the driver (bench_cartpole.py) reads from a contender's stdout."""
    result.setdefault("loadavg_end", load_average())
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# ---- autoscaling jobs (bench_autoscaling.py, bench_async.py, bench_bdq_vs_dqn.py) ------------------

#: Every autoscaling policy is scored on the same 20 traces: seeds 10000-10019.
AUTOSCALING_EVAL_SEED, AUTOSCALING_EVAL_EPISODES = 10_000, 20


def autoscaling_eval_seeds() -> list[int]:
    return list(range(AUTOSCALING_EVAL_SEED, AUTOSCALING_EVAL_SEED + AUTOSCALING_EVAL_EPISODES))


def autoscaling_job(base: dict[str, Any], pattern: str, max_env_steps: int, *, algorithm: dict | None = None,
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
    spec["evaluation"] = {"episodes": AUTOSCALING_EVAL_EPISODES, "seed": AUTOSCALING_EVAL_SEED}
    spec["checkpointing"] = {"enabled": False}
    return job


def train_job(job_dict: dict[str, Any], run_dir: Path, on_iteration=None) -> dict[str, Any]:
    """One `train()` in this process on an already started Ray; its greedy evaluation and counters."""
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
            first = AUTOSCALING_EVAL_SEED + AUTOSCALING_EVAL_EPISODES
            grid = [params for _, params in rank_thresholds(env, grid, list(range(first, first + 5)), multi)[:10]]
        score, params = rank_thresholds(env, grid, autoscaling_eval_seeds(), multi)[0]
    finally:
        env.close()
    return {"mean_return": score, **params}


# ---- the tests' cluster bed (bench_operator.py, bench_cluster.py) ----------------------------------


def from_tests(module: str):
    """A module of tests/ that a benchmark drives: the tests' real control plane (`bed.real_cluster`)
    and one-node cluster (`bed.cluster_bed`). The operator and cluster figures are measured on the very
    beds the tests run on, so the bed is not copied here. tests/ is no package (pytest puts it
    on sys.path, and the bed imports its shared `tools` by bare name, as every test module does), so
    this is the one place the benchmarks put it on sys.path, last, where it shadows nothing."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    return importlib.import_module(module)


def iqm_interval(values: list[float], digits: int = 1) -> dict[str, Any]:
    """The IQM of `values` with its 95% bootstrap interval (kuberl.sweep.statistics, the sweep's own ranking
    statistics), rounded. Imports KubeRL: for the project's venv only."""
    from kuberl.sweep.statistics import iqm_interval as interval

    i = interval(values)
    return {"iqm": round(i.estimate, digits), "low": round(i.low, digits), "high": round(i.high, digits)}


@contextlib.contextmanager
def kuberl_sweep(sweep: Path, prefix: str) -> Iterator[tuple[list[dict[str, str]], float, list[float]]]:
    """`kuberl sweep SWEEP` as a user runs it, in a directory that lasts the `with`: (its results.csv rows,
    the whole command's seconds, the load average when it started)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        load = load_average()
        t0 = time.perf_counter()
        proc = subprocess.run([str(REPO / ".venv" / "bin" / "kuberl"), "sweep", str(sweep), "--dir", tmp],
                              cwd=REPO, capture_output=True, text=True, check=False)
        whole = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            raise SystemExit(f"kuberl sweep failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        yield list(csv.DictReader((Path(tmp) / "results.csv").open())), whole, load

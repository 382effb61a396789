"""Time-to-solve CartPole-v1: KubeRL PPO and DQN (k = 1, 2) vs Stable-Baselines3 (zoo hyperparameters)
and RLlib PPO (its tuned CartPole example), 3 seeds each, every run in its own fresh process.

    bash bench/make_peer_venvs.sh                      # once: the peers' own virtualenvs
    .venv/bin/python bench/bench_cartpole.py           # all contenders, seeds 0 1 2
    .venv/bin/python bench/bench_cartpole.py --only kuberl-ppo-k1 sb3-ppo --seeds 0   # a subset
    .venv/bin/python bench/bench_cartpole.py --smoke   # tiny budgets: checks every contender runs

The protocol is in bench/common.py, shared by every contender: solved = mean of the last 100
training episodes >= 475, then a 100-episode deterministic evaluation (seeds 10000..10099) >= 475;
a failed evaluation lets training continue and the check repeats after 5k more env steps;
evaluation time is taken off the clock (reported separately). Ray start-up (KubeRL: ray.init; RLlib:
ray.init, then building the algorithm and its env runners) is off the clock and reported on its own.
KubeRL's clock includes starting its rollout actors. KubeRL DQN at k=2 and SB3 DQN run in `hold`
mode: they train on to 300k env steps with a deterministic evaluation every 25k steps (the curve),
time-to-solve taken on the way; KubeRL DQN at k=1 stops once solved.

Results go to bench/results/cartpole.json (runs are merged in by contender, so a subset can be re-run).
A single KubeRL run (what the driver starts in a subprocess):
    .venv/bin/python bench/bench_cartpole.py --one kuberl-ppo --workers 1 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    BENCH,
    EVAL_SEEDS,
    EXAMPLES,
    REPO,
    RESULT_PREFIX,
    RESULTS,
    Bench,
    SolveClock,
    Stopwatch,
    emit,
    load_average,
    read_result,
    stats,
    write_json,
)

BUDGET_STEPS = 300_000
BUDGET_SECONDS = 300.0
HOLD_SECONDS = 900.0  # DQN hold runs must reach 300k steps; this only ends a run that hangs
CURVE_EVERY = 25_000

# name -> (python, argv builder, hold?)
VENVS = Path(os.environ.get("KUBERL_BENCH_VENVS", BENCH / ".venvs"))  # where make_peer_venvs.sh put them
VENV_SB3 = VENVS / "sb3" / "bin" / "python"
VENV_RLLIB = VENVS / "rllib" / "bin" / "python"
PROJECT_PY = REPO / ".venv" / "bin" / "python"


def contenders(budget_steps: int, budget_seconds: float, hold_seconds: float, smoke: bool) -> dict[str, dict]:
    ppo = ["--budget-steps", str(budget_steps), "--budget-seconds", str(budget_seconds)]
    hold = ["--hold", "--budget-steps", str(budget_steps), "--budget-seconds", str(hold_seconds),
            "--curve-every", str(CURVE_EVERY if not smoke else max(budget_steps // 2, 1000))]
    dqn_solve = ["--budget-steps", str(budget_steps), "--budget-seconds", str(hold_seconds)]
    me = [str(PROJECT_PY), str(Path(__file__).resolve()), "--one"]
    sb3 = [str(VENV_SB3), str(BENCH / "peer_sb3_cartpole.py")]
    rllib = [str(VENV_RLLIB), str(BENCH / "peer_rllib_cartpole.py")]
    sb3_ppo_budget = ["--budget-steps", str(min(budget_steps, 100_000)), "--budget-seconds", str(budget_seconds)]
    return {
        # What a user runs: the whole `kuberl train examples/cartpole-ppo.yaml` command (2 workers).
        "kuberl-cli": {"cmd": me + ["kuberl-cli"], "algo": "PPO", "workers": 2},
        "kuberl-ppo-k1": {"cmd": me + ["kuberl-ppo", "--workers", "1", *ppo], "algo": "PPO", "workers": 1},
        "kuberl-ppo-k2": {"cmd": me + ["kuberl-ppo", "--workers", "2", *ppo], "algo": "PPO", "workers": 2},
        "sb3-ppo": {"cmd": sb3 + ["--algo", "ppo", *sb3_ppo_budget], "algo": "PPO", "workers": None},
        "rllib-ppo-1": {"cmd": rllib + ["--env-runners", "1", *ppo], "algo": "PPO", "workers": 1},
        "rllib-ppo-2": {"cmd": rllib + ["--env-runners", "2", *ppo], "algo": "PPO", "workers": 2},
        # k=1 DQN stops once solved (time-to-solve only); the 300k-step hold curve is run at k=2 (the
        # example job's worker count) and for SB3: three 300k-step runs per contender are what fits here.
        "kuberl-dqn-k1": {"cmd": me + ["kuberl-dqn", "--workers", "1", *dqn_solve], "algo": "DQN", "workers": 1},
        "kuberl-dqn-k2": {"cmd": me + ["kuberl-dqn", "--workers", "2", *hold], "algo": "DQN", "workers": 2},
        "sb3-dqn": {"cmd": sb3 + ["--algo", "dqn", *hold], "algo": "DQN", "workers": None},
    }


# ---- one KubeRL run, in this process --------------------------------------------------------------


def run_kuberl(algo: str, workers: int, seed: int, budget_steps: int, budget_seconds: float, hold: bool,
               curve_every: int, recheck_steps: int, overrides: list[str]) -> dict[str, Any]:
    import logging

    import yaml
    from kuberl.api.load import parse_job
    from kuberl.trainer.evaluation import greedy_episodes
    from kuberl.trainer.run import TrainOptions, train

    example = EXAMPLES / f"cartpole-{algo}.yaml"
    data = yaml.safe_load(example.read_text())
    for item in overrides:  # --set algorithm.dqn.bufferSize=300000 (paths under spec, camelCase as in YAML)
        path, _, value = item.partition("=")
        node = data["spec"]
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    job = parse_job(data, source=str(example))
    spec = job.spec
    spec.stopping.target_return = None  # the protocol decides when it is solved
    spec.stopping.max_wall_clock_seconds = budget_seconds * 3  # the protocol's clock (less eval) ends it first
    spec.evaluation.enabled = False  # the protocol evaluates
    clock = SolveClock(budget_steps, budget_seconds, recheck_steps, hold, curve_every)
    seen: dict[str, Any] = {}

    def on_iteration(row: dict[str, Any], loop) -> None:
        def evaluate() -> dict[str, Any]:
            loop.publish_weights()
            res = greedy_episodes(loop.workers, loop.weights_ref, loop.weights_version, EVAL_SEEDS)
            return {"episodes": res["episodes"], "mean_return": res["mean_return"], "min_return": res["min_return"]}

        full = len(loop.recent_returns) >= spec.stopping.return_window
        seen["row"] = row
        if clock.update(row["env_steps"], full, row["mean_return"], evaluate, clock=row["wall_clock"]):
            clock.finish(evaluate, clock=row["wall_clock"])
            loop.stop_signal["set"] = True

    logging.getLogger("kuberl").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="kuberl-bench-") as run_dir:
        t0 = time.perf_counter()
        result = train(job, TrainOptions(run_dir=Path(run_dir), workers=workers, seed=seed, progress=False,
                                         metrics_port=0, max_env_steps=budget_steps, on_iteration=on_iteration))
        total = time.perf_counter() - t0
    row = seen.get("row", {})
    if clock.stop_reason is None:
        clock.stop_reason = result.reason
    import torch

    hyper = spec.algorithm.hyperparameters().model_dump(mode="json", by_alias=True)
    return {
        "contender": f"kuberl-{algo}", "seed": seed, "workers": workers,
        "ray_start_seconds": round(result.ray_start_seconds, 3),
        "process_seconds_in_train": round(total, 3),
        "iterations": result.counters.iterations, "gradient_updates": result.counters.gradient_updates,
        # where the time went: the learner waiting for batches (sampling + transfer) vs the rest (learning)
        "learner_wait_seconds": round(result.counters.learner_wait, 3),
        "worker_idle_seconds": round(result.counters.worker_wait, 3),
        "envs_per_worker": spec.rollout_workers.envs_per_worker, "torch_threads": torch.get_num_threads(),
        "hyperparameters": hyper, "overrides": overrides, **clock.record(clock=row.get("wall_clock")),
    }


def run_cli(seed: int, workers: int | None) -> dict[str, Any]:
    """`kuberl train examples/cartpole-ppo.yaml` as a user runs it, timed from its process start to its
    exit. Solved = it stopped on the example's target (mean of the last 100 episodes >= 475) and its
    own 100-episode deterministic evaluation is >= 475; the training clock is its `wall_clock`."""
    kuberl = PROJECT_PY.with_name("kuberl")
    with tempfile.TemporaryDirectory(prefix="kuberl-cli-") as run_dir:
        cmd = [str(kuberl), "train", str(EXAMPLES / "cartpole-ppo.yaml"), "--run-dir", run_dir,
               "--no-progress", "--metrics-port", "0", "--seed", str(seed)]
        if workers:
            cmd += ["--workers", str(workers)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"kuberl train failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    ev = (summary.get("evaluation") or {}).get("deterministic") or {}
    solved = summary["stopped_by"] == "target_return" and (ev.get("mean_return") or 0) >= 475
    return {
        "contender": "kuberl-cli", "seed": seed, "workers": workers or 2, "command": " ".join(["kuberl train examples/cartpole-ppo.yaml", *cmd[8:]]),
        "solved": solved, "time_to_solve_seconds": round(summary["wall_clock"], 3) if solved else None,
        "env_steps_to_solve": summary["env_steps"] if solved else None, "stop_reason": summary["stopped_by"],
        "env_steps_total": summary["env_steps"], "train_seconds_total": round(summary["wall_clock"], 3),
        "eval_mean_return": ev.get("mean_return"), "ray_start_seconds": round(summary["ray_start_seconds"], 3),
        "command_wall_seconds": round(wall, 3), "time_split": summary.get("time_split"),
        "learner_wait_seconds": round(summary["learner_wait"], 3),
    }


# ---- the driver -------------------------------------------------------------------------------------


def run_one(name: str, entry: dict, seed: int, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    cmd = entry["cmd"] + ["--seed", str(seed)]
    load_start = load_average()
    print(f"[{time.strftime('%H:%M:%S')}] {name} seed {seed} (load {load_start[0]:.2f}) ...", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, rc = "timeout", -9
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (err or "")[-3000:]
        print(f"    FAILED (rc {rc}) after {wall:.1f}s\n{tail}", flush=True)
        return {"contender": name, "seed": seed, "error": f"rc {rc}", "stderr_tail": tail[-1500:],
                "process_wall_seconds": round(wall, 2), "loadavg_start": load_start}
    res = json.loads(lines[-1][len(RESULT_PREFIX):])
    res.update({"contender": name, "process_wall_seconds": round(wall, 2), "loadavg_start": load_start})
    tts = res.get("time_to_solve_seconds")
    print(f"    solved={res['solved']} time_to_solve={tts} steps={res.get('env_steps_to_solve')} "
          f"stop={res.get('stop_reason')} ray/setup={res.get('ray_start_seconds', res.get('setup_seconds'))} "
          f"wall={wall:.1f}s" + (f" hold={res['hold']}" if "hold" in res else ""), flush=True)
    return res


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    solved = [r for r in ok if r.get("solved")]
    out: dict[str, Any] = {
        "runs": len(runs), "solved": len(solved),
        "time_to_solve_seconds": stats([r["time_to_solve_seconds"] for r in solved]),
        "env_steps_to_solve": stats([r["env_steps_to_solve"] for r in solved]),
        "steps_per_second_training": stats([r["env_steps_total"] / r["train_seconds_total"]
                                             for r in ok if r.get("train_seconds_total")]),
        # process start to exit: the command itself for kuberl-cli, else the contender's whole process
        "whole_process_seconds": stats([r.get("command_wall_seconds", r["process_wall_seconds"]) for r in ok]),
    }
    splits = [r["time_split"] for r in ok if r.get("time_split")]
    if splits:
        out["time_split_median"] = {k: round(statistics.median(s[k] for s in splits), 3)
                                    for k in ("total", "startup", "collection", "learning", "evaluation",
                                              "report", "shutdown")}
    if any("ray_start_seconds" in r for r in ok):
        out["ray_start_seconds"] = stats([r["ray_start_seconds"] for r in ok if "ray_start_seconds" in r])
    if any("build_seconds" in r for r in ok):
        out["algorithm_build_seconds"] = stats([r["build_seconds"] for r in ok if "build_seconds" in r])
    holds = [r["hold"] for r in ok if "hold" in r]
    if holds:
        out["hold"] = {
            "held_to_end": sum(h["held_to_end"] for h in holds),
            "final_eval": [h["final_eval"] for h in holds],
            "min_eval_after_reaching": [h["min_eval_after_reaching"] for h in holds],
            "first_eval_at_target_steps": [h["first_eval_at_target_steps"] for h in holds],
        }
    return out


def ratios(summary: dict[str, dict[str, Any]], runs_by: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def med(name: str) -> tuple[float | None, bool]:
        """Median time-to-solve; a run that never solved counts as its whole training time (a lower
        bound of its time-to-solve), and the median is then flagged as a lower bound."""
        runs = [r for r in runs_by.get(name, []) if "error" not in r]
        if not runs:
            return None, False
        times = [r["time_to_solve_seconds"] if r.get("solved") else r["train_seconds_total"] for r in runs]
        return statistics.median(times), not all(r.get("solved") for r in runs)

    out = {}
    pairs = {
        "sb3_ppo_over_kuberl_cli": ("sb3-ppo", "kuberl-cli", 3.0),
        "sb3_ppo_over_kuberl_ppo_k1": ("sb3-ppo", "kuberl-ppo-k1", 3.0),
        "sb3_ppo_over_kuberl_ppo_k2": ("sb3-ppo", "kuberl-ppo-k2", 3.0),
        "rllib_ppo_1_over_kuberl_ppo_k1": ("rllib-ppo-1", "kuberl-ppo-k1", 10.0),
        "rllib_ppo_2_over_kuberl_ppo_k2": ("rllib-ppo-2", "kuberl-ppo-k2", 10.0),
        "sb3_dqn_over_kuberl_dqn_k1": ("sb3-dqn", "kuberl-dqn-k1", None),
        "sb3_dqn_over_kuberl_dqn_k2": ("sb3-dqn", "kuberl-dqn-k2", None),
    }
    for key, (peer, ours, target) in pairs.items():
        (a, a_open), (b, b_open) = med(peer), med(ours)
        if a is None or b is None or b <= 0:
            continue
        if b_open:  # KubeRL did not solve every run: no honest ratio
            out[key] = {"ratio": None, "target": target, "met": False, "note": f"{ours} did not solve every run"}
            continue
        out[key] = {"ratio": round(a / b, 2), "target": target,
                    "met": None if target is None else a / b >= target}
        if a_open:
            out[key]["note"] = f"{peer} did not solve every run: its median counts unsolved runs at their " \
                               "full training time, so the ratio is a lower bound"

    def whole(name: str) -> float | None:
        runs = [r for r in runs_by.get(name, []) if "error" not in r]
        values = [r.get("command_wall_seconds", r["process_wall_seconds"]) for r in runs]
        return statistics.median(values) if values else None

    for peer in ("sb3-ppo", "rllib-ppo-2"):
        a, b = whole(peer), whole("kuberl-cli")
        if a is not None and b:
            key = f"whole_process_{peer.replace('-', '_')}_over_kuberl_cli"
            out[key] = {"ratio": round(a / b, 2), "target": 3.0 if peer == "sb3-ppo" else None,
                        "met": a / b >= 3.0 if peer == "sb3-ppo" else None}
    return out


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--one", choices=["kuberl-ppo", "kuberl-dqn", "kuberl-cli"],
                   help="one KubeRL run in this process (kuberl-cli: the `kuberl train` command, timed)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="with --one: override a field of the example job's spec, e.g. algorithm.dqn.tau=0.001")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--curve-every", type=int, default=CURVE_EVERY)
    p.add_argument("--recheck-steps", type=int, default=5_000)
    p.add_argument("--budget-steps", type=int, default=BUDGET_STEPS)
    p.add_argument("--budget-seconds", type=float, default=BUDGET_SECONDS)
    p.add_argument("--hold-seconds", type=float, default=HOLD_SECONDS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--only", nargs="+", help="contenders to run (default: all)")
    p.add_argument("--smoke", action="store_true", help="tiny budgets; writes bench/.cache/cartpole-smoke.json")
    p.add_argument("--resummarize", action="store_true", help="recompute summary/ratios of --output; no runs")


def resummarize(output: Path) -> None:
    """Recompute summary and ratios of an existing results file (no runs)."""
    record = read_result(output)
    runs = record["results"]["runs"]
    record["summary"] = {name: summarize(r) for name, r in runs.items()}
    record["results"]["ratios_time_to_solve"] = ratios(record["summary"], runs)
    write_json(output, record)
    print(json.dumps({"summary": record["summary"], "ratios": record["results"]["ratios_time_to_solve"]}, indent=1))


def protocol_record(budget_steps: int, budget_seconds: float) -> dict[str, Any]:
    return {"solved": "mean of last 100 training episodes >= 475, then 100-episode deterministic "
                      "evaluation (seeds 10000-10099) >= 475; a failed evaluation is retried after 5000 "
                      "more env steps; evaluation time is off the clock",
            "ray_start": "off the clock, reported separately (KubeRL: ray.init; RLlib: ray.init and "
                         "algorithm build, separately)",
            "budget": {"env_steps": budget_steps, "train_seconds": budget_seconds,
                       "sb3_ppo_env_steps": min(budget_steps, 100_000),
                       "dqn_hold": {"env_steps": budget_steps, "eval_every": CURVE_EVERY}},
            "learner_torch_threads": 1,
            "whole_process": "process start to exit of each contender's own process; for kuberl-cli "
                             "the `kuberl train examples/cartpole-ppo.yaml` command (its evaluation, "
                             "checkpoint and report written), timed by its wrapper"}


def drive(bench: Bench) -> None:
    """Every chosen contender, every seed, each run a fresh process; merged into the results file."""
    args = bench.args
    if args.smoke:
        args.budget_steps, args.budget_seconds, args.hold_seconds = 6_000, 30.0, 60.0
    table = contenders(args.budget_steps, args.budget_seconds, args.hold_seconds, args.smoke)
    names = args.only or list(table)
    unknown = set(names) - set(table)
    if unknown:
        raise SystemExit(f"unknown contender(s) {sorted(unknown)}; known: {', '.join(table)}")
    for name in names:
        py = Path(table[name]["cmd"][0])
        if not py.exists():
            raise SystemExit(f"{py} is missing: run `bash bench/make_peer_venvs.sh` first")

    # numpy's OpenBLAS: this machine sets OPENBLAS_CORETYPE/L2_SIZE for old builds; a current numpy is
    # faster without them, so every contender runs without them (the same for all).
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    runs_by = bench.previous().get("runs", {})
    clock = Stopwatch()
    fresh: dict[str, list] = {n: [] for n in names}
    for seed in args.seeds:  # seed-major: load drift on this shared machine spreads over all contenders
        for name in names:
            timeout = (args.hold_seconds if table[name]["algo"] == "DQN" else args.budget_seconds) * 1.5 + 120
            fresh[name].append(run_one(name, table[name], seed, timeout, env))
    for name in names:
        runs_by[name] = fresh[name]
    summary = {name: summarize(runs) for name, runs in runs_by.items()}
    results = {
        "protocol": protocol_record(args.budget_steps, args.budget_seconds),
        "machine_notes": {"note": "shared 2-core machine: other agents' jobs ran concurrently; each run records "
                                  "loadavg_start and loadavg_end"},
        "last_invocation": {"contenders": names, "seeds": args.seeds, "wall_seconds": clock.seconds(1)},
        "ratios_time_to_solve": ratios(summary, runs_by),
        "runs": runs_by,
    }
    bench.write(results, summary)
    print(json.dumps({"summary": summary, "ratios": results["ratios_time_to_solve"]}, indent=1))


def main() -> None:
    bench = Bench(__doc__, None, arguments, output_help="the result file (default: bench/results/cartpole.json; "
                                                         "with --smoke, bench/.cache/cartpole-smoke.json)")
    args = bench.args
    if bench.output is None:
        bench.output = BENCH / ".cache" / "cartpole-smoke.json" if args.smoke else RESULTS / "cartpole.json"
    if args.resummarize:
        resummarize(bench.output)
    elif args.one == "kuberl-cli":
        emit(run_cli(args.seed, args.workers))
    elif args.one:
        emit(run_kuberl(args.one.split("-")[1], args.workers or 1, args.seed, args.budget_steps,
                        args.budget_seconds, args.hold, args.curve_every, args.recheck_steps, args.set or []))
    else:
        drive(bench)


if __name__ == "__main__":
    main()

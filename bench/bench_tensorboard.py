"""What the learner's TensorBoard event files cost: tensorboardX's import once torch is loaded, the
training loop's share of a row (tags + queueing) and the writer thread's (encoding, writing), and the
whole `kuberl train examples/cartpole-ppo.yaml` command before and after (runs alternating).

    .venv/bin/python bench/bench_tensorboard.py --before DIR [--runs 4]

DIR: a tree of the commit before the event files (`git archive <commit> | tar -x -C DIR`); its
operator/ and trainer/ go first on PYTHONPATH for the "before" runs, this tree's for the "after" runs,
with the same venv. Writes bench/results/tensorboard.json (--output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench, stats

ROW = {"iteration": 7, "env_steps": 7168, "episodes": 120, "wall_clock": 1.2345, "mean_return": 61.2,
       "episodes_per_second": 95.1, "env_steps_per_second": 5800.4, "loss": 3.21, "gradient_updates": 112,
       "workers_ready": 2, "worker_nodes": 1, "learner_wait": 0.31, "worker_wait": 0.12, "approx_kl": 0.008,
       "clip_fraction": 0.11, "learning_rate": 0.0049}


def import_seconds(runs: int) -> list[float]:
    code = ("import time, torch; t = time.perf_counter(); import tensorboardX; "
            "print(time.perf_counter() - t)")
    return [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(runs)]


def row_costs(rows: int) -> dict[str, float]:
    """Per row: the loop's share (row_scalars + EventLog.add: the calling thread's CPU time, rows 20 ms
    apart as they come apart in a run), and the writer's (the process's CPU time and the
    wall time until close() has written everything, rows added back to back)."""
    import torch  # noqa: F401  (loaded in a learner before the writer starts)
    from kuberl.trainer.tensorboard_log import EventLog, row_scalars

    def row(i: int) -> dict:
        return {**ROW, "iteration": i + 1, "env_steps": 1024 * (i + 1)}

    with tempfile.TemporaryDirectory() as tmp:
        events, loop = EventLog(Path(tmp)), 0.0
        time.sleep(2.0)  # the writer thread's import and file first: the loop's steady state is measured
        for i in range(200):
            t0 = time.thread_time()  # this thread's CPU time: a busy machine's preemptions are not in it
            events.add(1024 * (i + 1), row_scalars(row(i)))
            loop += time.thread_time() - t0
            time.sleep(0.02)  # rows come ~0.1 s apart in a run: the writer is done with this one by the next
        events.close(timeout=600)
    with tempfile.TemporaryDirectory() as tmp:
        events = EventLog(Path(tmp))
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(rows):
            events.add(1024 * (i + 1), row_scalars(row(i)))
        events.close(timeout=600)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"loop_cpu_us_per_row": round(loop / 200 * 1e6, 1), "writer_cpu_ms_per_row": round(cpu / rows * 1e3, 3),
            "writer_wall_ms_per_row": round(wall / rows * 1e3, 3), "scalars_per_row": len(row_scalars(ROW))}


def train_once(tree: Path, run_dir: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}/operator:{tree}/trainer", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(REPO / "examples/cartpole-ppo.yaml"),
                    "--run-dir", str(run_dir), "--no-progress", "--metrics-port", "0"], env=env, check=True,
                   capture_output=True, timeout=600)
    wall = time.perf_counter() - t0
    split = json.loads((run_dir / "summary.json").read_text())["time_split"]
    return {"command": wall, "startup": split["startup"], "total": split["total"]}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", type=Path, required=True,
                        help="a tree of the commit before the event files (see above)")
    parser.add_argument("--runs", type=int, default=4)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "tensorboard.json", arguments)
    args = bench.args
    result = {"tensorboardX_import_after_torch_s": stats(import_seconds(5)), **row_costs(2000)}
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, tree in (("before", args.before), ("after", REPO)):
                runs[name].append(train_once(tree, Path(tmp) / f"{name}-{i}"))
                print(name, runs[name][-1], flush=True)
    result["kuberl_train_cartpole_ppo"] = {
        name: {key: stats([r[key] for r in rs]) for key in ("command", "startup", "total")}
        for name, rs in runs.items()}
    print(json.dumps(result, indent=1))
    bench.write(result)


if __name__ == "__main__":
    main()

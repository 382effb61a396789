"""What MLflow tracking costs a run: `kuberl train examples/cartpole-ppo.yaml` with and without
spec.tracking.mlflow (a real `mlflow server` on loopback, SQLite store), runs alternating; the training
clock (summary.json's wall_clock: the loop) and the whole command (what a user waits for, the end's flush
of the files and the policy included); and the loop's own share of a row (Tracker.log_metrics: the calling
thread's CPU time).

    .venv/bin/python bench/bench_tracking.py [--runs 4]     # bench/results/tracking.json

The server comes from tests/tools.py (its own virtualenv, installed on first use).
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

from common import EXAMPLES, REPO, RESULTS, Bench, stats

sys.path.insert(0, str(REPO / "tests"))

ROW = {"iteration": 7, "env_steps": 7168, "episodes": 120, "wall_clock": 1.2345, "mean_return": 61.2,
       "episodes_per_second": 95.1, "env_steps_per_second": 5800.4, "loss": 3.21, "gradient_updates": 112,
       "workers_ready": 2, "worker_nodes": 1, "learner_wait": 0.31, "worker_wait": 0.12, "approx_kl": 0.008,
       "clip_fraction": 0.11, "learning_rate": 0.0049}


def loop_share(uri: str, rows: int = 500) -> dict[str, float]:
    """The training thread's CPU per row handed to the tracker (naming the metrics and queueing them)."""
    from kuberl.trainer.tracking import Tracker, row_metrics

    tracker = Tracker(uri, "bench-tracking", "loop-share")
    cpu = 0.0
    for i in range(rows):
        t0 = time.thread_time()
        tracker.log_metrics(1024 * (i + 1), row_metrics({**ROW, "iteration": i + 1, "env_steps": 1024 * (i + 1)}))
        cpu += time.thread_time() - t0
        time.sleep(0.005)
    sent = tracker.close()
    return {"loop_cpu_us_per_row": round(cpu / rows * 1e6, 1), "metrics_per_row": len(row_metrics(ROW)),
            "all_sent": sent}


def train_once(job: Path, run_dir: Path) -> dict[str, float]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(job), "--run-dir", str(run_dir),
                    "--no-progress", "--metrics-port", "0"], env=env, check=True, capture_output=True, timeout=900)
    wall = time.perf_counter() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"command": wall, "training_clock": summary["wall_clock"], "env_steps": summary["env_steps"]}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=4)


def main() -> None:
    import yaml
    from tools import MLflowServer

    bench = Bench(__doc__, RESULTS / "tracking.json", arguments)
    args = bench.args
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = MLflowServer(Path(tmp))
        server.start()
        try:
            job = yaml.safe_load((EXAMPLES / "cartpole-ppo.yaml").read_text())
            job["spec"]["tracking"] = {"mlflow": {"trackingUri": server.uri, "experiment": "bench-tracking"}}
            jobs = {"off": EXAMPLES / "cartpole-ppo.yaml", "on": Path(tmp) / "tracked.yaml"}
            jobs["on"].write_text(yaml.safe_dump(job))
            for i in range(args.runs):
                for name in ("off", "on"):
                    runs[name].append(train_once(jobs[name], Path(tmp) / f"{name}-{i}"))
                    print(name, runs[name][-1], flush=True)
            result = {"loop": loop_share(server.uri)}
        finally:
            server.stop()
    result["kuberl_train_cartpole_ppo"] = {
        name: {key: stats([r[key] for r in rs]) for key in ("command", "training_clock", "env_steps")}
        for name, rs in runs.items()}
    on, off = (result["kuberl_train_cartpole_ppo"][k] for k in ("on", "off"))
    result["median_ratio_on_over_off"] = {key: round(on[key]["median"] / off[key]["median"], 3)
                                          for key in ("command", "training_clock")}
    print(json.dumps(result, indent=1))
    bench.write(result)


if __name__ == "__main__":
    main()

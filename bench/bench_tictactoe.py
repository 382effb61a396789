"""Tic-Tac-Toe DQN, 100k training episodes, against the seed's figures (seed 000).

Trains `examples/tictactoe-dqn.yaml` as written (maxEpisodes 100000) with k = 1 and k = 2 rollout
workers on an embedded Ray, one after the other in this process, and records per k:
  - training wall-clock and episodes/s (Ray start-up reported apart; worker start-up is included),
  - the evaluation suites of the example: 1,000 games each vs uniform random moving first and
    second, and self-play (the greedy policy against itself),
  - the exact win/draw/loss probabilities of the final greedy policy against uniform random,
    computed over the whole game tree (1,000 sampled games can be lucky; these cannot),
  - the CPU seconds the learner and each rollout worker spent training (from the first to the
    last iteration), and the load average before and after: the machine's cores are shared with
    other work, so wall-clock includes time spent waiting for a core and CPU seconds do not.

    .venv/bin/python bench/bench_tictactoe.py [--workers 1 2] [--output bench/results/tictactoe.json]

`--example tictactoe-selfplay-dqn` trains the same game through PettingZoo (classic/tictactoe-v3 under
environment.multiAgent.policies: selfPlay) instead of KubeRL's numpy-batched Tic-Tac-Toe: the same DQN
settings, the same suites and the same exact figures (PettingZoo's observation, the board from the mover's
side cell by cell, is encoded as its env encodes it), written to bench/results/tictactoe_pettingzoo.json:

    .venv/bin/python bench/bench_tictactoe.py --example tictactoe-selfplay-dqn --workers 1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from common import RESULTS, Bench, example_job, load_average
from kuberl.api.load import parse_job
from kuberl.trainer.checkpoint import load_latest
from kuberl.trainer.envs.tictactoe import encode, winner
from kuberl.trainer.networks import QNetwork, numpy_params
from kuberl.trainer.policies import QPolicy
from kuberl.trainer.run import TrainOptions, train
from kuberl.trainer.spaces import SpaceInfo

SEED = {
    "source": "shared/seeds/000_8cb1ae3072f78aaa.txt (12-vCPU Paperspace C7)",
    "wall_clock_seconds": {"k=1": 295.8, "k=12": 228.6},
    "episodes_per_second": {"k=1": 338, "k=12": 438},
    "win_rate_first": "60-65%",
    "win_rate_second": "31-35%",
    "self_play": "strong first-move bias (X wins)",
}
TARGETS = {
    "wall_clock_seconds_max": 20.0,
    "losses_vs_random": 0,
    "win_rate_first_min": 0.95,
    "win_rate_second_min": 0.75,
    "self_play": "all draws",
}


def greedy_policy(run_dir: Path, job) -> QPolicy:
    """The final greedy policy, rebuilt from the run's last checkpoint."""
    _path, state = load_latest(run_dir / "checkpoints", map_location="cpu")
    cfg = job.spec.algorithm.dqn
    info = SpaceInfo(obs_dim=18, action_kind="Discrete", action_dims=(9,))
    net = QNetwork(info, cfg.network.hidden_sizes, cfg.network.activation, cfg.dueling)
    net.load_state_dict(state["algorithm"]["q"])
    policy = QPolicy(info, len(cfg.network.hidden_sizes), cfg.network.activation, cfg.dueling)
    policy.load(numpy_params(net))
    return policy


def pettingzoo_encode(board: tuple[int, ...], side: int) -> np.ndarray:
    """PettingZoo's classic/tictactoe-v3 observation of `board` (1 X, -1 O, 0 free) for the player `side`:
    (3, 3, 2) planes of its marks and the other's, flattened as KubeRL's multi-agent envs flatten it. Its
    cells are PettingZoo's squares, whose lines are the same set as `winner`'s."""
    cells = np.asarray(board)
    return np.stack([cells == side, cells == -side], axis=1).astype(np.float32).ravel()


def exact_vs_random(policy: QPolicy, agent_first: bool, encoder=encode) -> dict[str, float]:
    """P(win), P(draw), P(loss) of the greedy policy against a uniform-random opponent."""
    agent = 1 if agent_first else -1

    @functools.cache
    def outcome(board: tuple[int, ...], mover: int) -> np.ndarray:
        result = winner(board)
        if result is not None:
            return np.array([result == agent, result == 0, result == -agent], dtype=np.float64)
        free = [i for i in range(9) if board[i] == 0]
        if mover == agent:
            mask = np.array([c == 0 for c in board])
            cell = int(policy.act(None, encoder(board, agent)[None], mask[None], epsilon=0.0)[0])
            moves = [cell]
        else:
            moves = free
        total = np.zeros(3)
        for cell in moves:
            total += outcome((*board[:cell], mover, *board[cell + 1:]), -mover)
        return total / len(moves)

    win, draw, loss = outcome((0,) * 9, 1)
    return {"win": round(win, 5), "draw": round(draw, 5), "loss": round(loss, 6),
            "expected_losses_per_1000": round(1000 * loss, 3)}


class CpuMeter:
    """CPU seconds of the learner (this process) and of each rollout worker between the first and the
    last training iteration, read from /proc/<pid>/stat of the workers (Linux)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.pids: dict[str, int] = {}

    def _read(self) -> dict[str, float]:
        out = {"learner": time.process_time()}
        for name, pid in self.pids.items():
            with contextlib.suppress(FileNotFoundError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        return out

    def __call__(self, row, loop) -> None:
        if not self.pids:
            self.pids = {f"worker-{h.index}": ray.get(h.actor.pid.remote()) for h in loop.workers.ready()}
        reading = self._read()
        if not self.first:
            self.first = reading
        self.last = reading

    def seconds(self) -> dict[str, float]:
        return {k: round(self.last[k] - self.first[k], 2) for k in self.first if k in self.last}


def run_one(workers: int, run_dir: Path, max_episodes: int | None, example: str = "tictactoe-dqn") -> dict:
    job = parse_job(example_job(example))
    if max_episodes is not None:
        job.spec.stopping.max_episodes = max_episodes
    load_before = load_average()
    cpu = CpuMeter()
    t0 = time.perf_counter()
    result = train(job, TrainOptions(run_dir=run_dir, workers=workers, metrics_port=0, progress=False,
                                     on_iteration=cpu))
    total = time.perf_counter() - t0
    c = result.counters
    ev = result.evaluation
    suites = {name: {k: ev[name][k] for k in ("games", "wins", "draws", "losses", "win_rate")}
              for name in ("vs-random-first", "vs-random-second", "self-play")}
    policy = greedy_policy(run_dir, job)
    encoder = encode if job.spec.environment.multi_agent is None else pettingzoo_encode
    return {
        "example": f"examples/{example}.yaml",
        "environment": job.spec.environment.id,
        "whole_run_seconds": round(total, 2),
        "workers": workers,
        "envs_per_worker": job.spec.rollout_workers.envs_per_worker,
        "episodes": c.episodes,
        "env_steps": c.env_steps,
        "gradient_updates": c.gradient_updates,
        "training_wall_clock_seconds": round(c.wall_clock, 2),
        "episodes_per_second": round(c.episodes / c.wall_clock, 1),
        "ray_start_seconds": round(result.ray_start_seconds, 2),
        "evaluation_and_shutdown_seconds": round(total - c.wall_clock - result.ray_start_seconds, 2),
        "cpu_seconds_training": cpu.seconds(),
        "learner_wait_seconds": round(c.learner_wait, 2),
        "worker_wait_seconds": round(c.worker_wait, 2),
        "suites": suites,
        "exact_vs_random": {side: exact_vs_random(policy, first, encoder) for side, first in
                            (("first", True), ("second", False))},
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def verdict(run: dict) -> dict:
    s = run["suites"]
    return {
        "wall_clock": run["training_wall_clock_seconds"] <= TARGETS["wall_clock_seconds_max"],
        "no_losses_vs_random": s["vs-random-first"]["losses"] == 0 and s["vs-random-second"]["losses"] == 0,
        "win_rate_first": s["vs-random-first"]["win_rate"] >= TARGETS["win_rate_first_min"],
        "win_rate_second": s["vs-random-second"]["win_rate"] >= TARGETS["win_rate_second_min"],
        "self_play_all_draws": s["self-play"]["draws"] == s["self-play"]["games"],
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-episodes", type=int, help="override the example's 100k (quick checks only)")
    parser.add_argument("--example", default="tictactoe-dqn", choices=["tictactoe-dqn", "tictactoe-selfplay-dqn"],
                        help="the job: KubeRL's batched Tic-Tac-Toe, or PettingZoo's under self-play")


def main() -> None:
    bench = Bench(__doc__, None, arguments, output_help="the result file (default: bench/results/tictactoe.json, "
                  "with --example tictactoe-selfplay-dqn bench/results/tictactoe_pettingzoo.json)")
    args = bench.args
    if bench.output is None:
        bench.output = RESULTS / ("tictactoe.json" if args.example == "tictactoe-dqn" else "tictactoe_pettingzoo.json")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-ttt-") as tmp:
        for k in args.workers:
            run = run_one(k, Path(tmp) / f"k{k}", args.max_episodes, args.example)
            run["meets_target"] = verdict(run)
            runs.append(run)
            print(json.dumps(run, indent=2))
    bench.write({
        "machine_notes": {"processor": platform.processor() or platform.machine(),
                          "note": "cores shared with other work; see load_average_* per run"},
        "seed": SEED,
        "targets": TARGETS,
        "runs": runs,
    })


if __name__ == "__main__":
    main()

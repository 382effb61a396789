"""Collection scaling with worker count, on a 2-core machine: rollout workers whose envs wait on a
simulator (kuberl.trainer.envs.latency: every batch step waits `--step-seconds`, as a remote
simulator or game server would) leave their cores free while they wait, so k far above the core
count can be measured.

    .venv/bin/python bench/bench_scaling.py                        # local Ray and a 3-node `ray start` cluster
    .venv/bin/python bench/bench_scaling.py --modes local --k 1 2 4 --rounds 3

For each k (1, 2, 4, 8, 16): k RolloutWorker actors (the trainer's WorkerSet), each with `--envs`
envs, sample `--steps` steps per round with the PPO numpy policy (weights put once per round, as
the learner does); throughput = env steps collected / wall time of `--rounds` rounds after one
warm-up round. Efficiency = throughput(k) / (k x throughput(1)). Modes: `local` (the embedded Ray
`kuberl train` starts) and `cluster` (a head with no CPU and two worker nodes started with
`ray start` on this machine, `--k`/2 rollout slots each, the learner joining with --ray-address as
a learner pod does). Results: bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, Bench, free_port, load_average

RAY_BIN = str(Path(sys.executable).with_name("ray"))
ENV_ID = "kuberl.trainer.envs.latency:LatencyEnv"


def _weights(info) -> dict[str, np.ndarray]:
    import torch
    from kuberl.trainer.networks import ActorCritic, numpy_params

    torch.manual_seed(0)
    return numpy_params(ActorCritic(info, [64, 64], "tanh"))


def measure(k_values: list[int], envs: int, steps: int, rounds: int, step_seconds: float,
            cluster: bool) -> list[dict[str, Any]]:
    import ray
    from kuberl.trainer.rollout import make_env
    from kuberl.trainer.spaces import space_info
    from kuberl.trainer.workers import WorkerSet

    kwargs = {"step_seconds": step_seconds, "episode_steps": 200}
    probe = make_env(ENV_ID, kwargs)
    weights = _weights(space_info(probe.observation_space, probe.action_space))
    args = {"env_id": ENV_ID, "env_kwargs": kwargs, "num_envs": envs,
            "policy": {"kind": "ppo", "n_layers": 2, "activation": "tanh"}, "max_episode_steps": None}
    out = []
    for k in k_values:
        workers = WorkerSet(args, k, False, seed=k, expected=k)
        t_start = time.perf_counter()
        workers.reconcile(wait_for_all=300.0)
        start_seconds = time.perf_counter() - t_start
        if len(workers.ready()) < k:
            raise RuntimeError(f"only {len(workers.ready())} of {k} workers started")
        nodes = set()
        collected, elapsed = 0, 0.0
        load0 = load_average()[0]
        for r in range(rounds + 1):  # round 0 warms up
            ref = ray.put(weights)
            t0 = time.perf_counter()
            batches = workers.call("sample_onpolicy", {h.index: (ref, 1, steps, 0.99) for h in workers.ready()})
            dt = time.perf_counter() - t0
            if r:
                collected += sum(int(b["env_steps"]) for b in batches.values())
                elapsed += dt
            nodes |= {b["node"] for b in batches.values()}
        workers.shutdown()
        row = {"k": k, "env_steps": collected, "seconds": round(elapsed, 3),
               "steps_per_second": round(collected / elapsed, 1), "actor_start_seconds": round(start_seconds, 2),
               "nodes": len(nodes), "loadavg": [load0, load_average()[0]]}
        ideal_one = envs / step_seconds
        row["vs_ideal"] = round(row["steps_per_second"] / (k * ideal_one), 3)
        out.append(row)
        print(f"  {'cluster' if cluster else 'local'} k={k:2d}: {row['steps_per_second']:9.1f} steps/s "
              f"({row['vs_ideal']:.2f} of ideal, nodes {row['nodes']}, load {row['loadavg']})", flush=True)
        time.sleep(1.0)  # killed actors' processes leave before the next k starts
    base = out[0]["steps_per_second"] / out[0]["k"]
    for row in out:
        row["efficiency"] = round(row["steps_per_second"] / (row["k"] * base), 3)
        row["speedup"] = round(row["steps_per_second"] / out[0]["steps_per_second"], 2)
    return out


def run_local(a) -> list[dict[str, Any]]:
    import ray
    from kuberl.trainer.workers import start_ray

    start_ray(None, max(a.k))
    try:
        return measure(a.k, a.envs, a.steps, a.rounds, a.step_seconds, cluster=False)
    finally:
        ray.shutdown()


def run_cluster(a) -> list[dict[str, Any]]:
    """A head (no CPU, no rollout slot) and two worker nodes with max(k)/2 slots each, all `ray start`."""
    import ray
    from kuberl.trainer.workers import start_ray

    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    node_args = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--object-store-memory=100000000"]
    procs = [subprocess.Popen([RAY_BIN, "start", "--head", f"--port={port}", "--num-cpus=0",
                               "--include-dashboard=false", *node_args], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the Ray head did not start")
            time.sleep(0.5)
        half = max(max(a.k) // 2, 1)
        worker_cmd = [RAY_BIN, "start", f"--address=127.0.0.1:{port}", f"--num-cpus={half}",
                      f'--resources={{"rollout_slot": {half}}}', *node_args]
        start_ray(f"127.0.0.1:{port}", 0)
        # One worker node at a time (two starting at once on one machine can race for a port), and a
        # `ray start` that exits is started again, as a restarted worker pod would be.
        for n in (1, 2):
            node = None
            deadline = time.monotonic() + 180
            while ray.cluster_resources().get("rollout_slot", 0) < n * half:
                if node is None or node.poll() is not None:
                    node = subprocess.Popen(worker_cmd, env=env, start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    procs.append(node)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rollout slots: {ray.cluster_resources().get('rollout_slot', 0)}")
                time.sleep(0.5)
        return measure(a.k, a.envs, a.steps, a.rounds, a.step_seconds, cluster=True)
    finally:
        ray.shutdown()
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--envs", type=int, default=8, help="envs per worker")
    p.add_argument("--steps", type=int, default=32, help="steps per env per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--step-seconds", type=float, default=0.02, help="the simulator's wait per batch step")
    p.add_argument("--modes", nargs="+", default=["local", "cluster"], choices=["local", "cluster"])


def main() -> None:
    bench = Bench(__doc__, RESULTS / "scaling.json", arguments)
    a = bench.args
    results: dict[str, Any] = {}
    for mode in a.modes:
        print(f"{mode}:", flush=True)
        results[mode] = run_local(a) if mode == "local" else run_cluster(a)
    target = {mode: {"k16_efficiency": next((r["efficiency"] for r in rows if r["k"] == 16), None)}
              for mode, rows in results.items()}
    for t in target.values():
        t["target"] = 0.85
        t["met"] = None if t["k16_efficiency"] is None else t["k16_efficiency"] >= 0.85
    bench.write({
        "env": {"id": ENV_ID, "step_seconds": a.step_seconds, "envs_per_worker": a.envs,
                "batched": "LatencyBatch: one wait per batch step",
                "ideal_per_worker_steps_per_second": a.envs / a.step_seconds},
        "round": {"steps_per_env": a.steps, "rounds": a.rounds, "warmup_rounds": 1},
        "efficiency": "throughput(k) / (k x throughput(1)); vs_ideal: throughput(k) / (k x envs / step_seconds)",
        "machine_notes": {"note": "shared 2-core machine: the load averages say how busy it was"},
        "modes": results, "target_k16": target,
    })
    print(json.dumps(target, indent=1))


if __name__ == "__main__":
    main()

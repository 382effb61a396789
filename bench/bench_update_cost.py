"""What one off-policy gradient update costs: KubeRL's SAC and TD3 against Stable-Baselines3's, each in its own
process on the same data shapes (MuJoCo's InvertedDoublePendulum-v5 and Hopper-v5: batch 256, rl-baselines3-zoo's
networks for each, [256, 256] for SAC and [400, 300] for TD3), milliseconds per update over 300 updates after 50
to warm up, by torch thread count, with torch.profiler's breakdown of one side's updates by operator (self CPU
time): the profile that says what limits `bench_continuous.py`'s whole-command ratio against SB3.

KubeRL's side is `algorithms/sac.py` / `td3.py`'s `update()` on a replay buffer of random transitions; SB3's is
`model.train(gradient_steps=N, batch_size=256)` on a buffer its own `learn()` filled with random actions (its
learning_starts past the fill). Neither side steps an env while timed: this is the learner's share alone.

    bash bench/make_peer_venvs.sh sb3
    .venv/bin/python bench/bench_update_cost.py            # -> bench/results/update_cost.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH, RESULT_PREFIX, RESULTS, Bench, emit

#: (observation width, action width) of each task, as gymnasium's v5 envs give them.
TASKS = {"InvertedDoublePendulum-v5": (9, 1), "Hopper-v5": (11, 3)}
#: rl-baselines3-zoo's MuJoCo networks (hyperparams/sac.yml, td3.yml, commit 22e3ff2): SB3's SAC default and TD3's
#: net_arch [400, 300]; the zoo's TD3 learning rate 1e-3, SAC's SB3 default 3e-4.
NETWORKS = {"sac": [256, 256], "td3": [400, 300]}
LEARNING_RATES = {"sac": 3e-4, "td3": 1e-3}
BATCH, WARMUP, TIMED, PROFILED, FILL = 256, 50, 300, 100, 5_000


def arguments(p) -> None:
    p.add_argument("--side", choices=["driver", "kuberl", "sb3"], default="driver",
                   help="(internal) the side this process measures; the driver runs each in its own process")
    p.add_argument("--algo", choices=sorted(NETWORKS))
    p.add_argument("--task", choices=sorted(TASKS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sb3-python", default=str(BENCH / ".venvs" / "sb3" / "bin" / "python"))


def profile_rows(prof, top: int = 12) -> list[dict[str, Any]]:
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1.0
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"op": e.key, "calls_per_update": round(e.count / PROFILED, 1),
             "self_ms_per_update": round(e.self_cpu_time_total / 1000 / PROFILED, 3),
             "share": round(e.self_cpu_time_total / total, 3)} for e in rows]


def timed(update, profile: bool) -> dict[str, Any]:
    import torch

    for _ in range(WARMUP):
        update()
    t0 = time.perf_counter()
    for _ in range(TIMED):
        update()
    out: dict[str, Any] = {"ms_per_update": round((time.perf_counter() - t0) / TIMED * 1000, 3)}
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(PROFILED):
                update()
        out["profile"] = profile_rows(prof)
    return out


def kuberl_side(algo: str, task: str, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from kuberl.api.job import SACConfig, TD3Config
    from kuberl.trainer.algorithms.sac import SAC
    from kuberl.trainer.algorithms.td3 import TD3
    from kuberl.trainer.spaces import SpaceInfo

    torch.set_num_threads(threads)
    obs, act = TASKS[task]
    info = SpaceInfo(obs_dim=obs, action_kind="Box", action_dims=(act,), action_low=(-1.0,) * act,
                     action_high=(1.0,) * act)
    network = {"hidden_sizes": NETWORKS[algo], "activation": "relu"}
    if algo == "td3":
        learner = TD3(TD3Config(learning_starts=0, batch_size=BATCH, learning_rate=LEARNING_RATES[algo],
                                network=network), info, torch.device("cpu"), 0, 1_000_000)
    else:
        learner = SAC(SACConfig(learning_starts=0, batch_size=BATCH, policy_learning_rate=LEARNING_RATES[algo],
                                q_learning_rate=LEARNING_RATES[algo], network=network),
                      info, torch.device("cpu"), 0, 1_000_000)
    rng = np.random.default_rng(0)
    learner.buffer.add({"obs": rng.normal(size=(FILL, obs)).astype(np.float32),
                        "next_obs": rng.normal(size=(FILL, obs)).astype(np.float32),
                        "actions": rng.uniform(-1, 1, size=(FILL, act)).astype(np.float32),
                        "rewards": rng.normal(size=FILL).astype(np.float32),
                        "dones": np.zeros(FILL, np.float32), "discounts": np.full(FILL, 0.99, np.float32)})
    return timed(learner.update, profile=True)


def sb3_side(algo: str, task: str, threads: int) -> dict[str, Any]:
    import torch
    from stable_baselines3 import SAC, TD3

    torch.set_num_threads(threads)
    settings = {"learning_rate": LEARNING_RATES[algo], "batch_size": BATCH, "learning_starts": 10**9,
                "policy_kwargs": {"net_arch": NETWORKS[algo]}, "device": "cpu", "seed": 0}
    model = (TD3 if algo == "td3" else SAC)("MlpPolicy", task, **settings)
    model.learn(total_timesteps=FILL)  # random actions into its buffer: learning_starts is past the fill
    return timed(lambda: model.train(gradient_steps=1, batch_size=BATCH), profile=True)


def run_side(python: str, side: str, algo: str, task: str, threads: int) -> dict[str, Any]:
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    proc = subprocess.run([python, str(Path(__file__)), "--side", side, "--algo", algo, "--task", task,
                           "--threads", str(threads)], capture_output=True, text=True, env={**os.environ, **env},
                          check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        raise SystemExit(f"{side} {algo} {task} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def main() -> None:
    bench = Bench(__doc__, RESULTS / "update_cost.json", arguments)
    args = bench.args
    if args.side != "driver":
        measure = kuberl_side if args.side == "kuberl" else sb3_side
        emit({"side": args.side, "algo": args.algo, "task": args.task, "threads": args.threads,
              **measure(args.algo, args.task, args.threads)})
        return
    results, summary = [], {}
    for task in TASKS:
        for algo in NETWORKS:
            sb3 = run_side(args.sb3_python, "sb3", algo, task, 1)
            ours = {threads: run_side(sys.executable, "kuberl", algo, task, threads) for threads in (1, 2)}
            results += [sb3, *ours.values()]
            summary[f"{algo} {task}"] = {
                "sb3_ms_1_thread": sb3["ms_per_update"], "kuberl_ms_1_thread": ours[1]["ms_per_update"],
                "kuberl_ms_2_threads": ours[2]["ms_per_update"],
                "sb3_over_kuberl_1_thread": round(sb3["ms_per_update"] / ours[1]["ms_per_update"], 2),
                "sb3_over_kuberl_2_threads": round(sb3["ms_per_update"] / ours[2]["ms_per_update"], 2)}
            print(f"{algo} {task}: {summary[f'{algo} {task}']}", file=sys.stderr, flush=True)
    bench.write({"updates_timed": TIMED, "batch_size": BATCH, "runs": results}, summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

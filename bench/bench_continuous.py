"""SAC or TD3 on Pendulum-v1, KubeRL against Stable-Baselines3 in the same run, 5 seeds each, each through
its own command as a user runs it, one seed after another; both train 20,000 env steps and are scored by
the same greedy evaluation (20 episodes, seeds 10000..10019): its IQM over the seeds with a 95% bootstrap
interval (kuberl.sweep.statistics, the sweep's own ranking statistics), how many seeds reach -200, and the
time of the whole command (the sweep; each SB3 process) beside each trial's training clock.

- SAC (`--algo sac`, bench/results/continuous.json): KubeRL's defaults through `kuberl sweep
  examples/sweeps/pendulum-sac-seeds.yaml` against SB3 with rl-baselines3-zoo's Pendulum-v1 settings.
- TD3 (`--algo td3`, bench/results/continuous_td3.json): both with rl-baselines3-zoo's Pendulum-v1 settings
  (`examples/sweeps/pendulum-td3-zoo-seeds.yaml`: CleanRL's defaults, for 1M-step MuJoCo runs, start
  learning after 25,000 env steps, past this budget), so the implementations are compared, not defaults.

- SAC on MuJoCo's InvertedDoublePendulum-v5 (`--task InvertedDoublePendulum-v5`,
  bench/results/continuous_mujoco.json): KubeRL's defaults through `kuberl sweep
  examples/sweeps/inverted-double-pendulum-sac-seeds.yaml` against SB3 with rl-baselines3-zoo's MuJoCo defaults;
  the target is gymnasium's reward threshold for the task, 9,100.
- TD3 on it (`--algo td3 --task InvertedDoublePendulum-v5`, bench/results/continuous_mujoco_td3.json): both with
  rl-baselines3-zoo's MuJoCo settings for TD3 (`examples/sweeps/inverted-double-pendulum-td3-zoo-seeds.yaml`).
- SAC and TD3 on MuJoCo's Hopper-v5 (`--task Hopper-v5 [--algo td3]`, bench/results/continuous_hopper.json,
  continuous_hopper_td3.json): both sides with rl-baselines3-zoo's settings for Hopper (its MuJoCo defaults:
  `examples/sweeps/hopper-sac-zoo-seeds.yaml`, `hopper-td3-zoo-seeds.yaml`), so both make the same updates; the
  target is gymnasium's reward threshold for the task, 3,800, far past what 20,000 env steps reach: the figure
  is the return at that budget.

SB3 runs with one thread (bench/peer_sb3_continuous.py).

    bash bench/make_peer_venvs.sh sb3                       # once: SB3's own virtualenv
    .venv/bin/python bench/bench_continuous.py [--algo td3] [--task InvertedDoublePendulum-v5|Hopper-v5]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    BENCH,
    EXAMPLES,
    REPO,
    RESULT_PREFIX,
    RESULTS,
    Bench,
    iqm_interval,
    kuberl_sweep,
    load_average,
)

PENDULUM, IDP, HOPPER = "Pendulum-v1", "InvertedDoublePendulum-v5", "Hopper-v5"
SWEEPS = {(PENDULUM, "sac"): EXAMPLES / "sweeps" / "pendulum-sac-seeds.yaml",
          (PENDULUM, "td3"): EXAMPLES / "sweeps" / "pendulum-td3-zoo-seeds.yaml",
          (IDP, "sac"): EXAMPLES / "sweeps" / "inverted-double-pendulum-sac-seeds.yaml",
          (IDP, "td3"): EXAMPLES / "sweeps" / "inverted-double-pendulum-td3-zoo-seeds.yaml",
          (HOPPER, "sac"): EXAMPLES / "sweeps" / "hopper-sac-zoo-seeds.yaml",
          (HOPPER, "td3"): EXAMPLES / "sweeps" / "hopper-td3-zoo-seeds.yaml"}
OUTPUTS = {(PENDULUM, "sac"): RESULTS / "continuous.json", (PENDULUM, "td3"): RESULTS / "continuous_td3.json",
           (IDP, "sac"): RESULTS / "continuous_mujoco.json", (IDP, "td3"): RESULTS / "continuous_mujoco_td3.json",
           (HOPPER, "sac"): RESULTS / "continuous_hopper.json", (HOPPER, "td3"): RESULTS / "continuous_hopper_td3.json"}
#: Pendulum-v1: swung up and held; the MuJoCo tasks: gymnasium's reward threshold for each.
TARGETS = {PENDULUM: -200.0, IDP: 9100.0, HOPPER: 3800.0}


def arguments(p) -> None:
    p.add_argument("--algo", choices=sorted({algo for _, algo in SWEEPS}), default="sac")
    p.add_argument("--task", choices=list(TARGETS), default=PENDULUM)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sb3-python", default=str(BENCH / ".venvs" / "sb3" / "bin" / "python"))


def interval(values: list[float]) -> dict[str, Any]:
    return iqm_interval(values, 1)


def run_kuberl(sweep: Path, seeds: int, target: float) -> dict[str, Any]:
    with kuberl_sweep(sweep, "bench-continuous-") as (rows, whole, load):
        trials = []
        for row in rows[:seeds]:
            summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
            trials.append({"seed": int(row["seed"]), "env_steps": int(row["env_steps"]),
                           "evaluation_return": round(float(row["evaluation_return"]), 1),
                           "training_seconds": summary.get("wall_clock")})
    returns = [t["evaluation_return"] for t in trials]
    return {"command": f"kuberl sweep {sweep.relative_to(REPO)}", "whole_command_seconds": whole,
            "loadavg_start": load, "trials": trials, "evaluation_return": interval(returns),
            "seeds_at_target": sum(r >= target for r in returns)}


def run_sb3(python: str, algo: str, seeds: int, task: str, target: float) -> dict[str, Any]:
    trials, total = [], 0.0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    for seed in range(seeds):
        t0 = time.perf_counter()
        proc = subprocess.run([python, str(BENCH / "peer_sb3_continuous.py"), "--algo", algo, "--seed", str(seed),
                               "--env", task], cwd=REPO, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - t0
        total += wall
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if not lines:
            raise SystemExit(f"SB3 seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(lines[-1][len(RESULT_PREFIX):])
        trials.append({"seed": seed, "env_steps": result["env_steps"],
                       "evaluation_return": round(result["evaluation_return"], 1),
                       "training_seconds": result["train_seconds"], "process_seconds": round(wall, 1)})
        print(f"sb3 seed {seed}: {trials[-1]}", file=sys.stderr, flush=True)
    returns = [t["evaluation_return"] for t in trials]
    return {"command": f"bench/.venvs/sb3/bin/python bench/peer_sb3_continuous.py --algo {algo} --seed N "
                       f"--env {task}, N = 0..{seeds - 1}",
            "whole_command_seconds": round(total, 1), "trials": trials, "evaluation_return": interval(returns),
            "seeds_at_target": sum(r >= target for r in returns)}


def main() -> None:
    bench = Bench(__doc__, None, arguments, output_help="the result file (default: bench/results/continuous.json "
                                                        "for SAC, continuous_td3.json for TD3, continuous_mujoco.json "
                                                        "for InvertedDoublePendulum-v5, continuous_hopper.json for "
                                                        "Hopper-v5)")
    args = bench.args
    key = (args.task, args.algo)
    if key not in SWEEPS:
        raise SystemExit(f"no sweep for {args.algo} on {args.task}: {sorted(SWEEPS)}")
    bench.output = bench.output or OUTPUTS[key]
    target = TARGETS[args.task]
    before = load_average()
    ours = run_kuberl(SWEEPS[key], args.seeds, target)
    print(f"kuberl: {ours['evaluation_return']} in {ours['whole_command_seconds']} s", file=sys.stderr, flush=True)
    peer = run_sb3(args.sb3_python, args.algo, args.seeds, args.task, target)
    results = {"task": args.task, "env_steps": 20_000, "target_return": target, "loadavg_before": before,
               f"kuberl_{args.algo}": ours, f"sb3_{args.algo}_zoo": peer}
    summary = {
        f"kuberl_{args.algo}_evaluation_iqm": ours["evaluation_return"],
        f"sb3_{args.algo}_evaluation_iqm": peer["evaluation_return"],
        "kuberl_seeds_at_target": f"{ours['seeds_at_target']} of {args.seeds}",
        "sb3_seeds_at_target": f"{peer['seeds_at_target']} of {args.seeds}",
        "whole_command_sb3_over_kuberl": round(peer["whole_command_seconds"] / ours["whole_command_seconds"], 2),
    }
    bench.write(results, summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

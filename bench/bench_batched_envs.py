"""KubeRL's own envs, per-env vs numpy-batched: raw step rates and one rollout worker's rate.

    .venv/bin/python bench/bench_batched_envs.py [--envs 64] [--seconds 2] [--output bench/results/batched_envs.json]

For Tic-Tac-Toe (examples/tictactoe-dqn.yaml's kwargs: self-play opponent, half its moves random) and
Autoscaling-v0 / AutoscalingMulti-v0 (default kwargs), with `--envs` copies in this process, pinned to
one core (the first of its affinity):
  - raw, reference: gymnasium SyncVectorEnv of the per-env env (autoreset SAME_STEP), random legal
    actions: the per-env way a rollout worker could step them;
  - raw, batched: TicTacToeBatch / AutoscalingBatch, the same actions (tests/unit/test_batched_envs.py
    checks they run the same episodes step for step);
  - worker: one RolloutWorker (plain class) on the batched env, `sample_offpolicy` with the DQN
    policy of the env's example job (64 steps per call, new weights every call, as in training);
  - single env: one env made as evaluation and SyncVectorEnv make theirs (`rollout.make_env`),
    stepped alone with random legal actions.
Measured in turns (reference, batched, worker, single, repeated), the median of `--repeats` rounds;
the load average is recorded (the machine is shared). Then batched and single env again, as steps per
CPU second of this process (`*_cpu`), which other work on the shared cores disturbs less.
Tic-Tac-Toe's self-play opponent is a frozen copy of that policy in all four.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gymnasium as gym
import numpy as np
from common import EXAMPLES, RESULTS, Bench, Stopwatch, example_job, interleaved_rates

EXAMPLE_JOBS = {  # env id -> the example job whose policy (and Tic-Tac-Toe's kwargs) the worker uses
    "kuberl/TicTacToe-v0": "tictactoe-dqn.yaml",
    "kuberl/Autoscaling-v0": "autoscaling-dqn.yaml",
    "kuberl/AutoscalingMulti-v0": "autoscaling-dqn.yaml",
}


def _algorithm(env_id: str, env):
    import torch
    from kuberl.api.load import load_job_file
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.spaces import space_info

    torch.set_num_threads(1)
    job = load_job_file(EXAMPLES / EXAMPLE_JOBS[env_id])
    spec = job.spec
    if env_id.endswith("Multi-v0"):  # MultiDiscrete actions: the autoscaling BDQ example's algorithm
        spec = load_job_file(EXAMPLES / "autoscaling-bdq.yaml").spec
    info = space_info(env.single_observation_space, env.single_action_space)
    return algorithm_for(spec, info, torch.device("cpu"), 0, 100_000)


def _kwargs(env_id: str) -> dict:
    if env_id == "kuberl/TicTacToe-v0":
        return example_job(Path(EXAMPLE_JOBS[env_id]).stem)["spec"]["environment"]["kwargs"]
    return {}


def steppers(env_id: str, n: int):
    from kuberl.trainer.rollout import RolloutWorker, make_env, make_vector_env

    kwargs = _kwargs(env_id)
    reference = make_vector_env(env_id, kwargs, n, batched=False)
    batched = make_vector_env(env_id, kwargs, n)
    single = make_env(env_id, kwargs)
    algo = _algorithm(env_id, batched)
    if env_id == "kuberl/TicTacToe-v0":
        from kuberl.trainer.selfplay import FrozenOpponent

        opponent = FrozenOpponent()
        worker = RolloutWorker(env_id, kwargs, n, 0, algo.policy_config())
        worker.set_weights(algo.weights(), 0)
        opponent.refresh(worker.policy, 0)
        for env in [*reference.envs, single]:
            env.unwrapped.set_opponent_policy(opponent)
        batched.set_opponent_policy(opponent)
    else:
        worker = RolloutWorker(env_id, kwargs, n, 0, algo.policy_config())
    space = batched.single_action_space
    rng = np.random.default_rng(0)
    chunk = 32

    def one_env() -> int:
        # One env alone, as evaluation and a SyncVectorEnv's copies step it: reset when an episode ends.
        info = single_state["info"]
        for _ in range(chunk):
            mask = info.get("action_mask")
            if mask is not None:
                action = int(np.argmax(rng.random(9) + mask))
            elif isinstance(space, gym.spaces.MultiDiscrete):
                action = rng.integers(0, space.nvec)
            else:
                action = int(rng.integers(0, space.n))
            _obs, _r, terminated, truncated, info = single.step(action)
            if terminated or truncated:
                _obs, info = single.reset()
        single_state["info"] = info
        return chunk

    single_state = {"info": single.reset(seed=0)[1]}

    def raw(env):
        _obs, info = env.reset(seed=0)
        state = {"info": info}

        def run() -> int:
            for _ in range(chunk):
                mask = state["info"].get("action_mask")
                if mask is not None:
                    actions = np.argmax(rng.random((n, 9)) + np.asarray(mask, bool), axis=1)
                elif isinstance(space, gym.spaces.MultiDiscrete):
                    actions = rng.integers(0, space.nvec, (n, len(space.nvec)))
                else:
                    actions = rng.integers(0, space.n, n)
                _obs, _r, _te, _tr, state["info"] = env.step(actions)
            return chunk * n

        return run

    version = [0]

    def work() -> int:
        version[0] += 1
        return worker.sample_offpolicy(algo.weights(), version[0], 64, 0.1, 0.99, 1)["env_steps"]

    return {"reference_sync_vector_env": raw(reference), "batched": raw(batched), "worker_on_batched": work,
            "single_env": one_env}


def cpu_rates(fn, seconds: float, repeats: int) -> dict:
    """Steps per second of this process's CPU time: what other work on the shared cores changes least
    (a wall-clock rate also counts the time the scheduler gave them)."""
    rounds = []
    for _ in range(repeats):
        steps, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            steps += fn()
        rounds.append(steps / (time.process_time() - t0))
    return {"steps_per_cpu_second": round(statistics.median(rounds)), "rounds": [round(r) for r in rounds]}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "batched_envs.json", arguments)
    args = bench.args
    import kuberl.trainer.envs as envs_package

    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    clock = Stopwatch()
    results = {}
    for env_id in EXAMPLE_JOBS:
        fns = steppers(env_id, args.envs)
        rates = interleaved_rates(fns, args.seconds, args.repeats)
        for name in ("batched", "single_env"):
            rates[f"{name}_cpu"] = cpu_rates(fns[name], args.seconds, args.repeats)
        ref, bat = rates["reference_sync_vector_env"]["steps_per_second"], rates["batched"]["steps_per_second"]
        rates["batched_over_reference"] = round(bat / ref, 2)
        rates["worker_over_batched_raw"] = round(rates["worker_on_batched"]["steps_per_second"] / bat, 3)
        results[env_id] = rates
        print(env_id, json.dumps({k: v if not isinstance(v, dict) else v.get("steps_per_second", v.get(
            "steps_per_cpu_second")) for k, v in rates.items()}))
    bench.write({
        "machine_notes": {"processor": platform.machine(), "pinned_core": core,
                          "note": "cores shared with other work; see loadavg_1min per rate"},
        "envs": args.envs,
        "code": str(Path(envs_package.__file__).resolve().parent),  # which tree's envs ran (A/B runs)
        "wall_seconds": clock.seconds(1),
        "rates": results,
    })


if __name__ == "__main__":
    main()

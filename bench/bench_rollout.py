"""Rollout throughput: one KubeRL rollout worker vs the raw vectorized env, and k=2 vs k=1 through Ray.

    .venv/bin/python bench/bench_rollout.py [--envs 64] [--seconds 4] [--output bench/results/rollout.json]

Measures, on CartPole-v1 (env steps/s = vector steps x envs):
1. raw: gymnasium SyncVectorEnv of `--envs` CartPoles, random actions, autoreset mode SAME_STEP (as
   KubeRL's workers), in this process pinned to one core: the ceiling for one core;
2. worker, in-process: one `RolloutWorker` (plain class) with the same number of envs, same core,
   `sample_onpolicy` with a PPO policy (the example job's network) and `sample_offpolicy` with a DQN
   one (n-step transitions), weights passed as numpy arrays each call;
3. worker, Ray actor: the same worker as a Ray actor (pinned to one core), the driver publishing new
   weights with ray.put before every call (a new version each time, so each call loads them) and
   getting the batch back: what one worker delivers to the learner;
4. collection, k=1 vs k=2: KubeRL's WorkerSet with k actors (each pinned to its own core), every
   round: new weights, one sample call per worker, gather. Collection only, no learning. Done for
   `--envs` envs per worker and for the example job's own shape (8 envs x 64 steps per call).
The driver is not pinned. On this 2-core machine k=2 uses both cores for the workers; the driver and
Ray's own processes share them. The machine is shared with other jobs: the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORES = sorted(os.sched_getaffinity(0))


def pin(core: int) -> None:
    os.sched_setaffinity(0, {core})


def timed_rate(fn: Callable[[], int], seconds: float, warmup: int = 2, repeats: int = 3) -> dict[str, Any]:
    """Call fn (returns env steps done) repeatedly for `seconds`, `repeats` times; median steps/s."""
    for _ in range(warmup):
        fn()
    rates = []
    for _ in range(repeats):
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            steps += fn()
        rates.append(steps / (time.perf_counter() - t0))
    return {"steps_per_second": round(statistics.median(rates)), "runs": [round(r) for r in rates],
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def job_algorithm(name: str):
    """The example job's algorithm object: its policy config and initial weights."""
    import torch

    from kuberl.api.load import load_job_file
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.rollout import make_env
    from kuberl.trainer.spaces import space_info

    torch.set_num_threads(1)
    job = load_job_file(REPO / "examples" / f"cartpole-{name}.yaml")
    env = make_env("CartPole-v1", {})
    info = space_info(env.observation_space, env.action_space)
    env.close()
    return job, algorithm_for(job.spec, info, torch.device("cpu"), 0, job.spec.stopping.max_env_steps)


def bench_raw(n_envs: int, seconds: float, core: int) -> dict[str, Any]:
    pin(core)
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    chunk = 64

    def run() -> int:
        for _ in range(chunk):
            env.step(rng.integers(0, 2, size=n_envs))
        return chunk * n_envs

    out = timed_rate(run, seconds)
    env.close()
    return {**out, "envs": n_envs, "core": core, "actions": "uniform random (numpy rng, included)"}


def bench_worker_inprocess(n_envs: int, steps: int, seconds: float, core: int) -> dict[str, Any]:
    from kuberl.trainer.rollout import RolloutWorker

    pin(core)
    out = {}
    for name in ("ppo", "dqn"):
        job, algo = job_algorithm(name)
        worker = RolloutWorker("CartPole-v1", {}, n_envs, 0, algo.policy_config())
        weights = algo.weights()
        version = [0]
        if name == "ppo":
            def run() -> int:
                version[0] += 1
                return worker.sample_onpolicy(weights, version[0], steps, 0.99)["env_steps"]
        else:
            def run() -> int:
                version[0] += 1
                return worker.sample_offpolicy(weights, version[0], steps, 0.1, 0.99, 3)["env_steps"]
        out[name] = {**timed_rate(run, seconds), "envs": n_envs, "steps_per_call": steps, "core": core}
        worker.close()
    return out


def _start_ray(k: int) -> float:
    from kuberl.trainer.workers import start_ray

    return start_ray(None, k)


def _pin_actor(actor, core: int) -> None:
    import ray

    ray.get(actor.__ray_call__.remote(lambda self, c: os.sched_setaffinity(0, {c}), core))


def bench_actor(n_envs: int, steps: int, seconds: float, core: int) -> dict[str, Any]:
    """One rollout worker as a Ray actor; new weights each call (ray.put + load in the actor)."""
    import ray

    from kuberl.trainer.rollout import RolloutWorker

    out = {}
    for name in ("ppo", "dqn"):
        job, algo = job_algorithm(name)
        actor = ray.remote(num_cpus=1)(RolloutWorker).remote("CartPole-v1", {}, n_envs, 0, algo.policy_config())
        ray.get(actor.ping.remote())
        _pin_actor(actor, core)
        version = [0]
        put_seconds = []

        def run() -> int:
            version[0] += 1
            t = time.perf_counter()
            ref = ray.put(algo.weights())
            put_seconds.append(time.perf_counter() - t)
            if name == "ppo":
                batch = ray.get(actor.sample_onpolicy.remote(ref, version[0], steps, 0.99))
            else:
                batch = ray.get(actor.sample_offpolicy.remote(ref, version[0], steps, 0.1, 0.99, 3))
            return int(batch["env_steps"])

        out[name] = {**timed_rate(run, seconds), "envs": n_envs, "steps_per_call": steps, "core": core,
                     "weights_put_ms_median": round(statistics.median(put_seconds) * 1e3, 3)}
        ray.kill(actor)
    return out


def bench_collection(k: int, n_envs: int, steps: int, seconds: float) -> dict[str, Any]:
    """KubeRL's WorkerSet with k actors: publish weights, one sample call per worker, gather."""
    import ray

    from kuberl.trainer.workers import WorkerSet

    job, algo = job_algorithm("ppo")
    args = {"env_id": "CartPole-v1", "env_kwargs": {}, "num_envs": n_envs, "policy": algo.policy_config(),
            "max_episode_steps": None}
    workers = WorkerSet(args, k, False, 0)
    workers.reconcile(wait_for_all=60.0)
    handles = workers.ready()
    for i, h in enumerate(handles):
        _pin_actor(h.actor, CORES[i % len(CORES)])
    version = [0]

    def run() -> int:
        version[0] += 1
        ref = ray.put(algo.weights())
        batches = workers.call("sample_onpolicy", {h.index: (ref, version[0], steps, 0.99) for h in handles})
        return sum(int(b["env_steps"]) for b in batches.values())

    out = {**timed_rate(run, seconds), "workers": k, "envs_per_worker": n_envs, "steps_per_call": steps,
           "worker_cores": [CORES[i % len(CORES)] for i in range(len(handles))]}
    workers.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=64, help="steps per env per sample call")
    p.add_argument("--seconds", type=float, default=4.0, help="per measurement (x3, median)")
    p.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "rollout.json")
    args = p.parse_args()
    core = CORES[-1]
    load_before = [round(x, 2) for x in os.getloadavg()]
    t_all = time.perf_counter()
    all_cores = set(CORES)

    print("raw SyncVectorEnv ...", flush=True)
    raw = bench_raw(args.envs, args.seconds, core)
    print(f"  {raw['steps_per_second']:,} steps/s", flush=True)
    print("RolloutWorker in-process ...", flush=True)
    inproc = bench_worker_inprocess(args.envs, args.steps, args.seconds, core)
    print(f"  ppo {inproc['ppo']['steps_per_second']:,} dqn {inproc['dqn']['steps_per_second']:,} steps/s", flush=True)
    os.sched_setaffinity(0, all_cores)  # the driver is not pinned from here on

    import ray

    ray_seconds = _start_ray(2)
    print(f"ray started in {ray_seconds:.2f}s; RolloutWorker as a Ray actor ...", flush=True)
    actor = bench_actor(args.envs, args.steps, args.seconds, core)
    print(f"  ppo {actor['ppo']['steps_per_second']:,} dqn {actor['dqn']['steps_per_second']:,} steps/s", flush=True)
    collection: dict[str, Any] = {}
    for label, n_envs, steps in ((f"{args.envs}_envs_per_worker", args.envs, args.steps), ("example_job_8x64", 8, 64)):
        res = {}
        for k in (1, 2):
            print(f"collection k={k} ({label}) ...", flush=True)
            res[f"k{k}"] = bench_collection(k, n_envs, steps, args.seconds)
            print(f"  {res[f'k{k}']['steps_per_second']:,} steps/s", flush=True)
        res["k2_over_k1"] = round(res["k2"]["steps_per_second"] / res["k1"]["steps_per_second"], 2)
        collection[label] = res
    ray.shutdown()

    raw_rate = raw["steps_per_second"]
    result = {
        "benchmark": "rollout throughput, CartPole-v1",
        "machine": {"cpus": os.cpu_count(), "cores_available": CORES, "platform": platform.platform(),
                    "python": platform.python_version(), "numpy": np.__version__, "gymnasium": gym.__version__,
                    "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                    "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                    "note": "shared 2-core machine: other agents' jobs ran concurrently"},
        "ray_start_seconds": round(ray_seconds, 3),
        "raw_vector_env": raw,
        "worker_inprocess": inproc,
        "worker_ray_actor": actor,
        "collection": collection,
        "ratios": {
            "worker_inprocess_ppo_over_raw": round(inproc["ppo"]["steps_per_second"] / raw_rate, 3),
            "worker_inprocess_dqn_over_raw": round(inproc["dqn"]["steps_per_second"] / raw_rate, 3),
            "worker_actor_ppo_over_raw": round(actor["ppo"]["steps_per_second"] / raw_rate, 3),
            "worker_actor_dqn_over_raw": round(actor["dqn"]["steps_per_second"] / raw_rate, 3),
            "collection_k2_over_k1": {label: res["k2_over_k1"] for label, res in collection.items()},
        },
        "targets": {"one_worker_at_least_half_of_raw": 0.5, "k2_over_k1_at_least": 1.6},
        "wall_seconds": round(time.perf_counter() - t_all, 1),
        "argv": sys.argv[1:],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratios"], indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

"""Rollout throughput: one KubeRL rollout worker vs the raw vectorized env, and k=2 vs k=1 through Ray.

    .venv/bin/python bench/bench_rollout.py [--envs 64] [--seconds 4] [--output bench/results/rollout.json]

Measures, on CartPole-v1 (env steps/s = vector steps x envs):
1. raw: gymnasium SyncVectorEnv of `--envs` CartPoles, random actions, autoreset mode SAME_STEP (as
   KubeRL's workers), in this process pinned to one core: the ceiling for one core;
2. worker, in-process: one `RolloutWorker` (plain class) with the same number of envs, same core,
   `sample_onpolicy` with a PPO policy (the example job's network) and `sample_offpolicy` with a DQN
   one (n-step transitions), weights passed as numpy arrays each call;
1b. numpy-batched CartPole with `--big-envs` envs (1,024), same core: raw SyncVectorEnv, raw
   KubeRL batched CartPole (envs/batched.py, what a worker steps), raw gymnasium CartPoleVectorEnv
   (vector_entry_point), and a RolloutWorker (PPO, 16 steps per call) on the batched env
   (steps 2-4 step KubeRL's batched CartPole, step 1 SyncVectorEnv);
3. worker, Ray actor: the same worker as a Ray actor (pinned to one core), the driver publishing new
   weights with ray.put before every call (a new version each time, so each call loads them) and
   getting the batch back: what one worker delivers to the learner;
4. collection, k=1 vs k=2: KubeRL's WorkerSet with k actors (not pinned: on this shared machine
   pinning only kept them from escaping other jobs), every round: new weights, one sample call per
   worker, gather. Collection only, no learning. Done for `--envs` envs per worker and for the
   example job's own shape (8 envs x 64 steps per call);
5. machine ceiling: the raw vector env in one process on one core vs in two processes on two cores
   at once (no Ray, no learner): the most any k=2 could get from this machine.
The driver is not pinned after step 2. On this 2-core machine k=2 uses both cores for the workers;
the driver and Ray's own processes share them. The machine is shared with other jobs: the load
average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# One BLAS/OpenMP thread, as Ray gives a num_cpus=1 actor (OMP_NUM_THREADS=1): a pinned process whose
# OpenBLAS spawns a second thread on the same core spins against itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gymnasium as gym
import numpy as np
from common import EXAMPLES, RESULTS, Bench, Stopwatch, interleaved_rates

CORES = sorted(os.sched_getaffinity(0))


def job_algorithm(name: str):
    """The example job's algorithm object: its policy config and initial weights."""
    import torch
    from kuberl.api.load import load_job_file
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.rollout import make_env
    from kuberl.trainer.spaces import space_info

    torch.set_num_threads(1)
    job = load_job_file(EXAMPLES / f"cartpole-{name}.yaml")
    env = make_env("CartPole-v1", {})
    info = space_info(env.observation_space, env.action_space)
    env.close()
    return job, algorithm_for(job.spec, info, torch.device("cpu"), 0, job.spec.stopping.max_env_steps)


def raw_stepper(n_envs: int) -> Callable[[], int]:
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    chunk = 64

    def run() -> int:
        for _ in range(chunk):
            env.step(rng.integers(0, 2, size=n_envs))
        return chunk * n_envs

    return run


def raw_batched_stepper(n_envs: int, gymnasium_vector: bool = False) -> Callable[[], int]:
    """KubeRL's numpy-batched CartPole (what a rollout worker steps), or gymnasium's own
    CartPoleVectorEnv (`make_vec(..., vectorization_mode="vector_entry_point")`), random actions."""
    from kuberl.trainer.envs.batched import CartPoleBatch

    env = gym.make_vec("CartPole-v1", n_envs, vectorization_mode="vector_entry_point") if gymnasium_vector \
        else CartPoleBatch(n_envs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    chunk = 64

    def run() -> int:
        for _ in range(chunk):
            env.step(rng.integers(0, 2, size=n_envs))
        return chunk * n_envs

    return run


def worker_stepper(name: str, n_envs: int, steps: int) -> Callable[[], int]:
    """A plain RolloutWorker in this process; new weights (version) every call, as in training."""
    from kuberl.trainer.rollout import RolloutWorker

    _job, algo = job_algorithm(name)
    worker = RolloutWorker("CartPole-v1", {}, n_envs, 0, algo.policy_config())
    version = [0]

    def run() -> int:
        version[0] += 1
        weights = algo.weights()
        if name == "ppo":
            return worker.sample_onpolicy(weights, version[0], steps, 0.99)["env_steps"]
        return worker.sample_offpolicy(weights, version[0], steps, 0.1, 0.99, 3)["env_steps"]

    return run


def _raw_in_process(core: int, n_envs: int, seconds: float, queue) -> None:
    os.sched_setaffinity(0, {core})
    run = raw_stepper(n_envs)
    for _ in range(2):
        run()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += run()
    queue.put(steps / (time.perf_counter() - t0))


def machine_ceiling(n_envs: int, seconds: float, repeats: int) -> dict[str, Any]:
    """The raw vector env in one process on one core, then in two processes on two cores at once.
    No Ray, no learner: the best k=2 could do on this machine."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    one: list[float] = []
    two: list[float] = []
    for _ in range(repeats):
        for cores, out in (([CORES[-1]], one), (CORES[:2], two)):
            queue = ctx.Queue()
            procs = [ctx.Process(target=_raw_in_process, args=(c, n_envs, seconds, queue)) for c in cores]
            for proc in procs:
                proc.start()
            rates = [queue.get() for _ in procs]
            for proc in procs:
                proc.join()
            out.append(sum(rates))
    return {"one_process_steps_per_second": round(statistics.median(one)),
            "two_processes_steps_per_second": round(statistics.median(two)),
            "two_over_one": round(statistics.median(two) / statistics.median(one), 2),
            "rounds_one": [round(x) for x in one], "rounds_two": [round(x) for x in two]}


def _pin_actor(actor, core: int) -> None:
    import ray

    ray.get(actor.__ray_call__.remote(lambda self, c: os.sched_setaffinity(0, {c}), core))


def actor_stepper(name: str, n_envs: int, steps: int, core: int | None) -> Callable[[], int]:
    """One RolloutWorker as a Ray actor; every call: ray.put of new weights, sample, ray.get the batch."""
    import ray
    from kuberl.trainer.rollout import RolloutWorker

    _job, algo = job_algorithm(name)
    actor = ray.remote(num_cpus=1)(RolloutWorker).remote("CartPole-v1", {}, n_envs, 0, algo.policy_config())
    ray.get(actor.ping.remote())
    if core is not None:
        _pin_actor(actor, core)
    version = [0]

    def run() -> int:
        version[0] += 1
        ref = ray.put(algo.weights())
        if name == "ppo":
            batch = ray.get(actor.sample_onpolicy.remote(ref, version[0], steps, 0.99))
        else:
            batch = ray.get(actor.sample_offpolicy.remote(ref, version[0], steps, 0.1, 0.99, 3))
        return int(batch["env_steps"])

    return run


def collection_stepper(k: int, n_envs: int, steps: int) -> Callable[[], int]:
    """KubeRL's WorkerSet with k actors, as the learner loop drives it minus the learning: publish new
    weights, one sample call per worker, gather the batches."""
    import ray
    from kuberl.trainer.workers import WorkerSet

    _job, algo = job_algorithm("ppo")
    args = {"env_id": "CartPole-v1", "env_kwargs": {}, "num_envs": n_envs, "policy": algo.policy_config(),
            "max_episode_steps": None}
    workers = WorkerSet(args, k, False, 0)
    workers.reconcile(wait_for_all=60.0)
    handles = workers.ready()
    if len(handles) != k:
        raise RuntimeError(f"only {len(handles)} of {k} rollout workers started")
    version = [0]

    def run() -> int:
        version[0] += 1
        ref = ray.put(algo.weights())
        batches = workers.call("sample_onpolicy", {h.index: (ref, version[0], steps, 0.99) for h in handles})
        return sum(int(b["env_steps"]) for b in batches.values())

    return run


def ratios(single: dict, batched: dict, big: int, actor: dict, collection: dict, ceiling: dict | None) -> dict:
    """Each figure against what it is compared with: the raw env on the same core, k=1, one process."""
    raw_rate = single["raw_vector_env"]["steps_per_second"]

    def rate(table: dict, name: str) -> int:
        return table[name]["steps_per_second"]

    return {
        "worker_inprocess_ppo_over_raw": round(rate(single, "worker_inprocess_ppo") / raw_rate, 3),
        "worker_inprocess_dqn_over_raw": round(rate(single, "worker_inprocess_dqn") / raw_rate, 3),
        "worker_actor_ppo_over_raw": round(rate(actor, "worker_actor_ppo") / raw_rate, 3),
        "worker_actor_dqn_over_raw": round(rate(actor, "worker_actor_dqn") / raw_rate, 3),
        "collection_k2_over_k1": {label: res["k2_over_k1"] for label, res in collection.items()},
        "machine_two_processes_over_one": ceiling["two_over_one"] if ceiling else None,
        f"batched_{big}_worker_ppo_over_raw_kuberl_batched": round(
            rate(batched, "worker_inprocess_ppo") / rate(batched, "raw_kuberl_batched"), 3),
        f"batched_{big}_worker_ppo_over_raw_gymnasium_vector": round(
            rate(batched, "worker_inprocess_ppo") / rate(batched, "raw_gymnasium_vector_entry_point"), 3),
    }


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=64, help="steps per env per sample call")
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement turn")
    p.add_argument("--repeats", type=int, default=3, help="rounds of turns (median)")
    p.add_argument("--big-envs", type=int, default=1024, help="envs per worker for the batched-env comparison")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "rollout.json", arguments)
    args = bench.args
    core = CORES[-1]
    clock = Stopwatch()
    n, steps, sec, rep = args.envs, args.steps, args.seconds, args.repeats

    print(f"1-2. raw SyncVectorEnv vs RolloutWorker in-process, {n} envs, pinned to core {core} ...", flush=True)
    os.sched_setaffinity(0, {core})
    single = interleaved_rates({"raw_vector_env": raw_stepper(n), "worker_inprocess_ppo": worker_stepper("ppo", n, steps),
                                "worker_inprocess_dqn": worker_stepper("dqn", n, steps)}, sec, rep)
    for name, r in single.items():
        print(f"   {name:24s} {r['steps_per_second']:>9,} steps/s  {r['rounds']}", flush=True)
    big = args.big_envs
    print(f"1b. numpy-batched CartPole, {big} envs: raw (KubeRL's, gymnasium's) vs RolloutWorker, core {core} ...",
          flush=True)
    batched = interleaved_rates({"raw_sync_vector_env": raw_stepper(big),
                                 "raw_kuberl_batched": raw_batched_stepper(big),
                                 "raw_gymnasium_vector_entry_point": raw_batched_stepper(big, gymnasium_vector=True),
                                 "worker_inprocess_ppo": worker_stepper("ppo", big, 16)}, sec, rep)
    for name, r in batched.items():
        print(f"   {name:32s} {r['steps_per_second']:>11,} steps/s  {r['rounds']}", flush=True)
    os.sched_setaffinity(0, set(CORES))  # from here on the driver is not pinned

    ceiling = None
    if len(CORES) >= 2:
        print("5. machine ceiling: the raw vector env in 1 process vs 2 processes on 2 cores ...", flush=True)
        ceiling = machine_ceiling(n, sec, rep)
        print(f"   1 process {ceiling['one_process_steps_per_second']:,}, 2 processes "
              f"{ceiling['two_processes_steps_per_second']:,} steps/s: {ceiling['two_over_one']}x", flush=True)

    import ray
    from kuberl.trainer.workers import start_ray

    # 3 rollout slots: the k=1 and k=2 worker sets of step 4 live side by side (measured in turns;
    # an idle actor costs no CPU), and Ray must be able to place all three actors.
    ray_seconds = start_ray(None, 3)
    print(f"ray started in {ray_seconds:.2f}s", flush=True)
    print(f"3. RolloutWorker as a Ray actor pinned to core {core}, weights via ray.put every call ...", flush=True)
    actor = interleaved_rates({"worker_actor_ppo": actor_stepper("ppo", n, steps, core),
                               "worker_actor_dqn": actor_stepper("dqn", n, steps, core)}, sec, rep)
    for name, r in actor.items():
        print(f"   {name:24s} {r['steps_per_second']:>9,} steps/s  {r['rounds']}", flush=True)

    collection: dict[str, Any] = {}
    for label, n_envs, n_steps in ((f"{n}_envs_x_{steps}_steps", n, steps), ("example_job_8_envs_x_64_steps", 8, 64)):
        print(f"4. collection through Ray, k=1 vs k=2 ({label}; actors not pinned) ...", flush=True)
        res = interleaved_rates({"k1": collection_stepper(1, n_envs, n_steps),
                                 "k2": collection_stepper(2, n_envs, n_steps)}, sec, rep)
        res["k2_over_k1"] = round(res["k2"]["steps_per_second"] / res["k1"]["steps_per_second"], 2)
        for name in ("k1", "k2"):
            print(f"   {name:24s} {res[name]['steps_per_second']:>9,} steps/s  {res[name]['rounds']}", flush=True)
        collection[label] = res
    ray.shutdown()

    result = {
        "machine_notes": {"cores_available": CORES, "numpy": np.__version__, "gymnasium": gym.__version__,
                          "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                          "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                          "note": "shared 2-core machine: other agents' jobs ran concurrently"},
        "config": {"envs": n, "steps_per_call": steps, "seconds_per_turn": sec, "rounds": rep, "pinned_core": core},
        "ray_start_seconds": round(ray_seconds, 3),
        "single_core": single,
        "single_core_batched": {"envs": big, **batched},
        "worker_ray_actor": actor,
        "collection": collection,
        "machine_ceiling_two_processes": ceiling,
        "ratios": ratios(single, batched, big, actor, collection, ceiling),
        "targets": {"one_worker_at_least_half_of_raw": 0.5, "k2_over_k1_at_least": 1.6},
        "wall_seconds": clock.seconds(1),
    }
    bench.write(result)
    print(json.dumps(result["ratios"], indent=1))


if __name__ == "__main__":
    main()

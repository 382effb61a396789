"""Data-parallel learners (`spec.learner.replicas`): learner throughput at N = 1 and 2, the learner alone.

No rollout workers and no environment steps: synthetic batches shaped as the workers send them go
straight to the learner (`algo.learn` at N = 1, `ddp.LearnerGroup.learn` at N = 2, on the embedded Ray,
rank 1 a Ray actor on a learner slot, gloo on the CPU), so the learner is the limit. The network is
large for the observation (CartPole's spaces, two hidden layers of `--hidden` units) so that forward
and backward passes dominate, not Python.

- DQN: each iteration 2 workers send 64 transitions each; trainFrequency 4 gives 32 updates of
  batchSize 256 per learner. Learner samples/s = updates/s x 256 x N (the effective batch is N x 256).
- PPO: each iteration one batch of 128 x 16 samples, 4 epochs x 4 minibatches of 512: the same 16
  updates at every N, each rank evaluating its share of each minibatch. Samples/s = 2048 x 4 / s.

Threads: N = 1 runs twice, with one torch thread and with every core (`--threads`, default all); at
N = 2 each learner gets cores / 2. On this machine (2 cores, shared with other work) the two learners
have one core each. Each configuration runs `--repeats` times, the configurations in turn.

    .venv/bin/python bench/bench_ddp.py               # writes bench/results/ddp_learners.json
    .venv/bin/python bench/bench_ddp.py --only 1 --output /tmp/n1.json   # N = 1 alone (e.g. another tree)
    .venv/bin/python bench/bench_ddp.py --targets     # the examples with 2 learners: results/ddp_targets.json

`--targets` trains, with `learner.replicas: 2` through `train()` on the embedded Ray: CartPole PPO (the
example, target 195 over 100 episodes, 150k steps at most, 2 rollout workers) and the autoscaling BDQ
example as it is (its own budget: 60k steps or 600 s), whose target is to beat the searched threshold
autoscaler in its evaluation.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from common import EXAMPLES, RESULTS, Bench


def _job(name: str, replicas: int, hidden: int) -> Any:
    from kuberl.api.job import RLTrainingJob

    algo = ({"name": "DQN", "dqn": {"batchSize": 256, "learningStarts": 0, "trainFrequency": 4, "bufferSize": 50_000,
                                    "network": {"hiddenSizes": [hidden, hidden]}}}
            if name == "DQN" else
            {"name": "PPO", "ppo": {"epochs": 4, "minibatches": 4, "rolloutSteps": 128,
                                    "network": {"hiddenSizes": [hidden, hidden]}}})
    spec = {"algorithm": algo, "environment": {"id": "CartPole-v1"}, "stopping": {"maxEnvSteps": 10_000_000}}
    if replicas > 1:  # N = 1 leaves the field out: the same job runs on a tree from before it existed
        spec["learner"] = {"replicas": replicas}
    return RLTrainingJob.model_validate({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
                                         "metadata": {"name": "bench-ddp"}, "spec": spec})


def _batches(name: str, rng) -> list[dict[str, Any]]:
    import numpy as np

    if name == "DQN":
        return [{"obs": rng.standard_normal((64, 4)).astype(np.float32),
                 "next_obs": rng.standard_normal((64, 4)).astype(np.float32),
                 "actions": rng.integers(0, 2, 64), "rewards": np.ones(64, np.float32),
                 "dones": np.zeros(64, np.float32), "discounts": np.full(64, 0.99, np.float32),
                 "env_steps": 64, "worker_index": w} for w in range(2)]
    T, E = 128, 16
    return [{"obs": rng.standard_normal((T, E, 4)).astype(np.float32), "actions": rng.integers(0, 2, (T, E)),
             "logprobs": np.full((T, E), -0.69, np.float32), "rewards": np.ones((T, E), np.float32),
             "values": np.zeros((T, E), np.float32), "dones": np.zeros((T, E), np.float32),
             "last_values": np.zeros(E, np.float32), "env_steps": T * E, "worker_index": 0}]


def measure(name: str, replicas: int, hidden: int, threads: int, seconds: float) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import ray
    import torch
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.spaces import space_info
    from kuberl.trainer.workers import start_ray

    torch.set_num_threads(threads)
    job = _job(name, replicas, hidden)
    env = gym.make("CartPole-v1")
    algo = algorithm_for(job.spec, space_info(env.observation_space, env.action_space), torch.device("cpu"), 0,
                         10_000_000)
    learner: Any = algo
    group = None
    if replicas > 1:
        from kuberl.trainer.ddp import LearnerGroup

        start_ray(None, 1, replicas - 1)
        group = learner = LearnerGroup.start(job.spec, algo, False, threads)
    rng = np.random.default_rng(0)
    batches = _batches(name, rng)
    steps = 0
    for _ in range(2):  # warm-up: replay past one batch, first kernels
        steps += sum(b["env_steps"] for b in batches)
        learner.learn(batches, steps)
    updates, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += sum(b["env_steps"] for b in batches)
        updates += learner.learn(batches, steps).gradient_updates
    elapsed = time.perf_counter() - t0
    per_update = 256 * replicas if name == "DQN" else 512
    if group is not None:
        group.shutdown()
        ray.shutdown()
    return {"algorithm": name, "learners": replicas, "threads_per_learner": threads, "seconds": round(elapsed, 1),
            "gradient_updates": updates, "updates_per_second": round(updates / elapsed, 1),
            "samples_per_update": per_update, "learner_samples_per_second": round(updates * per_update / elapsed)}


def targets(bench: Bench) -> None:
    import json
    import tempfile

    import yaml
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    out: dict[str, Any] = {}
    ppo = yaml.safe_load((EXAMPLES / "cartpole-ppo.yaml").read_text())
    ppo["spec"]["stopping"] = {"targetReturn": 195, "returnWindow": 100, "maxEnvSteps": 150_000}
    ppo["spec"]["evaluation"] = {"episodes": 20}
    bdq = yaml.safe_load((EXAMPLES / "autoscaling-bdq.yaml").read_text())
    bdq["spec"]["algorithm"]["bdq"].pop("preference", None)  # the preference head runs with one learner
    for name, job in (("cartpole_ppo", ppo), ("autoscaling_bdq", bdq)):
        job["spec"]["learner"] = {"replicas": 2}
        t0 = time.perf_counter()
        r = train(parse_job(job), TrainOptions(run_dir=tempfile.mkdtemp(), workers=2, metrics_port=0, progress=False))
        ev = r.evaluation
        out[name] = {"learners": 2, "reason": r.reason, "env_steps": r.counters.env_steps,
                     "gradient_updates": r.counters.gradient_updates, "seconds": round(time.perf_counter() - t0, 1),
                     "mean_training_return": round(r.mean_return, 1) if r.mean_return is not None else None,
                     **{f"evaluation_{k}": round(v["mean_return"], 1) for k, v in ev.items() if "mean_return" in v}}
        print(name, json.dumps(out[name]), flush=True)
    bench.write(out)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores for all learners together")
    parser.add_argument("--repeats", type=int, default=2, help="each configuration's runs (the best is kept)")
    parser.add_argument("--only", type=int, choices=[1, 2], default=None)
    parser.add_argument("--targets", action="store_true", help="the examples' targets with 2 learners instead")


def main() -> None:
    bench = Bench(__doc__, None, arguments, output_help="the result file (default: bench/results/ddp_learners.json; "
                                                         "with --targets, bench/results/ddp_targets.json)")
    args = bench.args
    if bench.output is None:
        bench.output = RESULTS / ("ddp_targets.json" if args.targets else "ddp_learners.json")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.targets:
        targets(bench)
        return
    configs = [(1, 1), (1, args.threads), (2, max(1, args.threads // 2))]
    if args.only:
        configs = [c for c in configs if c[0] == args.only]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for name in ("DQN", "PPO"):
            for n, threads in dict.fromkeys(configs):
                row = measure(name, n, args.hidden, threads, args.seconds)
                print(row, flush=True)
                runs.setdefault((name, n, threads), []).append(row)
    rows = [max(rs, key=lambda r: r["updates_per_second"]) | {"updates_per_second_runs": [r["updates_per_second"]
                                                                                          for r in rs]}
            for rs in runs.values()]
    speedup = {}
    for name in ("DQN", "PPO"):
        best_one = max((r for r in rows if r["algorithm"] == name and r["learners"] == 1),
                       key=lambda r: r["updates_per_second"], default=None)
        two = next((r for r in rows if r["algorithm"] == name and r["learners"] == 2), None)
        if best_one and two:
            speedup[name] = {
                "against_n1_threads": best_one["threads_per_learner"],
                "updates_per_second": round(two["updates_per_second"] / best_one["updates_per_second"], 2),
                "learner_samples_per_second": round(two["learner_samples_per_second"]
                                                    / best_one["learner_samples_per_second"], 2)}
    result = {"network": f"MLP 4 -> {args.hidden} -> {args.hidden} -> heads (CartPole spaces), float32, CPU",
              "gpu": "none lent to this task: the GPU learner, NCCL and the on-device replay were not measured",
              "rows": rows, "speedup_2_over_best_1": speedup}
    bench.write(result)
    print(result["speedup_2_over_best_1"])


if __name__ == "__main__":
    main()

"""Rank processes for tests/integration/test_ddp.py: torch.multiprocessing spawns these (they import by module name)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from kuberl.api.job import RLTrainingJob
from kuberl.trainer import ddp
from kuberl.trainer.algorithms import algorithm_for
from kuberl.trainer.spaces import space_info

ENVS = {"PPO": "CartPole-v1", "DQN": "CartPole-v1", "BDQ": "kuberl/Autoscaling-v0"}
HYPERPARAMETERS: dict[str, dict[str, Any]] = {
    "PPO": {"epochs": 2, "minibatches": 4, "targetKl": 10.0, "entropyCoef": 0.01},
    "DQN": {"targetUpdate": "hard", "targetUpdateInterval": 2},
    "BDQ": {"targetUpdate": "polyak"},
}
UPDATES = 6  # DQN and BDQ: gradient updates; PPO: learn() calls (epochs x minibatches updates each)
HALF = 32  # transitions per learner per DQN/BDQ update (one learner alone gets 2 x HALF)


def build(name: str):
    key = {"PPO": "ppo", "DQN": "dqn", "BDQ": "bdq"}[name]
    job = RLTrainingJob.model_validate({
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"},
        "spec": {"algorithm": {"name": name, key: HYPERPARAMETERS[name]}, "environment": {"id": ENVS[name]},
                 "learner": {"replicas": 2}, "stopping": {"maxEnvSteps": 10_000}}})
    if "/" in ENVS[name]:
        import kuberl.trainer.envs  # noqa: F401  (registers kuberl/ ids)
    env = gym.make(ENVS[name])
    info = space_info(env.observation_space, env.action_space)
    env.close()
    return algorithm_for(job.spec, info, torch.device("cpu"), 0, 10_000)


def ppo_batches(info) -> list[list[dict[str, np.ndarray]]]:
    """UPDATES iterations of one on-policy batch each: [T=16, N=4] (64 samples, minibatches of 16)."""
    rng = np.random.default_rng(1)
    T, N = 16, 4
    out = []
    for _ in range(UPDATES):
        out.append([{"obs": rng.standard_normal((T, N, info.obs_dim)).astype(np.float32),
                     "actions": rng.integers(0, 2, (T, N)), "logprobs": np.full((T, N), -0.69, np.float32),
                     "rewards": rng.standard_normal((T, N)).astype(np.float32),
                     "values": rng.standard_normal((T, N)).astype(np.float32),
                     "dones": (rng.random((T, N)) < 0.05).astype(np.float32),
                     "last_values": np.zeros(N, np.float32)}])
    return out


def replay_batches(algo, rows: int) -> list[dict[str, torch.Tensor]]:
    """UPDATES sampled-replay batches of `rows` transitions, as `ReplayBuffer.sample` returns them."""
    g = torch.Generator().manual_seed(2)
    obs_dim = algo.info.obs_dim
    branches = getattr(algo, "branches", None)
    out = []
    for _ in range(UPDATES):
        if branches is None:
            actions = torch.randint(0, algo.info.action_dims[0], (rows,), generator=g)
        else:
            actions = torch.stack([torch.randint(0, n, (rows,), generator=g) for n in branches], dim=1)
        batch = {"obs": torch.randn(rows, obs_dim, generator=g), "next_obs": torch.randn(rows, obs_dim, generator=g),
                 "actions": actions, "rewards": torch.randn(rows, generator=g),
                 "dones": (torch.rand(rows, generator=g) < 0.1).float(), "discounts": torch.full((rows,), 0.99)}
        out.append(batch)
    return out


def update_on(algo, batch: dict[str, torch.Tensor]) -> float:
    """One DQN/BDQ gradient update on `batch`: the update's replay sample is this batch, whatever its size."""
    algo.buffer.sample = lambda batch_size, generator: batch
    try:
        return algo.update()
    finally:
        del algo.buffer.sample  # the buffer's own sample again


def train(algo, rank: int, world: int, share: slice | None = None) -> dict[str, torch.Tensor]:
    """UPDATES steps on this rank's share; returns the online network's parameters."""
    if algo.on_policy:
        for batches in ppo_batches(algo.info):
            algo.learn(batches, 1_000)
        net = algo.net
    else:
        for batch in replay_batches(algo, world * HALF):
            part = share if share is not None else slice(rank * HALF, (rank + 1) * HALF)
            update_on(algo, {k: v[part] for k, v in batch.items()})
        net = algo.q
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def run_rank(rank: int, world: int, port: int, names: list[str], results) -> None:
    """Joins a `world`-rank gloo group and trains each algorithm in `names` in turn on this rank's share."""
    torch.set_num_threads(1)
    store = torch.distributed.TCPStore("127.0.0.1", port, world, rank == 0, timeout=ddp.TIMEOUT)
    for name in names:
        algo = build(name)
        group_store = torch.distributed.PrefixStore(name, store)  # a fresh group: its own keys
        ddp.join(algo, rank, ddp.Rendezvous("127.0.0.1", port, world, "gloo"), store=group_store)
        try:
            # numpy, not tensors: a tensor crosses a queue by a file descriptor that dies with this process
            results.put((name, rank, {k: v.numpy() for k, v in train(algo, rank, world).items()}))
        finally:
            ddp.leave(algo)

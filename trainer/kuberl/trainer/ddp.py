"""Data-parallel learners (`spec.learner.replicas: N`): N learners hold identical models, each trains on
its own shard of every batch, and their gradients are averaged every update with torch.distributed
(gloo on CPU, NCCL on GPU).

Rank 0 is the learner that owns the loop (`run.train`): the rollout workers, checkpoints, metrics rows,
Prometheus metrics and the job's status. Ranks 1..N-1 are `LearnerRank` Ray actors, each on a learner
slot (`kuberl.api.learner_slots`). Each iteration `LearnerGroup.learn` hands every rank its share and all
ranks learn at once:

- on-policy (PPO): every rank gets the iteration's batches and the same minibatch permutation, and
  evaluates every `world`-th sample of each minibatch (advantages normalised with the whole
  minibatch's statistics), so N learners take the same step as one learner on the whole minibatch;
- off-policy (DQN, BDQ): each batch goes to the rank whose replay has been given the fewest env steps
  (`LearnerGroup.shard`), into that rank's own replay on its own device; rank 0 decides the number of
  updates for all, and each update every rank samples `batchSize` from its replay: the effective batch
  is N x batchSize.

Gradients are averaged by one bucketed all-reduce after each backward pass (`ProcessGroupCollectives`),
the arithmetic DistributedDataParallel does, without DDP's module wrapper: DQN calls its online network
three ways per update (targets under no_grad, the Q values taken, the workers' weights) and PPO calls
`ActorCritic.evaluate`, not `forward`, so a wrapper would split each algorithm's code in two.

The rendezvous is a TCPStore that rank 0 opens on a port the OS picks, on its node's address (127.0.0.1
locally); gloo's pair connections use the node's address too. On a cluster those ports are as exposed as
Ray's own: the job's NetworkPolicies admit only the job's own pods.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from kuberl.api.learner_slots import learner_slots
from kuberl.trainer.algorithms import Algorithm, LearnStats, algorithm_for
from kuberl.trainer.threads import container_cpus

log = logging.getLogger(__name__)

#: How long a collective (or the rendezvous) waits for a peer: a rank that died fails the others in
#: about this long at worst (gloo usually sees the closed connection at once).
TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("KUBERL_DDP_TIMEOUT_SECONDS", "120")))
#: How long rank 0 waits for the other learners to start (on a cluster: their pods scheduled, images pulled).
START_TIMEOUT = float(os.environ.get("KUBERL_DDP_START_TIMEOUT_SECONDS", "600"))


class ProcessGroupCollectives:
    """What an algorithm needs from its peers (`algorithms.base.Collectives`), on the default process group."""

    def __init__(self, world: int, device: torch.device):
        self.world, self.device = world, device

    def average_gradients(self, params: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one bucket: one all-reduce per update
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def mean(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world


@dataclass(frozen=True)
class Rendezvous:
    address: str
    port: int
    world: int
    backend: str


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join(algo: Algorithm, rank: int, rendezvous: Rendezvous, store: Any = None) -> None:
    """This process joins the learners' process group as `rank`; `algo` averages its gradients across it."""
    import torch.distributed as dist

    if store is None:
        store = dist.TCPStore(rendezvous.address, rendezvous.port, rendezvous.world, False, timeout=TIMEOUT)
    dist.init_process_group(rendezvous.backend, store=store, rank=rank, world_size=rendezvous.world, timeout=TIMEOUT)
    algo.rank, algo.world = rank, rendezvous.world
    algo.collectives = ProcessGroupCollectives(rendezvous.world, algo.device)


def leave(algo: Algorithm) -> None:
    import torch.distributed as dist

    algo.rank, algo.world, algo.collectives = 0, 1, None
    if dist.is_initialized():
        dist.destroy_process_group()


def own_replay_seed(algo: Algorithm, seed: int) -> None:
    """Off-policy: each rank samples its own replay with a generator of its own (rank 0's is the checkpoint's)."""
    if not algo.on_policy and algo.rank > 0:
        algo.generator.manual_seed(seed + 7919 * algo.rank + algo.gradient_updates)


def rank_device(device: str, rank: int) -> torch.device:
    """Rank `rank`'s device: GPU rank % count where one node has several (a learner pod has its own)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.device_count() > 1:
        return torch.device("cuda", rank % torch.cuda.device_count())
    return dev


class LearnerRank:
    """Rank r >= 1: a copy of rank 0's algorithm that learns its share of each iteration."""

    def __init__(self, spec: Any, info: Any, rank: int, device: str, threads: int | None):
        # Ray starts a CPU-less actor with OMP_NUM_THREADS=1; rank 0 computes with its container's CPUs
        # unless spec.learner.threads says otherwise, and so does this rank (its own pod's, on a cluster).
        torch.set_num_threads(threads or container_cpus())
        self.seed = spec.seed
        self.algo = algorithm_for(spec, info, rank_device(device, rank), spec.seed, spec.stopping.max_env_steps)
        self.rank = rank

    def join(self, rendezvous: Rendezvous, state: dict[str, Any]) -> int:
        """Joins the group and takes rank 0's state (its checkpoint's, on a resume); returns the rank."""
        join(self.algo, self.rank, rendezvous)
        self.algo.load_state_dict(state)
        own_replay_seed(self.algo, self.seed)
        return self.rank

    def learn(self, batches: list[dict[str, Any]], env_steps: int) -> LearnStats:
        return self.algo.learn(batches, env_steps)

    def store(self, batches: list[dict[str, Any]]) -> int:
        """Off-policy: its shard into its replay; returns its replay's size."""
        self.algo.store(batches)
        return self.algo.buffer.size

    def apply_updates(self, updates: int) -> list[float]:
        return self.algo.apply_updates(updates)

    def leave(self) -> None:
        leave(self.algo)


class LearnerGroup:
    """Rank 0's handle on the N learners: `learn` has `Algorithm.learn`'s signature and runs every rank."""

    def __init__(self, algo: Algorithm, actors: list[Any]):
        self.algo, self.actors = algo, actors
        self.world = len(actors) + 1
        self.received = [0] * self.world  # env steps each rank's replay has been given (off-policy)

    def shard(self, batches: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Off-policy: each batch to the rank whose replay has been given the fewest env steps, the lowest
        rank on a tie. Every rank's replay fills at the pace of all the workers together, whichever of
        them deliver: rank 0 sets the updates by the smallest replay, so a replay fed by one slow or
        not yet started worker would hold every rank's updates back."""
        shards: list[list[dict[str, Any]]] = [[] for _ in range(self.world)]
        for b in batches:
            rank = self.received.index(min(self.received))
            shards[rank].append(b)
            self.received[rank] += int(b["env_steps"])
        return shards

    @classmethod
    def start(cls, spec: Any, algo: Algorithm, cluster: bool, threads: int | None) -> LearnerGroup:
        """Starts ranks 1..N-1 on learner slots, opens the rendezvous, and has every rank join with rank
        0's state (so a restart of any learner resumes all of them from rank 0's checkpoint)."""
        import torch.distributed as dist

        world = spec.learner.replicas
        address = ray.util.get_node_ip_address() if cluster else "127.0.0.1"
        store = dist.TCPStore(address, 0, world, True, timeout=TIMEOUT, wait_for_workers=False)
        rendezvous = Rendezvous(address, store.port, world, backend_for(algo.device))
        remote = ray.remote(num_cpus=0, resources=learner_slots(1), max_restarts=0)(LearnerRank)
        actors = [remote.remote(spec, algo.info, rank, str(algo.device), threads) for rank in range(1, world)]
        try:
            ray.get([a.__ray_ready__.remote() for a in actors], timeout=START_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"spec.learner.replicas is {world}, but {world - 1} learner slot(s) did not come up "
                               f"within {START_TIMEOUT:.0f} s (on a cluster: the learner pods)") from None
        state = ray.put(algo.state_dict())
        joined = [a.join.remote(rendezvous, state) for a in actors]
        join(algo, 0, rendezvous, store)
        ray.get(joined, timeout=TIMEOUT.total_seconds())
        log.info("%d data-parallel learners joined (%s at %s:%d)", world, rendezvous.backend, address, store.port)
        return cls(algo, actors)

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        if self.algo.on_policy:
            if max_updates is not None:
                return self.algo.learn(batches, env_steps, max_updates)  # refuses it, as one learner does
            shared = ray.put(batches)
            refs = [a.learn.remote(shared, env_steps) for a in self.actors]
            stats = self.algo.learn(batches, env_steps)
            others = ray.get(refs)
            stats.loss = float(np.mean([stats.loss, *(s.loss for s in others)]))
            return stats
        shards = self.shard(batches)
        sizes = [a.store.remote(shard) for a, shard in zip(self.actors, shards[1:], strict=False)]
        new_steps = self.algo.store(shards[0]) + sum(int(b["env_steps"]) for shard in shards[1:] for b in shard)
        smallest = min([self.algo.buffer.size, *ray.get(sizes)])
        updates = self.algo.updates_owed(new_steps, env_steps, max_updates, buffer_size=smallest)
        refs = [a.apply_updates.remote(updates) for a in self.actors]
        losses = self.algo.apply_updates(updates)
        per_rank = [losses, *ray.get(refs)]
        return self.algo.stats([float(np.mean(x)) for x in zip(*per_rank, strict=False)], updates, env_steps)

    def shutdown(self, stop_actors: bool = True) -> None:
        """Rank 0 leaves the group; the other ranks are stopped unless the cluster is going away anyway."""
        leave(self.algo)
        for actor in self.actors if stop_actors else ():
            ray.kill(actor)

"""Data-parallel learners (`kuberl.trainer.ddp`): two real gloo processes, each on its half of every
batch, end with the parameters one learner reaches on the whole batch (PPO, DQN, BDQ); the job model's
rules for `learner.replicas`."""

from __future__ import annotations

import socket

import ddp_ranks
import pytest
import torch
import torch.multiprocessing as mp
from kuberl.api.job import RLTrainingJob
from kuberl.api.learner_slots import extra_learners, learner_slots


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NAMES = ["PPO", "DQN", "BDQ"]


@pytest.fixture(scope="module")
def two_ranks() -> dict[tuple[str, int], dict[str, torch.Tensor]]:
    """Two spawned processes in one gloo group train PPO, DQN and BDQ in turn, each on its half."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=ddp_ranks.run_rank, args=(rank, 2, port, NAMES, results)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        got = {(name, rank): params for name, rank, params in (results.get(timeout=300) for _ in range(2 * len(NAMES)))}
    finally:
        for p in procs:
            p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return {key: {k: torch.from_numpy(v) for k, v in params.items()} for key, params in got.items()}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("name", NAMES)
def test_two_learners_on_half_batches_reach_one_learners_parameters(name, two_ranks):
    initial = ddp_ranks.build(name)
    start = {k: v.clone() for k, v in (initial.net if name == "PPO" else initial.q).state_dict().items()}
    whole = ddp_ranks.train(ddp_ranks.build(name), 0, 2, share=slice(None))  # one learner, the whole batch
    rank0, rank1 = two_ranks[name, 0], two_ranks[name, 1]
    for key, value in whole.items():
        assert not torch.equal(value, start[key]), f"{name} {key} did not move: the test would prove nothing"
        torch.testing.assert_close(rank0[key], rank1[key], rtol=0, atol=1e-6, msg=f"{name} ranks differ at {key}")
        torch.testing.assert_close(rank0[key], value, rtol=1e-4, atol=1e-5, msg=f"{name} 2 learners != 1 at {key}")
    if name != "PPO":  # a learner on its half alone lands elsewhere: the averaging is what matches
        half = ddp_ranks.train(ddp_ranks.build(name), 0, 2, share=slice(0, ddp_ranks.HALF))
        assert any(not torch.allclose(half[k], whole[k], atol=1e-4) for k in whole)


def _job(**learner) -> dict:
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"},
            "spec": {"algorithm": {"name": "QLearning"}, "environment": {"id": "FrozenLake-v1"}, "learner": learner,
                     "stopping": {"maxEnvSteps": 1000}}}


def test_learner_replicas_default_one_and_qlearning_refuses_more():
    assert RLTrainingJob.model_validate(_job()).spec.learner.replicas == 1
    with pytest.raises(ValueError, match=r"learner.replicas > 1 needs a gradient-based algorithm"):
        RLTrainingJob.model_validate(_job(replicas=2))
    with pytest.raises(ValueError, match="replicas"):
        RLTrainingJob.model_validate(_job(replicas=0))


def test_learner_slots_are_the_extra_learners():
    assert extra_learners(1) == 0 and learner_slots(extra_learners(1)) == {}
    assert learner_slots(extra_learners(3)) == {"learner_slot": 2}


def test_every_ranks_replay_fills_whichever_workers_deliver():
    """One worker delivering everything (the other slow, or not started yet) still feeds both ranks'
    replays alike: rank 0 sets the updates by the smallest replay, so a starved rank would hold all back."""
    from kuberl.trainer.ddp import LearnerGroup

    group = LearnerGroup(algo=None, actors=[object()])  # rank 0 and one more
    batches = [{"worker_index": 0, "env_steps": 256} for _ in range(5)]
    shards = group.shard(batches[:3])
    assert [len(s) for s in shards] == [2, 1]
    shards = group.shard(batches[3:] + [{"worker_index": 1, "env_steps": 512}])
    assert [len(s) for s in shards] == [1, 2] and group.received == [768, 1024]

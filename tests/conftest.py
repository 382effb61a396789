"""Shared pytest setup: where the repo is, and a fresh job dict to edit per test."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

_EXAMPLE = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())


@pytest.fixture
def one_torch_thread():
    """Tiny networks: more threads only contend on a shared machine (2 threads ran 30x slower). Tests
    that train them use it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch  # here, not at the top: not every test process needs torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def job_dict() -> dict:
    """The CartPole PPO example as a dict, safe to mutate."""
    return copy.deepcopy(_EXAMPLE)


def job_pods(job, options) -> list[dict]:
    """Every pod the operator makes for a fresh job: head, learner and k rollout workers, in that order."""
    from kuberl.operator import builders

    return [
        builders.build_head_pod(job, options),
        builders.build_learner_pod(job, options),
        *(builders.build_worker_pod(job, options, i) for i in range(job.spec.rollout_workers.replicas)),
    ]

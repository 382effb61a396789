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

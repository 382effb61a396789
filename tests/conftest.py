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

"""What the integration modules share."""

from __future__ import annotations

import pytest
import ray

from kuberl.trainer.workers import start_ray


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray with two rollout slots for the module's runs, started fresh (a test before may have
    left one) and shut down after the module."""
    if ray.is_initialized():
        ray.shutdown()
    start_ray(None, local_slots=2)
    yield
    ray.shutdown()

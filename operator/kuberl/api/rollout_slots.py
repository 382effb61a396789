"""The contract between a job's rollout workers and its learner: one rollout worker is one Ray `rollout_slot`.

A worker pod's `ray start` offers one slot (`rollout_slots(1)`), the embedded Ray of `kuberl train` offers
`replicas` of them, every rollout actor takes one, and the learner reads the number of slots in its
cluster as the number of workers it should run. The operator's builders and the trainer's worker set both
use these two functions, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping

ROLLOUT_SLOT = "rollout_slot"


def rollout_slots(workers: int) -> dict[str, int]:
    """The Ray custom resources that `workers` rollout workers offer (or one rollout actor takes)."""
    return {ROLLOUT_SLOT: workers}


def workers_offered(cluster_resources: Mapping[str, float]) -> int:
    """How many rollout workers a Ray cluster offers room for: its rollout slots."""
    return int(cluster_resources.get(ROLLOUT_SLOT, 0))

"""The contract between a job's learner pods and its rank-0 learner: one extra learner is one Ray `learner_slot`.

`spec.learner.replicas: N` runs N data-parallel learners. Rank 0 is the learner that owns the loop (the
`kuberl train` process locally, the `<job>-learner` pod on a cluster); ranks 1..N-1 are Ray actors, each
taking one learner slot. The embedded Ray of `kuberl train` offers N-1 slots; on a cluster every extra
learner pod (`<job>-learner-1` ...) is a Ray node offering one. The operator's builders and the trainer both
use these functions, so the two sides cannot drift apart.
"""

from __future__ import annotations

LEARNER_SLOT = "learner_slot"


def learner_slots(learners: int) -> dict[str, int]:
    """The Ray custom resources that `learners` extra learners offer (or one learner actor takes)."""
    return {LEARNER_SLOT: learners} if learners > 0 else {}


def extra_learners(replicas: int) -> int:
    """Learners beyond rank 0: the learner actors (and, on a cluster, the extra learner pods)."""
    return max(replicas - 1, 0)

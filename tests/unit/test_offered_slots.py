"""The learner's read of its cluster's rollout slots (`workers.OfferedSlots`): bounded in time, so a learner
whose Ray head is gone still reaches its SIGTERM checkpoint, and never more than one read in flight."""

from __future__ import annotations

import threading

import pytest
from kuberl.trainer.workers import OfferedSlots, WorkerSet


class Gcs:
    """Answers the reads it is let answer, with the slots it holds; counts the reads it got."""

    def __init__(self, slots: int):
        self.slots, self.reads = slots, 0
        self.answering = threading.Event()
        self.answering.set()

    def read(self) -> dict[str, float]:
        self.reads += 1
        self.answering.wait()
        return {"CPU": 4.0, "rollout_slot": float(self.slots)}


def test_a_blocked_read_leaves_the_last_count_and_is_waited_on_rather_than_doubled():
    gcs = Gcs(slots=2)
    offered = OfferedSlots(gcs.read, timeout=30.0)
    assert offered() == 2
    gcs.answering.clear()  # the head is gone: the GCS does not answer
    gcs.slots = 3
    offered.timeout = 0.01
    assert offered() == 2 and offered() == 2, "the count last read stands"
    assert gcs.reads == 2, "the blocked read is waited on again, not joined by another"
    blocked = [t for t in threading.enumerate() if t.name == "kuberl-gcs-read"]
    assert blocked and all(t.daemon for t in blocked), "a read that never returns must not hold up the exit"
    gcs.answering.set()  # a new head: the blocked read answers
    offered.timeout = 30.0
    assert offered() == 3
    assert offered() == 3 and gcs.reads == 3


def test_a_read_that_fails_says_so_and_the_next_one_starts_afresh():
    calls = []

    def read() -> dict[str, float]:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("GCS refused")
        return {"rollout_slot": 1.0}

    offered = OfferedSlots(read, timeout=30.0)
    with pytest.raises(ConnectionError):
        offered()
    assert offered() == 1 and len(calls) == 2


def test_a_stop_ends_the_wait_for_workers_before_anything_is_asked_of_ray():
    """A SIGTERM while the learner waits for a rollout worker (a drain took them all, or the head is gone):
    the wait ends at once, so the loop reaches the checkpoint the SIGTERM asks for. Ray is not even started
    here: a read of the cluster would fail."""
    workers = WorkerSet({}, None, cluster=True, seed=0, stop=lambda: True)
    workers.reconcile(timeout=3600)
    assert not workers.workers

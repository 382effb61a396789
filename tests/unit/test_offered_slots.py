"""The learner's view of its cluster when the Ray head is gone (a drain evicting it, its node lost): the read of
the cluster's rollout slots (`workers.OfferedSlots`) is bounded in time and never takes the process down, and
letting go of an actor (`workers.kill_in_background`) never blocks the loop, so a learner whose head is gone
still reaches the checkpoint its SIGTERM asks for."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest
from ray.exceptions import RpcError

from kuberl.trainer.workers import OfferedSlots, WorkerSet, kill_in_background


class Gcs:
    """Answers with the slots it holds while up; raises RpcError, as Ray's GCS client does, while down."""

    def __init__(self, slots: int):
        self.slots, self.reads, self.up = slots, 0, True
        self.timeouts: list[float] = []

    def read(self, timeout: float) -> dict[str, float]:
        self.reads += 1
        self.timeouts.append(timeout)
        if not self.up:
            raise RpcError("Timed out while waiting for GCS to become available.")
        return {"CPU": 4.0, "rollout_slot": float(self.slots)}


def test_while_the_gcs_does_not_answer_the_count_last_read_stands():
    gcs = Gcs(slots=2)
    offered = OfferedSlots(gcs.read, timeout=1.5)
    assert offered() == 2
    gcs.up, gcs.slots = False, 3
    assert offered() == 2 and offered() == 2, "the count last read stands"
    assert offered.unanswered == 2
    gcs.up = True  # a new head
    assert offered() == 3 and offered.unanswered == 0
    assert gcs.timeouts == [1.5] * 4, "every read is bounded"


def test_an_error_other_than_the_gcs_not_answering_is_raised():
    def read(timeout: float) -> dict[str, float]:
        raise ValueError("not a cluster")

    with pytest.raises(ValueError):
        OfferedSlots(read)()


def test_letting_go_of_an_actor_never_waits_for_the_kill():
    released = threading.Event()
    killed: list[tuple[str, bool]] = []

    def kill(actor: str, no_restart: bool) -> None:
        released.wait()  # Ray's kill of an actor still registering, with the GCS gone: it never returns
        killed.append((actor, no_restart))

    thread = kill_in_background("actor-1", kill)
    assert thread.daemon, "a kill that never returns must not hold up the exit"
    assert thread.is_alive() and not killed
    released.set()
    thread.join(30)
    assert killed == [("actor-1", True)]


def test_a_stop_ends_the_wait_for_workers_before_anything_is_asked_of_ray():
    """A SIGTERM while the learner waits for a rollout worker (a drain took them all, or the head is gone):
    the wait ends at once, so the loop reaches the checkpoint the SIGTERM asks for. Ray is not even started
    here: a read of the cluster would fail."""
    workers = WorkerSet({}, None, cluster=True, seed=0, stop=lambda: True)
    workers.reconcile(timeout=3600)
    assert not workers.workers


# On a real Ray: its GCS killed, then what a learner does in that state. Run in a process of its own, which
# leaves without Ray's shutdown (that would wait on the dead GCS).
WITHOUT_GCS = textwrap.dedent("""
    import json, os, signal, threading, time
    import ray
    from kuberl.trainer.workers import OfferedSlots, WorkerSet, kill_in_background
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", resources={"rollout_slot": 2})

    @ray.remote(num_cpus=0)
    class Actor:
        def ping(self):
            return 1

    ray.get(Actor.remote().ping.remote())  # the class exported to the GCS while it answers, as a learner's is
    offered = OfferedSlots(timeout=1.0)
    out = {"before": offered()}
    node = ray._private.worker._global_node
    os.kill(node.all_processes[ray._private.ray_constants.PROCESS_TYPE_GCS_SERVER][0].process.pid, signal.SIGKILL)
    t0 = time.monotonic()
    out["reads"] = [offered() for _ in range(5)]
    out["read_seconds"] = time.monotonic() - t0
    workers = WorkerSet({}, None, cluster=True, seed=0)
    t0 = time.monotonic()
    workers.reconcile(timeout=3600)  # waits for a worker, were the head there to start one
    out["reconcile_seconds"] = time.monotonic() - t0
    out["head_unanswered"] = workers.head_unanswered()
    out["spawned"] = len(workers.workers)
    registering = Actor.remote()  # its registration with the GCS never finishes
    t0 = time.monotonic()
    background = kill_in_background(registering)
    out["let_go_seconds"] = time.monotonic() - t0
    plain = threading.Thread(target=ray.kill, args=(registering,), daemon=True)
    plain.start()
    plain.join(3.0)
    out["plain_kill_blocked"] = plain.is_alive()
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)
""")


def test_with_the_gcs_killed_a_real_learner_reads_the_last_count_stops_waiting_for_workers_and_lets_go_of_actors():
    done = subprocess.run([sys.executable, "-c", WITHOUT_GCS], capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    out = json.loads(line[len("RESULT "):])
    assert out["before"] == 2
    assert out["reads"] == [2] * 5, out
    assert out["read_seconds"] < 5 * 1.0 + 10, out  # each read bounded by its timeout (slack for a busy machine)
    assert out["let_go_seconds"] < 1.0, out
    # The wait for rollout workers ends at the first unanswered read: no actor starts without the head, and the
    # learner's loop (learner._head_lost) checkpoints and waits for the head or its SIGTERM instead.
    assert out["head_unanswered"] and out["spawned"] == 0, out
    assert out["reconcile_seconds"] < 1.0 + 10, out
    # What the background kill guards against, on this Ray: its own kill of an actor still registering blocks.
    assert out["plain_kill_blocked"], out

"""The learner's view of its rollout workers: Ray actors, one per rollout slot, replaced when they die.

Locally the embedded Ray offers `replicas` rollout slots; on a cluster every worker pod offers one
(`ray start --resources='{"rollout_slot": 1}'`), so the number of slots *is* the desired number of
workers and scaling the pods scales the actors.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.core.generated import gcs_pb2
from ray.exceptions import RayActorError, RayTaskError, RpcError

from kuberl.api.learner_slots import learner_slots
from kuberl.api.rollout_slots import rollout_slots, workers_offered
from kuberl.api.threads import THREAD_ENV
from kuberl.trainer.envs.resolve import EnvNotFound
from kuberl.trainer.ray_node import (
    REGISTER_S,
    host_and_port,
    lean_node_patches,
    polling_get_node,
    wait_for,
)
from kuberl.trainer.rollout import RolloutWorker

log = logging.getLogger(__name__)


def start_ray(address: str | None, local_slots: int, local_learners: int = 0, *,
              ship_import_path: bool = True) -> float:
    """Start an embedded Ray (or join `address`) with `local_slots` rollout slots and `local_learners`
    learner slots (data-parallel learners beyond rank 0); returns seconds it took. Joining, the workers
    get this process's import path (`ship_import_path`) through a runtime_env."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    if ray.is_initialized():
        return 0.0
    # User environments given as module:Class must import in the workers too.
    paths = [os.getcwd(), *[p for p in sys.path if p]]
    pythonpath = os.pathsep.join(dict.fromkeys(paths))
    if address:
        # A learner pod starts beside its head: wait for the head's GCS port however long its image pull
        # takes (as the pod's own Ray node does), then give the joining a bounded time and fail clearly.
        gcs = host_and_port(address)
        if gcs is not None:
            wait_for([gcs], report=log.warning)
        runtime_env = {"env_vars": {"PYTHONPATH": pythonpath}} if ship_import_path else None
        deadline = time.monotonic() + float(os.environ.get("KUBERL_RAY_CONNECT_TIMEOUT", "180"))
        while True:
            try:
                ray.init(address=address, runtime_env=runtime_env,
                         logging_level=logging.WARNING,
                         log_to_driver=True)
                break
            except (ConnectionError, RuntimeError) as err:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach the Ray cluster at {address}: {err}") from err
                log.info("Ray head at %s not reachable yet; retrying", address)
                time.sleep(2.0)
    else:
        # The local raylet inherits this environment and hands it to its workers, so they need no
        # runtime_env: one would make every actor wait for a fresh worker process set up for it. Each
        # rollout actor holds one of Ray's CPUs, so its thread pools get one thread (where the user set
        # none): numpy's OpenBLAS would otherwise start one per core in every worker.
        saved = {var: os.environ.get(var) for var in ("PYTHONPATH", *THREAD_ENV)}
        os.environ.update({"PYTHONPATH": pythonpath, **{var: "1" for var in THREAD_ENV if not saved[var]}})
        try:
            with _lean_local_head():
                ray.init(
                    address="local",  # never join a cluster some other `ray start` left on this machine
                    num_cpus=max(local_slots, os.cpu_count() or 1),
                    resources={**rollout_slots(local_slots), **learner_slots(local_learners)},
                    include_dashboard=False,
                    object_store_memory=256 * 1024 * 1024,
                    logging_level=logging.WARNING,
                    log_to_driver=True,
                )
        finally:  # the raylet has its copy; the rest of this process keeps what it had
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
    return time.perf_counter() - t0


#: Ray's C++ clients retry a connection to a socket that is not up yet every second (10 tries): the
#: raylet's own connection to its object store, seconds before anything runs, loses a whole second in
#: about half the starts. The same 10 s in all, tried every 50 ms.
_FAST_CONNECT_RETRIES = {"RAY_raylet_client_num_connect_attempts": "200",
                         "RAY_raylet_client_connect_timeout_milliseconds": "50"}


@contextlib.contextmanager
def _lean_local_head():
    """An embedded Ray that starts in about a second less, for a one-machine training run:
    - without the two head processes such a run never uses: the dashboard's API server (ray.init
      waits for it to come up, even with include_dashboard=False) and the autoscaler monitor;
    - with the node agent in Ray's minimal mode (what Ray runs where the dashboard's dependencies are
      not installed), so that the check for those dependencies does not import aiohttp here, and with
      the agents' port files written before the raylet waits 15 s for them (`ports_known_first`) and no
      dashboard agent, which does nothing in minimal mode (`without_dashboard_agent`);
    - asking the GCS every 20 ms whether the raylet has registered, where ray.init asks once a second;
    - with the connection retries of `_FAST_CONNECT_RETRIES`.
    `ray start` heads (clusters) keep all of Ray's defaults; KUBERL_RAY_FULL_HEAD=1 keeps them here too.
    Ray has no public switch for any of these, so this patches Ray 2.x for the duration of ray.init
    and leaves out each part where Ray looks different."""
    from ray._private import node as ray_node
    from ray._private import parameter, services

    if os.environ.get("KUBERL_RAY_FULL_HEAD") == "1":
        yield
        return
    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        if hasattr(owner, name):
            original = getattr(owner, name)
            setattr(owner, name, value)
            undo.append(lambda: setattr(owner, name, original))

    if hasattr(parameter.RayParams, "__init__"):
        params_init = parameter.RayParams.__init__

        def lean_params(self, *args, **kwargs):
            params_init(self, *args, **kwargs)
            self.no_monitor = True

        patch(parameter.RayParams, "__init__", lean_params)
    patch(ray_node.Node, "start_api_server", lambda self, **_: None)
    for owner, name, replacement in lean_node_patches():
        patch(owner, name, replacement)
    if hasattr(services, "get_node") and hasattr(services, "_get_gcs_client_options"):
        # Up to REGISTER_S (a pod's Ray node's wait) for the raylet to register, sooner once it is there or
        # once it exited: Ray's own loop gives it 30 s, and on a loaded machine (the test suite) a raylet
        # registered later than that and `kuberl sweep` failed "timed out during startup".
        patch(services, "get_node", polling_get_node(services.get_node, services._get_gcs_client_options,
                                                     wait_s=REGISTER_S))
    saved = {key: os.environ.get(key) for key in _FAST_CONNECT_RETRIES}
    for key, value in _FAST_CONNECT_RETRIES.items():
        os.environ.setdefault(key, value)  # the raylet inherits them; a user's own settings win
    try:
        yield
    finally:
        for restore in reversed(undo):
            restore()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def stop_local_ray_after_exit() -> bool:
    """For a process about to end with os._exit: make sure the embedded Ray it started goes with it,
    without stopping any of it now. `ray.shutdown()` stops Ray's processes one by one (about 1.5 s);
    stopping them from here while this process still runs races its own exit: Ray's core worker ends
    a driver whose object store went away, with status 1, and wins about 1 run in 15.

    Ray starts its head processes (GCS, raylet, log monitor) to die with this process; the raylet's
    own children (its agents and worker processes) would linger, the agents for good. A detached
    shell waits for this process to be gone, then kills those children, and any head process still
    there (each only if it is still a Ray process: its pid may have been reused). Returns False, doing
    nothing, when this process did not start the Ray it is connected to."""
    node = getattr(ray._private.worker, "_global_node", None)  # ray 2.x: the Node ray.init started
    if node is None or not node.is_head():
        return False
    heads = [info.process.pid for infos in node.all_processes.values() for info in infos]
    raylets = [info.process.pid for info in node.all_processes.get("raylet", [])]
    children = [child for pid in raylets for child in _child_pids(pid)]
    script = (
        'while [ -e "/proc/$0" ] && ! grep -q "^State:.Z" "/proc/$0/status" 2>/dev/null; do sleep 0.02; done; '
        'for p in "$@"; do grep -qa ray "/proc/$p/cmdline" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done; '
        "exit 0"
    )
    subprocess.Popen(["/bin/sh", "-c", script, str(os.getpid()), *map(str, children + heads)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    return True


def _child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; none elsewhere)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return found


@dataclass
class WorkerHandle:
    index: int
    actor: Any
    ready_ref: Any = None
    ready: bool = False


#: Seconds one read of the cluster's rollout slots may wait on Ray's GCS. With the head gone (a drain evicting
#: it, its node lost) the GCS does not answer; past this the count last read stands, and the loop goes on to
#: see the SIGTERM that the operator sends a learner whose head is gone.
GCS_READ_SECONDS = 2.0


def alive_resources(timeout: float) -> dict[str, float]:
    """The total resources of the cluster's live nodes, through the core worker's own GCS client: one call,
    bounded by `timeout`, that raises RpcError when the GCS does not answer. Not `ray.cluster_resources()`: it
    reads through Ray's GlobalStateAccessor, whose failed read is a failed check that aborts the process (a
    learner whose head a drain evicted died so, mid-run and before its SIGTERM came, losing every step since its
    last checkpoint), whatever thread it runs on."""
    client: Any = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: B009 - set at connect; untyped
    alive: int = gcs_pb2.GcsNodeInfo.ALIVE  # type: ignore[attr-defined]  # generated protobuf, no stubs
    total: collections.Counter[str] = collections.Counter()
    for node in client.get_all_node_info(timeout=timeout, state_filter=alive).values():
        total.update(dict(node.resources_total))
    return dict(total)


class OfferedSlots:
    """The cluster's rollout slots, read from the GCS at most GCS_READ_SECONDS at a time; when the GCS does not
    answer, the count last read."""

    def __init__(self, read: Callable[[float], dict[str, float]] = alive_resources,
                 timeout: float = GCS_READ_SECONDS):
        self._read, self.timeout = read, timeout
        self.last = 0
        self.unanswered = 0  # reads in a row that the GCS did not answer, for the log

    def __call__(self) -> int:
        try:
            value = self._read(self.timeout)
        except (RpcError, TimeoutError) as err:
            self.unanswered += 1
            if self.unanswered == 1:
                log.warning("Ray's GCS did not answer within %.0f s (%s; the head gone?): going on with %d "
                            "rollout slots", self.timeout, err, self.last)
            return self.last
        self.unanswered = 0
        self.last = workers_offered(value)
        return self.last


def kill_in_background(actor: Any, kill: Callable[..., Any] = ray.kill) -> threading.Thread:
    """`ray.kill(actor, no_restart=True)` on a daemon thread, not waited on. Ray's kill waits, with the GIL
    released and so deaf to Python's signal handlers, for the GCS to finish registering an actor still being
    registered: with the head gone (a drain evicting it, its node lost) that is forever, and a learner in it
    when its SIGTERM came would be killed at the end of its grace period without the checkpoint that SIGTERM
    asks for. Killing is tidying up an actor the learner has already let go of: what it returns, or whether it
    ever does, changes nothing the learner does next."""

    def run() -> None:
        try:
            kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or its cluster is
            pass

    thread = threading.Thread(target=run, name="kuberl-actor-kill", daemon=True)
    thread.start()
    return thread


class WorkerSet:
    """Keeps one rollout actor per rollout slot alive; counts replacements."""

    def __init__(self, make_args: dict[str, Any], desired: int | None, cluster: bool, seed: int,
                 expected: int = 1, stop: Callable[[], bool] | None = None):
        """`stop`: whether the run is stopping (its SIGTERM); a wait for workers ends once it says so, so the
        SIGTERM's checkpoint never waits for workers (a drain may have taken them all) past the grace period."""
        self.make_args = make_args
        self.fixed_desired = desired
        self.expected = expected  # what the spec asks for: at start, a cluster waits a while for that many slots
        self.stop = stop or (lambda: False)
        self.seed = seed
        self.workers: dict[int, WorkerHandle] = {}
        self.restarts = 0
        self._next_generation = 0
        self._actor_cls = ray.remote(num_cpus=1, resources=rollout_slots(1), max_restarts=0)(RolloutWorker)
        self._offered = OfferedSlots() if cluster else None  # locally the count is fixed: `desired`

    def desired(self) -> int:
        if self._offered is not None:
            return self._offered()
        return int(self.fixed_desired or 1)

    def head_unanswered(self) -> bool:
        """Whether the cluster's Ray head did not answer the last read of its rollout slots (its pod evicted, its
        node lost, or too busy to answer within GCS_READ_SECONDS). Never, on an embedded Ray."""
        return self._offered is not None and self._offered.unanswered > 0

    def _spawn(self, index: int) -> None:
        # A replacement gets a fresh seed stream so it does not replay its predecessor's episodes.
        generation = self._next_generation
        self._next_generation += 1
        args = dict(self.make_args, seed=self.seed + 1_000 * generation, worker_index=index)
        actor = self._actor_cls.options(name=None).remote(**args)
        self.workers[index] = WorkerHandle(index, actor, ready_ref=actor.ping.remote())

    def reconcile(self, wait_for_one: bool = True, timeout: float = 120.0, wait_for_all: float = 0.0) -> None:
        """Create missing actors, drop surplus ones, and mark started ones ready. Waits up to
        `wait_for_all` seconds for every desired actor (at start), and otherwise for at least one.
        The desired count is re-read while waiting: on a cluster, worker pods may join late. Returns at
        once when the run is stopping (`stop`)."""
        deadline = time.monotonic() + timeout
        all_deadline = time.monotonic() + wait_for_all
        while True:
            if self.stop():
                return
            want = self.desired()
            if self.head_unanswered():
                return  # no actor starts without the head; the learner decides what to do meanwhile
            for index in range(want):
                if index not in self.workers:
                    self._spawn(index)
            for index in sorted(self.workers):
                if index >= want:
                    kill_in_background(self.workers.pop(index).actor)
            pending = {h.ready_ref: h for h in self.workers.values() if not h.ready}
            if pending:
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                for ref in done:
                    handle = pending[ref]
                    try:
                        seen = ray.get(ref)
                        if seen.get("env_problem"):
                            raise EnvNotFound(f"rollout worker {handle.index} cannot use the environment: "
                                              f"{seen['env_problem']}")
                        handle.ready = True
                        pools = " ".join(f"{var}={n}" for var, n in seen["pools"].items())
                        log.info("rollout worker %d ready: container CPUs %d, thread pools %s", handle.index,
                                 seen["container_cpus"], pools)
                    except (RayActorError, RayTaskError) as err:
                        log.warning("rollout worker %d failed to start: %s", handle.index, err)
                        self.replace(handle.index)
            ready = len(self.ready())
            if (want == 0 or ready < max(want, self.expected if wait_for_all else 0)) \
                    and time.monotonic() < all_deadline:
                time.sleep(0.05)
                continue
            if ready or not wait_for_one:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no rollout worker became ready within {timeout:.0f}s "
                                   f"(desired {want}; are rollout-slot resources available?)")
            time.sleep(0.05)

    def ready(self) -> list[WorkerHandle]:
        return [h for h in self.workers.values() if h.ready]

    def replace(self, index: int) -> None:
        old = self.workers.pop(index, None)
        if old is not None:
            kill_in_background(old.actor)
        self.restarts += 1
        if not self.stop() and index < self.desired():
            self._spawn(index)

    def call(self, method: str, per_worker_args: dict[int, tuple],
             stop: Callable[[], bool] | None = None) -> dict[int, Any]:
        """Call `method` on ready workers and gather results; a worker that died is replaced and left
        out of this round. With `stop`, gives up on the results still out once it returns True."""
        refs = {}
        for h in self.ready():
            args = per_worker_args.get(h.index)
            if args is not None:
                refs[h.index] = getattr(h.actor, method).remote(*args)
        return self.gather(refs, stop=stop)

    def gather(self, refs: dict[int, Any], stop: Callable[[], bool] | None = None) -> dict[int, Any]:
        """Results by worker index, in the order of `refs`. Waits in half-second slices so that `stop`
        (a SIGTERM) is seen: a pod being deleted may have lost its Ray head with it, and then a dead
        worker's result never comes (its death is announced by the head), while the learner has a grace
        period to checkpoint in. Once stopping, nothing is replaced (that asks the head too)."""
        results: dict[int, Any] = {}
        pending = {ref: index for index, ref in refs.items()}
        while pending and not (stop is not None and stop()):
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
            for ref in done:
                index = pending.pop(ref)
                try:
                    results[index] = ray.get(ref)
                except RayActorError as err:
                    if stop is not None and stop():
                        continue
                    log.warning("rollout worker %d died (%s); replacing it", index, type(err).__name__)
                    self.replace(index)
        return {index: results[index] for index in refs if index in results}

    def shutdown(self) -> None:
        for h in self.workers.values():
            try:
                ray.kill(h.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers.clear()

"""The learner's loop: collect batches from the rollout workers, learn, count, report, checkpoint,
until a stopping rule (or SIGTERM) says stop; then the final evaluation.

One iteration reads top to bottom in `iterate`; sync and async collection (`run_loop`) differ only
in how its batches come in. `Loop` is what the steps share, and what `TrainOptions.on_iteration`
observers get.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from kuberl.api.job import CollectionMode, RLTrainingJob, RLTrainingJobSpec, StopReason
from kuberl.trainer.accounting import Counters, RateWindow, Tally, metrics_row, publish_iteration
from kuberl.trainer.metrics import LearnerMetrics
from kuberl.trainer.report import RunReport
from kuberl.trainer.workers import WorkerSet

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # torch comes with it: train() imports that in a thread of its own, while Ray starts
    from kuberl.trainer.algorithms.base import Algorithm, LearnStats
    from kuberl.trainer.checkpoint_store import ObjectCheckpoints
    from kuberl.trainer.ddp import LearnerGroup


@dataclass
class Loop:
    """What one run's iterations share. `stop_signal["set"]` (SIGTERM, or an observer) ends the run
    after the current iteration, with a checkpoint."""

    job: RLTrainingJob
    algo: Algorithm
    workers: WorkerSet
    metrics: LearnerMetrics
    report: RunReport
    counters: Counters
    recent_returns: collections.deque  # the last returnWindow episode returns
    ckpt_dir: Path
    stop_signal: dict[str, bool]
    on_iteration: Callable[[dict[str, Any], Loop], None] | None = None
    learners: LearnerGroup | None = None  # data-parallel learners (`ddp.py`); None: `algo` learns alone
    store: ObjectCheckpoints | None = None  # spec.checkpointing.s3: each checkpoint uploaded there too
    # The weights last put in Ray's object store, shared by every worker, and their version.
    weights_ref: Any = None
    weights_version: int = -1
    solved_at: float | None = None  # wall clock when the target return was reached
    # Accounting: the wall clock continues a resumed run's; increments are against what was published.
    rates: RateWindow = field(default_factory=RateWindow)
    start: float = field(init=False)
    last_loss: float = float("nan")
    base_restarts: int = field(init=False)
    reported_wait: float = field(init=False)
    last_ckpt_time: float = field(init=False)
    last_ckpt_iter: int = field(init=False)

    def __post_init__(self) -> None:
        self.start = time.perf_counter() - self.counters.wall_clock
        self.base_restarts = self.counters.worker_restarts
        self.reported_wait = self.counters.learner_wait
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_iter = self.counters.iterations

    @property
    def spec(self) -> RLTrainingJobSpec:
        return self.job.spec

    def publish_weights(self) -> None:
        """One ray.put per new version of the weights."""
        version = self.algo.gradient_updates
        if version != self.weights_version or self.weights_ref is None:
            self.weights_ref = ray.put(self.algo.weights())
            self.weights_version = version


def run_loop(loop: Loop) -> str:
    """Iterations until a stopping rule says stop; returns its reason."""
    if loop.spec.collection.mode == CollectionMode.ASYNC:
        return _run_async(loop)
    return _run_sync(loop)


# ---- one iteration ------------------------------------------------------------------------------


def iterate(loop: Loop, batches: list[dict[str, Any]], max_updates: int | None = None) -> None:
    """One iteration once its batches are in: learn, count, write the row, publish, checkpoint."""
    new_steps = sum(int(b["env_steps"]) for b in batches)
    loop.counters.env_steps += new_steps
    stats = (loop.learners or loop.algo).learn(batches, loop.counters.env_steps, max_updates=max_updates)
    tally = _count(loop, batches, new_steps, stats)
    # What needs Ray (a cluster's slot count asks its head) comes first, then the row, then the
    # metrics: a learner that dies here (its head gone) must not have published an iteration that
    # metrics.jsonl and its checkpoint never saw, or status.progress would go back on its restart.
    tally.workers_ready, tally.workers_desired = len(loop.workers.ready()), loop.workers.desired()
    row = metrics_row(loop.counters, tally)
    loop.report.iteration(row)
    publish_iteration(loop.metrics, loop.counters, tally)
    if loop.report.tracker is not None and loop.report.tracker.reachable is not None:
        loop.metrics.set("kuberl_tracker_reachable", float(loop.report.tracker.reachable))
    if loop.on_iteration is not None:
        loop.on_iteration(row, loop)
    checkpoint_when_due(loop)


def _count(loop: Loop, batches: list[dict[str, Any]], new_steps: int, stats: LearnStats) -> Tally:
    """Adds the iteration to the counters and the return window; returns what it added."""
    counters = loop.counters
    returns = np.concatenate([b["episode_returns"] for b in batches]) if batches else np.zeros(0)
    worker_wait = sum(float(b.get("idle_seconds", 0.0)) for b in batches)
    counters.iterations += 1
    counters.episodes += len(returns)
    loop.recent_returns.extend(float(r) for r in returns)
    counters.gradient_updates += stats.gradient_updates
    counters.worker_wait += worker_wait
    restarts = loop.base_restarts + loop.workers.restarts
    new_restarts, counters.worker_restarts = restarts - counters.worker_restarts, restarts
    new_wait, loop.reported_wait = counters.learner_wait - loop.reported_wait, counters.learner_wait
    now = time.perf_counter()
    counters.wall_clock = now - loop.start
    eps_rate, step_rate = loop.rates.add(now, counters.episodes, counters.env_steps)
    if not math.isnan(stats.loss):
        loop.last_loss = stats.loss
    return Tally(env_steps=new_steps, episodes=len(returns), gradient_updates=stats.gradient_updates,
                 worker_restarts=new_restarts, learner_wait=new_wait, worker_wait=worker_wait,
                 worker_nodes=len({b.get("node") for b in batches}), episodes_per_second=eps_rate,
                 env_steps_per_second=step_rate,
                 mean_return=float(np.mean(loop.recent_returns)) if loop.recent_returns else None,
                 loss=stats.loss, last_loss=loop.last_loss, extra=stats.extra)


# ---- collection: how an iteration's batches come in ------------------------------------------------


def _sample_call(loop: Loop) -> tuple[str, tuple]:
    """The rollout worker method for one batch, and its arguments."""
    algo = loop.algo
    if algo.on_policy:
        return "sample_onpolicy", (loop.weights_ref, loop.weights_version, algo.cfg.rollout_steps, algo.cfg.gamma)
    epsilon = algo.exploration(loop.counters.env_steps)
    return "sample_offpolicy", (loop.weights_ref, loop.weights_version, loop.spec.collection.fragment_steps,
                                epsilon, algo.cfg.gamma, algo.n_step)


def _run_sync(loop: Loop) -> str:
    """Every ready worker collects one batch with the current weights; the learner waits for all."""
    while True:
        reason = stop_reason(loop)
        if reason:
            return reason
        loop.workers.reconcile()
        if loop.stop_signal["set"] or _head_lost(loop):
            continue
        loop.publish_weights()
        method, args = _sample_call(loop)
        t_wait = time.perf_counter()
        batches = list(loop.workers.call(method, {h.index: args for h in loop.workers.ready()},
                                         stop=lambda: loop.stop_signal["set"]).values())
        loop.counters.learner_wait += time.perf_counter() - t_wait
        if not batches or loop.stop_signal["set"]:
            continue  # SIGTERM: this round is dropped whole; the checkpoint keeps the last iteration
        iterate(loop, batches)


def _run_async(loop: Loop) -> str:
    """Workers keep up to `queueSize` batches each in flight and step their envs while the learner
    trains on whichever batch is done first.

    `maxStaleness` bounds the policy a worker collects with: the learner applies an update only while
    every batch still being collected (handed out, not finished) was sent weights at most that many
    updates older. Updates the bound holds back stay owed (the algorithm applies them on a later
    call, so trainFrequency's replay ratio holds) and no new batch is handed out until they are
    applied. A finished batch is replay data like any other and holds nothing back.
    """
    max_staleness = loop.spec.collection.max_staleness
    inflight = _InFlight(loop)
    while True:
        reason = stop_reason(loop)
        if reason:
            break
        loop.workers.reconcile(wait_for_one=not inflight.calls)
        if loop.stop_signal["set"] or _head_lost(loop):
            continue
        loop.publish_weights()
        if not inflight.calls or not loop.algo.updates_held_back:
            inflight.fill()
        batches = inflight.first_done()
        if not batches:
            continue
        oldest = inflight.oldest_version_collecting()
        budget = None if oldest is None else max(max_staleness - (loop.algo.gradient_updates - oldest), 0)
        iterate(loop, batches, max_updates=budget)
        loop.metrics.set("kuberl_policy_staleness_updates",
                         0 if oldest is None else loop.algo.gradient_updates - oldest)
    inflight.cancel()
    if loop.algo.updates_held_back and reason in ("max_env_steps", "max_episodes"):
        # The step or episode budget is spent and nothing is collecting any more, so the bound holds
        # nothing back: the owed updates are applied, and trainFrequency's replay ratio holds to the
        # last batch however the batches happened to interleave with the updates. A solved target,
        # a SIGTERM or the wall-clock limit leaves them owed (the checkpoint keeps them).
        iterate(loop, [])
    return reason


#: Seconds between asks of a Ray head that did not answer (each ask itself waits up to GCS_READ_SECONDS).
HEAD_LOST_PAUSE_SECONDS = 0.5


def _head_lost(loop: Loop) -> bool:
    """Whether the Ray head stopped answering; if so, the iterations since the last checkpoint are saved now, and
    the loop collects nothing until the head answers again (a busy one) or SIGTERM comes (the operator replaces
    every pod of a job whose head is gone). Ray ends a process whose head has been gone for a minute, and on a
    busy cluster the operator's SIGTERM can come later than that: a learner that went on training meanwhile lost
    every iteration since its last checkpoint, which its replacement trained again."""
    if not loop.workers.head_unanswered():
        return False
    if loop.counters.iterations > loop.last_ckpt_iter:
        log.warning("the Ray head does not answer: checkpointing iteration %d, and collecting nothing until it "
                    "answers or this pod is stopped", loop.counters.iterations)
        checkpoint_when_due(loop, force=True)
    time.sleep(HEAD_LOST_PAUSE_SECONDS)  # a head that refuses at once is not asked in a tight loop
    return True


class _InFlight:
    """Async collection's sample calls handed out and not yet gathered: ref -> (worker index, weights
    version it was sent)."""

    def __init__(self, loop: Loop):
        self.loop = loop
        self.calls: dict[Any, tuple[int, int]] = {}

    def fill(self) -> None:
        """Up to `queueSize` calls per ready worker."""
        busy = collections.Counter(index for index, _ in self.calls.values())
        for handle in self.loop.workers.ready():
            for _ in range(self.loop.spec.collection.queue_size - busy[handle.index]):
                method, args = _sample_call(self.loop)
                self.calls[getattr(handle.actor, method).remote(*args)] = (handle.index, self.loop.weights_version)

    def first_done(self) -> list[dict[str, Any]]:
        """The batches of the calls done within 5 s of waiting (the wait counts as the learner's)."""
        t_wait = time.perf_counter()
        done, _ = ray.wait(list(self.calls), num_returns=1, timeout=5.0)
        self.loop.counters.learner_wait += time.perf_counter() - t_wait
        batches = []
        for ref in done:
            index, _version = self.calls.pop(ref)
            got = self.loop.workers.gather({index: ref})
            if index in got:
                batches.append(got[index])
            else:  # its other in-flight calls died with it
                for other in [r for r, (i, _) in self.calls.items() if i == index]:
                    self.calls.pop(other)
        return batches

    def oldest_version_collecting(self) -> int | None:
        """The oldest weights version among the calls still collecting (None when none is)."""
        if not self.calls:
            return None
        _, running = ray.wait(list(self.calls), num_returns=len(self.calls), timeout=0)
        return min((self.calls[ref][1] for ref in running), default=None)

    def cancel(self) -> None:
        for ref in list(self.calls):
            ray.cancel(ref, force=False)


# ---- stopping and checkpoints ---------------------------------------------------------------------


def stop_reason(loop: Loop) -> str | None:
    """The first stopping rule met (SIGTERM first), or None to go on."""
    stopping = loop.spec.stopping
    if loop.stop_signal["set"]:
        return StopReason.SIGNAL.value
    if (stopping.target_return is not None and len(loop.recent_returns) >= stopping.return_window
            and float(np.mean(loop.recent_returns)) >= stopping.target_return):
        if loop.solved_at is None:
            loop.solved_at = loop.counters.wall_clock
        return StopReason.TARGET_RETURN.value
    if stopping.max_env_steps is not None and loop.counters.env_steps >= stopping.max_env_steps:
        return StopReason.MAX_ENV_STEPS.value
    if stopping.max_episodes is not None and loop.counters.episodes >= stopping.max_episodes:
        return StopReason.MAX_EPISODES.value
    if (stopping.max_wall_clock_seconds is not None
            and time.perf_counter() - loop.start >= stopping.max_wall_clock_seconds):
        return StopReason.MAX_WALL_CLOCK_SECONDS.value
    return None


def checkpoint_when_due(loop: Loop, force: bool = False) -> None:
    """A checkpoint when an interval (iterations or seconds) is due, or `force` (the run's end, SIGTERM)
    unless this iteration has one already."""
    import torch

    from kuberl.trainer import checkpoint as ckpt

    settings, counters = loop.spec.checkpointing, loop.counters
    if not settings.enabled:
        return
    due = force
    if settings.interval_iterations and counters.iterations - loop.last_ckpt_iter >= settings.interval_iterations:
        due = True
    if settings.interval_seconds and time.monotonic() - loop.last_ckpt_time >= settings.interval_seconds:
        due = True
    if not due or (force and counters.iterations == loop.last_ckpt_iter and counters.checkpoints > 0):
        return
    counters.checkpoints += 1
    state = {
        "format": 1,
        "job_name": loop.job.metadata.name,
        "algorithm_name": loop.spec.algorithm.name.value,
        "algorithm": loop.algo.state_dict(),
        "counters": counters.as_dict(),
        "recent_returns": torch.tensor(list(loop.recent_returns), dtype=torch.float64),
        "torch_rng": torch.get_rng_state(),
    }
    t0 = time.perf_counter()
    path = ckpt.save_checkpoint(loop.ckpt_dir, counters.iterations, state, settings.keep_last)
    loop.metrics.set("kuberl_checkpoint_seconds", time.perf_counter() - t0)
    loop.last_ckpt_time = time.monotonic()
    loop.last_ckpt_iter = counters.iterations
    loop.metrics.inc("kuberl_checkpoints_total", 1)
    loop.metrics.set("kuberl_checkpoint_timestamp_seconds", time.time())
    loop.metrics.set("kuberl_checkpoint_iteration", counters.iterations)
    loop.report.checkpoint(path)
    if loop.store is not None:
        _upload_checkpoint(loop, path)


def _upload_checkpoint(loop: Loop, path: Path) -> None:
    """The checkpoint just written, to the object store too. A store that is down costs this checkpoint
    there (counted, said; the local one stays, and the next goes up when it answers); one that refuses
    the credentials ends the run (CheckpointStoreRefused), since none would ever go up."""
    from kuberl.trainer.object_store import ObjectStoreError

    assert loop.store is not None
    t0 = time.perf_counter()
    try:
        stored = loop.store.save(path, loop.counters.iterations, loop.spec.checkpointing.keep_last,
                                 loop.job.metadata.name)
    except ObjectStoreError as err:
        loop.metrics.inc("kuberl_checkpoint_upload_failures_total", 1)
        log.warning("checkpoint %s not in the object store: %s (kept on disk)", path.name, err)
        return
    seconds = time.perf_counter() - t0
    loop.metrics.set("kuberl_checkpoint_upload_seconds", seconds)
    log.info("checkpoint %s in %.3f s (%.1f kB)", stored.where, seconds, path.stat().st_size / 1e3)


# ---- evaluation -----------------------------------------------------------------------------------


def evaluate(loop: Loop) -> dict[str, Any]:
    """The final evaluation (`evaluation.evaluate`) with the last weights; its figures go to the metrics."""
    from kuberl.trainer.evaluation import evaluate as evaluate_spec

    loop.publish_weights()
    results = evaluate_spec(loop.spec, loop.workers, loop.weights_ref, loop.weights_version)
    main = results.get("deterministic")
    if main and main.get("mean_return") is not None:
        loop.metrics.set("kuberl_evaluation_return_mean", main["mean_return"])
    for name, res in results.items():
        if "win_rate" in res:
            loop.metrics.set_win_rate(name, res["win_rate"])
    return results

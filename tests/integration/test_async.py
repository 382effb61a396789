"""Asynchronous collection through real Ray: rollout workers step their envs while the learner trains
(their activity overlaps in time, which synchronous collection never does), the policy that
collected any batch is at most maxStaleness updates old, at most queueSize batches per worker are
in flight, and the wait metrics say which side waited."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from kuberl.trainer.envs.autoscaling import AutoscalingEnv

WORKERS, ENVS, FRAGMENT, QUEUE, MAX_STALENESS = 2, 4, 16, 2, 96
BATCH_STEPS = ENVS * FRAGMENT


class StampedAutoscaling(AutoscalingEnv):
    """Autoscaling-v0 that appends the monotonic time of every step to a file (one per env copy):
    the workers' side of the timeline. CLOCK_MONOTONIC is system-wide, so it compares with the
    learner's."""

    def __init__(self, stamp_dir: str, **kwargs):
        super().__init__(**kwargs)
        Path(stamp_dir).mkdir(parents=True, exist_ok=True)
        self._stamps = open(Path(stamp_dir) / f"{os.getpid()}-{id(self)}.txt", "a", buffering=1)  # noqa: SIM115

    def step(self, action):
        self._stamps.write(f"{time.monotonic()}\n")
        return super().step(action)


def _stamps(stamp_dir: Path) -> np.ndarray:
    files = [p for p in stamp_dir.glob("*.txt") if p.stat().st_size]  # the learner's probe env never steps
    return np.sort(np.concatenate([np.loadtxt(p, ndmin=1) for p in files] or [np.zeros(0)]))


def _train(mode: str, tmp_path: Path) -> dict:
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    stamp_dir = tmp_path / f"stamps-{mode}"
    job = parse_job({
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": f"async-{mode}"},
        "spec": {
            "algorithm": {"name": "DQN", "dqn": {"learningStarts": 256, "trainFrequency": 2, "batchSize": 64,
                                                 "network": {"hiddenSizes": [64, 64], "activation": "relu"}}},
            "environment": {"id": "test_async:StampedAutoscaling", "kwargs": {"stamp_dir": str(stamp_dir)}},
            "rolloutWorkers": {"replicas": WORKERS, "envsPerWorker": ENVS},
            "collection": {"mode": mode, "maxStaleness": MAX_STALENESS, "queueSize": QUEUE,
                           "fragmentSteps": FRAGMENT},
            "stopping": {"maxEnvSteps": 8_000},
            "evaluation": {"enabled": False},
            "checkpointing": {"enabled": False},
        },
    })
    seen: dict = {"updates": [], "staleness": [], "backlog": []}

    def observe(row, loop):
        if "metrics" not in seen:  # time every learner update from here on
            update = loop.algo.update

            def timed_update():
                t0 = time.monotonic()
                loss = update()
                seen["updates"].append((t0, time.monotonic()))
                return loss

            loop.algo.update = timed_update
        seen["metrics"] = loop.metrics
        seen["staleness"].append(loop.metrics.registry.get_sample_value(
            "kuberl_policy_staleness_updates", dict(zip(("job_name", "namespace", "algorithm", "environment"),
                                                         loop.metrics.labels.values()))))
        # Steps the workers have taken beyond what the learner has consumed: only queued batches.
        seen["backlog"].append(len(_stamps(stamp_dir)) - row["env_steps"])

    seen["result"] = train(job, TrainOptions(run_dir=tmp_path / mode, workers=WORKERS, metrics_port=0,
                                             progress=False, shutdown_ray=False, on_iteration=observe))
    seen["stamps"] = _stamps(stamp_dir)
    return seen


def _steps_during_updates(stamps: np.ndarray, updates: list[tuple[float, float]]) -> int:
    starts = np.array([u[0] for u in updates])
    ends = np.array([u[1] for u in updates])
    return int((np.searchsorted(stamps, ends) - np.searchsorted(stamps, starts)).sum())


def _value(metrics, name: str) -> float:
    labels = dict(zip(("job_name", "namespace", "algorithm", "environment"), metrics.labels.values()))
    return metrics.registry.get_sample_value(name, labels)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import ray

    from kuberl.trainer.workers import start_ray

    tmp = tmp_path_factory.mktemp("async")
    start_ray(None, local_slots=WORKERS)
    try:
        yield {mode: _train(mode, tmp) for mode in ("sync", "async")}
    finally:
        ray.shutdown()


def test_workers_keep_stepping_while_the_learner_trains(runs):
    sync, async_ = runs["sync"], runs["async"]
    for run in (sync, async_):
        assert run["result"].ok and run["result"].counters.gradient_updates > 500
        assert len(run["updates"]) > 500
    # Synchronous: workers wait while the learner trains, so no env step falls inside an update.
    assert _steps_during_updates(sync["stamps"], sync["updates"]) == 0
    # Asynchronous: a good share of all env steps happen while the learner is inside an update.
    overlapping = _steps_during_updates(async_["stamps"], async_["updates"])
    assert overlapping > 0.2 * len(async_["stamps"]), (overlapping, len(async_["stamps"]))


def test_staleness_and_queue_stay_bounded_without_losing_updates(runs):
    run = runs["async"]
    assert max(run["staleness"]) <= MAX_STALENESS
    assert max(run["staleness"]) > 0  # the learner did move on while batches were collected
    # Updates the bound held back were applied later: the replay ratio (trainFrequency 2) holds.
    sync_updates = runs["sync"]["result"].counters.gradient_updates
    assert run["result"].counters.gradient_updates >= sync_updates - MAX_STALENESS
    # Each worker holds at most queueSize batches not yet consumed, so that is all the workers can be ahead.
    assert max(run["backlog"]) <= WORKERS * QUEUE * BATCH_STEPS
    assert max(run["backlog"]) > 0  # and they were ahead of the learner


def test_wait_metrics_show_who_waited(runs):
    rates = {}
    for mode, run in runs.items():
        metrics, counters = run["metrics"], run["result"].counters
        learner_wait = _value(metrics, "kuberl_learner_wait_seconds_total")
        worker_wait = _value(metrics, "kuberl_worker_weight_wait_seconds_total")
        assert learner_wait == pytest.approx(counters.learner_wait) and learner_wait > 0
        assert worker_wait == pytest.approx(counters.worker_wait) and worker_wait > 0
        assert learner_wait < counters.wall_clock
        assert worker_wait < WORKERS * counters.wall_clock
        rates[mode] = worker_wait / (WORKERS * counters.wall_clock)  # share of worker time spent idle
    # Synchronous workers sit idle through every learn step; asynchronous ones have the next batch queued.
    assert rates["async"] < rates["sync"], rates


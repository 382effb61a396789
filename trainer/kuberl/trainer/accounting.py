"""What a run has done and how fast: the counters a checkpoint keeps, the rates a user sees, the row
each iteration writes to metrics.jsonl and the Prometheus metrics published from it."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from kuberl.trainer.metrics import METRICS, POLICY_RETURN_PREFIX, LearnerMetrics


@dataclass
class Counters:
    """Everything that must survive a restart to continue, not restart, a run."""

    iterations: int = 0
    env_steps: int = 0
    episodes: int = 0
    gradient_updates: int = 0
    wall_clock: float = 0.0
    worker_restarts: int = 0
    checkpoints: int = 0
    learner_wait: float = 0.0
    worker_wait: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class RateWindow:
    """Episodes/s and steps/s over the last few seconds (not since start: a user wants current speed)."""

    def __init__(self, seconds: float = 5.0):
        self.seconds = seconds
        self.points: collections.deque = collections.deque()

    def add(self, t: float, episodes: int, steps: int) -> tuple[float, float]:
        self.points.append((t, episodes, steps))
        while len(self.points) > 2 and t - self.points[1][0] >= self.seconds:
            self.points.popleft()
        t0, e0, s0 = self.points[0]
        dt = t - t0
        if dt <= 0:
            return 0.0, 0.0
        return (episodes - e0) / dt, (steps - s0) / dt


@dataclass
class Tally:
    """What one iteration added (the metrics count it up) and the figures its row reports."""

    env_steps: int
    episodes: int
    gradient_updates: int
    worker_restarts: int
    learner_wait: float
    worker_wait: float
    worker_nodes: int
    episodes_per_second: float
    env_steps_per_second: float
    mean_return: float | None
    loss: float  # this iteration's, NaN when it made no update
    last_loss: float  # the last finite one, what the loss gauge shows
    extra: dict[str, float] = field(default_factory=dict)  # the algorithm's own figures (LearnStats.extra)
    workers_ready: int = 0
    workers_desired: int = 0


def metrics_row(counters: Counters, tally: Tally) -> dict[str, Any]:
    """The iteration's line in metrics.jsonl (and metrics.csv): totals so far, current rates."""
    return {"iteration": counters.iterations, "env_steps": counters.env_steps, "episodes": counters.episodes,
            "wall_clock": round(counters.wall_clock, 4), "mean_return": tally.mean_return,
            "episodes_per_second": tally.episodes_per_second, "env_steps_per_second": tally.env_steps_per_second,
            "loss": tally.loss, "gradient_updates": counters.gradient_updates, "workers_ready": tally.workers_ready,
            "worker_nodes": tally.worker_nodes, "learner_wait": counters.learner_wait,
            "worker_wait": counters.worker_wait, **tally.extra}


def publish_iteration(metrics: LearnerMetrics, counters: Counters, tally: Tally) -> None:
    """The iteration's increments and gauges, once its row is written."""
    if tally.env_steps > 0:
        metrics.mark_first_step()
    metrics.inc("kuberl_episodes_total", tally.episodes)
    metrics.inc("kuberl_env_steps_total", tally.env_steps)
    metrics.inc("kuberl_gradient_updates_total", tally.gradient_updates)
    metrics.inc("kuberl_iterations_total", 1)
    metrics.set("kuberl_episodes_per_second", tally.episodes_per_second)
    metrics.set("kuberl_env_steps_per_second", tally.env_steps_per_second)
    metrics.set("kuberl_training_wall_clock_seconds", counters.wall_clock)
    if tally.mean_return is not None:
        metrics.set("kuberl_episode_return_mean", tally.mean_return)
    metrics.set("kuberl_rollout_workers_ready", tally.workers_ready)
    metrics.set("kuberl_rollout_workers_desired", tally.workers_desired)
    metrics.inc("kuberl_rollout_worker_restarts_total", tally.worker_restarts)
    if not math.isnan(tally.last_loss):
        metrics.set("kuberl_learner_loss", tally.last_loss)
    metrics.inc("kuberl_learner_wait_seconds_total", tally.learner_wait)
    metrics.inc("kuberl_worker_weight_wait_seconds_total", tally.worker_wait)
    for key, value in tally.extra.items():  # the algorithm's figures that are metrics (kuberl_preference_*)
        if METRICS.get(f"kuberl_{key}", ("",))[0] == "gauge" and not math.isnan(value):
            metrics.set(f"kuberl_{key}", value)
        elif key.startswith(POLICY_RETURN_PREFIX):  # a policy group's return (algorithms.groups)
            metrics.set_policy_return(key.removeprefix(POLICY_RETURN_PREFIX), value)


def publish_restored(metrics: LearnerMetrics, counters: Counters, desired_workers: int) -> None:
    """At start: counters continue across restarts, so they start at the checkpoint's values."""
    metrics.inc("kuberl_episodes_total", counters.episodes)
    metrics.inc("kuberl_env_steps_total", counters.env_steps)
    metrics.inc("kuberl_gradient_updates_total", counters.gradient_updates)
    metrics.inc("kuberl_iterations_total", counters.iterations)
    metrics.inc("kuberl_rollout_worker_restarts_total", counters.worker_restarts)
    metrics.inc("kuberl_checkpoints_total", counters.checkpoints)
    metrics.inc("kuberl_learner_wait_seconds_total", counters.learner_wait)
    metrics.inc("kuberl_worker_weight_wait_seconds_total", counters.worker_wait)
    metrics.set("kuberl_rollout_workers_desired", desired_workers)

"""The operator's own Prometheus metrics, served on its metrics port: names `kuberl_operator_*`.

The learner's metrics live in kuberl.trainer.metrics; the dashboard and README use both tables.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter as _Tally
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kuberl.api.job import Phase

#: name -> (type, help). Names as scraped (counters end in _total).
METRICS: dict[str, tuple[str, str]] = {
    "kuberl_operator_jobs": ("gauge", "RLTrainingJobs this operator watches, by phase."),
    "kuberl_operator_reconcile_duration_seconds": (
        "histogram", "Seconds one handler run took (create, update, timer, pod event), by handler."),
    "kuberl_operator_child_pods_created_total": ("counter", "Child pods created, by component."),
    "kuberl_operator_child_pod_restarts_total": (
        "counter", "Child pods replaced after they failed or disappeared, by component."),
    "kuberl_operator_phase_transitions_total": ("counter", "Job phase transitions, by the phase entered."),
    "kuberl_operator_event_loop_lag_seconds": (
        "histogram", "How late the operator's event loop woke a 0.1 s timer: time it was held up by one task."),
    "kuberl_operator_errors_total": (
        "counter", "Errors in handlers and progress scrapes, by handler and error kind."),
    "kuberl_operator_sweep_trials": (
        "gauge", "Trials of the RLSweeps this operator watches, by state (running, succeeded, stopped, failed)."),
    "kuberl_operator_sweep_best_objective": (
        "gauge", "Each RLSweep's best configuration so far: the IQM of its runs' objective (spec.objective)."),
}

#: A sweep trial's states, as the kuberl_operator_sweep_trials gauge labels them.
SWEEP_TRIAL_STATES = ("running", "succeeded", "stopped", "failed")
#: Buckets for event-loop lag: under 10 ms is healthy; 100 ms is the most one job may hold the loop up.
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Buckets for reconcile durations: a handler run is milliseconds; API latency can make it seconds.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class OperatorMetrics:
    """Every operator metric in one private registry; thread-safe like prometheus_client itself."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        help_ = {name: text for name, (_kind, text) in METRICS.items()}
        self.jobs = Gauge("kuberl_operator_jobs", help_["kuberl_operator_jobs"], ["phase"],
                          registry=self.registry)
        self.reconcile_duration = Histogram(
            "kuberl_operator_reconcile_duration_seconds", help_["kuberl_operator_reconcile_duration_seconds"],
            ["handler"], buckets=RECONCILE_BUCKETS, registry=self.registry)
        self.pods_created = Counter("kuberl_operator_child_pods_created", help_[
            "kuberl_operator_child_pods_created_total"], ["component"], registry=self.registry)
        self.pod_restarts = Counter("kuberl_operator_child_pod_restarts", help_[
            "kuberl_operator_child_pod_restarts_total"], ["component"], registry=self.registry)
        self.transitions = Counter("kuberl_operator_phase_transitions", help_[
            "kuberl_operator_phase_transitions_total"], ["phase"], registry=self.registry)
        self.loop_lag = Histogram(
            "kuberl_operator_event_loop_lag_seconds", help_["kuberl_operator_event_loop_lag_seconds"],
            buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        self.errors = Counter("kuberl_operator_errors", help_["kuberl_operator_errors_total"],
                              ["handler", "kind"], registry=self.registry)
        self.sweep_trials = Gauge("kuberl_operator_sweep_trials", help_["kuberl_operator_sweep_trials"],
                                  ["state"], registry=self.registry)
        self.sweep_best = Gauge("kuberl_operator_sweep_best_objective", help_["kuberl_operator_sweep_best_objective"],
                                ["namespace", "sweep"], registry=self.registry)
        for phase in Phase:
            self.jobs.labels(phase.value).set(0)
        for state in SWEEP_TRIAL_STATES:
            self.sweep_trials.labels(state).set(0)
        self._phases: dict[str, str] = {}
        self._sweeps: dict[tuple[str, str], dict[str, int]] = {}
        self._lock = threading.Lock()
        self.server: Any = None

    def job_phase(self, uid: str, phase: str | None) -> None:
        """Record a job's current phase (None: the job is gone) and recount the jobs gauge."""
        with self._lock:
            if phase is None:
                self._phases.pop(uid, None)
            else:
                self._phases[uid] = phase
            tally = _Tally(self._phases.values())
            for p in Phase:
                self.jobs.labels(p.value).set(tally.get(p.value, 0))

    def sweep(self, namespace: str, name: str, counts: dict[str, int] | None, best: float | None = None) -> None:
        """Record a sweep's trials by state and its best objective (counts None: the sweep is gone), and
        recount the trials gauge."""
        with self._lock:
            if counts is None:
                self._sweeps.pop((namespace, name), None)
                with contextlib.suppress(KeyError):
                    self.sweep_best.remove(namespace, name)
            else:
                self._sweeps[(namespace, name)] = counts
                if best is not None:
                    self.sweep_best.labels(namespace, name).set(best)
            for state in SWEEP_TRIAL_STATES:
                self.sweep_trials.labels(state).set(sum(c.get(state, 0) for c in self._sweeps.values()))

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start /metrics; returns the bound port (0 picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.server = server
        return server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


#: The process-wide instance the handlers record into (tests read it, or build their own).
OPERATOR_METRICS = OperatorMetrics()

"""The learner's Prometheus metrics: one registry, names `kuberl_<noun>_<unit>`, documented in the README.

Labels: job_name, namespace, algorithm, environment (never `job`, which Prometheus renames).
Imports prometheus_client only, so the dashboard test and the operator can read the names.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

LABELS = ("job_name", "namespace", "algorithm", "environment")

#: name -> (type, help). The README table and the Grafana dashboard are checked against this.
METRICS: dict[str, tuple[str, str]] = {
    "kuberl_episodes_total": ("counter", "Training episodes finished."),
    "kuberl_env_steps_total": ("counter", "Environment steps taken by all rollout workers."),
    "kuberl_episodes_per_second": ("gauge", "Episodes per second over the last iteration window."),
    "kuberl_env_steps_per_second": ("gauge", "Environment steps per second over the last iteration window."),
    "kuberl_training_wall_clock_seconds": ("gauge", "Seconds since training started (resumed runs add on)."),
    "kuberl_gradient_updates_total": ("counter", "Gradient (or table) updates applied by the learner."),
    "kuberl_iterations_total": ("counter", "Learner iterations (collect + learn rounds)."),
    "kuberl_episode_return_mean": ("gauge", "Mean training return over the stopping window."),
    "kuberl_policy_episode_return_mean": (
        "gauge", "Mean training return of one policy group's agents (environment.multiAgent.groups) in the "
                 "iteration's episodes, labelled by policy."),
    "kuberl_rollout_workers_ready": ("gauge", "Rollout workers alive and sampling."),
    "kuberl_rollout_workers_desired": ("gauge", "Rollout workers wanted by the job spec."),
    "kuberl_rollout_worker_restarts_total": ("counter", "Rollout actors that died and were replaced."),
    "kuberl_learner_loss": ("gauge", "Learner's total loss on the last update."),
    "kuberl_checkpoint_timestamp_seconds": ("gauge", "Unix time of the newest checkpoint (0 before the first)."),
    "kuberl_checkpoints_total": ("counter", "Checkpoints written."),
    "kuberl_checkpoint_iteration": (
        "gauge", "Learner iteration of the newest checkpoint (its file is ckpt-<iteration>.pt)."),
    "kuberl_checkpoint_seconds": (
        "gauge", "Seconds the newest checkpoint took to write to disk (serialised and synced): what a SIGTERM's "
                 "checkpoint needs of the pod's grace period, with the upload (0 before the first)."),
    "kuberl_checkpoint_upload_seconds": (
        "gauge", "Seconds the newest checkpoint took to reach the object store (spec.checkpointing.s3), commit "
                 "included (0 before the first, and without one)."),
    "kuberl_checkpoint_upload_failures_total": (
        "counter", "Checkpoints the object store (spec.checkpointing.s3) did not take after retries; the "
                   "local copy stays."),
    "kuberl_learner_wait_seconds_total": ("counter", "Seconds the learner waited for rollout data."),
    "kuberl_worker_weight_wait_seconds_total": ("counter", "Seconds rollout workers waited for new weights."),
    "kuberl_policy_staleness_updates": (
        "gauge", "Gradient updates between the policy a batch was collected with and the learner's."),
    "kuberl_evaluation_return_mean": ("gauge", "Mean return of the final deterministic evaluation."),
    "kuberl_evaluation_win_rate": ("gauge", "Win rate of an evaluation suite (two-player envs), labelled by suite."),
    "kuberl_job_finished": ("gauge", "1 once training has finished (stopping condition met), else 0."),
    "kuberl_stopped_by": (
        "gauge", "1 for the reason training stopped (label reason: target_return, max_env_steps, max_episodes, "
                 "max_wall_clock_seconds, signal), once it has."),
    "kuberl_first_step_timestamp_seconds": (
        "gauge", "Unix time the learner first received env steps from its rollout workers (0 before)."),
    "kuberl_time_to_first_step_seconds": (
        "gauge", "Seconds from the learner process's start to its first env steps (0 before)."),
    "kuberl_tracker_reachable": (
        "gauge", "1 while the experiment tracker (spec.tracking) answers, 0 while it does not (its metrics wait); "
                 "absent without one."),
    "kuberl_preference_accuracy": ("gauge", "Preference head: share of held-out ranked pairs it orders right."),
    "kuberl_preference_pairs_used": ("gauge", "Preference head: ranked pairs taken in so far (teacher and people)."),
    "kuberl_preference_pairs_human": ("gauge", "Preference head: ranked pairs taken in from the pairs file."),
    "kuberl_preference_pairs_rejected": ("gauge", "Preference head: pairs-file lines skipped as malformed."),
    "kuberl_preference_loss": ("gauge", "Preference head: mean Bradley-Terry loss over the last iteration."),
}


#: Metrics with a label of their own beside LABELS.
#: A metrics row's key for one policy group's mean return: `mean_return/<group>` (kuberl.trainer.algorithms.groups).
POLICY_RETURN_PREFIX = "mean_return/"
EXTRA_LABELS = {"kuberl_evaluation_win_rate": ("suite",), "kuberl_stopped_by": ("reason",),
                "kuberl_policy_episode_return_mean": ("policy",)}
#: Metrics exported only once set: a job without a tracker has no tracker to call unreachable.
ONLY_ONCE_SET = frozenset({"kuberl_tracker_reachable"})


@dataclass
class JobLabels:
    job_name: str
    namespace: str
    algorithm: str
    environment: str

    def values(self) -> tuple[str, str, str, str]:
        return (self.job_name, self.namespace, self.algorithm, self.environment)


class LearnerMetrics:
    """Holds every learner metric bound to one job's labels, in a private registry."""

    def __init__(self, labels: JobLabels, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.labels = labels
        self._m: dict[str, object] = {}
        for name, (kind, help_text) in METRICS.items():
            extra = EXTRA_LABELS.get(name, ())
            if kind == "counter":
                metric = Counter(name.removesuffix("_total"), help_text, LABELS + extra, registry=self.registry)
            else:
                metric = Gauge(name, help_text, LABELS + extra, registry=self.registry)
            self._m[name] = metric if extra or name in ONLY_ONCE_SET else metric.labels(*labels.values())
        self._m["kuberl_checkpoint_timestamp_seconds"].set(0)
        self._m["kuberl_job_finished"].set(0)
        self.first_step_at: float | None = None
        self.server = None

    def mark_first_step(self, now: float | None = None) -> None:
        """The first env steps arrived: when, and how long after this process started (on a cluster, its
        container). Later calls keep the first."""
        if self.first_step_at is not None:
            return
        self.first_step_at = time.time() if now is None else now
        self.set("kuberl_first_step_timestamp_seconds", self.first_step_at)
        self.set("kuberl_time_to_first_step_seconds", max(0.0, self.first_step_at - process_start_time()))

    def __getitem__(self, name: str):
        return self._m[name]

    def inc(self, name: str, amount: float = 1.0) -> None:
        if amount > 0:
            self._m[name].inc(amount)

    def set(self, name: str, value: float) -> None:
        if name in ONLY_ONCE_SET:
            self._m[name].labels(*self.labels.values()).set(value)
        else:
            self._m[name].set(value)

    def set_win_rate(self, suite: str, value: float) -> None:
        self._m["kuberl_evaluation_win_rate"].labels(*self.labels.values(), suite).set(value)

    def set_policy_return(self, policy: str, value: float) -> None:
        self._m["kuberl_policy_episode_return_mean"].labels(*self.labels.values(), policy).set(value)

    def set_stopped_by(self, reason: str) -> None:
        self._m["kuberl_stopped_by"].labels(*self.labels.values(), reason).set(1)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the /metrics HTTP server; returns the bound port (port 0 picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.server = server
        return server.server_address[1]

    def samples_text(self, limit: int = 4096) -> str:
        """The metrics as exposition sample lines (no HELP/TYPE), cut at a whole line within `limit` bytes.
        The job's own labels (LABELS) are left out: the pod is the job's, and the operator reads an unlabelled
        sample as its job's. With them, a job's long name, namespace and env id repeated on every line pushed
        the last samples (kuberl_job_finished among them) past Kubernetes' 4096 bytes."""
        from prometheus_client.utils import floatToGoString

        out, size = [], 0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                own = ",".join(f'{key}="{_escaped(value)}"' for key, value in sample.labels.items()
                               if key not in LABELS)
                line = f"{sample.name}{{{own}}} {floatToGoString(sample.value)}" if own else \
                    f"{sample.name} {floatToGoString(sample.value)}"
                if size + len(line.encode()) + 1 > limit:
                    return "\n".join(out) + "\n"
                out.append(line)
                size += len(line.encode()) + 1
        return "\n".join(out) + "\n"

    def write_termination_message(self) -> None:
        """In a pod: leave the final metrics as the container's termination message, so the operator
        reads the final progress and evaluation from the pod's status even after /metrics is gone."""
        write_termination_message(self.samples_text())

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _escaped(value: str) -> str:
    """A label value as the exposition format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """Unix time this process started, from Linux's /proc (its start in clock ticks after the boot, and the
    boot's time); where /proc cannot say, when this module was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


#: Kubernetes keeps at most 4096 bytes of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4096


def write_termination_message(text: str) -> None:
    """In a pod, write `text` to the container's terminationMessagePath (given in
    $KUBERL_TERMINATION_MESSAGE_PATH); elsewhere do nothing. Cut at Kubernetes' 4096 bytes."""
    import os

    path = os.environ.get("KUBERL_TERMINATION_MESSAGE_PATH")
    if not path:
        return
    data = text.encode()[:TERMINATION_MESSAGE_LIMIT].decode(errors="ignore")
    try:
        with open(path, "w") as handle:
            handle.write(data)
    except OSError as err:
        import logging

        logging.getLogger("kuberl.trainer").warning("cannot write the termination message to %s: %s", path, err)

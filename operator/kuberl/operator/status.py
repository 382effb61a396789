"""Status helpers: conditions in the Kubernetes shape, progress from the learner's /metrics text.

The only writer of `RLTrainingJob.status` is the reconcile loop in `jobs`; it builds the new
status with these functions and sends it only when it differs from what it last wrote.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from kuberl.api.job import (
    MAX_POLICY_GROUPS,
    Condition,
    EvaluationSpec,
    Progress,
    RLTrainingJobStatus,
    StopReason,
    is_group_name,
)

#: Condition types, all present once a job has been reconciled (status "True" or "False").
RUNNING = "Running"
DEGRADED = "Degraded"
COMPLETE = "Complete"
FAILED = "Failed"
SUSPENDED = "Suspended"
CONDITION_TYPES = (RUNNING, DEGRADED, COMPLETE, FAILED, SUSPENDED)
STOP_REASONS = frozenset(reason.value for reason in StopReason)
#: Only on a job with spec.tracking, once its learner has tried the tracker.
TRACKER_REACHABLE = "TrackerReachable"


def now() -> datetime:
    """UTC, whole seconds (Kubernetes times are RFC 3339 with second precision)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def get_condition(status: RLTrainingJobStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def set_condition(status: RLTrainingJobStatus, type_: str, value: bool, reason: str, message: str,
                  *, at: datetime, generation: int | None) -> None:
    """Set one condition; lastTransitionTime moves only when its status flips."""
    text = "True" if value else "False"
    old = get_condition(status, type_)
    changed_at = old.last_transition_time if old is not None and old.status == text else at
    new = Condition(type=type_, status=text, reason=reason, message=message,
                    last_transition_time=changed_at, observed_generation=generation)
    others = [c for c in status.conditions if c.type != type_]
    # Keep a stable order (CONDITION_TYPES), so an unchanged status serialises identically.
    merged = {c.type: c for c in [*others, new]}
    order = [t for t in CONDITION_TYPES if t in merged] + [t for t in merged if t not in CONDITION_TYPES]
    status.conditions = [merged[t] for t in order]


def is_true(status: RLTrainingJobStatus, type_: str) -> bool:
    cond = get_condition(status, type_)
    return cond is not None and cond.status == "True"


def dump(status: RLTrainingJobStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase; None kept so a merge patch clears the field)."""
    return status.model_dump(mode="json", by_alias=True)


def stored(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped status as the API server holds it after the merge patch: a null clears its field."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(dumped)


def load(raw: dict[str, Any] | None) -> RLTrainingJobStatus:
    return RLTrainingJobStatus.model_validate(raw or {})


def workers_column(ready: int, desired: int) -> str:
    return f"{ready}/{desired}"


# --------------------------------------------------------------------------------------------
# Progress from the learner's metrics
# --------------------------------------------------------------------------------------------

#: The learner's metric samples the job's progress is read from (kuberl.trainer.metrics.METRICS).
PROGRESS_METRICS = (
    "kuberl_episodes_total", "kuberl_env_steps_total", "kuberl_episodes_per_second",
    "kuberl_env_steps_per_second", "kuberl_episode_return_mean", "kuberl_training_wall_clock_seconds",
    "kuberl_gradient_updates_total", "kuberl_iterations_total",
)
#: Each policy group's mean return, labelled by policy (kuberl.trainer.metrics).
POLICY_RETURN_METRIC = "kuberl_policy_episode_return_mean"
CHECKPOINT_METRIC = "kuberl_checkpoint_timestamp_seconds"
FIRST_STEP_METRIC = "kuberl_first_step_timestamp_seconds"
#: What one checkpoint took: to disk, then to the object store (spec.checkpointing.s3).
CHECKPOINT_SECONDS_METRICS = ("kuberl_checkpoint_seconds", "kuberl_checkpoint_upload_seconds")
#: The longest checkpoint time taken from a learner: its figures are the tenant's, and the grace period
#: sized from them is bounded anyway (builders.MAX_LEARNER_GRACE_SECONDS).
MAX_CHECKPOINT_SECONDS = 3600.0


#: The largest integer the status holds: the API server stores integers as int64 and refuses a larger one,
#: which would stop every later status write of the job.
MAX_STATUS_INT = 2**63 - 1

#: The longest line read from a learner's metrics. A real learner's longest is a win-rate sample with the
#: longest names the spec allows: 529 characters. The text parser's time grows with the square of a line's
#: length on some inputs (17 s for one 1 MiB line of escaped quotes); with lines this short, a body of the
#: read cap (runtime.MAX_METRICS_BYTES) parses in about a second at worst.
MAX_METRICS_LINE_CHARS = 2048


#: Bounds of spec.evaluation.suites (its length and a suite's name).
MAX_SUITES = EvaluationSpec.model_fields["suites"].metadata[0].max_length
MAX_SUITE_NAME = 63


def _finite(value: float) -> float | None:
    """A sample's value as a finite float; None for NaN, +Inf, -Inf and integers past float's range (the
    text parser turns a value written as digits into an int of any size)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _count(value: float | None) -> int | None:
    """A non-negative count the status can hold; None when there is none."""
    if value is None or not 0 <= value <= MAX_STATUS_INT:
        return None
    return int(value)


def _timestamp(value: float | None) -> datetime | None:
    """A Unix time as a datetime; None for none yet (0) or one no datetime can hold."""
    if value is None or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value, timezone.utc).replace(microsecond=0)
    except (OverflowError, ValueError, OSError):
        return None


def _readable_rate(value: float) -> float:
    """A rate or a duration as a person reads it in `kubectl get`: to 0.1 (311.8905519378761 -> 311.9)."""
    return round(value, 1)


def _readable_return(value: float) -> float:
    """A return to 0.1, or to 3 significant figures where that keeps more (-207.775 -> -207.8,
    0.93456 -> 0.935): Tic-Tac-Toe's returns lie between -1 and 1."""
    if value == 0:
        return 0.0
    return round(value, max(1, 2 - math.floor(math.log10(abs(value)))))


def _readable_fraction(value: float) -> float:
    """A fraction such as a win rate, to 0.001 (a tenth of a percent)."""
    return round(value, 3)


def _progress(samples: dict[str, float], policy_returns: dict[str, float]) -> Progress:
    """Progress, field by field, from its (finite) metrics; a missing sample reads as the field's default.
    Rates and returns are rounded for `kubectl get` (the learner's metrics and files keep them whole), which
    also spares the status a write for a change in the fifteenth digit."""

    def count(metric: str) -> int:
        return _count(samples.get(metric)) or 0

    def rate(metric: str) -> float:
        return _readable_rate(max(0.0, samples.get(metric, 0.0)))

    mean_return = samples.get("kuberl_episode_return_mean")
    return Progress(
        episodes=count("kuberl_episodes_total"),
        env_steps=count("kuberl_env_steps_total"),
        episodes_per_second=rate("kuberl_episodes_per_second"),
        env_steps_per_second=rate("kuberl_env_steps_per_second"),
        mean_return=None if mean_return is None else _readable_return(mean_return),
        returns_by_policy={name: _readable_return(value) for name, value in sorted(policy_returns.items())}
        if policy_returns else None,
        wall_clock_seconds=rate("kuberl_training_wall_clock_seconds"),
        gradient_updates=count("kuberl_gradient_updates_total"),
        iterations=count("kuberl_iterations_total"),
    )


class LearnerReport:
    """What one scrape of the learner's /metrics says."""

    def __init__(self, progress: Progress, last_checkpoint_time: datetime | None, finished: bool,
                 last_checkpoint: str | None = None, evaluation: dict[str, Any] | None = None,
                 first_step_time: float | None = None, tracker_reachable: bool | None = None,
                 stopped_by: StopReason | None = None, checkpoint_seconds: float | None = None):
        self.progress = progress
        #: What the newest checkpoint took, to disk and to the store; None before the first.
        self.checkpoint_seconds = checkpoint_seconds
        #: Why training stopped, once the learner has finished.
        self.stopped_by = stopped_by
        #: Whether the experiment tracker answers the learner; None without one (or before it has tried).
        self.tracker_reachable = tracker_reachable
        self.last_checkpoint_time = last_checkpoint_time
        self.finished = finished
        self.last_checkpoint = last_checkpoint
        self.evaluation = evaluation
        #: Unix time the learner first received env steps (as it says: `time_to_first_step` bounds it).
        self.first_step_time = first_step_time


class _Samples(NamedTuple):
    values: dict[str, float]
    win_rates: dict[str, float]
    policy_returns: dict[str, float]
    stopped_by: StopReason | None


def _read_samples(text: str, job_name: str | None) -> _Samples:
    """The first finite value of each sample name (job_name's, or unlabelled), win rates by suite, returns by
    policy group, and why training stopped (a reason KubeRL knows, else none). A sample that is NaN, infinite
    or past float's range is skipped, as if the learner had not sent it."""
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > MAX_METRICS_LINE_CHARS:
            raise ValueError(f"line {number} of the metrics is {len(line)} characters long; the most read is "
                             f"{MAX_METRICS_LINE_CHARS} (a learner's longest is under 600)")
    samples: dict[str, float] = {}
    win_rates: dict[str, float] = {}
    policy_returns: dict[str, float] = {}
    stopped_by: StopReason | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if job_name is not None and sample.labels.get("job_name", job_name) != job_name:
                    continue
                value = _finite(sample.value)
                if value is None:
                    continue
                if sample.name == "kuberl_evaluation_win_rate" and "suite" in sample.labels:
                    # As many suites as a spec can name, with names a spec can hold: the rest is not
                    # this job's, and would only grow its status.
                    suite = sample.labels["suite"]
                    if len(suite) <= MAX_SUITE_NAME and (suite in win_rates or len(win_rates) < MAX_SUITES):
                        win_rates[suite] = value
                    continue
                if sample.name == POLICY_RETURN_METRIC:
                    # Only names a spec's groups can have, and no more of them than a spec can give.
                    policy = sample.labels.get("policy", "")
                    if is_group_name(policy) and (policy in policy_returns
                                                   or len(policy_returns) < MAX_POLICY_GROUPS):
                        policy_returns.setdefault(policy, value)
                    continue
                if sample.name == "kuberl_stopped_by":
                    if value >= 1.0 and stopped_by is None and sample.labels.get("reason") in STOP_REASONS:
                        stopped_by = StopReason(sample.labels["reason"])
                    continue
                samples.setdefault(sample.name, value)
    except OverflowError as err:  # a sample timestamp past float's range
        raise ValueError(f"the metrics are not Prometheus text format: {err}") from None
    return _Samples(samples, win_rates, policy_returns, stopped_by)


def parse_learner_metrics(text: str, job_name: str | None = None) -> LearnerReport:
    """Read progress from Prometheus exposition text. Samples of another job_name are ignored.

    Raises ValueError when the text is not exposition format or carries no KubeRL progress at all
    (a wrong URL answering 200 must not zero a job's progress). The text may be hostile (the learner pod
    is the tenant's): no NaN, infinity or number the API server cannot store reaches the report.
    """
    samples, win_rates, policy_returns, stopped_by = _read_samples(text, job_name)
    if not any(name in samples for name in PROGRESS_METRICS):
        raise ValueError("no kuberl_* progress metrics in the response")
    checkpoint_time = _timestamp(samples.get(CHECKPOINT_METRIC))
    finished = samples.get("kuberl_job_finished", 0.0) >= 1.0
    iteration = _count(samples.get("kuberl_checkpoint_iteration"))
    last_checkpoint = f"ckpt-{iteration:09d}.pt" if checkpoint_time and iteration else None
    evaluation = None
    # The learner sets its evaluation gauges before it reports finished: only then are they results.
    main_return = samples.get("kuberl_evaluation_return_mean")
    if finished and main_return is not None:
        evaluation = {"deterministic": {"meanReturn": _readable_return(main_return)}}
        for suite, rate in sorted(win_rates.items()):
            evaluation[suite] = {"winRate": _readable_fraction(rate)}
    first_step = samples.get(FIRST_STEP_METRIC)
    reachable = samples.get("kuberl_tracker_reachable")
    return LearnerReport(_progress(samples, policy_returns), checkpoint_time, finished, last_checkpoint, evaluation,
                         first_step if first_step is not None and first_step > 0 else None,
                         None if reachable is None else reachable >= 1.0, stopped_by if finished else None,
                         _checkpoint_seconds(samples))


def _checkpoint_seconds(samples: dict[str, float]) -> float | None:
    """What the newest checkpoint took, to disk and to the store, to 0.1; None before the first, and for
    figures no checkpoint takes (negative, or past MAX_CHECKPOINT_SECONDS)."""
    parts = [samples.get(name, 0.0) for name in CHECKPOINT_SECONDS_METRICS]
    if any(not 0 <= part <= MAX_CHECKPOINT_SECONDS for part in parts) or sum(parts) <= 0:
        return None
    return round(min(sum(parts), MAX_CHECKPOINT_SECONDS), 1)


def time_to_first_step(first_step_time: float | None, created: datetime | None, now: datetime) -> float | None:
    """Seconds from the job's creation to the learner's first env steps, to 0.1; None when either is unknown or
    the learner's time is not between the two (its clock is the tenant's to set: a time before the job
    existed or after this moment is not a start-up)."""
    if first_step_time is None or created is None:
        return None
    seconds = first_step_time - created.timestamp()
    if not 0 <= seconds <= (now - created).total_seconds() + 1:
        return None
    return round(seconds, 1)

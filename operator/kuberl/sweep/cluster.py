"""One pass of a sweep on a cluster, as data: from the sweep, its recorded trials and what its trial jobs say
now, the trials to start, the trials to stop, the new record and the ranking. The operator runs it in a
thread (Optuna and SciPy work here); nothing here calls the API server.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from typing import Any

from kuberl.api.sweep import (
    MAX_RANKED,
    MAX_REPORTS,
    ConfigurationResult,
    Metric,
    RLSweep,
    TrialCounts,
    TrialState,
    TrialStatus,
    trial_name,
)
from kuberl.sweep import statistics
from kuberl.sweep.engine import SweepChanged, SweepEngine, TrialInfo, TrialOutcome

DEADLINE_MESSAGE = "stopped: spec.activeDeadlineSeconds passed"


@dataclasses.dataclass
class SweepPass:
    """What one pass decided."""

    trials: list[TrialStatus]
    #: Trial jobs to create if absent: new trials, and recorded running ones whose job is missing.
    create: list[dict[str, Any]]
    #: Trial jobs to suspend: stopped by the pruner, or past the sweep's deadline.
    suspend: list[str]
    counts: TrialCounts
    #: Trials finished / the budget, for kubectl get.
    progress: str
    #: Every trial of the budget has finished (or the deadline passed and none runs).
    done: bool
    #: The ranking, recomputed when a trial finished this pass (None: keep the last one).
    ranking: list[ConfigurationResult] | None


def rounded(value: float | None, digits: int = 4) -> float | None:
    """A number a person reads: four significant digits."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def plan_pass(sweep: RLSweep, recorded: list[TrialStatus], jobs: dict[str, dict[str, Any]],
              started: datetime | None, now: datetime, ranked: bool) -> SweepPass:
    """The study rebuilt from `recorded` (the sweep's status), each running trial's job (`jobs`, by name) told
    to the engine, then new trials up to spec.parallelism. `ranked` False: rank even if nothing finished."""
    try:
        engine = SweepEngine.from_record(sweep, recorded)
    except (KeyError, ValueError) as err:  # optuna's own checks raise ValueError too
        raise SweepChanged(f"the trials recorded in the status do not fit the sweep's spec ({err}): the "
                           "parameters changed after trials started; create a new sweep for new parameters") from None
    trials = {t.number: t.model_copy(deep=True) for t in recorded}
    deadline = sweep.spec.active_deadline_seconds
    past_deadline = deadline is not None and started is not None and now >= started + timedelta(seconds=deadline)
    finished = False
    for trial in trials.values():
        if trial.state != TrialState.RUNNING or trial.name not in jobs:
            continue
        _observe(engine, trial, jobs[trial.name])
        if trial.state == TrialState.RUNNING and past_deadline:
            engine.finish(trial.number, TrialState.FAILED)
            trial.state, trial.message = TrialState.FAILED, DEADLINE_MESSAGE
        if trial.state != TrialState.RUNNING:
            finished = True
    # A stopped trial's job is suspended, again on a later pass if a patch did not go through.
    suspend = [t.name for t in trials.values() if t.state in (TrialState.STOPPED, TrialState.FAILED)
               and t.name in jobs and _job_phase(jobs[t.name]) not in ("Succeeded", "Failed", "Suspended")
               and not (jobs[t.name].get("spec") or {}).get("suspend")]
    running = sum(t.state == TrialState.RUNNING for t in trials.values())
    while running < sweep.spec.parallelism and not past_deadline:
        info = engine.next_trial()
        if info is None:
            break
        trials[info.number] = TrialStatus(number=info.number, name=trial_name(sweep.metadata.name, info.number),
                                          configuration=info.configuration, parameters=info.params, seed=info.seed)
        running += 1
    ordered = [trials[n] for n in sorted(trials)]
    create = [engine.trial_job(_info(t)) for t in ordered if t.state == TrialState.RUNNING and t.name not in jobs]
    counts = TrialCounts(**{state.value.lower(): sum(t.state == state for t in ordered) for state in TrialState})
    ended = counts.succeeded + counts.stopped + counts.failed
    ranking = rank(sweep, engine.trials()) if finished or not ranked else None
    return SweepPass(ordered, create, suspend, counts, f"{ended}/{engine.max_trials}", running == 0, ranking)


def _job_phase(job: dict[str, Any]) -> str | None:
    return (job.get("status") or {}).get("phase")


def _observe(engine: SweepEngine, trial: TrialStatus, job: dict[str, Any]) -> None:
    """A running trial's job as its status says now: its progress reported to the pruner, or its end."""
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    trial.env_steps = int(progress.get("envSteps") or 0)
    trial.mean_return = rounded(progress.get("meanReturn"))
    phase = status.get("phase")
    if phase == "Succeeded":
        value = engine.final_value(_outcome(engine, status))
        state = TrialState.SUCCEEDED if value is not None and math.isfinite(value) else TrialState.FAILED
        engine.finish(trial.number, state, value)
        trial.state, trial.objective = state, rounded(value) if state == TrialState.SUCCEEDED else None
        if state == TrialState.FAILED:
            trial.message = f"its job succeeded without a {engine.metric.value} to score"
        return
    if phase == "Failed":
        engine.finish(trial.number, TrialState.FAILED)
        trial.state = TrialState.FAILED
        trial.message = f"its job failed: {status.get('reason') or ''} {status.get('message') or ''}".strip()[:500]
        return
    if engine.report(trial.number, trial.env_steps, progress.get("meanReturn")):
        engine.finish(trial.number, TrialState.STOPPED)
        trial.state = TrialState.STOPPED
        trial.message = f"stopped by the pruner at {trial.env_steps} env steps"
    reports = engine.study.get_trials(deepcopy=False)[trial.number].intermediate_values
    trial.reports = {str(step): reports[step] for step in sorted(reports)[-MAX_REPORTS:]}


def _outcome(engine: SweepEngine, status: dict[str, Any]) -> TrialOutcome:
    """What a succeeded trial job measured, from its status."""
    progress = status.get("progress") or {}
    deterministic = ((status.get("evaluation") or {}).get("deterministic") or {}).get("meanReturn")
    target = engine.sweep.spec.template.stopping.target_return
    mean_return = progress.get("meanReturn")
    reached = target is not None and mean_return is not None and mean_return >= target
    return TrialOutcome(mean_return, deterministic, int(progress.get("envSteps") or 0), reached)


def _info(trial: TrialStatus) -> TrialInfo:
    return TrialInfo(trial.number, trial.configuration, dict(trial.parameters), trial.seed, TrialState.RUNNING)


def rank(sweep: RLSweep, infos: list[TrialInfo]) -> list[ConfigurationResult]:
    """Configurations best first by the IQM of their finished runs, with 95% bootstrap intervals."""
    higher = sweep.spec.objective.metric != Metric.ENV_STEPS_TO_TARGET
    out: list[ConfigurationResult] = []
    for ranked in statistics.rank(infos, higher_is_better=higher):
        if ranked.rank is None or ranked.interval is None or len(out) >= MAX_RANKED:
            break
        interval = ranked.interval
        result = ConfigurationResult(rank=ranked.rank, configuration=ranked.configuration,
                                     parameters=ranked.params, iqm=rounded(interval.estimate),
                                     ci_low=rounded(interval.low), ci_high=rounded(interval.high),
                                     runs=len(ranked.values))
        result.summary = summary(result)
        out.append(result)
    return out


def summary(result: ConfigurationResult) -> str:
    """`learningRate=0.0025 IQM 187.2 [160.1, 201.3]`: the values by the last part of their path."""
    values = " ".join(f"{path.rsplit('.', 1)[-1]}={_show(value)}" for path, value in result.parameters.items())
    interval = f" [{result.ci_low:g}, {result.ci_high:g}]" if result.ci_low is not None else ""
    return f"{values} IQM {result.iqm:g}{interval}"


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

"""How a job's phase reads in its status: the conditions each phase sets and the message a user reads.

The planner (`lifecycle`) decides the phase; `write_conditions` makes the rest of the status agree with it.
"""

from __future__ import annotations

from datetime import datetime

from kuberl.api.job import Phase, RLTrainingJob, RLTrainingJobStatus, StopReason
from kuberl.operator import status as job_status


def write_conditions(status: RLTrainingJobStatus, *, generation: int | None, now: datetime,
                     job: RLTrainingJob | None) -> str:
    """observedGeneration, and the Running, Complete, Failed, Suspended and Degraded conditions from
    status.phase; returns the phase's message (what an Event for a transition to it says)."""
    phase = Phase(status.phase)
    status.observed_generation = generation
    if phase == Phase.FAILED:
        status.workers_ready, status.workers = 0, job_status.workers_column(0, status.workers_desired)
    if phase not in (Phase.FAILED, Phase.QUEUED, Phase.STARTING):
        status.message = None  # what a queued or starting job waited for is over
    message = phase_message(status, job)

    running_reason = {Phase.RUNNING: "Training", Phase.SUCCEEDED: "Completed",
                      Phase.FAILED: status.reason or "Failed"}
    job_status.set_condition(status, job_status.RUNNING, phase == Phase.RUNNING,
                             running_reason.get(phase, phase.value), message, at=now, generation=generation)
    succeeded = phase == Phase.SUCCEEDED
    job_status.set_condition(status, job_status.COMPLETE, succeeded,
                             "TrainingFinished" if succeeded else phase.value,
                             message if succeeded else "", at=now, generation=generation)
    failed = phase == Phase.FAILED
    job_status.set_condition(status, job_status.FAILED, failed,
                             (status.reason or "Failed") if failed else phase.value,
                             (status.message or "") if failed else "", at=now, generation=generation)
    suspended = phase == Phase.SUSPENDED
    job_status.set_condition(status, job_status.SUSPENDED, suspended,
                             "SuspendedBySpec" if suspended else phase.value,
                             message if suspended else "", at=now, generation=generation)
    degraded = job_status.get_condition(status, job_status.DEGRADED)
    if degraded is None or phase not in (Phase.RUNNING, Phase.STARTING):
        job_status.set_condition(status, job_status.DEGRADED, False, phase.value, "", at=now,
                                 generation=generation)
    return message


def phase_message(status: RLTrainingJobStatus, job: RLTrainingJob | None) -> str:
    """What the job is doing in its phase, in a user's words (the Running condition's message)."""
    phase = Phase(status.phase)
    if phase == Phase.PENDING:
        return "waiting for the operator to create the job's pods"
    if phase == Phase.QUEUED:
        return status.message or "waiting for Kueue to admit the job's pods"
    if phase == Phase.STARTING:
        return (f"waiting for the Ray head, the learner and {status.workers_desired} rollout workers "
                "to be ready")
    if phase == Phase.RUNNING:
        return "the learner is training"
    if phase == Phase.SUCCEEDED:
        return summary(status)
    if phase == Phase.SUSPENDED:
        return ("spec.suspend is true: the job's pods are deleted; set it to false to resume"
                + ("" if job is None or job.spec.checkpointing.volume.claim_name else
                   " (checkpoints were on an emptyDir and are gone: training starts over)"))
    return status.message or ""


#: A finished job's stop reason in a user's words, naming the spec field that stopped it.
STOPPED_BY_TEXT = {
    StopReason.TARGET_RETURN: "reached stopping.targetReturn",
    StopReason.MAX_ENV_STEPS: "reached stopping.maxEnvSteps",
    StopReason.MAX_EPISODES: "reached stopping.maxEpisodes",
    StopReason.MAX_WALL_CLOCK_SECONDS: "reached stopping.maxWallClockSeconds",
    StopReason.SIGNAL: "stopped by SIGTERM",
}


def summary(status: RLTrainingJobStatus) -> str:
    """A finished job's one line: what training did."""
    progress = status.progress
    why = f" ({STOPPED_BY_TEXT[StopReason(status.stopped_by)]})" if status.stopped_by else ""
    text = f"training finished{why}: {progress.episodes} episodes, {progress.env_steps} env steps"
    if progress.mean_return is not None:
        text += f", mean return {progress.mean_return:.4g}"
    if progress.returns_by_policy:
        text += ", by policy: " + ", ".join(f"{name} {value:.4g}" for name, value in progress.returns_by_policy.items())
    return text

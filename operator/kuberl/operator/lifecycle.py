"""The reconcile decision, as a pure function: (job, status, pods, now) -> what to create, delete and report.

`plan()` validates the job, runs the steps of its phase (`STEPS_BY_PHASE`) and returns a `Plan`: pods
to create and delete, the new status (the only one the operator writes), and Events. The handlers do
the I/O; everything a user relies on about the lifecycle is decided here, and the unit tests drive it
with plain dicts.

What each phase does:
- any phase: an invalid spec fails the job (`InvalidSpec`) before any pod exists; fixing the spec
  retries it;
- Succeeded, Failed: the job keeps its learner pod (for logs) and loses the rest; ttlSecondsAfterFinished
  deletes it;
- Pending, Queued, Starting, Running: the learner exiting 0 is success; `suspend` deletes every pod, the
  learner first (it checkpoints on SIGTERM while its Ray cluster is still up); the learner or the head
  failing (or vanishing while the job is Running) is a restart counted against backoffLimit; a new
  head starts a new Ray epoch, and the learner and workers of the old one are recreated, since they
  belonged to a cluster that is gone; a failed or vanished rollout worker is replaced (the job is
  Degraded meanwhile); replicas are followed up and down by worker index; a job with a Kueue queue is
  one gated pod group (`kueue`): Queued until Kueue lifts the gates, and a change of its size re-queues
  it; while Starting, pods' waiting reasons are reported (`startup`), and startupDeadlineSeconds fails
  a job that does not reach Running in time;
- Suspended: the same, once `suspend` is false again: resuming restarts the activeDeadlineSeconds
  clock, like a batch Job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kuberl.api.job import Phase, RLTrainingJob, RLTrainingJobStatus
from kuberl.api.problems import Problem
from kuberl.operator import builders, kueue, names, phases, refusals, startup
from kuberl.operator import status as job_status
from kuberl.operator.builders import BuildOptions
from kuberl.operator.names import Component
from kuberl.operator.pods import PodView

# Failure reasons (status.reason and the Failed condition's reason).
INVALID_SPEC = "InvalidSpec"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"


@dataclass(frozen=True)
class JobMeta:
    name: str
    namespace: str
    uid: str | None = None
    generation: int | None = None
    #: metadata.creationTimestamp: when `kubectl apply` made the job.
    created: datetime | None = None


@dataclass
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Plan:
    """What one reconcile pass decided."""

    status: RLTrainingJobStatus
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[PodView] = field(default_factory=list)
    ensure_services: bool = False
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    #: Seconds until a time-based action is due (TTL, deadline); None: nothing scheduled.
    wake_in: float | None = None
    #: Components whose pods were replaced this pass (operator metrics).
    restarts: list[Component] = field(default_factory=list)
    #: The job's PodDisruptionBudget's minAvailable, when scaling changed the job's pod count.
    budget_min_available: int | None = None

    @property
    def acted(self) -> bool:
        return bool(self.create or self.delete or self.delete_job)

    def wake(self, at: datetime, now: datetime) -> None:
        seconds = max(0.0, (at - now).total_seconds())
        self.wake_in = seconds if self.wake_in is None else min(self.wake_in, seconds)


def buildable(job: RLTrainingJob, options: BuildOptions) -> list[Problem]:
    """Problems the builders find that the model cannot (e.g. a CPU quantity Ray cannot read)."""
    problems = []
    for path, resources in (("spec.rolloutWorkers.resources", job.spec.rollout_workers.resources),):
        try:
            builders.cpu_count(resources)
        except ValueError as err:
            problems.append(Problem(path, str(err), resources.model_dump(by_alias=True)))
    return problems


class _Pass:
    """What one pass knows and has decided so far. A step that settles the pass sets `done`."""

    def __init__(self, plan: Plan, meta: JobMeta, problems: list[Problem], pods: list[PodView],
                 now: datetime, options: BuildOptions, before: Phase, deleted: frozenset[str],
                 workers_desired: int):
        self.plan, self.status, self.meta, self.problems = plan, plan.status, meta, problems
        self.now, self.options, self.deleted = now, options, deleted
        #: The phase the job was in when the pass began (before validation).
        self.before = before
        #: spec.rolloutWorkers.replicas (the status's own count when the spec does not parse).
        self.workers_desired = workers_desired
        self.owned = [pod for pod in pods if pod.owned]
        self.live = [pod for pod in self.owned if not pod.terminating]
        # Names we cannot create right now: a pod of that name is still terminating or not ours.
        self.blocked = {pod.name for pod in pods if pod.terminating or not pod.owned}
        # The live pods of the current Ray epoch, by component (`_sort_pods`).
        self.head_pod: PodView | None = None
        self.learner_pod: PodView | None = None
        self.worker_pods: dict[int, PodView] = {}  # index -> pod
        self.learner_replicas: dict[int, PodView] = {}  # rank -> pod, ranks >= 1
        #: The learner answered this pass's read of its /metrics past its first iteration: it trains.
        self.learner_training = False
        self.done = False

    @property
    def phase(self) -> Phase:
        return Phase(self.status.phase)

    def delete(self, pods: list[PodView]) -> None:
        for pod in pods:
            if pod not in self.plan.delete:
                self.plan.delete.append(pod)
                self.blocked.add(pod.name)

    def fail(self, reason: str, message: str, *, keep_ended_learner: bool = True) -> None:
        self.status.phase = Phase.FAILED
        self.status.reason, self.status.message = reason, message
        self.status.completion_time = self.now
        keep = [pod for pod in self.live
                if keep_ended_learner and pod.component == Component.LEARNER and pod.ended]
        self.delete([pod for pod in self.live if pod not in keep])
        self.set_workers(0)
        self.done = True

    def set_workers(self, ready: int) -> None:
        self.status.workers_ready, self.status.workers_desired = ready, self.workers_desired
        self.status.workers = job_status.workers_column(ready, self.workers_desired)

    def degraded(self, reason: str, message: str) -> None:
        job_status.set_condition(self.status, job_status.DEGRADED, True, reason, message, at=self.now,
                                 generation=self.meta.generation)

    def restarts_used(self) -> int:
        """Restarts counted against backoffLimit: a disrupted pod's replacement is not the job failing."""
        return self.status.learner_restarts + self.status.head_restarts - self.status.disruption_restarts


#: One step of a pass; the job is the validated one.
Step = Callable[[_Pass, RLTrainingJob], None]


def _checkpoint_note(job: RLTrainingJob) -> str:
    claim = job.spec.checkpointing.volume.claim_name
    if claim:
        return f"resuming from the newest checkpoint on PersistentVolumeClaim {claim}"
    return ("checkpoints were on an emptyDir, which died with the learner pod: training starts over "
            "(set spec.checkpointing.volume.claimName to resume instead)")


# -- validation, every phase ------------------------------------------------------------------------------


def _validate(pass_: _Pass, job: RLTrainingJob | None) -> None:
    """An invalid spec fails the job before any pod exists; a failed job whose spec now validates (a new
    generation) starts over."""
    if job is not None and not pass_.problems:
        pass_.problems = buildable(job, pass_.options)
    if pass_.phase == Phase.FAILED and pass_.status.reason == INVALID_SPEC:
        if pass_.problems or pass_.status.observed_generation == pass_.meta.generation:
            if pass_.problems:
                pass_.status.message = _problems_text(pass_.problems)
            # A learner that refused the spec stays for its log; nothing else runs.
            pass_.delete([pod for pod in pass_.live
                          if not (pod.component == Component.LEARNER and pod.ended)])
            pass_.done = True
            _expire(pass_, job)
            return
        # The spec was edited and now validates: start over, once the old attempt's pods are gone.
        pass_.status.phase, pass_.status.reason, pass_.status.message = Phase.PENDING, None, None
        pass_.status.completion_time = None
        if pass_.live:
            pass_.delete(pass_.live)
            pass_.done = True
            return
    if pass_.problems and not pass_.phase.terminal:
        pass_.fail(INVALID_SPEC, _problems_text(pass_.problems), keep_ended_learner=False)
        _expire(pass_, job)


def _problems_text(problems: list[Problem]) -> str:
    return "; ".join(str(problem) for problem in problems)


# -- Succeeded, Failed ------------------------------------------------------------------------------------


def _finished(pass_: _Pass, job: RLTrainingJob | None) -> None:
    """The learner stays for its log (unless the deadline ended it), serving runs, the rest goes."""
    pass_.done = True
    if pass_.phase == Phase.SUCCEEDED and job is not None and job.spec.serving is not None:
        # Create-if-absent every pass: a deleted serving Deployment or Service comes back.
        pass_.plan.create.extend(builders.build_serving(job, pass_.options))
        pass_.status.serving_endpoint = builders.serving_endpoint(job)
    keep_learner = pass_.status.reason != DEADLINE_EXCEEDED
    pass_.delete([pod for pod in pass_.live
                  if not (keep_learner and pod.component == Component.LEARNER and pod.ended)])
    _expire(pass_, job)


def _expire(pass_: _Pass, job: RLTrainingJob | None) -> None:
    """ttlSecondsAfterFinished: delete the finished job when due, else wake up then."""
    ttl = job.spec.ttl_seconds_after_finished if job else None
    if ttl is not None and pass_.status.completion_time is not None:
        expires = pass_.status.completion_time + timedelta(seconds=ttl)
        if pass_.now >= expires:
            pass_.plan.delete_job = True
        else:
            pass_.plan.wake(expires, pass_.now)


# -- the ends of an active job: success, suspension, activeDeadlineSeconds ---------------------------------


def _sort_pods(pass_: _Pass, job: RLTrainingJob) -> None:
    """Split live pods by component; pods of an older Ray epoch are deleted (planned, not counted)."""
    _note_disruptions(pass_)
    epoch = pass_.status.head_restarts
    stale = [pod for pod in pass_.live if pod.epoch is not None and pod.epoch != epoch]
    pass_.delete(stale)
    current = [pod for pod in pass_.live if pod not in stale]
    pass_.head_pod = next((pod for pod in current if pod.component == Component.HEAD), None)
    pass_.learner_pod = next((pod for pod in current if pod.component == Component.LEARNER), None)
    pass_.worker_pods = {pod.index: pod for pod in current
                         if pod.component == Component.ROLLOUT_WORKER and pod.index is not None}
    pass_.learner_replicas = {pod.index: pod for pod in current
                              if pod.component == Component.LEARNER_REPLICA and pod.index is not None}


def _learner_succeeded(pass_: _Pass, job: RLTrainingJob) -> None:
    if pass_.learner_pod is not None and pass_.learner_pod.phase == "Succeeded":
        pass_.status.phase = Phase.SUCCEEDED
        pass_.status.reason = pass_.status.message = None
        pass_.status.completion_time = pass_.now
        pass_.delete([pod for pod in pass_.live if pod is not pass_.learner_pod])
        pass_.set_workers(0)
        _finished(pass_, job)


def _suspend(pass_: _Pass, job: RLTrainingJob) -> None:
    if not job.spec.suspend:
        return
    # The learner first: on SIGTERM it checkpoints its last iteration, which needs its Ray cluster up.
    # Head and workers go once the learner pod is gone: deleted together, the learner would hang on its
    # vanished head and lose the iterations since its last checkpoint.
    learner = [pod for pod in pass_.owned if pod.component == Component.LEARNER and not pod.ended]
    if learner:
        pass_.delete([pod for pod in learner if not pod.terminating])
    else:
        pass_.delete(pass_.live)
    pass_.status.phase = Phase.SUSPENDED
    pass_.set_workers(0)
    pass_.done = True


def _resume(pass_: _Pass, job: RLTrainingJob) -> None:
    """A suspended job whose spec.suspend is false again. Like a batch Job, the activeDeadlineSeconds
    clock restarts."""
    pass_.status.phase = Phase.STARTING
    pass_.status.start_time = pass_.now
    pass_.plan.events.append(Event("Normal", "Resumed", "suspend is false: recreating the job's pods; "
                                   + _checkpoint_note(job)))


def _deadline(pass_: _Pass, job: RLTrainingJob) -> None:
    limit = job.spec.active_deadline_seconds
    if limit is None or pass_.status.start_time is None:
        return
    due = pass_.status.start_time + timedelta(seconds=limit)
    if pass_.now >= due:
        pass_.fail(DEADLINE_EXCEEDED, f"the job was active longer than activeDeadlineSeconds ({limit} s)",
                   keep_ended_learner=False)
    else:
        pass_.plan.wake(due, pass_.now)


# -- failures, counted against backoffLimit ---------------------------------------------------------------


def _note_disruptions(pass_: _Pass) -> None:
    """Remember each head or learner pod the cluster is taking away (its DisruptionTarget condition), until its
    replacement: the condition is gone with the pod, and a pass often sees only that the pod vanished."""
    for pod in pass_.owned:
        if (pod.disrupted and pod.component in (Component.HEAD, Component.LEARNER)
                and pod.name not in pass_.status.disrupted_pods):
            pass_.status.disrupted_pods = [*pass_.status.disrupted_pods, pod.name][-8:]


def _disruption(pass_: _Pass, name: str, pod: PodView | None) -> bool:
    """Whether the pod `name` that ended or vanished was disrupted rather than failed; if so, its restart is
    counted as one (not against backoffLimit) and the record of it is done with."""
    if name not in pass_.status.disrupted_pods and not (pod is not None and pod.disrupted):
        return False
    pass_.status.disrupted_pods = [n for n in pass_.status.disrupted_pods if n != name]
    pass_.status.disruption_restarts += 1
    return True


def _ended(what: str, why: str, disrupted: bool) -> str:
    if disrupted:
        return f"{what} was evicted or preempted ({why}), which does not count against backoffLimit"
    return f"{what} failed ({why})"


def _check_head(pass_: _Pass, job: RLTrainingJob) -> None:
    head = pass_.head_pod
    name = names.head_pod(pass_.meta.name)
    failed = head is not None and head.ended
    vanished = head is None and pass_.before == Phase.RUNNING and name not in pass_.deleted
    if not (failed or vanished):
        return
    why = (head.why or f"pod phase {head.phase}") if failed and head else "the head pod disappeared"
    limit = job.spec.backoff_limit
    disrupted = _disruption(pass_, name, head)
    if not disrupted and _backoff_spent(pass_, job, f"the Ray head failed ({why})"):
        return
    pass_.status.head_restarts += 1
    # The Ray cluster is gone: every pod joined to it goes, and all come back in the new epoch.
    pass_.delete([pod for pod in pass_.live if pod.component is not None])
    pass_.status.phase = Phase.STARTING
    message = (f"{_ended('the Ray head', why, disrupted)}; restarts counted {pass_.restarts_used()} of {limit}: "
               f"a new head starts, rollout workers rejoin, the learner restarts, {_checkpoint_note(job)}")
    pass_.degraded("HeadRestarted", message)
    pass_.plan.events.append(Event("Warning", "HeadRestarted", message))
    pass_.plan.restarts.append(Component.HEAD)
    pass_.set_workers(0)
    pass_.done = True


def _backoff_spent(pass_: _Pass, job: RLTrainingJob, what: str) -> bool:
    """Fail the job when backoffLimit restarts (learner and head together) are used up; say whether it did."""
    limit = job.spec.backoff_limit
    if pass_.restarts_used() < limit:
        return False
    pass_.fail(BACKOFF_LIMIT_EXCEEDED, f"{what} and backoffLimit ({limit}) restarts are used up "
               f"(learner restarts {pass_.status.learner_restarts}, "
               f"head restarts {pass_.status.head_restarts})")
    return True


def _check_learner(pass_: _Pass, job: RLTrainingJob) -> None:
    learner = pass_.learner_pod
    failed = learner is not None and learner.phase == "Failed"
    name = learner_name(pass_.meta)
    vanished = (learner is None and pass_.before == Phase.RUNNING and name not in pass_.blocked
                and name not in pass_.deleted)
    if not (failed or vanished):
        return
    if failed and learner is not None and learner.invalid_spec is not None:
        # The learner checked what the operator cannot (a module:Class env, the env's kwargs): a
        # restart would refuse the same spec again.
        pass_.fail(INVALID_SPEC, learner.invalid_spec)
        return
    why = (learner.why or "pod phase Failed") if failed and learner else "the learner pod disappeared"
    limit = job.spec.backoff_limit
    disrupted = _disruption(pass_, name, learner)
    if not disrupted and _backoff_spent(pass_, job, f"the learner failed ({why})"):
        return
    pass_.status.learner_restarts += 1
    if learner is not None:
        pass_.delete([learner])
        pass_.learner_pod = None
    pass_.status.phase = Phase.STARTING
    message = (f"{_ended('the learner', why, disrupted)}; restarts counted {pass_.restarts_used()} of {limit}, "
               f"{_checkpoint_note(job)}")
    pass_.degraded("LearnerRestarted", message)
    pass_.plan.events.append(Event("Warning", "LearnerRestarted", message))
    pass_.plan.restarts.append(Component.LEARNER)


def learner_name(meta: JobMeta) -> str:
    return names.learner_pod(meta.name)


# -- the pods follow the spec -----------------------------------------------------------------------------


def _follow_learner_replicas(pass_: _Pass, job: RLTrainingJob) -> None:
    """Learner pods of ranks 1..N-1: an ended one is replaced (rank 0's process group fails with it, so
    rank 0 restarts, counted, and resumes every rank from its checkpoint). Rank 0 reads N once, at its
    start: when spec.learner.replicas changes, its pod is deleted (SIGTERM: it checkpoints and leaves; not
    counted) and comes back with the new N; ranks past N go once no rank 0 trains with them."""
    pods = pass_.learner_replicas
    desired = builders.learner_pods(job)
    rank0 = next((pod for pod in pass_.owned if pod.component == Component.LEARNER and not pod.ended), None)
    training_with = rank0.learner_replicas if rank0 is not None else None
    if rank0 is not None and not rank0.terminating and training_with not in (None, desired):
        pass_.delete([rank0])
        pass_.learner_pod = None
        message = (f"learner replicas {training_with} -> {desired}: "
                   f"the learner checkpoints and restarts with {desired}")
        pass_.plan.events.append(Event("Normal", "LearnersRescaled", message))
    for rank in sorted(pods):
        pod = pods[rank]
        past_n = rank >= desired and (training_with is None or rank >= training_with)
        if past_n or (pod.ended and rank < desired):
            pass_.delete([pods.pop(rank)])
            if pod.ended and rank < desired:
                message = f"{pod.name} ended ({pod.why or 'pod phase ' + pod.phase}): replacing it"
                pass_.degraded("LearnerReplicaReplaced", message)
                pass_.plan.events.append(Event("Warning", "LearnerReplicaReplaced", message))
    epoch = pass_.status.head_restarts
    for rank in range(1, desired):
        name = names.learner_replica_pod(pass_.meta.name, rank)
        if rank not in pods and name not in pass_.blocked:
            replica = builders.build_learner_replica_pod(job, pass_.options, rank, epoch=epoch)
            pass_.plan.create.append(kueue.enroll(replica, job, epoch))


def _regroup(pass_: _Pass, job: RLTrainingJob) -> None:
    """A Kueue pod group's size is fixed: when the job's group changed (replicas, or the queue added or
    removed), its pods go, and the next passes create the new group, which Kueue admits anew."""
    expected = kueue.pod_group_name(job, pass_.status.head_restarts) if job.queue_name else None
    current = [pod for pod in pass_.live if pod.component is not None and pod not in pass_.plan.delete]
    if not any(pod.group != expected for pod in current):
        return
    pass_.delete(current)
    pass_.status.phase = Phase.STARTING
    pass_.set_workers(0)
    pass_.plan.events.append(Event("Normal", "Requeued", (
        f"the job's Kueue pod group is now {expected} ({kueue.gang_size(job)} pods)" if expected else
        "the job no longer names a Kueue queue") + ": deleting its pods and creating them again, "
        + _checkpoint_note(job)))
    pass_.done = True


def _follow_workers(pass_: _Pass, job: RLTrainingJob) -> None:
    desired = job.spec.rollout_workers.replicas
    previous = pass_.status.workers_desired
    removed = sorted(i for i in pass_.worker_pods if i >= desired)
    pass_.delete([pass_.worker_pods.pop(i) for i in removed])
    if desired != previous and previous > 0:
        pass_.plan.budget_min_available = builders.disruption_budget_pods(job, desired) - 1
    if desired < previous or removed:
        deleting = f": deleting {', '.join(names.worker_pod(pass_.meta.name, i) for i in removed)}"
        pass_.plan.events.append(Event("Normal", "ScaledDown", f"rollout workers {previous} -> {desired}"
                                       + (deleting if removed else "")))
    elif 0 < previous < desired:
        adding = ", ".join(names.worker_pod(pass_.meta.name, i) for i in range(previous, desired))
        pass_.plan.events.append(Event("Normal", "ScaledUp", f"rollout workers {previous} -> {desired}: "
                                       f"adding {adding}"))
    replaced = []
    for index in range(desired):
        pod = pass_.worker_pods.get(index)
        name = names.worker_pod(pass_.meta.name, index)
        if pod is not None and pod.ended:
            replaced.append(f"{name} ended ({pod.why or 'pod phase ' + pod.phase})")
            pass_.delete([pass_.worker_pods.pop(index)])
        elif (pod is None and name not in pass_.blocked and name not in pass_.deleted
              and pass_.before == Phase.RUNNING and index < previous):
            replaced.append(f"{name} disappeared")
    if replaced:
        message = "; ".join(replaced) + ": replacing, training goes on with the others"
        pass_.degraded("WorkerReplaced", message)
        pass_.plan.events.append(Event("Warning", "WorkerReplaced", message))
        pass_.plan.restarts.extend([Component.ROLLOUT_WORKER] * len(replaced))
    _create_missing(pass_, job, desired)


def _create_missing(pass_: _Pass, job: RLTrainingJob, desired: int) -> None:
    """Head, learner and workers that do not exist; a Pending job is Starting once it has pods."""
    epoch = pass_.status.head_restarts
    wanted: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if pass_.head_pod is None:
        wanted.append((names.head_pod(pass_.meta.name),
                       lambda: builders.build_head_pod(job, pass_.options, epoch=epoch)))
    if pass_.learner_pod is None:
        wanted.append((learner_name(pass_.meta),
                       lambda: builders.build_learner_pod(job, pass_.options, epoch=epoch,
                                                          checkpoint_seconds=pass_.status.checkpoint_seconds)))
    for index in range(desired):
        if index not in pass_.worker_pods:
            wanted.append((names.worker_pod(pass_.meta.name, index),
                           functools.partial(builders.build_worker_pod, job, pass_.options, index, epoch=epoch)))
    for name, build in wanted:
        if name not in pass_.blocked:
            pass_.plan.create.append(kueue.enroll(build(), job, epoch))
    if pass_.plan.create:
        pass_.plan.ensure_services = True
        if pass_.phase == Phase.PENDING:
            pass_.status.phase = Phase.STARTING
        if pass_.status.start_time is None:
            pass_.status.start_time = pass_.now


# -- the phase follows the pods ---------------------------------------------------------------------------


def _queued(pass_: _Pass, job: RLTrainingJob) -> None:
    """Queued while any pod of the job waits for Kueue's admission gate; the Admitted condition says which."""
    if job.queue_name is None:
        return
    deleting = {pod.name for pod in pass_.plan.delete}
    pods = [pod for pod in pass_.live if pod.component is not None and pod.name not in deleting]
    gated = sum(1 for pod in pods if pod.gated) + len([m for m in pass_.plan.create if kueue.is_gated(m)])
    total = kueue.gang_size(job)
    if gated:
        message = kueue.waiting_message(job, gated, total)
        job_status.set_condition(pass_.status, kueue.ADMITTED, False, "WaitingForKueue", message,
                                 at=pass_.now, generation=pass_.meta.generation)
        if pass_.phase in (Phase.PENDING, Phase.STARTING, Phase.QUEUED):
            pass_.status.phase = Phase.QUEUED
            pass_.status.message = message
    elif pods:
        job_status.set_condition(pass_.status, kueue.ADMITTED, True, "Admitted",
                                 f"Kueue admitted pod group {pods[0].group} ({total} pods) from LocalQueue "
                                 f"{job.queue_name}", at=pass_.now, generation=pass_.meta.generation)
        if pass_.phase == Phase.QUEUED:
            pass_.status.phase = Phase.STARTING


def _observe(pass_: _Pass, job: RLTrainingJob) -> None:
    """Phase and worker counts from what is running now (pods created this pass are not yet)."""
    desired = job.spec.rollout_workers.replicas
    deleting = {pod.name for pod in pass_.plan.delete}
    ready = sum(1 for i, pod in pass_.worker_pods.items()
                if i < desired and pod.ready and pod.name not in deleting)
    pass_.set_workers(ready)
    head, learner = pass_.head_pod, pass_.learner_pod
    head_up = head is not None and head.phase == "Running" and head.name not in deleting
    learner_up = learner is not None and learner.phase == "Running" and learner.name not in deleting
    # A learner that answered with its first iterations trains, whether or not its readiness probe has
    # passed yet: the kubelet probes it every few seconds, and a short job (or a busy node, where a probe
    # times out) would otherwise go from Starting to Succeeded without ever being Running.
    learner_ready = learner is not None and (learner.ready or pass_.learner_training)
    all_up = (head_up and learner_up and head is not None and head.ready and learner_ready
              and ready == desired)
    if pass_.phase in (Phase.PENDING, Phase.STARTING) and all_up:
        pass_.status.phase = Phase.RUNNING
    replaced_now = any(e.reason in ("WorkerReplaced", "LearnerRestarted") for e in pass_.plan.events)
    if pass_.phase == Phase.RUNNING and not replaced_now:
        if not head_up:
            pass_.degraded("HeadNotRunning", f"the Ray head pod is {head.phase if head else 'missing'}")
        elif not learner_up:
            pass_.degraded("LearnerNotRunning",
                           f"the learner pod is {learner.phase if learner else 'missing'}")
        elif ready < desired:
            # A loss reported earlier (WorkerReplaced, ...) stays the reason until all are back.
            if not job_status.is_true(pass_.status, job_status.DEGRADED):
                pass_.degraded("WorkersNotReady", f"{ready}/{desired} rollout workers ready")
        else:
            job_status.set_condition(pass_.status, job_status.DEGRADED, False, "AllReady",
                                     f"the Ray head, the learner and {desired}/{desired} rollout workers "
                                     "are ready", at=pass_.now, generation=pass_.meta.generation)


def _startup(pass_: _Pass, job: RLTrainingJob) -> None:
    """While Starting: why pods wait (status.message, StartupBlocked, an Event when it changes), and
    startupDeadlineSeconds."""
    deleting = {pod.name for pod in pass_.plan.delete}
    waiting = [(pod.name, pod.waiting) for pod in sorted(pass_.live, key=lambda p: p.name)
               if pod.waiting is not None and pod.name not in deleting]
    summary = startup.summarize(waiting) if pass_.phase == Phase.STARTING else None
    old = job_status.get_condition(pass_.status, startup.STARTUP_BLOCKED)
    if summary is not None:
        reason, message = summary
        if old is None or old.status != "True" or startup.family(old.reason) != startup.family(reason):
            pass_.plan.events.append(Event("Warning", reason, message))
        job_status.set_condition(pass_.status, startup.STARTUP_BLOCKED, True, reason, message, at=pass_.now,
                                 generation=pass_.meta.generation)
        pass_.status.message = message
    else:
        if old is not None:  # set once a problem was seen; False again when it is gone
            job_status.set_condition(pass_.status, startup.STARTUP_BLOCKED, False, "NoProblemSeen", "",
                                     at=pass_.now, generation=pass_.meta.generation)
        if pass_.phase in (Phase.STARTING, Phase.RUNNING) and pass_.status.reason is None:
            pass_.status.message = None
    _startup_deadline(pass_, job, old.message if old is not None and old.status == "True" else None)


def _startup_deadline(pass_: _Pass, job: RLTrainingJob, last_problem: str | None) -> None:
    limit = job.spec.startup_deadline_seconds
    if limit is None or pass_.phase != Phase.STARTING:
        return
    # From the latest of: the pods' creation (or resume), Kueue's admission, the job leaving Running.
    marks = [pass_.status.start_time]
    for type_, value in ((kueue.ADMITTED, "True"), (job_status.RUNNING, "False")):
        condition = job_status.get_condition(pass_.status, type_)
        if condition is not None and condition.status == value:
            marks.append(condition.last_transition_time)
    since = max((mark for mark in marks if mark is not None), default=None)
    if since is None:
        return
    due = since + timedelta(seconds=limit)
    if pass_.now < due:
        pass_.plan.wake(due, pass_.now)
        return
    degraded = job_status.get_condition(pass_.status, job_status.DEGRADED)
    why = (pass_.status.message or last_problem
           or (degraded.message if degraded is not None and degraded.status == "True" else None)
           or "no pod reported a problem: the pods were still starting")
    pass_.plan.create.clear()
    pass_.plan.ensure_services = False
    pass_.fail(startup.STARTUP_DEADLINE_EXCEEDED,
               f"the job was not Running within startupDeadlineSeconds ({limit} s); last seen: {why}",
               keep_ended_learner=False)


# -- the reconcile, by phase ------------------------------------------------------------------------------

# An active job (Pending, Queued, Starting, Running) runs every step: a pass moves it on (Pending ->
# Starting once its pods are created, Queued -> Starting once Kueue admits them, Starting -> Running once
# all are ready, Running -> Starting when the learner restarts) and the steps after act on the new phase.
# These follow the suspend check (and a suspended job's resume):
_AFTER_SUSPEND: tuple[Step, ...] = (
    _deadline,
    _check_head, _check_learner,                          # failures, counted against backoffLimit
    _follow_learner_replicas, _regroup, _follow_workers,  # the pods follow the spec
    _queued, _observe, _startup,                          # the phase follows the pods
)

#: The steps of a pass, in order, by the job's phase once its spec is validated; each may end the pass.
STEPS_BY_PHASE: dict[Phase, tuple[Step, ...]] = {
    Phase.PENDING: (_sort_pods, _learner_succeeded, _suspend, *_AFTER_SUSPEND),
    Phase.QUEUED: (_sort_pods, _learner_succeeded, _suspend, *_AFTER_SUSPEND),
    Phase.STARTING: (_sort_pods, _learner_succeeded, _suspend, *_AFTER_SUSPEND),
    Phase.RUNNING: (_sort_pods, _learner_succeeded, _suspend, *_AFTER_SUSPEND),
    Phase.SUSPENDED: (_sort_pods, _learner_succeeded, _suspend, _resume, *_AFTER_SUSPEND),
    Phase.SUCCEEDED: (_finished,),
    Phase.FAILED: (_finished,),
}


def plan(*, meta: JobMeta, job: RLTrainingJob | None, problems: list[Problem] | None,
         status: RLTrainingJobStatus, pods: list[PodView], now: datetime,
         options: BuildOptions, report: job_status.LearnerReport | None = None,
         deleted: frozenset[str] | set[str] = frozenset(), refusal: refusals.Refusal | None = None) -> Plan:
    """Decide one reconcile pass. `job` is None only when even the schema fails (`problems` says why).

    `deleted`: pods the operator itself deleted and has not recreated yet; their absence is planned,
    not a loss to count. `refusal`: what the API server last refused of the job's creates (`refusals`).
    """
    decided = Plan(status=status.model_copy(deep=True))
    before = Phase(decided.status.phase)
    _take_report(decided.status, report)
    if report is not None and report.tracker_reachable is not None:
        _tracker_condition(decided.status, report.tracker_reachable, now, meta.generation)
    if decided.status.time_to_first_step_seconds is None and report is not None:
        decided.status.time_to_first_step_seconds = job_status.time_to_first_step(report.first_step_time,
                                                                                  meta.created, now)
    refused = refusals.current(refusal, meta.generation)
    spec_fault = refusals.as_problem(refused, before)
    workers_desired = job.spec.rollout_workers.replicas if job else decided.status.workers_desired
    pass_ = _Pass(decided, meta, [*(problems or []), *([spec_fault] if spec_fault else [])], pods, now, options,
                  before, frozenset(deleted), workers_desired)
    pass_.learner_training = report is not None and report.progress.iterations > 0
    _validate(pass_, job)
    if not pass_.done:
        _run_phase(pass_, job)
    held = refusals.hold(decided.status, refused, before, generation=meta.generation, now=now)
    if held is not None:
        decided.events.append(Event("Warning", "FailedCreate", held))
    _settle(decided, meta, before, now, job)
    return decided


def _take_report(status: RLTrainingJobStatus, report: job_status.LearnerReport | None) -> None:
    """Progress, checkpoint and evaluation from the learner's /metrics."""
    # A restarted learner serves /metrics while it still starts Ray and restores its checkpoint: until
    # its first iteration its counters read 0, and writing them would send the job's progress backwards.
    if report is None or (report.progress.iterations == 0 and status.progress.iterations > 0):
        return
    status.progress = report.progress
    if report.last_checkpoint_time is not None:
        status.last_checkpoint_time = report.last_checkpoint_time
    if report.last_checkpoint is not None:
        status.last_checkpoint = report.last_checkpoint
    if report.evaluation is not None:
        status.evaluation = report.evaluation
    if report.stopped_by is not None:
        status.stopped_by = report.stopped_by
    if report.checkpoint_seconds is not None:  # the longest: a replay buffer's checkpoint grows as it fills
        status.checkpoint_seconds = max(status.checkpoint_seconds or 0.0, report.checkpoint_seconds)


#: Why TrackerReachable is False, and what to check.
TRACKER_UNREACHABLE = ("the learner cannot reach spec.tracking.mlflow.trackingUri: training goes on, and its metrics "
                       "wait in the learner and are sent once the tracker answers (check the URL, the Secret, and "
                       "the namespace's egress rules)")


def _tracker_condition(status: RLTrainingJobStatus, reachable: bool, now: datetime, generation: int | None) -> None:
    job_status.set_condition(status, job_status.TRACKER_REACHABLE, reachable,
                             "Answering" if reachable else "Unreachable", "" if reachable else TRACKER_UNREACHABLE,
                             at=now, generation=generation)


def _run_phase(pass_: _Pass, job: RLTrainingJob | None) -> None:
    """The steps of the job's phase, until one ends the pass."""
    if job is None:
        # Only a spec that does not even parse comes without a job: validation failed it, unless it had
        # finished already, and then it only cleans up.
        if not pass_.phase.terminal:
            raise ValueError("plan() needs the job, or the problems that keep its spec from parsing")
        _finished(pass_, None)
        return
    for step in STEPS_BY_PHASE[pass_.phase]:
        step(pass_, job)
        if pass_.done:
            return


def _settle(decided: Plan, meta: JobMeta, before: Phase, now: datetime, job: RLTrainingJob | None) -> None:
    """Conditions from the phase, observedGeneration, and an Event for a phase transition."""
    status = decided.status
    message = phases.write_conditions(status, generation=meta.generation, now=now, job=job)
    phase = Phase(status.phase)
    if phase == before:
        return
    if phase == Phase.FAILED:
        decided.events.append(Event("Warning", status.reason or "Failed", status.message or "the job failed"))
    elif not (phase == Phase.STARTING and any(e.reason in ("HeadRestarted", "LearnerRestarted", "Resumed")
                                              for e in decided.events)):
        # A restart's or a resume's own Event already says why the job is Starting again.
        decided.events.append(Event("Normal", phase.value, message))

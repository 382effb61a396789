"""The reconcile decision, as a pure function: (job, status, pods, now) -> what to create, delete and report.

`plan()` reads the job and what its pods are doing, switches on the phase, and returns a `Plan`:
pods to create and delete, the new status (the only one the operator writes), and Events. The
handlers do the I/O; everything a user relies on about the lifecycle is decided here, and the unit
tests drive it with plain dicts.

The rules, in order:
- an invalid spec fails the job (`InvalidSpec`) before any pod exists; fixing the spec retries it;
- a finished job keeps its learner pod (for logs) and loses the rest; ttlSecondsAfterFinished deletes it;
- `suspend` deletes every pod, the learner first (it checkpoints on SIGTERM while its Ray cluster is
  still up); resuming restarts the activeDeadlineSeconds clock, like a batch Job;
- the learner exiting 0 is success; the learner or the head failing (or vanishing while the job is
  Running) is a restart counted against backoffLimit; a new head starts a new Ray epoch, and the
  learner and workers of the old one are recreated, since they belonged to a cluster that is gone;
- a failed or vanished rollout worker is replaced (the job is Degraded meanwhile); replicas are
  followed up and down by worker index;
- a job with a Kueue queue is one gated pod group (`kueue`): Queued until Kueue lifts the gates; a
  change of its size re-queues it;
- while Starting, pods' waiting reasons are reported (`startup`), and startupDeadlineSeconds fails a
  job that does not reach Running in time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kuberl.api.job import Phase, RLTrainingJob, RLTrainingJobStatus
from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, Problem, is_report
from kuberl.operator import builders, kueue, names, startup
from kuberl.operator import status as job_status
from kuberl.operator.builders import BuildOptions
from kuberl.operator.names import Component

# Failure reasons (status.reason and the Failed condition's reason).
INVALID_SPEC = "InvalidSpec"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"


@dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one child pod."""

    name: str
    component: Component | None
    uid: str | None = None
    index: int | None = None
    epoch: int | None = None
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    owned: bool = True
    ip: str | None = None
    why: str = ""
    #: The termination message of a container that exited 0 (the learner's final metrics).
    final_message: str | None = None
    #: What a container that exited with INVALID_SPEC_EXIT_CODE said (the learner refusing its spec).
    invalid_spec: str | None = None
    #: The rank-0 learner pod's spec.learner.replicas (names.LEARNER_REPLICAS_ANNOTATION).
    learner_replicas: int | None = None
    #: Held by a scheduling gate (Kueue's admission gate); the Kueue pod group it belongs to.
    gated: bool = False
    group: str | None = None
    #: (reason, message) of a problem that keeps the pod from starting (startup.pod_waiting).
    waiting: tuple[str, str] | None = None

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @classmethod
    def from_pod(cls, pod: dict[str, Any], owner_uid: str | None = None) -> PodView:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        # A running pod without a Ready condition (nothing probes it yet) counts as ready.
        ready = phase == "Running" and conditions.get("Ready", "True") == "True"
        try:
            component = Component(labels.get(names.COMPONENT_LABEL))
        except ValueError:
            component = None
        owners = [ref.get("uid") for ref in meta.get("ownerReferences") or []]
        return cls(
            name=meta.get("name", ""),
            component=component,
            uid=meta.get("uid"),
            index=_int(labels.get(names.WORKER_INDEX_LABEL)),
            epoch=_int(labels.get(names.EPOCH_LABEL)),
            phase=phase,
            ready=ready,
            terminating=bool(meta.get("deletionTimestamp")),
            owned=owner_uid is None or owner_uid in owners,
            ip=status.get("podIP"),
            why=_why(status),
            final_message=_final_message(status) if phase == "Succeeded" else None,
            invalid_spec=_invalid_spec(status) if phase == "Failed" else None,
            learner_replicas=_int((meta.get("annotations") or {}).get(names.LEARNER_REPLICAS_ANNOTATION)),
            gated=kueue.is_gated(pod),
            group=kueue.group_of(pod),
            waiting=startup.pod_waiting(pod),
        )


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _final_message(status: dict[str, Any]) -> str | None:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("exitCode") == 0 and term.get("message"):
            return term["message"]
    return None


def _invalid_spec(status: dict[str, Any]) -> str | None:
    """The learner's report of a spec it refused: exit status 2 and `kuberl validate`'s text as its
    termination message (any other exit is a failure to restart from)."""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        message = (term.get("message") or "").strip()
        if term.get("exitCode") == INVALID_SPEC_EXIT_CODE and is_report(message):
            return message
    return None


def _why(status: dict[str, Any]) -> str:
    """A short account of how a pod ended: exit code and reason, or the pod's own reason."""
    parts = []
    if status.get("reason"):
        parts.append(status["reason"] + (f": {status['message']}" if status.get("message") else ""))
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            text = f"container {cs.get('name')} exited with code {term.get('exitCode')}"
            if term.get("reason"):
                text += f" ({term['reason']})"
            if term.get("message"):
                text += f": {term['message'].strip()[-300:]}"
            parts.append(text)
    return "; ".join(parts)


@dataclass(frozen=True)
class JobMeta:
    name: str
    namespace: str
    uid: str | None = None
    generation: int | None = None


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


def plan(*, meta: JobMeta, job: RLTrainingJob | None, problems: list[Problem] | None,
         status: RLTrainingJobStatus, pods: list[PodView], now: datetime,
         options: BuildOptions, report: job_status.LearnerReport | None = None,
         deleted: frozenset[str] | set[str] = frozenset()) -> Plan:
    """Decide one reconcile pass. `job` is None only when even the schema fails (`problems` says why).

    `deleted`: pods the operator itself deleted and has not recreated yet; their absence is planned,
    not a loss to count.
    """
    new_status = status.model_copy(deep=True)
    decided = Plan(status=new_status)
    before = Phase(new_status.phase)
    # A restarted learner serves /metrics while it still starts Ray and restores its checkpoint: until
    # its first iteration its counters read 0, and writing them would send the job's progress backwards.
    if report is not None and report.progress.iterations == 0 and new_status.progress.iterations > 0:
        report = None
    if report is not None:
        new_status.progress = report.progress
        if report.last_checkpoint_time is not None:
            new_status.last_checkpoint_time = report.last_checkpoint_time
        if report.last_checkpoint is not None:
            new_status.last_checkpoint = report.last_checkpoint
        if report.evaluation is not None:
            new_status.evaluation = report.evaluation
    _Pass(decided, meta, job, problems or [], pods, now, options, before, frozenset(deleted)).run()
    _finish(decided, meta, before, now, job)
    return decided


class _Pass:
    """One pass of the decision, split in steps that each may end it (`self.done`)."""

    def __init__(self, plan: Plan, meta: JobMeta, job: RLTrainingJob | None, problems: list[Problem],
                 pods: list[PodView], now: datetime, options: BuildOptions, before: Phase,
                 deleted: frozenset[str]):
        self.plan, self.status, self.meta, self.job, self.problems = plan, plan.status, meta, job, problems
        self.deleted = deleted
        self.now, self.options, self.before = now, options, before
        self.owned = [pod for pod in pods if pod.owned]
        self.live = [pod for pod in self.owned if not pod.terminating]
        # Names we cannot create right now: a pod of that name is still terminating or not ours.
        self.blocked = {pod.name for pod in pods if pod.terminating or not pod.owned}
        self.learner_replicas: dict[int, PodView] = {}  # rank -> pod, ranks >= 1 (`_current`)
        self.done = False

    @property
    def phase(self) -> Phase:
        return Phase(self.status.phase)

    def run(self) -> None:
        """The steps in order; each may end the pass (`done`)."""
        for step in STEPS:
            step(self)
            if self.done:
                return

    # -- helpers --------------------------------------------------------------------------

    def delete(self, pods: list[PodView]) -> None:
        for pod in pods:
            if pod not in self.plan.delete:
                self.plan.delete.append(pod)
                self.blocked.add(pod.name)

    def fail(self, reason: str, message: str, *, keep_ended_learner: bool = True) -> None:
        self.status.phase = Phase.FAILED
        self.status.reason, self.status.message = reason, message
        self.status.completion_time = self.now
        keep = [pod for pod in self.live if keep_ended_learner and pod.component == Component.LEARNER and pod.ended]
        self.delete([pod for pod in self.live if pod not in keep])
        self.set_workers(0)
        self.done = True

    def set_workers(self, ready: int) -> None:
        desired = self.job.spec.rollout_workers.replicas if self.job else self.status.workers_desired
        self.status.workers_ready, self.status.workers_desired = ready, desired
        self.status.workers = job_status.workers_column(ready, desired)

    def degraded(self, reason: str, message: str) -> None:
        job_status.set_condition(self.status, job_status.DEGRADED, True, reason, message, at=self.now,
                          generation=self.meta.generation)

    def restarts_used(self) -> int:
        return self.status.learner_restarts + self.status.head_restarts

    def checkpoint_note(self) -> str:
        assert self.job is not None
        claim = self.job.spec.checkpointing.volume.claim_name
        if claim:
            return f"resuming from the newest checkpoint on PersistentVolumeClaim {claim}"
        return ("checkpoints were on an emptyDir, which died with the learner pod: training starts over "
                "(set spec.checkpointing.volume.claimName to resume instead)")


# -- the steps of a pass, in order ------------------------------------------------------------------------


def _validate(ps: _Pass) -> None:
    if ps.job is not None and not ps.problems:
        ps.problems = buildable(ps.job, ps.options)
    if ps.phase == Phase.FAILED and ps.status.reason == INVALID_SPEC:
        if ps.problems or ps.status.observed_generation == ps.meta.generation:
            if ps.problems:
                ps.status.message = _problems_text(ps.problems)
            # A learner that refused the spec stays for its log; nothing else runs.
            ps.delete([pod for pod in ps.live if not (pod.component == Component.LEARNER and pod.ended)])
            ps.done = True
            _expire(ps)
            return
        # The spec was edited and now validates: start over, once the old attempt's pods are gone.
        ps.status.phase, ps.status.reason, ps.status.message = Phase.PENDING, None, None
        ps.status.completion_time = None
        if ps.live:
            ps.delete(ps.live)
            ps.done = True
            return
    if ps.problems and not ps.phase.terminal:
        ps.fail(INVALID_SPEC, _problems_text(ps.problems), keep_ended_learner=False)
        _expire(ps)


def _finished(ps: _Pass) -> None:
    if not ps.phase.terminal:
        return
    ps.done = True
    if ps.phase == Phase.SUCCEEDED and ps.job is not None and ps.job.spec.serving is not None:
        # Create-if-absent every pass: a deleted serving Deployment or Service comes back.
        ps.plan.create.extend(builders.build_serving(ps.job, ps.options))
        ps.status.serving_endpoint = builders.serving_endpoint(ps.job)
    keep_learner = ps.status.reason != DEADLINE_EXCEEDED
    ps.delete([pod for pod in ps.live
                 if not (keep_learner and pod.component == Component.LEARNER and pod.ended)])
    _expire(ps)


def _expire(ps: _Pass) -> None:
    """ttlSecondsAfterFinished: delete the finished job when due, else wake up then."""
    ttl = ps.job.spec.ttl_seconds_after_finished if ps.job else None
    if ttl is not None and ps.status.completion_time is not None:
        expires = ps.status.completion_time + timedelta(seconds=ttl)
        if ps.now >= expires:
            ps.plan.delete_job = True
        else:
            ps.plan.wake(expires, ps.now)


def _suspend(ps: _Pass) -> None:
    assert ps.job is not None
    if ps.job.spec.suspend:
        # The learner first: on SIGTERM it checkpoints its last iteration, which needs its Ray
        # cluster up. Head and workers go once the learner pod is gone (seen on the bed: all
        # deleted at once, the learner hung on its vanished head and lost an interval).
        learner = [pod for pod in ps.owned if pod.component == Component.LEARNER and not pod.ended]
        if learner:
            ps.delete([pod for pod in learner if not pod.terminating])
        else:
            ps.delete(ps.live)
        ps.status.phase = Phase.SUSPENDED
        ps.set_workers(0)
        ps.done = True
    elif ps.phase == Phase.SUSPENDED:
        # Resume. Like a batch Job, the activeDeadlineSeconds clock restarts.
        ps.status.phase = Phase.STARTING
        ps.status.start_time = ps.now
        ps.plan.events.append(Event("Normal", "Resumed", "suspend is false: recreating the job's pods; "
                                   + ps.checkpoint_note()))


def _deadline(ps: _Pass) -> None:
    assert ps.job is not None
    limit = ps.job.spec.active_deadline_seconds
    if limit is None or ps.status.start_time is None:
        return
    due = ps.status.start_time + timedelta(seconds=limit)
    if ps.now >= due:
        ps.fail(DEADLINE_EXCEEDED, f"the job was active longer than activeDeadlineSeconds ({limit} s)",
                  keep_ended_learner=False)
    else:
        ps.plan.wake(due, ps.now)


def _current(ps: _Pass) -> None:
    """Split live pods by component; pods of an older Ray epoch are deleted (planned, not counted)."""
    epoch = ps.status.head_restarts
    stale = [pod for pod in ps.live if pod.epoch is not None and pod.epoch != epoch]
    ps.delete(stale)
    current = [pod for pod in ps.live if pod not in stale]
    ps.head_pod = next((pod for pod in current if pod.component == Component.HEAD), None)
    ps.learner_pod = next((pod for pod in current if pod.component == Component.LEARNER), None)
    ps.worker_pods = {pod.index: pod for pod in current
                        if pod.component == Component.ROLLOUT_WORKER and pod.index is not None}
    ps.learner_replicas = {pod.index: pod for pod in current
                           if pod.component == Component.LEARNER_REPLICA and pod.index is not None}


def _learner_succeeded(ps: _Pass) -> None:
    _current(ps)
    if ps.learner_pod is not None and ps.learner_pod.phase == "Succeeded":
        ps.status.phase = Phase.SUCCEEDED
        ps.status.reason = ps.status.message = None
        ps.status.completion_time = ps.now
        ps.delete([pod for pod in ps.live if pod is not ps.learner_pod])
        ps.set_workers(0)
        ps.done = True
        _finished(ps)


def _check_head(ps: _Pass) -> None:
    assert ps.job is not None
    head = ps.head_pod
    failed = head is not None and head.ended
    vanished = head is None and ps.before == Phase.RUNNING and names.head_pod(ps.meta.name) not in ps.deleted
    if not (failed or vanished):
        return
    why = (head.why or f"pod phase {head.phase}") if failed and head else "the head pod disappeared"
    limit = ps.job.spec.backoff_limit
    if _backoff_spent(ps, f"the Ray head failed ({why})"):
        return
    ps.status.head_restarts += 1
    # The Ray cluster is gone: every pod joined to it goes, and all come back in the new epoch.
    ps.delete([pod for pod in ps.live if pod.component is not None])
    ps.status.phase = Phase.STARTING
    message = (f"the Ray head failed ({why}); restart {ps.restarts_used()} of {limit}: a new head starts, "
               f"rollout workers rejoin, the learner restarts, {ps.checkpoint_note()}")
    ps.degraded("HeadRestarted", message)
    ps.plan.events.append(Event("Warning", "HeadRestarted", message))
    ps.plan.restarts.append(Component.HEAD)
    ps.set_workers(0)
    ps.done = True


def _backoff_spent(ps: _Pass, what: str) -> bool:
    """Fail the job when backoffLimit restarts (learner and head together) are used up; say whether it did."""
    assert ps.job is not None
    limit = ps.job.spec.backoff_limit
    if ps.restarts_used() < limit:
        return False
    ps.fail(BACKOFF_LIMIT_EXCEEDED, f"{what} and backoffLimit ({limit}) restarts are used up "
            f"(learner restarts {ps.status.learner_restarts}, head restarts {ps.status.head_restarts})")
    return True


def _check_learner(ps: _Pass) -> None:
    assert ps.job is not None
    learner = ps.learner_pod
    failed = learner is not None and learner.phase == "Failed"
    name = learner_name(ps.meta)
    vanished = (learner is None and ps.before == Phase.RUNNING and name not in ps.blocked
                and name not in ps.deleted)
    if not (failed or vanished):
        return
    if failed and learner is not None and learner.invalid_spec is not None:
        # The learner checked what the operator cannot (a module:Class env, the env's kwargs): a
        # restart would refuse the same spec again.
        ps.fail(INVALID_SPEC, learner.invalid_spec)
        return
    why = (learner.why or "pod phase Failed") if failed and learner else "the learner pod disappeared"
    limit = ps.job.spec.backoff_limit
    if _backoff_spent(ps, f"the learner failed ({why})"):
        return
    ps.status.learner_restarts += 1
    if learner is not None:
        ps.delete([learner])
        ps.learner_pod = None
    ps.status.phase = Phase.STARTING
    message = f"the learner failed ({why}); restart {ps.restarts_used()} of {limit}, {ps.checkpoint_note()}"
    ps.degraded("LearnerRestarted", message)
    ps.plan.events.append(Event("Warning", "LearnerRestarted", message))
    ps.plan.restarts.append(Component.LEARNER)


def _follow_learner_replicas(ps: _Pass) -> None:
    """Learner pods of ranks 1..N-1: an ended one is replaced (rank 0's process group fails with it, so
    rank 0 restarts, counted, and resumes every rank from its checkpoint). Rank 0 reads N once, at its
    start: when spec.learner.replicas changes, its pod is deleted (SIGTERM: it checkpoints and leaves; not
    counted) and comes back with the new N; ranks past N go once no rank 0 trains with them."""
    assert ps.job is not None
    pods = ps.learner_replicas
    desired = builders.learner_pods(ps.job)
    rank0 = next((pod for pod in ps.owned if pod.component == Component.LEARNER and not pod.ended), None)
    training_with = rank0.learner_replicas if rank0 is not None else None
    if rank0 is not None and not rank0.terminating and training_with not in (None, desired):
        ps.delete([rank0])
        ps.learner_pod = None
        message = f"learner replicas {training_with} -> {desired}: the learner checkpoints and restarts with {desired}"
        ps.plan.events.append(Event("Normal", "LearnersRescaled", message))
    for rank in sorted(pods):
        pod = pods[rank]
        past_n = rank >= desired and (training_with is None or rank >= training_with)
        if past_n or (pod.ended and rank < desired):
            ps.delete([pods.pop(rank)])
            if pod.ended and rank < desired:
                message = f"{pod.name} ended ({pod.why or 'pod phase ' + pod.phase}): replacing it"
                ps.degraded("LearnerReplicaReplaced", message)
                ps.plan.events.append(Event("Warning", "LearnerReplicaReplaced", message))
    epoch = ps.status.head_restarts
    for rank in range(1, desired):
        name = names.learner_replica_pod(ps.meta.name, rank)
        if rank not in pods and name not in ps.blocked:
            ps.plan.create.append(kueue.enroll(builders.build_learner_replica_pod(ps.job, ps.options, rank, epoch=epoch),
                                               ps.job, epoch))


def _follow_workers(ps: _Pass) -> None:
    assert ps.job is not None
    desired = ps.job.spec.rollout_workers.replicas
    previous = ps.status.workers_desired
    removed = sorted(i for i in ps.worker_pods if i >= desired)
    ps.delete([ps.worker_pods.pop(i) for i in removed])
    if desired < previous or removed:
        ps.plan.events.append(Event("Normal", "ScaledDown", f"rollout workers {previous} -> {desired}"
                                   + (f": deleting {', '.join(names.worker_pod(ps.meta.name, i) for i in removed)}"
                                      if removed else "")))
    elif 0 < previous < desired:
        ps.plan.events.append(Event("Normal", "ScaledUp", f"rollout workers {previous} -> {desired}: adding "
                                   + ", ".join(names.worker_pod(ps.meta.name, i) for i in range(previous, desired))))
    replaced = []
    for index in range(desired):
        pod = ps.worker_pods.get(index)
        name = names.worker_pod(ps.meta.name, index)
        if pod is not None and pod.ended:
            replaced.append(f"{name} ended ({pod.why or 'pod phase ' + pod.phase})")
            ps.delete([ps.worker_pods.pop(index)])
        elif (pod is None and name not in ps.blocked and name not in ps.deleted
              and ps.before == Phase.RUNNING and index < previous):
            replaced.append(f"{name} disappeared")
    if replaced:
        message = "; ".join(replaced) + ": replacing, training goes on with the others"
        ps.degraded("WorkerReplaced", message)
        ps.plan.events.append(Event("Warning", "WorkerReplaced", message))
        ps.plan.restarts.extend([Component.ROLLOUT_WORKER] * len(replaced))
    _create_missing(ps, desired)


def _create_missing(ps: _Pass, desired: int) -> None:
    assert ps.job is not None
    epoch = ps.status.head_restarts
    wanted: list[tuple[str, Any]] = []
    if ps.head_pod is None:
        wanted.append((names.head_pod(ps.meta.name), lambda: builders.build_head_pod(ps.job, ps.options, epoch=epoch)))
    if ps.learner_pod is None:
        wanted.append((learner_name(ps.meta),
                       lambda: builders.build_learner_pod(ps.job, ps.options, epoch=epoch)))
    for index in range(desired):
        if index not in ps.worker_pods:
            wanted.append((names.worker_pod(ps.meta.name, index),
                           lambda i=index: builders.build_worker_pod(ps.job, ps.options, i, epoch=epoch)))
    for name, build in wanted:
        if name not in ps.blocked:
            ps.plan.create.append(kueue.enroll(build(), ps.job, epoch))
    if ps.plan.create:
        ps.plan.ensure_services = True
        if ps.phase == Phase.PENDING:
            ps.status.phase = Phase.STARTING
        if ps.status.start_time is None:
            ps.status.start_time = ps.now


def _observe(ps: _Pass) -> None:
    """Phase and worker counts from what is running now (pods created this pass are not yet)."""
    assert ps.job is not None
    desired = ps.job.spec.rollout_workers.replicas
    deleting = {pod.name for pod in ps.plan.delete}
    ready = sum(1 for i, pod in ps.worker_pods.items() if i < desired and pod.ready and pod.name not in deleting)
    ps.set_workers(ready)
    head = ps.head_pod
    head_up = head is not None and head.phase == "Running" and head.name not in deleting
    learner_up = (ps.learner_pod is not None and ps.learner_pod.phase == "Running"
                  and ps.learner_pod.name not in deleting)
    all_up = head_up and learner_up and head.ready and ps.learner_pod.ready and ready == desired
    if ps.phase in (Phase.PENDING, Phase.STARTING) and all_up:
        ps.status.phase = Phase.RUNNING
    replaced_now = any(e.reason in ("WorkerReplaced", "LearnerRestarted") for e in ps.plan.events)
    if ps.phase == Phase.RUNNING and not replaced_now:
        if not head_up:
            ps.degraded("HeadNotRunning", f"the Ray head pod is {head.phase if head else 'missing'}")
        elif not learner_up:
            ps.degraded("LearnerNotRunning",
                          f"the learner pod is {ps.learner_pod.phase if ps.learner_pod else 'missing'}")
        elif ready < desired:
            # A loss reported earlier (WorkerReplaced, ...) stays the reason until all are back.
            if not job_status.is_true(ps.status, job_status.DEGRADED):
                ps.degraded("WorkersNotReady", f"{ready}/{desired} rollout workers ready")
        else:
            job_status.set_condition(ps.status, job_status.DEGRADED, False, "AllReady",
                              f"the Ray head, the learner and {desired}/{desired} rollout workers are ready",
                              at=ps.now, generation=ps.meta.generation)


def _regroup(ps: _Pass) -> None:
    """A Kueue pod group's size is fixed: when the job's group changed (replicas, or the queue added or
    removed), its pods go, and the next passes create the new group, which Kueue admits anew."""
    assert ps.job is not None
    expected = kueue.pod_group_name(ps.job, ps.status.head_restarts) if ps.job.queue_name else None
    current = [pod for pod in ps.live if pod.component is not None and pod not in ps.plan.delete]
    if not any(pod.group != expected for pod in current):
        return
    ps.delete(current)
    ps.status.phase = Phase.STARTING
    ps.set_workers(0)
    ps.plan.events.append(Event("Normal", "Requeued", (
        f"the job's Kueue pod group is now {expected} ({kueue.gang_size(ps.job)} pods)" if expected else
        "the job no longer names a Kueue queue") + ": deleting its pods and creating them again, "
        + ps.checkpoint_note()))
    ps.done = True


def _queued(ps: _Pass) -> None:
    """Queued while any pod of the job waits for Kueue's admission gate; the Admitted condition says which."""
    assert ps.job is not None
    if ps.job.queue_name is None:
        return
    deleting = {pod.name for pod in ps.plan.delete}
    pods = [pod for pod in ps.live if pod.component is not None and pod.name not in deleting]
    gated = sum(1 for pod in pods if pod.gated) + len([m for m in ps.plan.create if kueue.is_gated(m)])
    total = kueue.gang_size(ps.job)
    if gated:
        message = kueue.waiting_message(ps.job, gated, total)
        job_status.set_condition(ps.status, kueue.ADMITTED, False, "WaitingForKueue", message, at=ps.now,
                                 generation=ps.meta.generation)
        if ps.phase in (Phase.PENDING, Phase.STARTING, Phase.QUEUED):
            ps.status.phase = Phase.QUEUED
            ps.status.message = message
    elif pods:
        job_status.set_condition(ps.status, kueue.ADMITTED, True, "Admitted",
                                 f"Kueue admitted pod group {pods[0].group} ({total} pods) from LocalQueue "
                                 f"{ps.job.queue_name}", at=ps.now, generation=ps.meta.generation)
        if ps.phase == Phase.QUEUED:
            ps.status.phase = Phase.STARTING


def _startup(ps: _Pass) -> None:
    """While Starting: why pods wait (status.message, StartupBlocked, an Event when it changes), and
    startupDeadlineSeconds."""
    assert ps.job is not None
    deleting = {pod.name for pod in ps.plan.delete}
    waiting = [(pod.name, pod.waiting) for pod in sorted(ps.live, key=lambda p: p.name)
               if pod.waiting is not None and pod.name not in deleting]
    summary = startup.summarize(waiting) if ps.phase == Phase.STARTING else None
    old = job_status.get_condition(ps.status, startup.STARTUP_BLOCKED)
    if summary is not None:
        reason, message = summary
        if old is None or old.status != "True" or startup.family(old.reason) != startup.family(reason):
            ps.plan.events.append(Event("Warning", reason, message))
        job_status.set_condition(ps.status, startup.STARTUP_BLOCKED, True, reason, message, at=ps.now,
                                 generation=ps.meta.generation)
        ps.status.message = message
    elif ps.phase != Phase.FAILED:
        if old is not None:  # set once a problem was seen; False again when it is gone
            job_status.set_condition(ps.status, startup.STARTUP_BLOCKED, False, "NoProblemSeen", "", at=ps.now,
                                     generation=ps.meta.generation)
        if ps.phase in (Phase.STARTING, Phase.RUNNING) and ps.status.reason is None:
            ps.status.message = None
    _startup_deadline(ps, old.message if old is not None and old.status == "True" else None)


def _startup_deadline(ps: _Pass, last_problem: str | None) -> None:
    assert ps.job is not None
    limit = ps.job.spec.startup_deadline_seconds
    if limit is None or ps.phase != Phase.STARTING:
        return
    # From the latest of: the pods' creation (or resume), Kueue's admission, the job leaving Running.
    marks = [ps.status.start_time]
    for type_, value in ((kueue.ADMITTED, "True"), (job_status.RUNNING, "False")):
        condition = job_status.get_condition(ps.status, type_)
        if condition is not None and condition.status == value:
            marks.append(condition.last_transition_time)
    since = max((mark for mark in marks if mark is not None), default=None)
    if since is None:
        return
    due = since + timedelta(seconds=limit)
    if ps.now < due:
        ps.plan.wake(due, ps.now)
        return
    degraded = job_status.get_condition(ps.status, job_status.DEGRADED)
    why = (ps.status.message or last_problem
           or (degraded.message if degraded is not None and degraded.status == "True" else None)
           or "no pod reported a problem: the pods were still starting")
    ps.plan.create.clear()
    ps.plan.ensure_services = False
    ps.fail(startup.STARTUP_DEADLINE_EXCEEDED,
            f"the job was not Running within startupDeadlineSeconds ({limit} s); last seen: {why}",
            keep_ended_learner=False)


STEPS: tuple[Callable[[_Pass], None], ...] = (_validate, _finished, _learner_succeeded, _suspend, _deadline,
                                              _check_head, _check_learner, _follow_learner_replicas, _regroup,
                                              _follow_workers, _queued, _observe, _startup)


def learner_name(meta: JobMeta) -> str:
    return names.learner_pod(meta.name)


def _problems_text(problems: list[Problem]) -> str:
    return "; ".join(str(problem) for problem in problems)


_TRANSITION_EVENTS: dict[Phase, tuple[str, str]] = {
    Phase.PENDING: ("Normal", "Pending"),
    Phase.QUEUED: ("Normal", "Queued"),
    Phase.STARTING: ("Normal", "Starting"),
    Phase.RUNNING: ("Normal", "Running"),
    Phase.SUCCEEDED: ("Normal", "Succeeded"),
    Phase.SUSPENDED: ("Normal", "Suspended"),
}


def _finish(decided: Plan, meta: JobMeta, before: Phase, now: datetime, job: RLTrainingJob | None) -> None:
    """Conditions from the phase, observedGeneration, and an Event for a phase transition."""
    status = decided.status
    phase = Phase(status.phase)
    gen = meta.generation
    status.observed_generation = gen
    d = status.workers_desired
    if phase == Phase.FAILED:
        status.workers_ready, status.workers = 0, job_status.workers_column(0, d)
    if phase not in (Phase.FAILED, Phase.QUEUED, Phase.STARTING):
        status.message = None  # what a queued or starting job waited for is over

    message_for = {
        Phase.PENDING: "waiting for the operator to create the job's pods",
        Phase.QUEUED: status.message or "waiting for Kueue to admit the job's pods",
        Phase.STARTING: f"waiting for the Ray head, the learner and {d} rollout workers to be ready",
        Phase.RUNNING: "the learner is training",
        Phase.SUCCEEDED: _summary(status),
        Phase.SUSPENDED: "spec.suspend is true: the job's pods are deleted; set it to false to resume"
        + ("" if job is None or job.spec.checkpointing.volume.claim_name else
           " (checkpoints were on an emptyDir and are gone: training starts over)"),
        Phase.FAILED: status.message or "",
    }
    running_reason = {Phase.RUNNING: "Training", Phase.SUCCEEDED: "Completed", Phase.FAILED: status.reason or "Failed"}
    job_status.set_condition(status, job_status.RUNNING, phase == Phase.RUNNING, running_reason.get(phase, phase.value),
                      message_for[phase], at=now, generation=gen)
    job_status.set_condition(status, job_status.COMPLETE, phase == Phase.SUCCEEDED,
                      "TrainingFinished" if phase == Phase.SUCCEEDED else phase.value,
                      message_for[phase] if phase == Phase.SUCCEEDED else "", at=now, generation=gen)
    failed = phase == Phase.FAILED
    job_status.set_condition(status, job_status.FAILED, failed, (status.reason or "Failed") if failed else phase.value,
                      (status.message or "") if failed else "", at=now, generation=gen)
    job_status.set_condition(status, job_status.SUSPENDED, phase == Phase.SUSPENDED, "SuspendedBySpec" if phase == Phase.SUSPENDED
                      else phase.value, message_for[phase] if phase == Phase.SUSPENDED else "", at=now,
                      generation=gen)
    degraded = job_status.get_condition(status, job_status.DEGRADED)
    if degraded is None or phase not in (Phase.RUNNING, Phase.STARTING):
        job_status.set_condition(status, job_status.DEGRADED, False, phase.value, "", at=now, generation=gen)

    if phase != before:
        if phase == Phase.FAILED:
            decided.events.append(Event("Warning", status.reason or "Failed", status.message or "the job failed"))
        elif not (phase == Phase.STARTING and any(e.reason in ("HeadRestarted", "LearnerRestarted", "Resumed")
                                                  for e in decided.events)):
            type_, reason = _TRANSITION_EVENTS[phase]
            decided.events.append(Event(type_, reason, message_for[phase]))


def _summary(st: RLTrainingJobStatus) -> str:
    pr = st.progress
    text = f"training finished: {pr.episodes} episodes, {pr.env_steps} env steps"
    if pr.mean_return is not None:
        text += f", mean return {pr.mean_return:.4g}"
    return text


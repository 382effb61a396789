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
  followed up and down by worker index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kuberl.api.job import Phase, RLTrainingJob, RLTrainingJobStatus
from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, Problem, is_report
from kuberl.operator import builders, names
from kuberl.operator import status as st_
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
         options: BuildOptions, report: st_.LearnerReport | None = None,
         deleted: frozenset[str] | set[str] = frozenset()) -> Plan:
    """Decide one reconcile pass. `job` is None only when even the schema fails (`problems` says why).

    `deleted`: pods the operator itself deleted and has not recreated yet; their absence is planned,
    not a loss to count.
    """
    st = status.model_copy(deep=True)
    p = Plan(status=st)
    before = Phase(st.phase)
    # A restarted learner serves /metrics while it still starts Ray and restores its checkpoint: until
    # its first iteration its counters read 0, and writing them would send the job's progress backwards.
    if report is not None and report.progress.iterations == 0 and st.progress.iterations > 0:
        report = None
    if report is not None:
        st.progress = report.progress
        if report.last_checkpoint_time is not None:
            st.last_checkpoint_time = report.last_checkpoint_time
        if report.last_checkpoint is not None:
            st.last_checkpoint = report.last_checkpoint
        if report.evaluation is not None:
            st.evaluation = report.evaluation
    _Pass(p, meta, job, problems or [], pods, now, options, before, frozenset(deleted)).run()
    _finish(p, meta, before, now, job)
    return p


class _Pass:
    """One pass of the decision, split in steps that each may end it (`self.done`)."""

    def __init__(self, p: Plan, meta: JobMeta, job: RLTrainingJob | None, problems: list[Problem],
                 pods: list[PodView], now: datetime, options: BuildOptions, before: Phase,
                 deleted: frozenset[str]):
        self.p, self.st, self.meta, self.job, self.problems = p, p.status, meta, job, problems
        self.deleted = deleted
        self.now, self.options, self.before = now, options, before
        self.owned = [pod for pod in pods if pod.owned]
        self.live = [pod for pod in self.owned if not pod.terminating]
        # Names we cannot create right now: a pod of that name is still terminating or not ours.
        self.blocked = {pod.name for pod in pods if pod.terminating or not pod.owned}
        self.done = False

    @property
    def phase(self) -> Phase:
        return Phase(self.st.phase)

    def run(self) -> None:
        for step in (self.validate, self.finished, self.learner_succeeded, self.suspend, self.deadline,
                     self.check_head, self.check_learner, self.follow_workers, self.observe):
            step()
            if self.done:
                return

    # -- helpers --------------------------------------------------------------------------

    def delete(self, pods: list[PodView]) -> None:
        for pod in pods:
            if pod not in self.p.delete:
                self.p.delete.append(pod)
                self.blocked.add(pod.name)

    def fail(self, reason: str, message: str, *, keep_ended_learner: bool = True) -> None:
        self.st.phase = Phase.FAILED
        self.st.reason, self.st.message = reason, message
        self.st.completion_time = self.now
        keep = [pod for pod in self.live if keep_ended_learner and pod.component == Component.LEARNER and pod.ended]
        self.delete([pod for pod in self.live if pod not in keep])
        self.set_workers(0)
        self.done = True

    def set_workers(self, ready: int) -> None:
        desired = self.job.spec.rollout_workers.replicas if self.job else self.st.workers_desired
        self.st.workers_ready, self.st.workers_desired = ready, desired
        self.st.workers = st_.workers_column(ready, desired)

    def degraded(self, reason: str, message: str) -> None:
        st_.set_condition(self.st, st_.DEGRADED, True, reason, message, at=self.now,
                          generation=self.meta.generation)

    def restarts_used(self) -> int:
        return self.st.learner_restarts + self.st.head_restarts

    def checkpoint_note(self) -> str:
        assert self.job is not None
        claim = self.job.spec.checkpointing.volume.claim_name
        if claim:
            return f"resuming from the newest checkpoint on PersistentVolumeClaim {claim}"
        return ("checkpoints were on an emptyDir, which died with the learner pod: training starts over "
                "(set spec.checkpointing.volume.claimName to resume instead)")

    # -- steps ----------------------------------------------------------------------------

    def validate(self) -> None:
        if self.job is not None and not self.problems:
            self.problems = buildable(self.job, self.options)
        if self.phase == Phase.FAILED and self.st.reason == INVALID_SPEC:
            if self.problems or self.st.observed_generation == self.meta.generation:
                if self.problems:
                    self.st.message = _problems_text(self.problems)
                # A learner that refused the spec stays for its log; nothing else runs.
                self.delete([pod for pod in self.live if not (pod.component == Component.LEARNER and pod.ended)])
                self.done = True
                self.expire()
                return
            # The spec was edited and now validates: start over, once the old attempt's pods are gone.
            self.st.phase, self.st.reason, self.st.message = Phase.PENDING, None, None
            self.st.completion_time = None
            if self.live:
                self.delete(self.live)
                self.done = True
                return
        if self.problems and not self.phase.terminal:
            self.fail(INVALID_SPEC, _problems_text(self.problems), keep_ended_learner=False)
            self.expire()

    def finished(self) -> None:
        if not self.phase.terminal:
            return
        self.done = True
        if self.phase == Phase.SUCCEEDED and self.job is not None and self.job.spec.serving is not None:
            # Create-if-absent every pass: a deleted serving Deployment or Service comes back.
            self.p.create.extend(builders.build_serving(self.job, self.options))
            self.st.serving_endpoint = builders.serving_endpoint(self.job)
        keep_learner = self.st.reason != DEADLINE_EXCEEDED
        self.delete([pod for pod in self.live
                     if not (keep_learner and pod.component == Component.LEARNER and pod.ended)])
        self.expire()

    def expire(self) -> None:
        """ttlSecondsAfterFinished: delete the finished job when due, else wake up then."""
        ttl = self.job.spec.ttl_seconds_after_finished if self.job else None
        if ttl is not None and self.st.completion_time is not None:
            expires = self.st.completion_time + timedelta(seconds=ttl)
            if self.now >= expires:
                self.p.delete_job = True
            else:
                self.p.wake(expires, self.now)

    def suspend(self) -> None:
        assert self.job is not None
        if self.job.spec.suspend:
            # The learner first: on SIGTERM it checkpoints its last iteration, which needs its Ray
            # cluster up. Head and workers go once the learner pod is gone (seen on the bed: all
            # deleted at once, the learner hung on its vanished head and lost an interval).
            learner = [pod for pod in self.owned if pod.component == Component.LEARNER and not pod.ended]
            if learner:
                self.delete([pod for pod in learner if not pod.terminating])
            else:
                self.delete(self.live)
            self.st.phase = Phase.SUSPENDED
            self.set_workers(0)
            self.done = True
        elif self.phase == Phase.SUSPENDED:
            # Resume. Like a batch Job, the activeDeadlineSeconds clock restarts.
            self.st.phase = Phase.STARTING
            self.st.start_time = self.now
            self.p.events.append(Event("Normal", "Resumed", "suspend is false: recreating the job's pods; "
                                       + self.checkpoint_note()))

    def deadline(self) -> None:
        assert self.job is not None
        limit = self.job.spec.active_deadline_seconds
        if limit is None or self.st.start_time is None:
            return
        due = self.st.start_time + timedelta(seconds=limit)
        if self.now >= due:
            self.fail(DEADLINE_EXCEEDED, f"the job was active longer than activeDeadlineSeconds ({limit} s)",
                      keep_ended_learner=False)
        else:
            self.p.wake(due, self.now)

    def _current(self) -> None:
        """Split live pods by component; pods of an older Ray epoch are deleted (planned, not counted)."""
        epoch = self.st.head_restarts
        stale = [pod for pod in self.live if pod.epoch is not None and pod.epoch != epoch]
        self.delete(stale)
        current = [pod for pod in self.live if pod not in stale]
        self.head_pod = next((pod for pod in current if pod.component == Component.HEAD), None)
        self.learner_pod = next((pod for pod in current if pod.component == Component.LEARNER), None)
        self.worker_pods = {pod.index: pod for pod in current
                            if pod.component == Component.ROLLOUT_WORKER and pod.index is not None}

    def learner_succeeded(self) -> None:
        self._current()
        if self.learner_pod is not None and self.learner_pod.phase == "Succeeded":
            self.st.phase = Phase.SUCCEEDED
            self.st.reason = self.st.message = None
            self.st.completion_time = self.now
            self.delete([pod for pod in self.live if pod is not self.learner_pod])
            self.set_workers(0)
            self.done = True
            self.finished()

    def check_head(self) -> None:
        assert self.job is not None
        head = self.head_pod
        failed = head is not None and head.ended
        vanished = head is None and self.before == Phase.RUNNING and names.head_pod(self.meta.name) not in self.deleted
        if not (failed or vanished):
            return
        why = (head.why or f"pod phase {head.phase}") if failed and head else "the head pod disappeared"
        limit = self.job.spec.backoff_limit
        if self.restarts_used() >= limit:
            self.fail(BACKOFF_LIMIT_EXCEEDED,
                      f"the Ray head failed ({why}) and backoffLimit ({limit}) restarts are used up "
                      f"(learner restarts {self.st.learner_restarts}, head restarts {self.st.head_restarts})")
            return
        self.st.head_restarts += 1
        # The Ray cluster is gone: every pod joined to it goes, and all come back in the new epoch.
        self.delete([pod for pod in self.live if pod.component is not None])
        self.st.phase = Phase.STARTING
        message = (f"the Ray head failed ({why}); restart {self.restarts_used()} of {limit}: a new head starts, "
                   f"rollout workers rejoin, the learner restarts, {self.checkpoint_note()}")
        self.degraded("HeadRestarted", message)
        self.p.events.append(Event("Warning", "HeadRestarted", message))
        self.p.restarts.append(Component.HEAD)
        self.set_workers(0)
        self.done = True

    def check_learner(self) -> None:
        assert self.job is not None
        learner = self.learner_pod
        failed = learner is not None and learner.phase == "Failed"
        name = learner_name(self.meta)
        vanished = (learner is None and self.before == Phase.RUNNING and name not in self.blocked
                    and name not in self.deleted)
        if not (failed or vanished):
            return
        if failed and learner is not None and learner.invalid_spec is not None:
            # The learner checked what the operator cannot (a module:Class env, the env's kwargs): a
            # restart would refuse the same spec again.
            self.fail(INVALID_SPEC, learner.invalid_spec)
            return
        why = (learner.why or "pod phase Failed") if failed and learner else "the learner pod disappeared"
        limit = self.job.spec.backoff_limit
        if self.restarts_used() >= limit:
            self.fail(BACKOFF_LIMIT_EXCEEDED,
                      f"the learner failed ({why}) and backoffLimit ({limit}) restarts are used up "
                      f"(learner restarts {self.st.learner_restarts}, head restarts {self.st.head_restarts})")
            return
        self.st.learner_restarts += 1
        if learner is not None:
            self.delete([learner])
            self.learner_pod = None
        self.st.phase = Phase.STARTING
        message = f"the learner failed ({why}); restart {self.restarts_used()} of {limit}, {self.checkpoint_note()}"
        self.degraded("LearnerRestarted", message)
        self.p.events.append(Event("Warning", "LearnerRestarted", message))
        self.p.restarts.append(Component.LEARNER)

    def follow_workers(self) -> None:
        assert self.job is not None
        desired = self.job.spec.rollout_workers.replicas
        previous = self.st.workers_desired
        removed = sorted(i for i in self.worker_pods if i >= desired)
        self.delete([self.worker_pods.pop(i) for i in removed])
        if desired < previous or removed:
            self.p.events.append(Event("Normal", "ScaledDown", f"rollout workers {previous} -> {desired}"
                                       + (f": deleting {', '.join(names.worker_pod(self.meta.name, i) for i in removed)}"
                                          if removed else "")))
        elif 0 < previous < desired:
            self.p.events.append(Event("Normal", "ScaledUp", f"rollout workers {previous} -> {desired}: adding "
                                       + ", ".join(names.worker_pod(self.meta.name, i) for i in range(previous, desired))))
        replaced = []
        for index in range(desired):
            pod = self.worker_pods.get(index)
            name = names.worker_pod(self.meta.name, index)
            if pod is not None and pod.ended:
                replaced.append(f"{name} ended ({pod.why or 'pod phase ' + pod.phase})")
                self.delete([self.worker_pods.pop(index)])
            elif (pod is None and name not in self.blocked and name not in self.deleted
                  and self.before == Phase.RUNNING and index < previous):
                replaced.append(f"{name} disappeared")
        if replaced:
            message = "; ".join(replaced) + ": replacing, training goes on with the others"
            self.degraded("WorkerReplaced", message)
            self.p.events.append(Event("Warning", "WorkerReplaced", message))
            self.p.restarts.extend([Component.ROLLOUT_WORKER] * len(replaced))
        self.create_missing(desired)

    def create_missing(self, desired: int) -> None:
        assert self.job is not None
        epoch = self.st.head_restarts
        wanted: list[tuple[str, Any]] = []
        if self.head_pod is None:
            wanted.append((names.head_pod(self.meta.name), lambda: builders.build_head_pod(self.job, self.options, epoch=epoch)))
        if self.learner_pod is None:
            wanted.append((learner_name(self.meta),
                           lambda: builders.build_learner_pod(self.job, self.options, epoch=epoch)))
        for index in range(desired):
            if index not in self.worker_pods:
                wanted.append((names.worker_pod(self.meta.name, index),
                               lambda i=index: builders.build_worker_pod(self.job, self.options, i, epoch=epoch)))
        for name, build in wanted:
            if name not in self.blocked:
                self.p.create.append(build())
        if self.p.create:
            self.p.ensure_services = True
            if self.phase == Phase.PENDING:
                self.st.phase = Phase.STARTING
            if self.st.start_time is None:
                self.st.start_time = self.now

    def observe(self) -> None:
        """Phase and worker counts from what is running now (pods created this pass are not yet)."""
        assert self.job is not None
        desired = self.job.spec.rollout_workers.replicas
        deleting = {pod.name for pod in self.p.delete}
        ready = sum(1 for i, pod in self.worker_pods.items() if i < desired and pod.ready and pod.name not in deleting)
        self.set_workers(ready)
        head = self.head_pod
        head_up = head is not None and head.phase == "Running" and head.name not in deleting
        learner_up = (self.learner_pod is not None and self.learner_pod.phase == "Running"
                      and self.learner_pod.name not in deleting)
        all_up = head_up and learner_up and head.ready and self.learner_pod.ready and ready == desired
        if self.phase in (Phase.PENDING, Phase.STARTING) and all_up:
            self.st.phase = Phase.RUNNING
        replaced_now = any(e.reason in ("WorkerReplaced", "LearnerRestarted") for e in self.p.events)
        if self.phase == Phase.RUNNING and not replaced_now:
            if not head_up:
                self.degraded("HeadNotRunning", f"the Ray head pod is {head.phase if head else 'missing'}")
            elif not learner_up:
                self.degraded("LearnerNotRunning",
                              f"the learner pod is {self.learner_pod.phase if self.learner_pod else 'missing'}")
            elif ready < desired:
                # A loss reported earlier (WorkerReplaced, ...) stays the reason until all are back.
                if not st_.is_true(self.st, st_.DEGRADED):
                    self.degraded("WorkersNotReady", f"{ready}/{desired} rollout workers ready")
            else:
                st_.set_condition(self.st, st_.DEGRADED, False, "AllReady",
                                  f"the Ray head, the learner and {desired}/{desired} rollout workers are ready",
                                  at=self.now, generation=self.meta.generation)


def learner_name(meta: JobMeta) -> str:
    return names.learner_pod(meta.name)


def _problems_text(problems: list[Problem]) -> str:
    return "; ".join(str(problem) for problem in problems)


_TRANSITION_EVENTS: dict[Phase, tuple[str, str]] = {
    Phase.PENDING: ("Normal", "Pending"),
    Phase.STARTING: ("Normal", "Starting"),
    Phase.RUNNING: ("Normal", "Running"),
    Phase.SUCCEEDED: ("Normal", "Succeeded"),
    Phase.SUSPENDED: ("Normal", "Suspended"),
}


def _finish(p: Plan, meta: JobMeta, before: Phase, now: datetime, job: RLTrainingJob | None) -> None:
    """Conditions from the phase, observedGeneration, and an Event for a phase transition."""
    st = p.status
    phase = Phase(st.phase)
    gen = meta.generation
    st.observed_generation = gen
    d = st.workers_desired
    if phase == Phase.FAILED:
        st.workers_ready, st.workers = 0, st_.workers_column(0, d)

    message_for = {
        Phase.PENDING: "waiting for the operator to create the job's pods",
        Phase.STARTING: f"waiting for the Ray head, the learner and {d} rollout workers to be ready",
        Phase.RUNNING: "the learner is training",
        Phase.SUCCEEDED: _summary(st),
        Phase.SUSPENDED: "spec.suspend is true: the job's pods are deleted; set it to false to resume"
        + ("" if job is None or job.spec.checkpointing.volume.claim_name else
           " (checkpoints were on an emptyDir and are gone: training starts over)"),
        Phase.FAILED: st.message or "",
    }
    running_reason = {Phase.RUNNING: "Training", Phase.SUCCEEDED: "Completed", Phase.FAILED: st.reason or "Failed"}
    st_.set_condition(st, st_.RUNNING, phase == Phase.RUNNING, running_reason.get(phase, phase.value),
                      message_for[phase], at=now, generation=gen)
    st_.set_condition(st, st_.COMPLETE, phase == Phase.SUCCEEDED,
                      "TrainingFinished" if phase == Phase.SUCCEEDED else phase.value,
                      message_for[phase] if phase == Phase.SUCCEEDED else "", at=now, generation=gen)
    failed = phase == Phase.FAILED
    st_.set_condition(st, st_.FAILED, failed, (st.reason or "Failed") if failed else phase.value,
                      (st.message or "") if failed else "", at=now, generation=gen)
    st_.set_condition(st, st_.SUSPENDED, phase == Phase.SUSPENDED, "SuspendedBySpec" if phase == Phase.SUSPENDED
                      else phase.value, message_for[phase] if phase == Phase.SUSPENDED else "", at=now,
                      generation=gen)
    degraded = st_.get_condition(st, st_.DEGRADED)
    if degraded is None or phase not in (Phase.RUNNING, Phase.STARTING):
        st_.set_condition(st, st_.DEGRADED, False, phase.value, "", at=now, generation=gen)

    if phase != before:
        if phase == Phase.FAILED:
            p.events.append(Event("Warning", st.reason or "Failed", st.message or "the job failed"))
        elif not (phase == Phase.STARTING and any(e.reason in ("HeadRestarted", "LearnerRestarted", "Resumed")
                                                  for e in p.events)):
            type_, reason = _TRANSITION_EVENTS[phase]
            p.events.append(Event(type_, reason, message_for[phase]))


def _summary(st: RLTrainingJobStatus) -> str:
    pr = st.progress
    text = f"training finished: {pr.episodes} episodes, {pr.env_steps} env steps"
    if pr.mean_return is not None:
        text += f", mean return {pr.mean_return:.4g}"
    return text


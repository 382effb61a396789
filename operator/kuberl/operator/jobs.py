"""The jobs' controller: one reconcile loop per RLTrainingJob (`loop.ObjectLoop`, a kopf daemon); job and
pod events only wake it up.

The loop is the single writer of the job's status. Each pass: read the job and its pods, read the
learner's /metrics when due, let `lifecycle.plan` decide, then delete, create (if absent), write
the status when it changed, and post the Events. Kopf's own retries are not needed: the loop
catches API errors, counts them, and tries again after a short backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import secrets
import time
from datetime import datetime
from typing import Any

import aiohttp
import kopf

from kuberl.api.job import GROUP, PLURAL, VERSION, Phase, RLTrainingJob
from kuberl.api.load import InvalidJob, Problem, parse_job
from kuberl.api.semantics import check_registered
from kuberl.api.tenancy import Tenancy
from kuberl.operator import builders, lifecycle, names, refusals
from kuberl.operator import status as job_status
from kuberl.operator.lifecycle import JobMeta, Plan
from kuberl.operator.loop import ObjectLoop, StatusWriter, retry_after
from kuberl.operator.names import Component
from kuberl.operator.pods import PodView
from kuberl.operator.runtime import ApiError, Runtime

QUICK_PASSES = 3  # passes in a row without waiting, while deletions make room for replacements
#: The text of Pod Security admission's 403: the pod as specified can never be admitted in this namespace,
#: so it is the spec's fault, as a 422 is, not something to wait out.
POD_SECURITY_REFUSAL = "violates PodSecurity"


def validate_spec(body: kopf.Body, spec_json: str, logger: logging.Logger | logging.LoggerAdapter,
                  tenancy: Tenancy | None = None) -> tuple[RLTrainingJob | None, list[Problem]]:
    """Validate like `kuberl validate`: the schema, what the templates may do in the job's namespace
    (`tenancy`; the default: Pod Security "restricted", no ServiceAccount), then the environment against the
    table of registered ids (`check_registered`), never importing or building what the spec names; a
    `module:...` id is the learner pod's to check. Returns the job (None when even the schema fails) and
    every problem."""
    name = body["metadata"]["name"]
    data = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": name, "namespace": body["metadata"]["namespace"],
                     "labels": dict(body["metadata"].get("labels") or {})},
        "spec": json.loads(spec_json),
    }
    try:
        return parse_job(data, check=check_registered, source=name, tenancy=tenancy or Tenancy()), []
    except InvalidJob as err:
        try:
            return parse_job(data, source=name), list(err.problems)
        except InvalidJob:
            return None, list(err.problems)
    except Exception as err:  # a spec that breaks the parser is the spec's problem, never a retry loop
        logger.exception("validating the spec failed")
        return None, [Problem("spec", f"cannot validate the spec: {type(err).__name__}: {err}", has_value=False)]


class ProgressReader:
    """The learner's progress for the job's status: its /metrics while it runs (every progress_interval),
    its termination message once it has finished."""

    def __init__(self, runtime: Runtime, job_name: str, logger: logging.Logger | logging.LoggerAdapter):
        self.runtime, self.job_name, self.logger = runtime, job_name, logger
        self.last_read = -math.inf

    def due_in(self) -> float:
        return max(0.0, self.last_read + self.runtime.config.progress_interval - time.monotonic())

    async def read(self, job: RLTrainingJob | None, pods: list[PodView]) -> job_status.LearnerReport | None:
        if job is None or not job.spec.metrics.enabled:
            return None
        # A learner that finished left its final metrics as its termination message: the last word on
        # progress and the evaluation, which a scrape may have missed in the moments before it exited.
        ended = next((pod for pod in pods if pod.component == Component.LEARNER and pod.owned
                      and pod.phase == "Succeeded" and pod.final_message), None)
        if ended is not None:
            with contextlib.suppress(ValueError):
                return job_status.parse_learner_metrics(ended.final_message, job_name=self.job_name)
        if self.due_in() > 0:
            return None
        learner = next((pod for pod in pods if pod.component == Component.LEARNER and pod.owned
                        and not pod.terminating and pod.phase == "Running"), None)
        url = self.runtime.config.metrics_url()(job, learner) if learner is not None else None
        if url is None:
            return None
        self.last_read = time.monotonic()
        try:
            body = await self.runtime.get_metrics(url)
            # Off the event loop: a body of the read cap takes up to a second to parse, which would stall
            # every other job's loop and kopf's watches.
            return await asyncio.to_thread(self.parse, body)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as err:
            self.runtime.metrics.errors.labels("progress", type(err).__name__).inc()
            self.logger.debug(f"cannot read the learner's progress from {url}: {err}")
            return None

    def parse(self, body: bytes) -> job_status.LearnerReport:
        """A scraped body as a report; raises ValueError (UnicodeDecodeError included) when it is not
        Prometheus text of this job's learner."""
        return job_status.parse_learner_metrics(body.decode("utf-8"), job_name=self.job_name)


@dataclasses.dataclass
class Applied:
    """What one pass's writes came to."""

    #: Pods that exist now among those the pass meant to create.
    created: set[str] = dataclasses.field(default_factory=set)
    #: What the API server refused as invalid (422, or Pod Security admission's 403): the spec is at fault.
    refused: str | None = None
    #: What it refused as forbidden (any other 403: a quota, a LimitRange): the namespace is at fault, for now.
    forbidden: str | None = None
    #: The first unexpected error (after doing the rest).
    error: Exception | None = None

    @property
    def clean(self) -> bool:
        return self.refused is None and self.forbidden is None and self.error is None


class ChildWriter:
    """Carries out a plan's deletions and creations (create-if-absent) for one job.

    Every object of a pass is first sent as a server-side dry run (`dryRun=All`: the API server's own
    validation, admission and quota, nothing written), so that an object the server refuses (a 422
    from a template mistake only the server knows, a 403 from Pod Security or a quota) stops the pass
    before any object of it exists: no job is left half-built. Then what pods need (the Ray token, the
    learner's job ConfigMap, Services, NetworkPolicies) is created first; pods follow only once all
    of it exists. Both go in batches that double while the API server accepts them (1, 2, 4, ...), as
    Kubernetes' ReplicaSet and Job controllers create theirs: a refusal stops the pass after one
    request, not after a whole job's worth.
    """

    def __init__(self, runtime: Runtime, body: kopf.Body):
        self.runtime, self.body = runtime, body
        self.namespace = body["metadata"]["namespace"]

    async def apply(self, plan: Plan, job: RLTrainingJob | None) -> Applied:
        kube = self.runtime.kube
        out = Applied()
        deletions = await asyncio.gather(*(kube.delete_pod(self.namespace, pod.name, pod.uid) for pod in plan.delete),
                                         return_exceptions=True)
        for result in deletions:  # 404/409: already gone, or replaced by a pod with another uid
            if isinstance(result, Exception) and not (isinstance(result, ApiError) and result.status in (404, 409)):
                out.error = out.error or result
        if plan.budget_min_available is not None:
            try:
                budget = names.disruption_budget(self.body["metadata"]["name"])
                await kube.patch_disruption_budget(self.namespace, budget, plan.budget_min_available)
            except ApiError as err:  # 404: a job from before budgets, or one whose budget someone deleted
                if err.status != 404:
                    out.error = out.error or err
        pods = list(plan.create)
        needed: list[dict[str, Any]] = []
        if plan.ensure_services and job is not None:
            needed += [builders.build_ray_token_secret(job, secrets.token_hex(32))]
            needed += builders.build_services(job, self.runtime.config.build)
        if job is not None and any(_component(pod) == Component.LEARNER for pod in pods):
            needed.append(builders.build_job_spec_config_map(job))
        builders.adopt([*needed, *pods], owner=self.body)
        # The pods go in batches of their own, from one: a namespace that refuses pods (a quota, Pod
        # Security) refuses one request a try, however many other objects the job has.
        await self._in_batches(needed, out, dry_run=True)
        await self._in_batches(pods, out, dry_run=True)
        if out.clean:
            await self._create(needed, out)
            await self._in_batches(pods, out)
        return out

    async def _in_batches(self, manifests: list[dict[str, Any]], out: Applied, *, dry_run: bool = False) -> None:
        batch = 1
        while manifests and out.clean:
            await self._create(manifests[:batch], out, dry_run=dry_run)
            manifests, batch = manifests[batch:], batch * 2

    async def _create(self, manifests: list[dict[str, Any]], out: Applied, *, dry_run: bool = False) -> None:
        results = await asyncio.gather(*(self.runtime.kube.create(m, dry_run=dry_run) for m in manifests),
                                       return_exceptions=True)
        for manifest, result in zip(manifests, results, strict=True):
            name = manifest["metadata"]["name"]
            what = f"{manifest['kind']} {name}"
            if isinstance(result, ApiError) and result.status == 409:
                # Create-if-absent: it exists (a restarted operator, or a quick second pass). The Ray token
                # Secret that exists keeps its token: the operator never reads it.
                created = True
            elif isinstance(result, ApiError) and (result.status == 422 or (
                    result.status == 403 and POD_SECURITY_REFUSAL in result.message)):
                out.refused, created = out.refused or f"{what}: {result.message}", False
            elif isinstance(result, ApiError) and result.status == 403:
                out.forbidden, created = out.forbidden or f"{what}: {result.message}", False
            elif isinstance(result, Exception):
                out.error, created = out.error or result, False
            else:
                created = True
                if manifest["kind"] == "Pod" and not dry_run:
                    self.runtime.metrics.pods_created.labels(_component(manifest)).inc()
            if created and manifest["kind"] == "Pod" and not dry_run:
                out.created.add(name)


def _component(manifest: dict[str, Any]) -> str:
    return manifest["metadata"]["labels"][names.COMPONENT_LABEL]


class JobLoop(ObjectLoop):
    """The reconcile loop of one job."""

    plural, noun, operation, quick_passes = PLURAL, "job", "reconcile", QUICK_PASSES

    def __init__(self, runtime: Runtime, body: kopf.Body, logger: logging.Logger | logging.LoggerAdapter):
        super().__init__(runtime, body, logger)
        self.status = self._initial_status(body.get("status"))
        self.status_writer = StatusWriter(
            runtime, body, self.key, lambda new: runtime.kube.patch_job_status(self.namespace, self.name, new),
            job_status.dump(self.status) if body.get("status") else None)
        self.progress = ProgressReader(runtime, self.name, logger)
        self.children = ChildWriter(runtime, body)
        #: What the API server last refused of this job's creates: the planner's to decide on (`refusals`).
        self.refusal: refusals.Refusal | None = None
        #: Pods this loop deleted and has not recreated: their absence is planned, not a loss.
        self.deleted: set[str] = set()
        self._parsed: tuple[str, RLTrainingJob | None, list[Problem]] | None = None

    def _initial_status(self, raw: Any) -> Any:
        try:
            return job_status.load(raw)
        except ValueError as err:
            self.logger.warning(f"status is unreadable, starting from an empty one: {err}")
            return job_status.load(None)

    def forget(self) -> None:
        self.runtime.seen_specs.pop(self.key, None)
        self.runtime.metrics.job_phase(self.uid or self.name, None)

    async def write_status(self) -> None:
        await self.status_writer.write(job_status.dump(self.status))

    # -- one pass -----------------------------------------------------------------------------

    async def reconcile(self) -> float:
        body = self.body
        if body["metadata"].get("deletionTimestamp"):
            return self.runtime.config.idle_interval  # kopf stops this loop; the children go with the job
        spec_json = json.dumps(body.get("spec"), sort_keys=True)
        # Validation and planning are pure and, for the largest job, tens of milliseconds each: they run on
        # a thread, so no job holds up the event loop that every other job's loop and kopf's watches share.
        job, problems = await asyncio.to_thread(self._parse, body, spec_json)
        raw_pods = await self.runtime.kube.list_pods(self.namespace, names.label_selector(self.name))
        pods = [PodView.from_pod(pod, self.uid) for pod in raw_pods
                if (pod.get("metadata", {}).get("labels") or {}).get(names.JOB_NAME_LABEL) == self.name]
        report = await self.progress.read(job, pods)
        meta = JobMeta(self.name, self.namespace, self.uid, body["metadata"].get("generation"),
                       _created(body["metadata"].get("creationTimestamp")))
        decide = functools.partial(lifecycle.plan, meta=meta, job=job, problems=problems, status=self.status,
                                   pods=pods, now=job_status.now(), options=self.runtime.config.build,
                                   report=report, deleted=self.deleted)
        plan = await asyncio.to_thread(decide, refusal=self.refusal)
        before = Phase(self.status.phase)
        applied = await self.children.apply(plan, job)
        self.deleted |= {pod.name for pod in plan.delete}
        self.deleted -= applied.created
        refusal = refusals.after(self.refusal, forbidden=applied.forbidden, invalid=applied.refused,
                                 clean=applied.clean, created=bool(plan.create), generation=meta.generation,
                                 retry=lambda tries: retry_after(self.runtime.config, tries, transient=False))
        if refusal != self.refusal:
            # What the server just refused (or took again) is the planner's to decide on, in this pass, so the
            # status written below says so. What this second answer would create or delete beyond what was
            # just done waits for the next pass (`_next_wait`).
            self.refusal = refusal
            plan = await asyncio.to_thread(decide, refusal=refusal)
        self.status = plan.status
        await self.write_status()
        post_events(self.body, plan, self.logger)
        count(self.runtime, self.uid or self.name, plan, before)
        self.runtime.seen_specs[self.key] = spec_json
        if plan.delete_job:
            self.logger.info("ttlSecondsAfterFinished has passed: deleting the job")
            await self.runtime.kube.delete_job(self.namespace, self.name, self.uid)
            return self.runtime.config.idle_interval
        if applied.error is not None:
            raise applied.error
        return self._next_wait(plan, job, pods)

    def _parse(self, body: kopf.Body, spec_json: str) -> tuple[RLTrainingJob | None, list[Problem]]:
        """Validate like `kuberl validate` (`validate_spec`); cached until the spec changes."""
        if self._parsed is None or self._parsed[0] != spec_json:
            self._parsed = (spec_json, *validate_spec(body, spec_json, self.logger, self.runtime.config.tenancy))
        return self._parsed[1], self._parsed[2]

    def _next_wait(self, plan: Plan, job: RLTrainingJob | None, pods: list[PodView]) -> float:
        config = self.runtime.config
        phase = Phase(plan.status.phase)
        if plan.delete:
            return 0.0  # room was made: act on it now
        if self.refusal is not None and not phase.terminal:
            return self.refusal.retry_s  # until the server takes the creates (a pod event wakes it sooner)
        if phase in (Phase.PENDING, Phase.QUEUED, Phase.STARTING, Phase.RUNNING):
            wait = config.reconcile_interval
            learner_running = any(pod.component == Component.LEARNER and pod.phase == "Running" for pod in pods)
            if job is not None and job.spec.metrics.enabled and learner_running:
                wait = min(wait, self.progress.due_in())
        else:
            wait = config.idle_interval
        if plan.wake_in is not None:
            wait = min(wait, plan.wake_in + 0.05)
        return wait


def _created(stamp: Any) -> datetime | None:
    """metadata.creationTimestamp (RFC 3339, as the API server writes it) as a datetime."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def post_events(body: kopf.Body, plan: Plan, logger: logging.Logger | logging.LoggerAdapter) -> None:
    for event in plan.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])
        log = logger.warning if event.type == "Warning" else logger.info
        log(f"{event.reason}: {event.message}")


def count(runtime: Runtime, job_key: str, plan: Plan, before: Phase) -> None:
    """The operator's own metrics for one pass: transitions, the job's phase, pod restarts."""
    phase = Phase(plan.status.phase)
    if phase != before:
        runtime.metrics.transitions.labels(phase.value).inc()
    runtime.metrics.job_phase(job_key, phase.value)
    for component in plan.restarts:
        runtime.metrics.pod_restarts.labels(component.value).inc()


# --------------------------------------------------------------------------------------------
# kopf handlers
# --------------------------------------------------------------------------------------------


async def reconcile_job(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                        logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    """The job's reconcile loop, for as long as the job exists."""
    await JobLoop(memo.runtime, body, logger).run(stopped)


async def job_changed(body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Wake the job's loop when its spec changed, it is being deleted, or another writer changed its status
    (the loop's own status writes do not)."""
    runtime: Runtime = memo.runtime
    key = (PLURAL, namespace or "", name)
    if (body["metadata"].get("deletionTimestamp")
            or json.dumps(body.get("spec"), sort_keys=True) != runtime.seen_specs.get(key)
            or runtime.overwritten(key, body.get("status"))):
        runtime.poke(key)


async def pod_changed(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A child pod changed (scheduled, started, ready, failed, deleted): wake its job's loop."""
    job_name = labels.get(names.JOB_NAME_LABEL)
    if job_name:
        memo.runtime.poke((PLURAL, namespace or "", job_name))


def register(registry: kopf.OperatorRegistry) -> None:
    """The jobs' handlers, on the operator's registry (`controllers.build_registry`)."""
    kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, id="reconcile", cancellation_timeout=10.0)(reconcile_job)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="job-changed")(job_changed)
    kopf.on.event("", "v1", "pods", registry=registry, id="pod-changed",
                  labels={names.MANAGED_BY_LABEL: names.OPERATOR_NAME})(pod_changed)

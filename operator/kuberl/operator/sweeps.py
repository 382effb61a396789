"""The sweeps' controller: one loop per RLSweep (`loop.ObjectLoop`, a kopf daemon) runs its trials as child
RLTrainingJobs owned by the sweep, at most spec.parallelism at a time, suspends those the pruner stops, and
writes the sweep's status; a trial job's events wake its sweep's loop.

The sweep's status is the record of its trials: each pass rebuilds the Optuna study from it (`kuberl.sweep.
cluster`, in a thread, bounded in time), so a restarted operator goes on where the last one was. A new trial is
recorded before its job is created, and a recorded trial whose job is missing is created again (create-if-absent).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import kopf

from kuberl.api.job import GROUP, VERSION
from kuberl.api.job import PLURAL as JOB_PLURAL
from kuberl.api.load import InvalidJob, Problem
from kuberl.api.semantics import check_registered
from kuberl.api.sweep import (
    PLURAL,
    InvalidSweep,
    RLSweep,
    RLSweepStatus,
    SweepPhase,
    TrialState,
    parse_sweep,
)
from kuberl.operator import status as job_status
from kuberl.operator.loop import PASS_FAILED, ObjectLoop, StatusWriter
from kuberl.operator.runtime import ApiError, Runtime

if TYPE_CHECKING:
    from kuberl.api.sweep import TrialStatus
    from kuberl.sweep.cluster import SweepPass

#: The label a trial job carries: its sweep's name (the sweep's loop lists its trials by it).
SWEEP_LABEL = "kuberl.dev/sweep"
#: The most one pass's Optuna and SciPy work may take; past it the pass is tried again later.
PASS_TIMEOUT_S = 30.0
COMPLETE, FAILED, DEGRADED = job_status.COMPLETE, job_status.FAILED, job_status.DEGRADED
#: The Degraded condition's reason once a pass goes through again (while passes fail: `loop.PASS_FAILED`).
PASS_WENT_THROUGH = "PassSucceeded"


class SpecChanged(Exception):
    """The sweep's parameters no longer fit the trials it has recorded."""


def plan(sweep: RLSweep, trials: list[TrialStatus], jobs: dict[str, dict[str, Any]], started: datetime | None,
         now: datetime, ranked: bool) -> SweepPass:
    """One pass's decisions (`kuberl.sweep.cluster.plan_pass`). Optuna and SciPy are imported here, with the
    first sweep's first pass, on a thread: an operator that runs no sweep never holds them (about 90 MB of
    memory and seconds of start-up)."""
    from kuberl.sweep.cluster import plan_pass
    from kuberl.sweep.engine import SweepChanged

    try:
        return plan_pass(sweep, trials, jobs, started, now, ranked)
    except SweepChanged as err:
        raise SpecChanged(str(err)) from err


def validate_sweep(body: kopf.Body, runtime: Runtime,
                   logger: logging.Logger | logging.LoggerAdapter) -> tuple[RLSweep | None, list[Problem]]:
    """Validate as `kuberl validate` does (`parse_sweep`, with this namespace's tenancy), the environment against
    the table of registered ids as the job's own loop will: a sweep that fails is refused before any trial
    exists."""
    meta = body["metadata"]
    data = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": dict(meta.get("labels") or {})},
            "spec": json.loads(json.dumps(body.get("spec")))}
    try:
        return parse_sweep(data, source=meta["name"], check=check_registered, tenancy=runtime.config.tenancy), []
    except InvalidSweep as err:
        return None, list(err.problems)
    except Exception as err:  # a spec that breaks the parser is the spec's problem, never a retry loop
        logger.exception("validating the sweep failed")
        return None, [Problem("spec", f"cannot validate the spec: {type(err).__name__}: {err}", has_value=False)]


def owned_trial(sweep: RLSweep, uid: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """A trial job the sweep owns: the garbage collector deletes it with the sweep."""
    manifest["metadata"]["labels"][SWEEP_LABEL] = sweep.metadata.name
    manifest["metadata"]["ownerReferences"] = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLSweep",
                                                "name": sweep.metadata.name, "uid": uid, "controller": True,
                                                "blockOwnerDeletion": True}]
    return manifest


def record_pass(status: RLSweepStatus, planned: SweepPass, generation: int | None, now: Any) -> None:
    """A pass's outcome into the sweep's status: the trials, counts, ranking, phase and conditions."""
    status.trials, status.trials_by_state, status.progress = planned.trials, planned.counts, planned.progress
    if planned.ranking is not None:
        status.ranking = planned.ranking
        status.best = planned.ranking[0] if planned.ranking else None
    status.observed_generation, status.reason, status.message = generation, None, None
    job_status.set_condition(status, FAILED, False, "", "", at=now, generation=generation)
    _pass_went_through(status, generation, now)
    if planned.done:
        status.phase = SweepPhase.SUCCEEDED
        status.completion_time = status.completion_time or now
        counts = planned.counts
        message = f"{counts.succeeded} trial(s) scored, {counts.stopped} stopped, {counts.failed} failed"
        job_status.set_condition(status, COMPLETE, True, "TrialsFinished", message, at=now, generation=generation)
    else:
        status.phase = SweepPhase.RUNNING
        job_status.set_condition(status, COMPLETE, False, "TrialsRunning", f"{planned.progress} trials finished",
                                 at=now, generation=generation)


def record_refusal(status: RLSweepStatus, problems: list[Problem], reason: str, generation: int | None,
                   now: Any) -> str:
    """A sweep that cannot run into its status: Failed with `reason`, every problem named; returns the message."""
    message = "; ".join(str(p) for p in problems)[:4000]
    status.phase, status.reason, status.message = SweepPhase.FAILED, reason, message
    status.observed_generation = generation
    job_status.set_condition(status, COMPLETE, False, reason, "the sweep cannot run", at=now, generation=generation)
    job_status.set_condition(status, FAILED, True, reason, message, at=now, generation=generation)
    _pass_went_through(status, generation, now)
    return message


def _pass_went_through(status: RLSweepStatus, generation: int | None, now: Any) -> None:
    if job_status.is_true(status, DEGRADED):
        job_status.set_condition(status, DEGRADED, False, PASS_WENT_THROUGH, "", at=now, generation=generation)


class SweepLoop(ObjectLoop):
    """One sweep's reconcile loop, the single writer of its status."""

    plural, noun, operation = PLURAL, "sweep", "sweep"

    def __init__(self, runtime: Runtime, body: kopf.Body, logger: logging.Logger | logging.LoggerAdapter):
        super().__init__(runtime, body, logger)
        self.kube = runtime.kube
        try:
            self.status = RLSweepStatus.model_validate(body.get("status") or {})
        except ValueError:  # a status written by someone else: the trial jobs remain, the record starts again
            self.status = RLSweepStatus()
        self.status_writer = StatusWriter(
            runtime, body, self.key, lambda new: self.kube.patch_status(PLURAL, self.namespace, self.name, new), None)
        self.ranked = False
        self._validated: tuple[str, tuple[RLSweep | None, list[Problem]]] | None = None

    def forget(self) -> None:
        self.runtime.metrics.sweep(self.namespace, self.name, None)

    def record_failure(self, error: str, retry: float) -> bool:
        """Degraded, naming the error and the next try. The phase stays: the sweep is retried, not failed, for
        the error may be the operator's."""
        job_status.set_condition(self.status, DEGRADED, True, PASS_FAILED,
                                 f"{error} (try {self.failures}; next in {retry:.0f} s)",
                                 at=job_status.now(), generation=self.body["metadata"].get("generation"))
        return True

    async def write_status(self) -> None:
        await self.status_writer.write(self.status.model_dump(mode="json", by_alias=True))

    async def reconcile(self) -> float:
        config = self.runtime.config
        if self.status.phase.terminal and self.status.observed_generation == self.body["metadata"].get("generation"):
            return config.idle_interval
        sweep, problems = await self._validate()
        if sweep is None:
            await self._refuse(problems)
            return config.idle_interval
        now = job_status.now()
        self.status.start_time = self.status.start_time or now
        listed = await self.kube.list_jobs(self.namespace, f"{SWEEP_LABEL}={self.name}")
        jobs = {job["metadata"]["name"]: job for job in listed
                if any(ref.get("uid") == self.uid for ref in job["metadata"].get("ownerReferences") or [])}
        # Optuna and SciPy off the event loop, and bounded: a pass that takes too long is tried again.
        try:
            planned = await asyncio.wait_for(asyncio.to_thread(plan, sweep, self.status.trials, jobs,
                                                               self.status.start_time, now, self.ranked),
                                             timeout=PASS_TIMEOUT_S)
        except SpecChanged as err:
            await self._refuse([Problem("spec.parameters", str(err), has_value=False)], reason="SpecChanged")
            return config.idle_interval
        except InvalidJob as err:  # a trial its parameters cannot make: the spec's fault, as validation's is
            await self._refuse(list(err.problems))
            return config.idle_interval
        self._record(planned, now)
        # The record first: a trial in it whose job is missing (this process stopped in between) is created
        # by the next pass.
        await self.write_status()
        refused = {}
        for manifest in planned.create:
            refused.update(await self._create(sweep, manifest))
        if refused:  # the API server refuses the trial's job as invalid: a failed trial, not a retry loop
            for trial in self.status.trials:
                if trial.name in refused:
                    trial.state = TrialState.FAILED
                    trial.message = f"the API server refused its job: {refused[trial.name]}"
            await self.write_status()
            return 0.0
        for name in planned.suspend:
            await self.kube.patch_job(self.namespace, name, {"spec": {"suspend": True}})
            kopf.info(self.body, reason="TrialStopped", message=f"{name}: " + next(
                t.message or "" for t in planned.trials if t.name == name))
        if planned.done:
            kopf.info(self.body, reason="SweepComplete", message=self.status.best.summary if self.status.best
                      else "no trial scored")
            return config.idle_interval
        return config.reconcile_interval

    async def _validate(self) -> tuple[RLSweep | None, list[Problem]]:
        """`validate_sweep`, in a thread (a sweep's corner checks validate a job per value) and again only when
        the spec or labels changed."""
        key = json.dumps([self.body.get("spec"), self.body["metadata"].get("labels")], sort_keys=True)
        if self._validated is None or self._validated[0] != key:
            result = await asyncio.wait_for(asyncio.to_thread(validate_sweep, self.body, self.runtime, self.logger),
                                            timeout=PASS_TIMEOUT_S)
            self._validated = (key, result)
        return self._validated[1]

    async def _create(self, sweep: RLSweep, manifest: dict[str, Any]) -> dict[str, str]:
        """Create a trial's job if absent; {name: why} when the API server refuses it as invalid (422)."""
        try:
            await self.kube.create_job(owned_trial(sweep, self.uid, manifest))
        except ApiError as err:
            if err.status == 422:
                return {manifest["metadata"]["name"]: err.message[:1000]}
            if err.status != 409:  # 409: it exists already (a quick second pass)
                raise
        return {}

    def _record(self, planned: SweepPass, now: Any) -> None:
        if planned.ranking is not None:
            self.ranked = True
        record_pass(self.status, planned, self.body["metadata"].get("generation"), now)
        best = self.status.best.iqm if self.status.best is not None else None
        self.runtime.metrics.sweep(self.namespace, self.name, planned.counts.model_dump(), best)

    async def _refuse(self, problems: list[Problem], reason: str = "InvalidSpec") -> None:
        """An invalid sweep: Failed, every problem named, nothing (more) created."""
        was_failed = self.status.phase == SweepPhase.FAILED
        message = record_refusal(self.status, problems, reason, self.body["metadata"].get("generation"),
                                 job_status.now())
        if not was_failed:
            kopf.warn(self.body, reason=reason, message=message[:1000])
        await self.write_status()


# --------------------------------------------------------------------------------------------
# kopf handlers
# --------------------------------------------------------------------------------------------


async def reconcile_sweep(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                          logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    """The sweep's reconcile loop, for as long as the sweep exists."""
    await SweepLoop(memo.runtime, body, logger).run(stopped)


async def sweep_changed(body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Wake the sweep's loop when its spec changed or it is being deleted."""
    memo.runtime.poke((PLURAL, namespace or "", name))


async def trial_changed(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A trial job changed (progress, phase): wake its sweep's loop."""
    sweep = labels.get(SWEEP_LABEL)
    if sweep:
        memo.runtime.poke((PLURAL, namespace or "", sweep))


def register(registry: kopf.OperatorRegistry) -> None:
    """The sweeps' handlers, on the operator's registry (`controllers.build_registry`)."""
    kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, id="reconcile-sweep",
                cancellation_timeout=10.0)(reconcile_sweep)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="sweep-changed")(sweep_changed)
    kopf.on.event(GROUP, VERSION, JOB_PLURAL, registry=registry, id="trial-changed",
                  labels={SWEEP_LABEL: kopf.PRESENT})(trial_changed)

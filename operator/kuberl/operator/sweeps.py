"""kopf handlers for RLSweeps: one loop per sweep (a kopf daemon) runs its trials as child RLTrainingJobs owned
by the sweep, at most spec.parallelism at a time, suspends those the pruner stops, and writes the sweep's status;
a trial job's events wake its sweep's loop.

The sweep's status is the record of its trials: each pass rebuilds the Optuna study from it (`kuberl.sweep.
cluster`, in a thread, bounded in time), so a restarted operator goes on where the last one was. A new trial is
recorded before its job is created, and a recorded trial whose job is missing is created again (create-if-absent).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
import kopf
import urllib3

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
from kuberl.operator.runtime import ApiError, Runtime

if TYPE_CHECKING:
    from kuberl.sweep.cluster import SweepPass

#: The label a trial job carries: its sweep's name (the sweep's loop lists its trials by it).
SWEEP_LABEL = "kuberl.dev/sweep"
#: The most one pass's Optuna and SciPy work may take; past it the pass is tried again later.
PASS_TIMEOUT_S = 30.0
#: The longest wait between passes that fail: they double from the reconcile interval up to this.
PASS_BACKOFF_MAX_S = 300.0
COMPLETE, FAILED, DEGRADED = job_status.COMPLETE, job_status.FAILED, job_status.DEGRADED
#: The Degraded condition's reason while passes fail, and once one goes through again.
PASS_FAILED, PASS_WENT_THROUGH = "PassFailed", "PassSucceeded"


class SpecChanged(Exception):
    """The sweep's parameters no longer fit the trials it has recorded."""


def plan(*args: Any) -> SweepPass:
    """One pass's decisions (`kuberl.sweep.cluster.plan_pass`). Optuna and SciPy are imported here, with the
    first sweep's first pass, on a thread: an operator that runs no sweep never holds them (about 90 MB of
    memory and seconds of start-up)."""
    from kuberl.sweep.cluster import plan_pass
    from kuberl.sweep.engine import SweepChanged

    try:
        return plan_pass(*args)
    except SweepChanged as err:
        raise SpecChanged(str(err)) from err


def poke_key(name: str) -> str:
    """A sweep's wake-up key among the jobs' (a name has no '/', so a sweep and a job of one name differ)."""
    return f"{PLURAL}/{name}"


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


def pass_backoff(reconcile_interval: float, failures: int) -> float:
    """Seconds before the next pass after `failures` failed passes in a row: doubling from the reconcile
    interval, at most PASS_BACKOFF_MAX_S. An event of the sweep or of a trial still wakes it sooner."""
    return min(PASS_BACKOFF_MAX_S, reconcile_interval * 2 ** min(max(failures, 1) - 1, 20))


def record_pass_error(status: RLSweepStatus, err: Exception, failures: int, retry: float, generation: int | None,
                      now: Any) -> str:
    """A pass that failed on an unexpected error into the status: Degraded, naming the error and the next try.
    The phase stays: the sweep is retried, not failed, for the error may be the operator's. Returns the error's
    text (without the count of tries, so that the same error is told once)."""
    error = f"the operator's pass of this sweep failed: {type(err).__name__}: {err}"[:1000]
    job_status.set_condition(status, DEGRADED, True, PASS_FAILED, f"{error} (try {failures}; next in {retry:.0f} s)",
                             at=now, generation=generation)
    return error


def _pass_went_through(status: RLSweepStatus, generation: int | None, now: Any) -> None:
    if job_status.is_true(status, DEGRADED):
        job_status.set_condition(status, DEGRADED, False, PASS_WENT_THROUGH, "", at=now, generation=generation)


class SweepLoop:
    """One sweep's reconcile loop, the single writer of its status."""

    def __init__(self, runtime: Runtime, body: kopf.Body, logger: logging.Logger | logging.LoggerAdapter):
        self.runtime, self.body, self.logger = runtime, body, logger
        self.kube = runtime.kube
        meta = body["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        try:
            self.status = RLSweepStatus.model_validate(body.get("status") or {})
        except ValueError:  # a status written by someone else: the trial jobs remain, the record starts again
            self.status = RLSweepStatus()
        self.written: dict[str, Any] | None = None
        self.ranked = False
        self._validated: tuple[str, tuple[RLSweep | None, list[Problem]]] | None = None
        #: Passes failed in a row, and the last unexpected error told on the sweep (an Event each new one).
        self.failures = 0
        self.told: str | None = None

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        try:
            await self.runtime.run_passes((self.namespace, poke_key(self.name)), stopped, self.reconcile_once)
        finally:
            self.runtime.metrics.sweep(self.namespace, self.name, None)

    async def reconcile_once(self) -> float:
        """One pass; returns seconds until the next one is due. A pass that fails is retried with back-off."""
        unexpected: Exception | None = None
        try:
            wait = await self.reconcile()
            self.failures, self.told = 0, None
            return wait
        except ApiError as err:
            kind = f"http_{err.status}"
            self.logger.warning(f"Kubernetes API error, retrying: {err}")
        except (urllib3.exceptions.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            kind = type(err).__name__
            self.logger.warning(f"the sweep's pass did not finish, retrying: {kind}: {err}")
        except Exception as err:  # a bug must not stop the sweep's loop for good: logged, counted, told on the sweep
            kind, unexpected = type(err).__name__, err
            self.logger.exception("the sweep's pass failed, retrying")
        self.runtime.metrics.errors.labels("sweep", kind).inc()
        self.failures += 1
        retry = pass_backoff(self.runtime.config.reconcile_interval, self.failures)
        if unexpected is not None:
            await self._tell_failure(unexpected, retry)
        return retry

    async def _tell_failure(self, err: Exception, retry: float) -> None:
        """The failed pass on the sweep: its Degraded condition, and a Warning Event for each new error."""
        error = record_pass_error(self.status, err, self.failures, retry, self.body["metadata"].get("generation"),
                                  job_status.now())
        if error != self.told:
            kopf.warn(self.body, reason=PASS_FAILED, message=f"{error}; retrying")
            self.told = error
        try:
            await self._write_status()
        except (ApiError, urllib3.exceptions.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as write:
            self.logger.warning(f"cannot record the failed pass on the sweep: {type(write).__name__}: {write}")

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
        await self._write_status()
        refused = {}
        for manifest in planned.create:
            refused.update(await self._create(sweep, manifest))
        if refused:  # the API server refuses the trial's job as invalid: a failed trial, not a retry loop
            for trial in self.status.trials:
                if trial.name in refused:
                    trial.state = TrialState.FAILED
                    trial.message = f"the API server refused its job: {refused[trial.name]}"
            await self._write_status()
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
        await self._write_status()

    async def _write_status(self) -> None:
        new = self.status.model_dump(mode="json", by_alias=True)
        if new != self.written:
            await self.kube.patch_status(PLURAL, self.namespace, self.name, new)
            self.written = new


# --------------------------------------------------------------------------------------------
# kopf handlers
# --------------------------------------------------------------------------------------------


async def reconcile_sweep(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                          logger: logging.Logger | logging.LoggerAdapter, **_: Any) -> None:
    """The sweep's reconcile loop, for as long as the sweep exists."""
    await SweepLoop(memo.runtime, body, logger).run(stopped)


async def sweep_changed(body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Wake the sweep's loop when its spec changed or it is being deleted."""
    memo.runtime.poke(namespace, poke_key(name))


async def trial_changed(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A trial job changed (progress, phase): wake its sweep's loop."""
    sweep = labels.get(SWEEP_LABEL)
    if sweep:
        memo.runtime.poke(namespace, poke_key(sweep))


def register(registry: kopf.OperatorRegistry) -> None:
    """The sweep handlers, on the operator's registry (`handlers.build_registry`)."""
    kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, id="reconcile-sweep",
                cancellation_timeout=10.0)(reconcile_sweep)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="sweep-changed")(sweep_changed)
    kopf.on.event(GROUP, VERSION, JOB_PLURAL, registry=registry, id="trial-changed",
                  labels={SWEEP_LABEL: kopf.PRESENT})(trial_changed)

"""kopf handlers for RLSweeps: one loop per sweep (a kopf daemon) runs its trials as child RLTrainingJobs owned
by the sweep, at most spec.parallelism at a time, suspends those the pruner stops, and writes the sweep's status;
a trial job's events wake its sweep's loop.

The sweep's status is the record of its trials: each pass rebuilds the Optuna study from it (`kuberl.sweep.
cluster`, in a thread, bounded in time), so a restarted operator goes on where the last one was. A new trial is
recorded before its job is created, and a recorded trial whose job is missing is created again (create-if-absent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
import kopf
import urllib3

from kuberl.api.job import GROUP, VERSION
from kuberl.api.job import PLURAL as JOB_PLURAL
from kuberl.api.load import InvalidJob, Problem, parse_job
from kuberl.api.semantics import check_registered
from kuberl.api.sweep import (
    PLURAL,
    InvalidSweep,
    RLSweep,
    RLSweepStatus,
    SweepPhase,
    TrialState,
    parse_sweep,
    trial_job,
    trial_name,
)
from kuberl.operator import status as job_status
from kuberl.operator.runtime import ApiError, Runtime

if TYPE_CHECKING:
    from kuberl.sweep.cluster import SweepPass

#: The label a trial job carries: its sweep's name (the sweep's loop lists its trials by it).
SWEEP_LABEL = "kuberl.dev/sweep"
#: The most one pass's Optuna and SciPy work may take; past it the pass is tried again later.
PASS_TIMEOUT_S = 30.0
COMPLETE, FAILED = job_status.COMPLETE, job_status.FAILED


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


def validate_sweep(body: kopf.Body, runtime: Runtime) -> tuple[RLSweep | None, list[Problem]]:
    """Validate like `kuberl sweep` (`parse_sweep`), then the template as a job of this namespace as the job's
    own loop will (its tenancy, the registered environments): a sweep that fails is refused before any trial
    exists."""
    meta = body["metadata"]
    data = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": dict(meta.get("labels") or {})},
            "spec": json.loads(json.dumps(body.get("spec")))}
    try:
        sweep = parse_sweep(data, source=meta["name"])
    except InvalidSweep as err:
        return None, list(err.problems)
    first = trial_job(sweep, trial_name(sweep.metadata.name, 0), {}, sweep.spec.template.seed)
    try:
        parse_job(first, check=check_registered, source=meta["name"], tenancy=runtime.config.tenancy)
    except InvalidJob as err:
        return None, [dataclasses.replace(p, path=p.path.replace("spec.", "spec.template.", 1), line=None)
                      for p in err.problems]
    return sweep, []


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

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        try:
            await self.runtime.run_passes((self.namespace, poke_key(self.name)), stopped, self.reconcile_once)
        finally:
            self.runtime.metrics.sweep(self.namespace, self.name, None)

    async def reconcile_once(self) -> float:
        config = self.runtime.config
        try:
            return await self.reconcile()
        except ApiError as err:
            self.runtime.metrics.errors.labels("sweep", f"http_{err.status}").inc()
            self.logger.warning(f"Kubernetes API error, retrying: {err}")
        except (urllib3.exceptions.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            self.runtime.metrics.errors.labels("sweep", type(err).__name__).inc()
            self.logger.warning(f"the sweep's pass did not finish, retrying: {type(err).__name__}: {err}")
        return config.reconcile_interval

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
            result = await asyncio.wait_for(asyncio.to_thread(validate_sweep, self.body, self.runtime),
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
        now = job_status.now()
        message = "; ".join(str(p) for p in problems)[:4000]
        if self.status.phase != SweepPhase.FAILED:
            kopf.warn(self.body, reason=reason, message=message[:1000])
        status = self.status
        status.phase, status.reason, status.message = SweepPhase.FAILED, reason, message
        status.observed_generation = self.body["metadata"].get("generation")
        job_status.set_condition(status, COMPLETE, False, reason, "the sweep cannot run", at=now,
                                 generation=status.observed_generation)
        job_status.set_condition(status, FAILED, True, reason, message, at=now,
                                 generation=status.observed_generation)
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

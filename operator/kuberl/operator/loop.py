"""One object's reconcile loop, the same for every kind the operator runs (jobs, sweeps): a kopf daemon per
object runs passes until the object is gone; events of the object or of its children only wake it.

What every kind shares lives here, once: how a pass that fails is classified, counted, told and retried
(`ObjectLoop.reconcile_once`, `retry_after`), how the loop is woken (`Key`: the kind, the namespace, the
name), and how the status is written (`StatusWriter`: only when it changed, or when another writer
overwrote it). What a pass decides is each kind's own (`jobs.JobLoop`, `sweeps.SweepLoop`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Awaitable, Callable, ClassVar

import aiohttp
import kopf
import urllib3

from kuberl.operator import status as object_status
from kuberl.operator.runtime import ApiError, Key, OperatorConfig, Runtime

#: Errors that say the API server (or the way to it) is away for a moment, not that the pass is wrong.
TRANSIENT = (ApiError, urllib3.exceptions.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
#: The longest wait between passes that fail on an unexpected error (Kubernetes' Job controller waits up
#: to 6 min between a failed pod's retries).
BACKOFF_MAX_S = 300.0
#: The Warning Event's reason when a pass fails on an unexpected error.
PASS_FAILED = "PassFailed"
#: Status writes of an object remembered, so that the watch's echo of an earlier one is not taken for
#: another writer's.
RECENT_WRITES = 4


def retry_after(config: OperatorConfig, failures: int, *, transient: bool) -> float:
    """Seconds before the next pass after `failures` failed passes in a row. The API server away
    (`transient`): 0.2 s doubling, at most the reconcile interval (it is usually back at once). Anything
    else (a bug, a pass that cannot go through, creates the server refuses): the reconcile interval
    doubling, at most BACKOFF_MAX_S, so what fails every time costs little. An event of the object or of a
    child still wakes the loop sooner."""
    failures = min(max(failures, 1), 20)
    if transient:
        return min(config.reconcile_interval, 0.2 * 2 ** failures)
    return min(BACKOFF_MAX_S, config.reconcile_interval * 2 ** (failures - 1))


class StatusWriter:
    """Writes an object's status when it changed, or when another writer overwrote it: the status is the
    operator's record of the object, and the writes are merge patches with no resourceVersion, so a
    concurrent writer never makes one fail (409) but can replace what it says."""

    def __init__(self, runtime: Runtime, body: kopf.Body, key: Key,
                 patch: Callable[[dict[str, Any]], Awaitable[None]], written: dict[str, Any] | None):
        self.runtime, self.body, self.key, self.patch = runtime, body, key, patch
        #: What the API holds (as dumped), so an unchanged status is not written again.
        self.written = written

    async def write(self, new: dict[str, Any]) -> None:
        recent = self.runtime.written_statuses.setdefault(self.key, collections.deque(maxlen=RECENT_WRITES))
        if new == self.written and not self._overwritten(recent):
            return
        await self.patch(new)
        self.written = new
        recent.append(object_status.stored(new))

    def _overwritten(self, recent: collections.deque[dict[str, Any]]) -> bool:
        """The object's status as last seen (kopf keeps the body current) is no write of this loop's."""
        live = self.body.get("status")
        return bool(live) and self.written is not None and live not in recent and live != object_status.stored(
            self.written)


class ObjectLoop:
    """One object's reconcile loop, the single writer of its status. A kind's loop gives `reconcile` (one
    pass: returns seconds until the next is due) and, where its status has room to say so, `record_failure`."""

    #: The kind's plural (the first part of its wake-up key), and what a person calls one.
    plural: ClassVar[str]
    noun: ClassVar[str]
    #: The `kuberl_operator_errors` label of this kind's passes.
    operation: ClassVar[str]
    #: Passes in a row that ask for no wait and run at once (`Runtime.run_passes`).
    quick_passes: ClassVar[int] = 0

    def __init__(self, runtime: Runtime, body: kopf.Body, logger: logging.Logger | logging.LoggerAdapter):
        self.runtime, self.body, self.logger = runtime, body, logger
        meta = body["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta.get("uid")
        self.key: Key = (self.plural, self.namespace, self.name)
        #: Passes failed in a row, and the last unexpected error told on the object (an Event each new one).
        self.failures = 0
        self.told: str | None = None

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        try:
            await self.runtime.run_passes(self.key, stopped, self.reconcile_once, quick_passes=self.quick_passes)
        finally:
            self.runtime.written_statuses.pop(self.key, None)
            self.forget()

    def forget(self) -> None:
        """What the runtime keeps of this object, dropped once its loop ends."""

    async def reconcile(self) -> float:
        raise NotImplementedError

    def record_failure(self, error: str, retry: float) -> bool:
        """Put an unexpected failure into the status; True when it did (the loop then writes it)."""
        return False

    async def write_status(self) -> None:
        raise NotImplementedError

    async def reconcile_once(self) -> float:
        """One pass; returns seconds until the next one is due. A pass that fails is counted, told and retried
        with back-off (`retry_after`): a bug must not stop the object's loop for good."""
        started = time.perf_counter()
        unexpected: Exception | None = None
        try:
            wait = await self.reconcile()
            self.failures, self.told = 0, None
            return wait
        except ApiError as err:
            kind = f"http_{err.status}"
            self.logger.warning(f"Kubernetes API error, retrying: {err}")
        except TRANSIENT as err:
            kind = type(err).__name__
            self.logger.warning(f"cannot reach the Kubernetes API, retrying: {kind}: {err}")
        except Exception as err:  # noqa: BLE001 - logged, counted, told on the object, retried
            kind, unexpected = type(err).__name__, err
            self.logger.exception("the pass failed, retrying")
        finally:
            self.runtime.metrics.reconcile_duration.labels(self.operation).observe(time.perf_counter() - started)
        self.runtime.metrics.errors.labels(self.operation, kind).inc()
        self.failures += 1
        retry = retry_after(self.runtime.config, self.failures, transient=unexpected is None)
        if unexpected is not None:
            await self._tell(unexpected, retry)
        return retry

    async def _tell(self, err: Exception, retry: float) -> None:
        """An unexpected failure on the object: a Warning Event for each new error, and its status where the
        kind's has room for it."""
        error = f"the operator's pass of this {self.noun} failed: {type(err).__name__}: {err}"[:1000]
        if error != self.told:
            kopf.warn(self.body, reason=PASS_FAILED, message=f"{error}; retrying in {retry:.0f} s")
            self.told = error
        if self.record_failure(error, retry):
            try:
                await self.write_status()
            except TRANSIENT as write:
                self.logger.warning(f"cannot record the failed pass: {type(write).__name__}: {write}")

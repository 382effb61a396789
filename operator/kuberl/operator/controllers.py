"""The operator's kopf registry: its controllers side by side (`jobs`: RLTrainingJobs, `sweeps`: RLSweeps,
each one loop per object on `loop.ObjectLoop`), and what the operator does once for all of them (its
settings, the event-loop watch, closing the runtime).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from kuberl.operator import jobs, names, sweeps
from kuberl.operator.runtime import Runtime

#: How often the operator checks that its event loop is free (`watch_event_loop`).
LOOP_LAG_PERIOD_S = 0.1


async def watch_event_loop(runtime: Runtime) -> None:
    """Record how late the event loop wakes a timer (kuberl_operator_event_loop_lag_seconds): every job's
    loop and kopf's watches share it, so a handler that holds it up stalls them all."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(LOOP_LAG_PERIOD_S)
        runtime.metrics.loop_lag.observe(max(0.0, loop.time() - started - LOOP_LAG_PERIOD_S))


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.tasks.add(asyncio.ensure_future(watch_event_loop(memo.runtime)))
    settings.persistence.finalizer = names.FINALIZER
    # Kopf's bookkeeping goes to annotations: the CRD's status schema has no room for it.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kuberl.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kuberl.dev", key="last-handled-configuration")
    # Events are the lifecycle's own (kopf.event), not every log line of the handlers.
    settings.posting.loggers = False


async def close_runtime(memo: kopf.Memo, **_: Any) -> None:
    await memo.runtime.close()


def build_registry(*, login: bool = True) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers; run it with `kopf.operator(registry=..., memo=Memo(runtime=...))`."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry, id="configure")(configure)
    kopf.on.cleanup(registry=registry, id="close-runtime")(close_runtime)
    if login:
        kopf.on.login(registry=registry, id="login")(kopf.login_via_client)
    jobs.register(registry)
    sweeps.register(registry)
    return registry


def memo_for(runtime: Runtime) -> kopf.Memo:
    return kopf.Memo(runtime=runtime)

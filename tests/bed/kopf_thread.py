"""
kopf for real in a test: `run_kopf_in_thread` runs an operator (a module, or a kopf.OperatorRegistry)
in a thread of its own against whatever API server $KUBECONFIG names, until the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import kopf

__all__ = ["KopfOperator", "run_kopf_in_thread"]


@attrs.define
class KopfOperator:
    """A kopf operator running in its own thread; what `run_kopf_in_thread` yields."""

    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    thread: threading.Thread
    ready_flag: threading.Event
    stop_flag: threading.Event
    error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


def _test_settings(settings: kopf.OperatorSettings) -> None:
    """Defaults that keep a test's operator quick to start, react and stop."""
    settings.networking.request_timeout = 10
    settings.watching.connect_timeout = 5
    # Kopf reconnects a watch after this much silence.
    settings.watching.inactivity_timeout = 60


@contextlib.contextmanager
def run_kopf_in_thread(
    target: kopf.OperatorRegistry | types.ModuleType | str | None = None,
    *,
    namespaces: Sequence[str] = (),
    clusterwide: bool = False,
    settings_hook: Callable[[kopf.OperatorSettings], None] | None = None,
    memo: Any = None,
    startup_timeout: float = 15,
    stop_timeout: float = 15,
) -> Iterator[KopfOperator]:
    """
    Run `kopf.operator(standalone=True)` in a thread with its own event loop, until the block ends.

    `target` is a kopf.OperatorRegistry (given a login handler that reads $KUBECONFIG), or a
    module (object or dotted name) that registers its handlers on kopf's default registry when
    imported, such as `kuberl.operator.controllers`; None means the default registry as it is.
    Returns once kopf reports ready; on exit, stops kopf and re-raises whatever made it fail.
    Use it from sync tests: kopf's shutdown would cancel pytest-asyncio's tasks if it shared the
    test's loop. `settings_hook(settings)` adjusts kopf's settings before it starts.
    """
    if isinstance(target, kopf.OperatorRegistry):
        registry = target
        # Only kopf's default registry comes with login handlers; a bare one finds no credentials.
        # A fixed id keeps it to one handler however often the registry is run.
        kopf.on.login(registry=registry, id="kubeconfig-of-the-test")(kopf.login_with_kubeconfig)
    else:
        if isinstance(target, str):
            importlib.import_module(target)  # registers the handlers (once per process)
        registry = kopf.get_default_registry()
    settings = kopf.OperatorSettings()
    _test_settings(settings)
    if settings_hook is not None:
        settings_hook(settings)

    operator = KopfOperator(
        registry=registry,
        settings=settings,
        thread=None,  # type: ignore[arg-type]
        ready_flag=threading.Event(),
        stop_flag=threading.Event(),
    )

    def main() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    settings=settings,
                    standalone=True,
                    clusterwide=clusterwide,
                    namespaces=list(namespaces),
                    ready_flag=operator.ready_flag,
                    stop_flag=operator.stop_flag,
                    memo=memo,
                )
            )
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            operator.error = exc

    operator.thread = threading.Thread(target=main, name="kopf-operator", daemon=True)
    operator.thread.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not operator.ready_flag.wait(0.05):
            if not operator.thread.is_alive():
                raise RuntimeError("kopf exited before it was ready") from operator.error
            if time.monotonic() > deadline:
                raise TimeoutError(f"kopf did not get ready in {startup_timeout}s")
        yield operator
    finally:
        operator.stop_flag.set()
        operator.thread.join(stop_timeout)
        if operator.thread.is_alive():
            raise TimeoutError(f"kopf did not stop in {stop_timeout}s")
    if operator.error is not None:
        raise RuntimeError("kopf failed") from operator.error

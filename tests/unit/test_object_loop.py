"""One loop for every kind: a job's pass that raises is told on the job and retried with back-off, by the same
rule as a sweep's (tests/unit/test_sweep_security.py), while the API server away is retried at once; both
kinds are woken by keys that keep a job and a sweep of one name apart."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest

from kuberl.operator import jobs, lifecycle, loop, sweeps
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import ApiError, OperatorConfig, Runtime

NS = "tenant"
REAL_PLAN = lifecycle.plan


class FakeKube:
    """The API calls a job's pass makes, recorded: what the loop sends is what is checked."""

    def __init__(self) -> None:
        self.statuses: list[dict] = []
        self.created: list[str] = []
        self.list_error: Exception | None = None

    async def list_pods(self, namespace: str, selector: str) -> list[dict]:
        if self.list_error is not None:
            raise self.list_error
        return []

    async def create(self, manifest: dict, *, dry_run: bool = False) -> None:
        if not dry_run:
            self.created.append(f"{manifest['kind']}/{manifest['metadata']['name']}")

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        pass

    async def patch_job_status(self, namespace: str, name: str, status: dict) -> None:
        self.statuses.append(copy.deepcopy(status))


@pytest.fixture
def told(monkeypatch) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(loop.kopf, "warn", lambda body, reason, message: events.append((reason, message)))
    monkeypatch.setattr(jobs.kopf, "event", lambda body, type, reason, message: None)
    return events


def job_loop(job_dict: dict) -> tuple[jobs.JobLoop, FakeKube]:
    runtime = Runtime(OperatorConfig(reconcile_interval=10.0), metrics=OperatorMetrics())
    runtime._kube = FakeKube()
    body = {**job_dict, "metadata": {**job_dict["metadata"], "namespace": NS, "uid": "u", "generation": 1}}
    return jobs.JobLoop(runtime, body, logging.getLogger(__name__)), runtime._kube


async def test_a_jobs_pass_that_raises_is_told_on_the_job_and_retried_with_back_off(job_dict, told, monkeypatch):
    def broken(**_kwargs):
        raise RuntimeError("no plan today")

    monkeypatch.setattr(lifecycle, "plan", broken)
    loop_, kube = job_loop(job_dict)
    waits = [await loop_.reconcile_once() for _ in range(3)]
    assert waits == [10.0, 20.0, 40.0]  # the sweep's rule: the reconcile interval, doubling
    assert told == [("PassFailed", "the operator's pass of this job failed: RuntimeError: no plan today; "
                                   "retrying in 10 s")]  # once for the same error, not at every try
    assert loop_.runtime.metrics.errors.labels("reconcile", "RuntimeError")._value.get() == 3
    assert kube.created == []
    # The pass goes through again: the job's pods are created and the count starts over.
    monkeypatch.setattr(lifecycle, "plan", REAL_PLAN)
    assert await loop_.reconcile_once() >= 0
    assert loop_.failures == 0 and loop_.told is None
    assert f"Pod/{job_dict['metadata']['name']}-learner" in kube.created, kube.created
    assert kube.statuses and kube.statuses[-1]["phase"] in ("Pending", "Starting"), kube.statuses[-1]


async def test_the_api_server_away_is_retried_soon_without_an_event(job_dict, told):
    loop_, kube = job_loop(job_dict)
    kube.list_error = ApiError(503, "ServiceUnavailable", "the server is restarting")
    waits = [await loop_.reconcile_once() for _ in range(8)]
    assert waits[:3] == [0.4, 0.8, 1.6] and waits[-1] == 10.0  # at most the reconcile interval
    assert told == []
    assert loop_.runtime.metrics.errors.labels("reconcile", "http_503")._value.get() == 8


def test_back_off_has_one_rule_for_every_kind():
    config = OperatorConfig(reconcile_interval=10.0)
    assert [loop.retry_after(config, n, transient=False) for n in (1, 2, 3, 6, 100)] == [10, 20, 40, 300, 300]
    assert [loop.retry_after(config, n, transient=True) for n in (1, 2, 6, 100)] == [0.4, 0.8, 10, 10]
    assert jobs.JobLoop.reconcile_once is sweeps.SweepLoop.reconcile_once is loop.ObjectLoop.reconcile_once


def test_a_job_and_a_sweep_of_one_name_have_their_own_wake_ups():
    runtime = Runtime(OperatorConfig(), metrics=OperatorMetrics())
    job_key, sweep_key = (jobs.PLURAL, NS, "same"), (sweeps.PLURAL, NS, "same")
    runtime.pokes[job_key], runtime.pokes[sweep_key] = asyncio.Event(), asyncio.Event()
    runtime.poke(sweep_key)
    assert runtime.pokes[sweep_key].is_set() and not runtime.pokes[job_key].is_set()

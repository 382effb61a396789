"""A tenant's RLSweep cannot get more than its namespace allows, nor stop the operator's loop: a parameter under a
role the template sets to null is refused naming the field; any error in a pass is told on the sweep and
retried with back-off; `kuberl validate` refuses a sweep exactly as the operator does (tenancy included); and
a sweep's pods at once are bounded."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import yaml
from conftest import REPO

from kuberl.api import job as m
from kuberl.api.crd import sweep_crd
from kuberl.api.sweep import MAX_SWEEP_PODS, InvalidSweep, parse_sweep, trial_spec
from kuberl.api.tenancy import Allowance, Tenancy
from kuberl.operator import loop as loop_base
from kuberl.operator import sweeps
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import ApiError, OperatorConfig, Runtime
from kuberl.trainer import cli

EXAMPLE = REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml"
NS = "tenant"


@pytest.fixture
def sweep() -> dict:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["metadata"]["namespace"] = NS
    return data


def problems(data: dict, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(InvalidSweep) as err:
        parse_sweep(data, **kwargs)
    return {p.path: p.message for p in err.value.problems}


# ---- a parameter under a role set to null ---------------------------------------------------------------


def test_a_parameter_under_a_section_the_template_sets_to_null_is_refused_naming_both(sweep):
    sweep["spec"]["template"]["serving"] = None
    sweep["spec"]["parameters"] = [{"path": "serving.replicas", "values": [1, 2]}]
    found = problems(sweep)
    assert list(found) == ["spec.parameters[0].path"]
    assert found["spec.parameters[0].path"].startswith("spec.template.serving is null, so no trial can set "
                                                       "serving.replicas under it: give serving as a mapping")


def test_a_role_left_out_is_made_for_the_parameter(sweep):
    sweep["spec"]["template"].pop("rolloutWorkers")
    sweep["spec"]["parameters"] = [{"path": "rolloutWorkers.replicas", "values": [1, 2]}]
    sweep["spec"]["maxTrials"] = 10
    assert parse_sweep(sweep).spec.parameters[0].path == "rolloutWorkers.replicas"


def test_the_trial_builder_refuses_a_section_that_is_no_mapping_with_the_sweeps_own_error():
    with pytest.raises(InvalidSweep) as err:
        trial_spec({"serving": None}, {"serving.replicas": 2}, seed=0)
    [problem] = err.value.problems
    assert problem.path == "spec.parameters" and problem.value == "serving.replicas"
    assert "spec.template.serving is null" in problem.message
    with pytest.raises(InvalidSweep, match="spec.template.learner is a int"):
        trial_spec({"learner": 3}, {"learner.replicas": 2}, seed=0)


# ---- the pods a sweep may have at once --------------------------------------------------------------------


def test_the_pod_bound_is_the_largest_jobs_pods_and_the_crd_says_so():
    learners = m.LearnerSpec.model_fields["replicas"].metadata
    workers = m.RolloutWorkersSpec.model_fields["replicas"].metadata
    assert MAX_SWEEP_PODS == 1 + next(x.le for x in learners if hasattr(x, "le")) + next(
        x.le for x in workers if hasattr(x, "le")) == 577
    spec = sweep_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert f"at most {MAX_SWEEP_PODS} pods at once" in spec["properties"]["parallelism"]["description"]
    assert f"at most {MAX_SWEEP_PODS} pods at once" in (REPO / "docs" / "sweeps.md").read_text()


def test_parallelism_times_a_trials_pods_over_the_bound_is_refused(sweep):
    sweep["spec"]["template"]["rolloutWorkers"]["replicas"] = 8
    sweep["spec"]["parallelism"] = 100
    message = problems(sweep)["spec.parallelism"]
    assert message.startswith("100 trial(s) at once x 10 pods each (1 head, 1 learner(s), 8 rollout worker(s)")
    assert f"= 1000 pods, more than the {MAX_SWEEP_PODS} a sweep may have at once" in message
    sweep["spec"]["parallelism"] = 57  # 570 pods
    parse_sweep(sweep)


def test_the_bound_counts_the_most_replicas_any_parameter_sets(sweep):
    sweep["spec"]["parameters"].append({"path": "rolloutWorkers.replicas", "values": [1, 40]})
    sweep["spec"]["maxTrials"] = 30
    sweep["spec"]["parallelism"] = 14  # 14 x (1 + 1 + 40) = 588
    assert "= 588 pods" in problems(sweep)["spec.parallelism"]
    sweep["spec"]["parallelism"] = 13  # 546
    parse_sweep(sweep)
    sweep["spec"]["search"]["sampler"] = "random"
    sweep["spec"]["parameters"][1] = {"path": "learner.replicas", "distribution": {"type": "int", "low": 1,
                                                                                    "high": 64}}
    message = problems(sweep)["spec.parallelism"]
    assert "13 trial(s) at once x 66 pods each (1 head, 64 learner(s), 1 rollout worker(s)" in message


def test_serving_pods_count_for_every_trial_for_they_stay(sweep):
    template = sweep["spec"]["template"]
    template["checkpointing"]["volume"] = {"claimName": "checkpoints"}
    template["serving"] = {"replicas": 40}
    sweep["spec"]["maxTrials"] = 15  # 15 trials x 40 serving pods, beside 2 x 3 running
    message = problems(sweep)["spec.parallelism"]
    assert "+ 15 trial(s) x 40 serving pod(s), kept after each trial succeeds = 606 pods" in message
    template["serving"]["replicas"] = 2
    parse_sweep(sweep)


# ---- `kuberl validate` judges a sweep as the operator does ------------------------------------------------


def operator_problems(data: dict, tenancy: Tenancy) -> list[str]:
    body = {**copy.deepcopy(data), "metadata": {**data["metadata"], "uid": "u"}}
    runtime = Runtime(OperatorConfig(tenancy=tenancy), metrics=OperatorMetrics())
    _sweep, found = sweeps.validate_sweep(body, runtime, logging.getLogger(__name__))
    return [f"{p.path}: {p.message}" for p in found]


def cli_validate(data: dict, tmp_path, capsys, *flags: str) -> tuple[int, str]:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code = cli.main(["validate", *flags, str(path)])
    out = capsys.readouterr()
    return code, out.err + out.out


@pytest.mark.parametrize(("role", "pod", "flags", "allowance"), [
    ("learner", {"spec": {"hostNetwork": True}}, ("--pod-security", "privileged"),
     Allowance(pod_security="privileged")),
    ("rolloutWorkers", {"spec": {"serviceAccountName": "trainer"}}, ("--service-account", "trainer"),
     Allowance(service_accounts=frozenset({"trainer"}))),
])
def test_kuberl_validate_refuses_what_the_operator_refuses_with_the_same_message(sweep, tmp_path, capsys, role, pod,
                                                                                flags, allowance):
    sweep["spec"]["template"].setdefault(role, {})["template"] = pod
    refused = operator_problems(sweep, Tenancy())
    assert refused and all(p.startswith(f"spec.template.{role}.template.spec.") for p in refused)
    code, text = cli_validate(sweep, tmp_path, capsys)
    assert code == 2 and "is not a valid RLSweep" in text
    for problem in refused:
        path, message = problem.split(": ", 1)
        assert f"{path} (line" in text and message in text
    # What the platform team allows in the namespace, the flags allow, both sides alike.
    assert operator_problems(sweep, Tenancy(namespaces={NS: allowance})) == []
    code, text = cli_validate(sweep, tmp_path, capsys, *flags)
    assert code == 0 and text.startswith("ok: cartpole-ppo-lr"), text


def test_the_operators_own_namespace_is_refused_for_a_sweep_as_for_a_job(sweep):
    found = operator_problems(sweep, Tenancy(operator_namespace=NS))
    assert found and found[0].startswith("metadata.namespace: jobs may not run in the operator's own namespace")


# ---- the sweep's loop: refusals end it Failed, errors are told and retried ---------------------------------


class FakeKube:
    def __init__(self):
        self.statuses: list[dict] = []
        self.created: list[str] = []
        self.fail_status_writes = False

    async def list_jobs(self, namespace: str, selector: str) -> list[dict]:
        return []

    async def create_job(self, manifest: dict) -> None:
        self.created.append(manifest["metadata"]["name"])

    async def patch_job(self, namespace: str, name: str, patch: dict) -> None:
        pass

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict) -> None:
        if self.fail_status_writes:
            raise ApiError(500, "InternalError", "etcd is away")
        self.statuses.append(copy.deepcopy(status))


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, str]]:
    told: list[tuple[str, str]] = []
    monkeypatch.setattr(sweeps.kopf, "warn", lambda body, reason, message: told.append((reason, message)))
    monkeypatch.setattr(sweeps.kopf, "info", lambda body, reason, message: None)
    return told


def loop(sweep: dict) -> tuple[sweeps.SweepLoop, FakeKube]:
    runtime = Runtime(OperatorConfig(reconcile_interval=10.0), metrics=OperatorMetrics())
    runtime._kube = FakeKube()
    body = {**sweep, "metadata": {**sweep["metadata"], "uid": "u", "generation": 1}}
    return sweeps.SweepLoop(runtime, body, logging.getLogger(__name__)), runtime._kube


def condition(status: dict, type_: str) -> dict | None:
    return next((c for c in status["conditions"] if c["type"] == type_), None)


async def test_a_sweep_with_a_parameter_under_a_null_role_ends_failed_as_invalid_spec(sweep, events):
    sweep["spec"]["template"]["serving"] = None
    sweep["spec"]["parameters"] = [{"path": "serving.replicas", "values": [1, 2]}]
    sweep_loop, kube = loop(sweep)
    assert await sweep_loop.reconcile_once() == sweep_loop.runtime.config.idle_interval
    status = kube.statuses[-1]
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert status["message"].startswith("spec.parameters[0].path: spec.template.serving is null")
    assert condition(status, "Failed")["status"] == "True" and kube.created == []
    assert [reason for reason, _ in events] == ["InvalidSpec"]


async def test_an_error_in_a_pass_is_told_on_the_sweep_and_retried_with_back_off(sweep, events, monkeypatch):
    def broken(*_args):
        raise RuntimeError("no plan today")

    monkeypatch.setattr(sweeps, "plan", broken)
    sweep_loop, kube = loop(sweep)
    waits = [await sweep_loop.reconcile_once() for _ in range(3)]
    assert waits == [10.0, 20.0, 40.0]
    degraded = condition(kube.statuses[-1], "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PassFailed"
    assert degraded["message"] == ("the operator's pass of this sweep failed: RuntimeError: no plan today "
                                   "(try 3; next in 40 s)")
    assert kube.statuses[-1]["phase"] == "Running"
    assert events == [("PassFailed", "the operator's pass of this sweep failed: RuntimeError: no plan today; "
                                     "retrying in 10 s")]  # once for the same error, not at every try
    errors = sweep_loop.runtime.metrics.errors.labels("sweep", "RuntimeError")._value.get()
    assert errors == 3
    # The pass goes through again: the trials start, and the condition says so.
    monkeypatch.undo()
    monkeypatch.setattr(sweeps.kopf, "warn", lambda body, reason, message: events.append((reason, message)))
    assert await sweep_loop.reconcile_once() == 10.0
    assert condition(kube.statuses[-1], "Degraded")["status"] == "False" and kube.created == ["cartpole-ppo-lr-t0000",
                                                                                            "cartpole-ppo-lr-t0001"]
    assert sweep_loop.failures == 0


async def test_the_back_off_is_capped_and_a_failed_status_write_does_not_escape(sweep, events, monkeypatch):
    monkeypatch.setattr(sweeps, "plan", lambda *_: 1 / 0)
    sweep_loop, kube = loop(sweep)
    kube.fail_status_writes = True
    for _ in range(8):
        wait = await sweep_loop.reconcile_once()
    assert wait == loop_base.BACKOFF_MAX_S
    assert loop_base.retry_after(sweep_loop.runtime.config, 1000, transient=False) == loop_base.BACKOFF_MAX_S

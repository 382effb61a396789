"""One pass of a sweep on a cluster (`kuberl.sweep.cluster.plan_pass`): the study rebuilt from the status's record
each pass, trials up to parallelism, the pruner's stops, the deadline, the ranking; and the RLSweep status model."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from kuberl.api.crd import sweep_crd
from kuberl.api.sweep import RLSweepStatus, TrialState, parse_sweep
from kuberl.sweep.cluster import plan_pass
from kuberl.sweep.engine import SweepChanged

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def sweep(**spec: Any):
    data = {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep", "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"template": {"algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
                                  "stopping": {"maxEnvSteps": 100_000}},
                     "parameters": [{"path": "algorithm.ppo.learningRate", "values": [0.001, 0.01, 0.1]}],
                     "seeds": 2, "maxTrials": 6, "parallelism": 2, **spec}}
    return parse_sweep(data)


def job(phase: str = "Running", env_steps: int = 0, mean_return: float | None = None) -> dict:
    return {"status": {"phase": phase, "progress": {"envSteps": env_steps, "meanReturn": mean_return}}}


def run_to_the_end(s, score) -> tuple[list, list[str]]:
    """Pass after pass, each trial's job succeeding with `score(trial)` the pass after it was created."""
    recorded: list = []
    jobs: dict[str, dict] = {}
    created: list[str] = []
    for _ in range(100):
        planned = plan_pass(s, recorded, jobs, NOW, NOW, ranked=bool(recorded))
        for manifest in planned.create:
            created.append(manifest["metadata"]["name"])
            jobs[manifest["metadata"]["name"]] = job()
        recorded = planned.trials
        for t in recorded:
            if t.state == TrialState.RUNNING and jobs[t.name]["status"]["phase"] == "Running":
                jobs[t.name] = job("Succeeded", 100_000, score(t))
        if planned.done:
            return planned, created
    raise AssertionError("the sweep never finished")


def test_trials_start_up_to_parallelism_and_each_is_created_once():
    planned = plan_pass(sweep(), [], {}, NOW, NOW, ranked=False)
    assert [t.name for t in planned.trials] == ["s-t0000", "s-t0001"]
    assert [m["metadata"]["name"] for m in planned.create] == ["s-t0000", "s-t0001"]
    assert planned.counts.running == 2 and planned.progress == "0/6" and not planned.done
    # The next pass, with both jobs there: nothing more to create, nothing new to start.
    again = plan_pass(sweep(), planned.trials, {t.name: job() for t in planned.trials}, NOW, NOW, ranked=True)
    assert again.create == [] and [t.name for t in again.trials] == ["s-t0000", "s-t0001"]
    # A recorded trial whose job is missing (the operator stopped between the record and the create) is created.
    missing = plan_pass(sweep(), planned.trials, {"s-t0000": job()}, NOW, NOW, ranked=True)
    assert [m["metadata"]["name"] for m in missing.create] == ["s-t0001"]


def test_a_grid_sweep_rebuilt_every_pass_runs_every_configuration_on_every_seed_seed_by_seed():
    planned, created = run_to_the_end(sweep(), lambda t: 1000 * t.parameters["algorithm.ppo.learningRate"])
    assert created == [f"s-t{n:04d}" for n in range(6)]
    runs = [(t.configuration, t.seed) for t in planned.trials]
    assert sorted(runs) == [(c, s) for c in range(3) for s in (0, 1)]
    assert [seed for _c, seed in runs] == [0, 0, 0, 1, 1, 1]  # every configuration's first seed, then the next
    assert planned.progress == "6/6" and planned.counts.succeeded == 6
    best = planned.ranking[0]
    assert best.parameters == {"algorithm.ppo.learningRate": 0.1} and best.iqm == 100.0 and best.runs == 2
    assert best.summary.startswith("learningRate=0.1 IQM 100")


def test_a_random_sweep_rebuilt_every_pass_draws_new_configurations():
    s = sweep(parameters=[{"path": "algorithm.ppo.learningRate",
                           "distribution": {"type": "logUniform", "low": 1e-4, "high": 1e-1}}],
              search={"sampler": "random", "seed": 3}, seeds=1)
    planned, _ = run_to_the_end(s, lambda t: t.number)
    values = [t.parameters["algorithm.ppo.learningRate"] for t in planned.trials]
    assert len(values) == 6 and len(set(values)) == 6


def test_the_pruner_stops_a_trial_far_below_the_median_and_its_job_is_suspended():
    s = sweep(seeds=1, maxTrials=3, earlyStopping={"pruner": "median", "startupTrials": 1, "minEnvSteps": 1000,
                                                   "everyEnvSteps": 1000})
    first = plan_pass(s, [], {}, NOW, NOW, ranked=False)
    jobs = {"s-t0000": job("Running", 5000, 200.0), "s-t0001": job()}
    second = plan_pass(s, first.trials, jobs, NOW, NOW, ranked=True)
    assert second.trials[0].reports == {"5000": 200.0}
    jobs["s-t0000"] = job("Succeeded", 10_000, 250.0)
    third = plan_pass(s, second.trials, jobs, NOW, NOW, ranked=True)
    assert third.trials[0].state == TrialState.SUCCEEDED and third.trials[0].objective == 250.0
    jobs.update({"s-t0001": job("Running", 5000, 10.0), "s-t0002": job()})
    fourth = plan_pass(s, third.trials, jobs, NOW, NOW, ranked=True)
    assert fourth.trials[1].state == TrialState.STOPPED and "pruner" in fourth.trials[1].message
    assert fourth.suspend == ["s-t0001"] and fourth.counts.stopped == 1
    # Until its job is suspended, each pass asks again; then no more.
    assert plan_pass(s, fourth.trials, jobs, NOW, NOW, ranked=True).suspend == ["s-t0001"]
    jobs["s-t0001"] = {**job("Suspended", 5000, 10.0), "spec": {"suspend": True}}
    assert plan_pass(s, fourth.trials, jobs, NOW, NOW, ranked=True).suspend == []


def test_a_record_that_no_longer_fits_the_spec_is_refused_not_crashed_on():
    first = plan_pass(sweep(), [], {}, NOW, NOW, ranked=False)
    changed = sweep(parameters=[{"path": "algorithm.ppo.clipCoef", "values": [0.1, 0.2]}])
    with pytest.raises(SweepChanged, match="parameters changed"):
        plan_pass(changed, first.trials, {}, NOW, NOW, ranked=True)


def test_past_the_deadline_no_trial_starts_and_those_running_fail_and_are_suspended():
    s = sweep(activeDeadlineSeconds=60)
    first = plan_pass(s, [], {}, NOW, NOW, ranked=False)
    late = plan_pass(s, first.trials, {t.name: job() for t in first.trials}, NOW, NOW + timedelta(seconds=61),
                     ranked=True)
    assert [t.state for t in late.trials] == [TrialState.FAILED, TrialState.FAILED]
    assert late.suspend == ["s-t0000", "s-t0001"] and late.create == [] and late.done


def test_a_failed_job_is_a_failed_trial_with_its_reason():
    first = plan_pass(sweep(), [], {}, NOW, NOW, ranked=False)
    failed = {"status": {"phase": "Failed", "reason": "BackoffLimitExceeded", "message": "the learner failed"}}
    planned = plan_pass(sweep(), first.trials, {"s-t0000": failed, "s-t0001": job()}, NOW, NOW, ranked=True)
    assert planned.trials[0].state == TrialState.FAILED
    assert planned.trials[0].message == "its job failed: BackoffLimitExceeded the learner failed"
    assert [t.name for t in planned.trials if t.state == TrialState.RUNNING] == ["s-t0001", "s-t0002"]


def test_the_status_round_trips_through_json_as_the_api_server_stores_it():
    first = plan_pass(sweep(), [], {}, NOW, NOW, ranked=False)
    status = RLSweepStatus(trials=first.trials, trials_by_state=first.counts, progress=first.progress)
    stored = status.model_dump(mode="json", by_alias=True)
    assert stored["trialsByState"] == {"running": 2, "succeeded": 0, "stopped": 0, "failed": 0}
    assert RLSweepStatus.model_validate(stored) == status


@pytest.mark.parametrize("column", [".status.phase", ".status.progress", ".status.trialsByState.running",
                                    ".status.trialsByState.stopped", ".status.best.summary"])
def test_kubectl_get_columns_read_fields_of_the_status_schema(column):
    version = sweep_crd()["spec"]["versions"][0]
    assert column in [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    node = version["schema"]["openAPIV3Schema"]
    for part in column.strip(".").split("."):
        node = node["properties"][part]
    assert node["type"] in ("string", "integer")

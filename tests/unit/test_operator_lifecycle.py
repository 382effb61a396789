"""The reconcile decision (`lifecycle.plan`) for every lifecycle rule, with pods in given states.

These run the pure planner the operator runs; the integration tests run the same rules through kopf
against a real API server.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from kuberl.api.job import Phase, Progress, RLTrainingJob, RLTrainingJobStatus
from kuberl.api.load import InvalidJob, parse_job
from kuberl.api.semantics import check_registered
from kuberl.operator import builders, lifecycle, refusals
from kuberl.operator import status as job_status
from kuberl.operator.builders import BuildOptions
from kuberl.operator.lifecycle import JobMeta
from kuberl.operator.names import Component
from kuberl.operator.pods import PodView

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
OPTIONS = BuildOptions()
UID = "job-uid"


class Sim:
    """Drives the planner pass by pass, applying its creates and deletes to a set of fake pods."""

    def __init__(self, job_dict: dict, generation: int = 1):
        self.job_dict = job_dict
        self.generation = generation
        self.status = RLTrainingJobStatus()
        self.pods: dict[str, dict] = {}
        self.now = T0
        self.plans: list[lifecycle.Plan] = []
        self.deleted: set[str] = set()  # as the handler keeps it: deleted by us, not yet recreated

    def job(self) -> tuple[RLTrainingJob | None, list]:
        try:
            return parse_job(self.job_dict, check=check_registered), []
        except InvalidJob as err:
            try:
                return parse_job(self.job_dict), err.problems
            except InvalidJob:
                return None, err.problems  # not even the schema holds (no API-server validation)

    def step(self, *, seconds: float = 1, report: job_status.LearnerReport | None = None) -> lifecycle.Plan:
        self.now += timedelta(seconds=seconds)
        job, problems = self.job()
        views = [PodView.from_pod(p, UID) for p in self.pods.values()]
        plan = lifecycle.plan(meta=JobMeta("cartpole-ppo", "default", UID, self.generation), job=job,
                              problems=problems, status=self.status, pods=views, now=self.now, options=OPTIONS,
                              report=report, deleted=self.deleted)
        self.deleted |= {pod.name for pod in plan.delete}
        self.deleted -= {m["metadata"]["name"] for m in plan.create}
        for pod in plan.delete:
            del self.pods[pod.name]
        for manifest in plan.create:
            builders.adopt([manifest], {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
                                        "metadata": {"name": "cartpole-ppo", "namespace": "default", "uid": UID}})
            manifest["metadata"]["uid"] = f"uid-{manifest['metadata']['name']}-{len(self.plans)}"
            assert manifest["metadata"]["name"] not in self.pods, "created a pod that exists"
            self.pods[manifest["metadata"]["name"]] = manifest
        self.status = plan.status
        self.plans.append(plan)
        return plan

    def set(self, name: str, phase: str, *, ready: bool = True, exit_code: int | None = None) -> None:
        status: dict = {"phase": phase, "podIP": "10.0.0.7"}
        if phase == "Running":
            status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        if phase in ("Succeeded", "Failed"):
            code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
            status["containerStatuses"] = [{"name": "main", "state": {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error"}}}]
        self.pods[name]["status"] = status

    def run_all(self) -> None:
        for name in self.pods:
            self.set(name, "Running")

    @property
    def phase(self) -> Phase:
        return Phase(self.status.phase)

    def condition(self, type_: str):
        return job_status.get_condition(self.status, type_)

    def names(self) -> list[str]:
        return sorted(self.pods)


@pytest.fixture
def sim(job_dict) -> Sim:
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 2
    return Sim(job_dict)


def running(sim: Sim) -> Sim:
    sim.step()
    sim.run_all()
    sim.step()
    assert sim.phase == Phase.RUNNING
    return sim


ALL = ["cartpole-ppo-head", "cartpole-ppo-learner", "cartpole-ppo-worker-0", "cartpole-ppo-worker-1"]


def test_a_learner_that_reports_its_first_iterations_is_running_before_its_readiness_probe_passes(sim):
    """A short job trains for seconds, fewer than the kubelet takes to probe the learner Ready: its answer
    on /metrics with iterations done says it trains. An answer before the first iteration does not."""
    sim.step()
    sim.run_all()
    sim.set("cartpole-ppo-learner", "Running", ready=False)
    sim.step(report=job_status.LearnerReport(Progress(), None, False))
    assert sim.phase == Phase.STARTING  # serving its metrics, not yet training
    plan = sim.step(report=job_status.LearnerReport(Progress(env_steps=1024, iterations=1), None, False))
    assert sim.phase == Phase.RUNNING and [(e.type, e.reason) for e in plan.events] == [("Normal", "Running")]


def test_new_job_creates_head_learner_and_workers_then_runs(sim):
    plan = sim.step()
    assert sorted(m["metadata"]["name"] for m in plan.create) == ALL
    assert plan.ensure_services
    assert sim.phase == Phase.STARTING and sim.status.start_time == sim.now
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Starting")]
    assert sim.status.workers == "0/2" and sim.status.observed_generation == 1
    assert sim.condition("Running").status == "False" and sim.condition("Running").reason == "Starting"

    sim.run_all()
    sim.set("cartpole-ppo-worker-1", "Running", ready=False)
    plan = sim.step()
    assert sim.phase == Phase.STARTING and sim.status.workers == "1/2"  # not every worker is ready yet
    sim.set("cartpole-ppo-worker-1", "Running")
    plan = sim.step()
    assert not plan.create and not plan.delete
    assert sim.phase == Phase.RUNNING and sim.status.workers == "2/2"
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Running")]
    assert {c.type: c.status for c in sim.status.conditions} == {
        "Running": "True", "Degraded": "False", "Complete": "False", "Failed": "False", "Suspended": "False"}


def test_a_steady_pass_changes_nothing(sim):
    running(sim)
    before = job_status.dump(sim.status)
    plan = sim.step(seconds=30)
    assert not plan.acted and not plan.events
    assert job_status.dump(plan.status) == before  # lastTransitionTime does not move without a transition


def test_invalid_spec_fails_with_the_field_and_creates_nothing(sim):
    sim.job_dict["spec"]["environment"]["id"] = "CartPoel-v1"
    plan = sim.step()
    assert plan.create == [] and not plan.ensure_services and sim.pods == {}
    assert sim.phase == Phase.FAILED and sim.status.reason == "InvalidSpec"
    assert "spec.environment.id" in sim.status.message and "CartPoel-v1" in sim.status.message
    failed = sim.condition("Failed")
    assert (failed.status, failed.reason) == ("True", "InvalidSpec")
    assert plan.events[-1].type == "Warning" and plan.events[-1].reason == "InvalidSpec"
    assert sim.step().create == []  # and stays so


def test_a_spec_failing_the_schema_is_invalid_too(sim):
    del sim.job_dict["spec"]["stopping"]
    sim.job_dict["spec"]["rolloutWorkers"]["replicas"] = 0
    sim.step()
    assert sim.phase == Phase.FAILED and sim.status.reason == "InvalidSpec" and sim.pods == {}
    assert "spec.stopping: required field is missing" in sim.status.message
    assert "spec.rolloutWorkers.replicas" in sim.status.message


def test_algorithm_that_cannot_act_in_the_action_space_is_invalid(job_dict):
    job_dict["spec"]["algorithm"]["name"] = "DQN"
    job_dict["spec"]["environment"]["id"] = "Pendulum-v1"
    sim = Sim(job_dict)
    sim.step()
    assert sim.status.reason == "InvalidSpec" and "spec.algorithm.name" in sim.status.message
    assert sim.pods == {}


def test_fixed_spec_of_an_invalid_job_starts_it(sim):
    sim.job_dict["spec"]["environment"]["id"] = "Nope-v0"
    sim.step()
    assert sim.phase == Phase.FAILED
    sim.job_dict["spec"]["environment"]["id"] = "CartPole-v1"
    sim.generation = 2
    plan = sim.step()
    assert sim.phase == Phase.STARTING and len(plan.create) == 4
    assert sim.status.reason is None and sim.condition("Failed").status == "False"


def test_unreadable_cpu_quantity_is_invalid_spec(sim):
    sim.job_dict["spec"]["rolloutWorkers"]["resources"] = {"requests": {"cpu": "lots"}}
    sim.step()
    assert sim.status.reason == "InvalidSpec" and "spec.rolloutWorkers.resources" in sim.status.message
    assert sim.pods == {}


def test_failed_worker_is_replaced_and_the_job_is_degraded_meanwhile(sim):
    running(sim)
    sim.set("cartpole-ppo-worker-1", "Failed", exit_code=137)
    plan = sim.step()
    assert [p.name for p in plan.delete] == ["cartpole-ppo-worker-1"]
    assert plan.restarts == [Component.ROLLOUT_WORKER]
    assert sim.phase == Phase.RUNNING  # training goes on
    degraded = sim.condition("Degraded")
    assert (degraded.status, degraded.reason) == ("True", "WorkerReplaced")
    assert "cartpole-ppo-worker-1" in degraded.message and "137" in degraded.message
    assert ("Warning", "WorkerReplaced") in [(e.type, e.reason) for e in plan.events]
    plan = sim.step(seconds=0.1)  # the pod is gone: its replacement is created
    assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-worker-1"]
    assert plan.restarts == [] and not plan.events  # the same loss is not counted twice
    assert sim.condition("Degraded").reason == "WorkerReplaced"  # until the replacement is ready
    sim.step()
    assert sim.condition("Degraded").reason == "WorkerReplaced"
    sim.set("cartpole-ppo-worker-1", "Running")
    sim.step()
    assert sim.condition("Degraded").status == "False" and sim.status.workers == "2/2"


def test_vanished_worker_is_recreated(sim):
    running(sim)
    del sim.pods["cartpole-ppo-worker-0"]
    plan = sim.step()
    assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-worker-0"]
    assert sim.condition("Degraded").reason == "WorkerReplaced"
    assert "disappeared" in sim.condition("Degraded").message


def test_scale_up_and_down_by_worker_index(sim):
    running(sim)
    sim.job_dict["spec"]["rolloutWorkers"]["replicas"] = 4
    plan = sim.step()
    assert sorted(m["metadata"]["name"] for m in plan.create) == ["cartpole-ppo-worker-2", "cartpole-ppo-worker-3"]
    assert plan.events[0].reason == "ScaledUp"
    assert sim.status.workers == "2/4" and sim.condition("Degraded").reason == "WorkersNotReady"
    sim.run_all()
    sim.step()
    assert sim.status.workers == "4/4" and sim.condition("Degraded").status == "False"

    sim.job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    plan = sim.step()
    assert sorted(p.name for p in plan.delete) == ["cartpole-ppo-worker-1", "cartpole-ppo-worker-2",
                                                   "cartpole-ppo-worker-3"]
    assert plan.events[0].reason == "ScaledDown" and plan.restarts == []
    assert sim.status.workers == "1/1" and sim.phase == Phase.RUNNING
    assert not sim.step().acted  # removed workers are not "replaced"


def test_learner_failure_restarts_it_until_backoff_limit_then_fails(sim):
    sim.job_dict["spec"]["backoffLimit"] = 2
    running(sim)
    for attempt in (1, 2):
        sim.set("cartpole-ppo-learner", "Failed", exit_code=1)
        plan = sim.step()
        assert [p.name for p in plan.delete] == ["cartpole-ppo-learner"]
        assert sim.status.learner_restarts == attempt and sim.phase == Phase.STARTING
        event = next(e for e in plan.events if e.reason == "LearnerRestarted")
        assert event.type == "Warning" and f"restarts counted {attempt} of 2" in event.message
        assert "emptyDir" in event.message  # says the checkpoints are gone with the pod
        plan = sim.step(seconds=0.1)
        assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-learner"]
        sim.set("cartpole-ppo-learner", "Running")
        sim.step()
        assert sim.phase == Phase.RUNNING
    sim.set("cartpole-ppo-learner", "Failed", exit_code=3)
    plan = sim.step()
    assert sim.phase == Phase.FAILED and sim.status.reason == "BackoffLimitExceeded"
    assert "exited with code 3" in sim.status.message
    # Head and workers go; the failed learner stays for `kubectl logs`.
    assert sim.names() == ["cartpole-ppo-learner"] and sim.status.completion_time == sim.now
    assert sim.condition("Failed").status == "True" and sim.condition("Running").reason == "BackoffLimitExceeded"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "BackoffLimitExceeded")]


def test_learner_restart_with_a_claim_says_it_resumes(sim):
    sim.job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "ckpt"}
    running(sim)
    sim.set("cartpole-ppo-learner", "Failed")
    plan = sim.step()
    assert "resuming from the newest checkpoint on PersistentVolumeClaim ckpt" in plan.events[0].message


def test_a_restarted_learners_grace_period_is_sized_from_the_longest_checkpoint_measured(sim):
    """The first learner pod has Kubernetes' default grace; each one after carries the job's longest measured
    checkpoint (to disk and to the store) twice over, on top of the default: a SIGTERM's checkpoint fits."""
    plan = sim.step()
    learner = next(m for m in plan.create if m["metadata"]["name"] == "cartpole-ppo-learner")
    assert "terminationGracePeriodSeconds" not in learner["spec"]  # nothing measured yet
    sim.run_all()

    def report(seconds: float | None) -> job_status.LearnerReport:
        return job_status.LearnerReport(Progress(env_steps=512, iterations=3), None, False, checkpoint_seconds=seconds)

    sim.step(report=report(41.2))
    sim.step(report=report(7.5))  # a smaller one later does not shrink it: the buffer's checkpoint grows
    sim.step(report=report(None))
    assert sim.status.checkpoint_seconds == 41.2
    sim.set("cartpole-ppo-learner", "Failed")
    sim.step()
    plan = sim.step(seconds=0.1)
    learner = next(m for m in plan.create if m["metadata"]["name"] == "cartpole-ppo-learner")
    assert learner["spec"]["terminationGracePeriodSeconds"] == 30 + 83


def test_the_grace_period_from_a_measured_checkpoint_is_bounded_and_a_templates_own_wins(job_dict):
    job = parse_job(job_dict, check=check_registered)
    assert builders.learner_grace_seconds(None) is None
    assert builders.learner_grace_seconds(0.07) == 31
    assert builders.learner_grace_seconds(3600.0) == builders.MAX_LEARNER_GRACE_SECONDS == 600
    assert builders.build_learner_pod(job, OPTIONS, checkpoint_seconds=10.0)["spec"][
        "terminationGracePeriodSeconds"] == 50
    job_dict["spec"]["learner"] = {"template": {"spec": {"terminationGracePeriodSeconds": 900}}}
    job = parse_job(job_dict, check=check_registered)
    assert builders.build_learner_pod(job, OPTIONS, checkpoint_seconds=10.0)["spec"][
        "terminationGracePeriodSeconds"] == 900


def test_the_checkpoint_time_is_read_from_the_learners_metrics_disk_and_store_together():
    text = 'kuberl_env_steps_total{job_name="j"} 512\nkuberl_checkpoint_seconds{job_name="j"} 0.25\n'
    assert job_status.parse_learner_metrics(text, job_name="j").checkpoint_seconds == 0.2
    both = text + 'kuberl_checkpoint_upload_seconds{job_name="j"} 1.5\n'
    assert job_status.parse_learner_metrics(both, job_name="j").checkpoint_seconds == 1.8
    # Before the first checkpoint the gauges read 0; a figure no checkpoint takes is the tenant's invention.
    for value in ("0", "-3", "1e12", "NaN", "+Inf"):
        hostile = text.replace("0.25", value)
        assert job_status.parse_learner_metrics(hostile, job_name="j").checkpoint_seconds is None, value


def evict(sim: Sim, name: str) -> None:
    """What the eviction API does to a pod (a drain, preemption): the DisruptionTarget condition, then the
    deletion; the pod terminates with its grace period."""
    pod = sim.pods[name]
    pod["metadata"]["deletionTimestamp"] = "2025-01-01T12:00:00Z"
    status = pod.setdefault("status", {})
    status["conditions"] = [*status.get("conditions", []), {"type": "DisruptionTarget", "status": "True",
                                                             "reason": "EvictionByEvictionAPI"}]


def test_an_evicted_learner_is_restarted_without_spending_the_backoff_limit(sim):
    """A drain (or preemption) takes pods away; the job did not fail. With backoffLimit 0 a failed learner
    fails the job, an evicted one is replaced, its restart counted apart (Kubernetes Jobs' podFailurePolicy
    for DisruptionTarget, built in)."""
    sim.job_dict["spec"]["backoffLimit"] = 0
    running(sim)
    evict(sim, "cartpole-ppo-learner")
    plan = sim.step()  # terminating: nothing to do yet but remember why it goes
    assert not plan.create and sim.status.disrupted_pods == ["cartpole-ppo-learner"]
    del sim.pods["cartpole-ppo-learner"]  # its node stopped it and deleted the pod
    plan = sim.step()
    assert sim.phase == Phase.STARTING, sim.status.message
    assert sim.status.learner_restarts == 1 and sim.status.disruption_restarts == 1
    assert sim.status.disrupted_pods == []
    event = next(e for e in plan.events if e.reason == "LearnerRestarted")
    assert "evicted or preempted" in event.message and "restarts counted 0 of 0" in event.message
    if "cartpole-ppo-learner" not in sim.pods:  # the pod is gone already: created in this pass or the next
        sim.step(seconds=0.1)
    assert "cartpole-ppo-learner" in sim.pods
    sim.set("cartpole-ppo-learner", "Running")
    sim.step()
    # The same learner failing on its own is a failure: the limit of 0 is spent on it.
    sim.set("cartpole-ppo-learner", "Failed", exit_code=1)
    sim.step()
    assert sim.phase == Phase.FAILED and sim.status.reason == "BackoffLimitExceeded"


def test_an_evicted_head_restarts_the_ray_cluster_without_spending_the_backoff_limit(sim):
    sim.job_dict["spec"]["backoffLimit"] = 0
    running(sim)
    evict(sim, "cartpole-ppo-head")
    plan = sim.step()
    assert sim.phase == Phase.STARTING, sim.status.message
    assert sim.status.head_restarts == 1 and sim.status.disruption_restarts == 1
    assert sorted(p.name for p in plan.delete) == sorted(n for n in ALL if n != "cartpole-ppo-head")
    assert "evicted or preempted" in sim.condition("Degraded").message


def test_a_head_that_fails_on_its_own_still_spends_the_backoff_limit(sim):
    sim.job_dict["spec"]["backoffLimit"] = 0
    running(sim)
    sim.set("cartpole-ppo-head", "Failed")
    sim.step()
    assert sim.phase == Phase.FAILED and sim.status.reason == "BackoffLimitExceeded"
    assert sim.status.disruption_restarts == 0


def test_head_failure_recreates_the_ray_cluster_in_a_new_epoch(sim):
    running(sim)
    sim.set("cartpole-ppo-head", "Failed")
    plan = sim.step()
    assert sorted(p.name for p in plan.delete) == ALL  # the Ray cluster is gone: everything restarts
    assert sim.status.head_restarts == 1 and sim.phase == Phase.STARTING
    assert sim.condition("Running").status == "False"  # never Running with nothing running
    assert sim.condition("Degraded").reason == "HeadRestarted"
    plan = sim.step(seconds=0.1)
    assert sorted(m["metadata"]["name"] for m in plan.create) == ALL
    assert {m["metadata"]["labels"]["kuberl.dev/ray-epoch"] for m in plan.create} == {"1"}
    sim.run_all()
    sim.step()
    assert sim.phase == Phase.RUNNING and sim.status.head_restarts == 1


def test_deleted_head_while_running_counts_and_fails_at_the_limit(sim):
    sim.job_dict["spec"]["backoffLimit"] = 0
    running(sim)
    del sim.pods["cartpole-ppo-head"]
    sim.step()
    assert sim.phase == Phase.FAILED and sim.status.reason == "BackoffLimitExceeded"
    assert "head pod disappeared" in sim.status.message
    assert sim.pods == {}


def test_pods_of_an_older_ray_epoch_are_recycled(sim):
    running(sim)
    sim.status.head_restarts = 1  # e.g. the operator restarted after recreating the head
    sim.pods["cartpole-ppo-head"]["metadata"]["labels"]["kuberl.dev/ray-epoch"] = "1"
    plan = sim.step()
    assert sorted(p.name for p in plan.delete) == ALL[1:]
    assert plan.restarts == []  # planned, not counted


def test_learner_exit_0_succeeds_cleans_up_and_keeps_progress(sim):
    running(sim)
    report = job_status.LearnerReport(Progress(episodes=500, env_steps=40_000, mean_return=480.5), T0, True)
    sim.step(report=report)
    sim.set("cartpole-ppo-learner", "Succeeded")
    plan = sim.step()
    assert sim.phase == Phase.SUCCEEDED and sim.status.completion_time == sim.now
    assert sorted(p.name for p in plan.delete) == ALL[:1] + ALL[2:]
    assert sim.names() == ["cartpole-ppo-learner"]
    assert sim.status.progress.episodes == 500 and sim.status.progress.mean_return == 480.5
    complete = sim.condition("Complete")
    assert (complete.status, complete.reason) == ("True", "TrainingFinished")
    assert "500 episodes" in complete.message
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Succeeded")]
    assert not sim.step().acted  # terminal: nothing more happens


def test_a_restarted_learner_that_has_not_iterated_yet_does_not_send_progress_backwards(sim):
    running(sim)
    sim.step(report=job_status.LearnerReport(
        Progress(episodes=300, env_steps=53_248, iterations=52), T0, False))
    # The new learner serves /metrics while it starts Ray and restores its checkpoint: zeros until then.
    sim.step(report=job_status.LearnerReport(Progress(), None, False))
    assert sim.status.progress.env_steps == 53_248 and sim.status.progress.iterations == 52
    # Its first iteration continues from the checkpoint's counters: those are reported.
    sim.step(report=job_status.LearnerReport(
        Progress(episodes=310, env_steps=54_272, iterations=53), T0, False))
    assert sim.status.progress.env_steps == 54_272


def test_ttl_deletes_a_finished_job_when_due(sim):
    sim.job_dict["spec"]["ttlSecondsAfterFinished"] = 60
    running(sim)
    sim.set("cartpole-ppo-learner", "Succeeded")
    plan = sim.step()
    assert plan.wake_in == pytest.approx(60) and not plan.delete_job
    assert sim.step(seconds=30).wake_in == pytest.approx(30)
    assert sim.step(seconds=31).delete_job


def test_ttl_applies_to_invalid_jobs_too(sim):
    sim.job_dict["spec"]["ttlSecondsAfterFinished"] = 0
    sim.job_dict["spec"]["environment"]["id"] = "Nope-v0"
    sim.step()
    assert sim.step().delete_job


def test_suspend_deletes_pods_and_resume_recreates_them(sim):
    running(sim)
    sim.job_dict["spec"]["suspend"] = True
    plan = sim.step()
    # The learner first: it checkpoints on SIGTERM, which needs its Ray head and workers still up.
    assert [p.name for p in plan.delete] == ["cartpole-ppo-learner"] and sim.phase == Phase.SUSPENDED
    assert sim.condition("Suspended").status == "True" and sim.condition("Running").status == "False"
    assert "emptyDir" in sim.condition("Suspended").message
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Suspended")]
    assert sim.status.workers == "0/2"
    plan = sim.step()  # the learner pod is gone: now the rest
    assert sorted(p.name for p in plan.delete) == [n for n in ALL if n != "cartpole-ppo-learner"]
    assert not plan.events
    assert not sim.step().acted

    sim.job_dict["spec"]["suspend"] = False
    plan = sim.step(seconds=100)
    assert sorted(m["metadata"]["name"] for m in plan.create) == ALL
    assert sim.phase == Phase.STARTING and sim.status.start_time == sim.now  # deadline clock restarts
    assert [e.reason for e in plan.events] == ["Resumed"]
    assert sim.status.learner_restarts == 0
    sim.run_all()
    sim.step()
    assert sim.phase == Phase.RUNNING


def test_active_deadline_fails_the_job_and_deletes_every_pod(sim):
    sim.job_dict["spec"]["activeDeadlineSeconds"] = 100
    running(sim)
    assert sim.plans[-1].wake_in == pytest.approx(99)  # started one step before
    sim.step(seconds=120)
    assert sim.phase == Phase.FAILED and sim.status.reason == "DeadlineExceeded"
    assert sim.pods == {}
    assert "activeDeadlineSeconds (100 s)" in sim.condition("Failed").message


def test_pods_of_another_owner_or_terminating_block_creation(sim):
    sim.pods["cartpole-ppo-head"] = {"metadata": {"name": "cartpole-ppo-head", "uid": "old",
                                                  "labels": {"kuberl.dev/component": "head"},
                                                  "ownerReferences": [{"uid": "previous-job"}]}}
    plan = sim.step()
    assert "cartpole-ppo-head" not in [m["metadata"]["name"] for m in plan.create]
    assert len(plan.create) == 3 and not plan.delete  # not ours: neither used nor deleted


def test_progress_report_goes_into_status(sim):
    running(sim)
    checkpoint = T0 + timedelta(minutes=3)
    sim.step(report=job_status.LearnerReport(Progress(episodes=12, env_steps=3400, episodes_per_second=2.5,
                                               env_steps_per_second=700.0, wall_clock_seconds=12.0,
                                               gradient_updates=40, iterations=5), checkpoint, False))
    assert sim.status.progress.env_steps == 3400 and sim.status.progress.episodes_per_second == 2.5
    assert sim.status.last_checkpoint_time == checkpoint
    sim.step()  # no report: progress is kept
    assert sim.status.progress.env_steps == 3400


def test_time_to_first_step_is_read_once_from_the_learner_and_bounded_by_the_jobs_life(job_dict):
    created = T0 - timedelta(seconds=30)
    report = job_status.LearnerReport(Progress(env_steps=512, iterations=1), None, False,
                                      first_step_time=created.timestamp() + 12.34)

    def time_to_first_step(status, first_step_time, now):
        views = []
        report.first_step_time = first_step_time
        job = parse_job(job_dict, check=check_registered)
        return lifecycle.plan(meta=JobMeta("cartpole-ppo", "default", UID, 1, created), job=job, problems=[],
                              status=status, pods=views, now=now, options=OPTIONS,
                              report=report).status.time_to_first_step_seconds

    assert time_to_first_step(RLTrainingJobStatus(), created.timestamp() + 12.34, T0) == 12.3
    # Set once: a restarted learner's later first step does not move it.
    assert time_to_first_step(RLTrainingJobStatus(time_to_first_step_seconds=12.3),
                              created.timestamp() + 500, T0 + timedelta(minutes=10)) == 12.3
    # The learner's clock is the tenant's: a time before the job existed, or after now, is not a start-up.
    assert time_to_first_step(RLTrainingJobStatus(), created.timestamp() - 5, T0) is None
    assert time_to_first_step(RLTrainingJobStatus(), T0.timestamp() + 3600, T0) is None
    assert time_to_first_step(RLTrainingJobStatus(), None, T0) is None


def test_the_learners_first_step_time_is_read_from_its_metrics():
    text = ('kuberl_env_steps_total{job_name="j"} 512\n'
            'kuberl_first_step_timestamp_seconds{job_name="j"} 1.7e9\n')
    assert job_status.parse_learner_metrics(text, job_name="j").first_step_time == 1.7e9
    zero = text.replace("1.7e9", "0")
    assert job_status.parse_learner_metrics(zero, job_name="j").first_step_time is None  # none yet


# -- what the API server refused of the job's creates: the planner decides (`refusals`) ------------------------


def decide(sim: Sim, refusal: refusals.Refusal | None) -> lifecycle.Plan:
    """The planner's answer for the sim's job as it stands, with `refusal`; nothing applied."""
    job, problems = sim.job()
    views = [PodView.from_pod(p, UID) for p in sim.pods.values()]
    return lifecycle.plan(meta=JobMeta("cartpole-ppo", "default", UID, sim.generation), job=job, problems=problems,
                          status=sim.status, pods=views, now=sim.now, options=OPTIONS, deleted=sim.deleted,
                          refusal=refusal)


def refused(previous: refusals.Refusal | None = None, *, forbidden: str | None = None, invalid: str | None = None,
            generation: int = 1) -> refusals.Refusal | None:
    return refusals.after(previous, forbidden=forbidden, invalid=invalid, clean=False, created=True,
                          generation=generation, retry=lambda tries: 10.0 * 2 ** (tries - 1))


QUOTA = "Pod cartpole-ppo-head: exceeded quota: no-pods, requested: pods=1, used: pods=0, limited: pods=0"


def test_forbidden_creates_hold_the_job_with_the_reason_and_clear_once_they_go_through(sim):
    first = refused(forbidden=QUOTA)
    plan = decide(sim, first)
    held = job_status.get_condition(plan.status, refusals.CREATE_FORBIDDEN)
    assert (held.status, held.reason) == ("True", "Forbidden")
    assert held.message == f"{QUOTA} (try 1; next in 10.0 s)"
    assert ("Warning", "FailedCreate") in [(e.type, e.reason) for e in plan.events]
    assert Phase(plan.status.phase) not in (Phase.FAILED,) and plan.status.reason is None
    assert plan.create  # the next try creates the same pods again

    sim.status = plan.status
    second = refused(first, forbidden=QUOTA)
    assert (second.tries, second.retry_s) == (2, 20.0)
    plan = decide(sim, second)
    assert job_status.get_condition(plan.status, refusals.CREATE_FORBIDDEN).message.endswith("(try 2; next in 20.0 s)")
    assert "FailedCreate" not in [e.reason for e in plan.events]  # told once, not at every try

    sim.status = plan.status
    gone = refusals.after(second, forbidden=None, invalid=None, clean=True, created=True, generation=1,
                          retry=lambda tries: 10.0)
    assert gone is None
    plan = decide(sim, gone)
    cleared = job_status.get_condition(plan.status, refusals.CREATE_FORBIDDEN)
    assert (cleared.status, cleared.reason) == ("False", "Created")


def test_an_invalid_child_fails_a_new_job_in_the_servers_words_and_a_started_job_keeps_its_pods(sim):
    words = "Pod cartpole-ppo-worker-0: spec.tolerations[0].operator: Unsupported value: \"Sometimes\""
    plan = decide(sim, refused(invalid=words))
    assert Phase(plan.status.phase) == Phase.FAILED and plan.status.reason == lifecycle.INVALID_SPEC
    assert plan.status.message == f"spec: the API server refused a child of this job: {words}"
    assert not plan.create and job_status.get_condition(plan.status, refusals.CHANGE_REFUSED) is None

    running(sim)
    plan = decide(sim, refused(invalid=words))
    assert Phase(plan.status.phase) == Phase.RUNNING and not plan.delete
    held = job_status.get_condition(plan.status, refusals.CHANGE_REFUSED)
    assert (held.status, held.reason) == ("True", "Invalid")
    assert held.message == f"{words}; the job keeps the pods it has: fix the spec and apply it again (try 1; next in 10.0 s)"


def test_a_refusal_under_an_older_spec_is_not_held_against_the_new_one(sim):
    words = "Pod cartpole-ppo-head: spec.containers[0].image: Invalid value"
    old = refused(invalid=words, generation=1)
    sim.generation = 2
    plan = decide(sim, old)
    assert Phase(plan.status.phase) != Phase.FAILED and plan.create
    # A pass under the new spec that the server takes drops it, created or not.
    assert refusals.after(old, forbidden=None, invalid=None, clean=True, created=False, generation=2,
                          retry=lambda tries: 10.0) is None
    # Under the same spec, a pass with nothing to create keeps it (the job is still held or failed).
    assert refusals.after(old, forbidden=None, invalid=None, clean=True, created=False, generation=1,
                          retry=lambda tries: 10.0) is old

"""The learner's last word reaches the job's status through its pod, not a race with a scrape.

A learner exits right after its final evaluation; the operator's next scrape of /metrics would find
nothing. So the learner writes its final metrics to its container's terminationMessagePath, the
kubelet puts them into the pod's status, and the operator parses them as it parses a scrape.
"""

from __future__ import annotations

import pytest

from kuberl.api.job import StopReason
from kuberl.operator import builders
from kuberl.operator.pods import PodView
from kuberl.operator.status import parse_learner_metrics
from kuberl.trainer.metrics import JobLabels, LearnerMetrics


def finished_metrics(tmp_path, monkeypatch) -> str:
    metrics = LearnerMetrics(JobLabels("ttt", "ml", "DQN", "kuberl/TicTacToe-v0"))
    metrics.inc("kuberl_episodes_total", 100_000)
    metrics.inc("kuberl_env_steps_total", 380_000)
    metrics.set("kuberl_episode_return_mean", 0.93)
    metrics.set("kuberl_evaluation_return_mean", 0.97)
    metrics.set_win_rate("vs-random-first", 0.99)
    metrics.set_win_rate("self-play", 0.0)
    metrics.set("kuberl_checkpoint_timestamp_seconds", 1_700_000_000)
    metrics.set("kuberl_checkpoint_iteration", 812)
    metrics.set("kuberl_job_finished", 1)
    metrics.set_stopped_by("max_env_steps")
    metrics.mark_first_step(1_700_000_100.0)
    metrics.mark_first_step(1_700_000_900.0)  # the first is kept
    path = tmp_path / "termination-log"
    monkeypatch.setenv("KUBERL_TERMINATION_MESSAGE_PATH", str(path))
    metrics.write_termination_message()
    return path.read_text()


def test_the_final_metrics_fit_a_termination_message_and_parse_as_a_scrape(tmp_path, monkeypatch):
    text = finished_metrics(tmp_path, monkeypatch)
    assert len(text.encode()) <= 4096, "the kubelet keeps at most 4096 bytes"
    report = parse_learner_metrics(text, job_name="ttt")
    assert report.finished
    assert report.progress.episodes == 100_000 and report.progress.env_steps == 380_000
    assert report.evaluation == {"deterministic": {"meanReturn": 0.97}, "self-play": {"winRate": 0.0},
                                 "vs-random-first": {"winRate": 0.99}}
    assert report.last_checkpoint == "ckpt-000000812.pt"
    assert report.first_step_time == 1_700_000_100.0
    assert report.stopped_by == StopReason.MAX_ENV_STEPS


def test_a_finished_learner_of_eight_groups_with_the_longest_names_leaves_every_groups_return(tmp_path, monkeypatch):
    """Policy groups' returns reach a finished job's status through the termination message too: eight groups
    (the most a spec gives) with 31-character names, beside a long job name, namespace and env id."""
    from kuberl.api.job import MAX_POLICY_GROUPS

    job, namespace = "j" * 40, "n" * 63
    metrics = LearnerMetrics(JobLabels(job, namespace, "PPO", "mpe2.simple_adversary_v3:parallel_env"))
    metrics.inc("kuberl_episodes_total", 1_000)
    metrics.inc("kuberl_env_steps_total", 300_000)
    metrics.set("kuberl_episode_return_mean", -3.25)
    groups = {f"{chr(ord('a') + i)}{'x' * 30}": -10.0 * i - 10.04 for i in range(MAX_POLICY_GROUPS)}
    for name, value in groups.items():
        metrics.set_policy_return(name, value)
    metrics.set("kuberl_evaluation_return_mean", -2.5)
    metrics.set("kuberl_job_finished", 1)
    metrics.set_stopped_by("max_env_steps")
    path = tmp_path / "termination-log"
    monkeypatch.setenv("KUBERL_TERMINATION_MESSAGE_PATH", str(path))
    metrics.write_termination_message()
    report = parse_learner_metrics(path.read_text(), job_name=job)
    assert report.finished and report.stopped_by == StopReason.MAX_ENV_STEPS
    assert report.progress.returns_by_policy == pytest.approx({name: round(v, 1) for name, v in groups.items()})


def test_why_training_stopped_is_a_reason_kuberl_knows_or_none():
    line = 'kuberl_stopped_by{{job_name="ttt",namespace="ml",algorithm="DQN",environment="e",reason="{}"}} {}\n'
    base = "kuberl_episodes_total 1\nkuberl_job_finished 1\n"
    assert parse_learner_metrics(base + line.format("target_return", 1), "ttt").stopped_by == StopReason.TARGET_RETURN
    for reason, value in (("rm -rf /", 1), ("x" * 200, 1), ("target_return", 0)):
        assert parse_learner_metrics(base + line.format(reason, value), "ttt").stopped_by is None
    with pytest.raises(ValueError, match="characters long"):  # a line past the read limit: nothing is read
        parse_learner_metrics(base + line.format("x" * 5000, 1), "ttt")
    # Only a finished learner's reason counts: one still training has not stopped.
    running = "kuberl_episodes_total 1\nkuberl_job_finished 0\n" + line.format("max_env_steps", 1)
    assert parse_learner_metrics(running, "ttt").stopped_by is None


def test_a_finished_jobs_summary_says_which_rule_stopped_it():
    from kuberl.api.job import RLTrainingJobStatus
    from kuberl.operator.phases import summary

    status = RLTrainingJobStatus(phase="Succeeded", stoppedBy="target_return",
                                 progress={"episodes": 310, "envSteps": 67_584, "meanReturn": 476.25})
    assert summary(status) == ("training finished (reached stopping.targetReturn): 310 episodes, 67584 env steps, "
                               "mean return 476.2")
    assert summary(RLTrainingJobStatus(phase="Succeeded")).startswith("training finished: 0 episodes")
    groups = RLTrainingJobStatus(phase="Succeeded", progress={
        "episodes": 12_000, "envSteps": 300_000, "meanReturn": -3.25,
        "returnsByPolicy": {"adversary": -14.2, "good": 6.33}})
    assert summary(groups) == ("training finished: 12000 episodes, 300000 env steps, mean return -3.25, by policy: "
                               "adversary -14.2, good 6.33")


def test_the_time_to_first_step_counts_from_this_process_start():
    import time

    from kuberl.trainer import metrics as learner_metrics

    started = learner_metrics.process_start_time()
    # Read from /proc, not the import-time fallback: this process started before the module was imported
    # (Python's start-up and pytest's collection came first), and not long before on a busy machine.
    assert 0 < learner_metrics._IMPORTED_AT - started < 600
    metrics = LearnerMetrics(JobLabels("j", "ml", "PPO", "CartPole-v1"))
    metrics.mark_first_step()
    seconds = metrics["kuberl_time_to_first_step_seconds"]._value.get()
    assert 0 < seconds <= time.time() - started + 1


def test_a_succeeded_learner_pod_hands_its_message_to_the_operator(tmp_path, monkeypatch):
    text = finished_metrics(tmp_path, monkeypatch)
    pod = {"metadata": {"name": "ttt-learner", "labels": {"kuberl.dev/component": "learner"}},
           "status": {"phase": "Succeeded", "containerStatuses": [
               {"name": "learner", "state": {"terminated": {"exitCode": 0, "message": text}}}]}}
    assert PodView.from_pod(pod).final_message == text
    failed = {**pod, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "learner", "state": {"terminated": {"exitCode": 1, "message": "Traceback ..."}}}]}}
    assert PodView.from_pod(failed).final_message is None


def test_the_learner_pod_says_where_to_write_it(monkeypatch):
    from kuberl.api.load import parse_job

    job = parse_job({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
                     "metadata": {"name": "cartpole", "namespace": "ml"},
                     "spec": {"algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
                              "stopping": {"maxEnvSteps": 1000}}}, source="test")
    (container,) = builders.build_learner_pod(job, builders.BuildOptions())["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}  # (RAY_AUTH_TOKEN comes from a Secret)
    assert env["KUBERL_TERMINATION_MESSAGE_PATH"] == container["terminationMessagePath"] == "/dev/termination-log"

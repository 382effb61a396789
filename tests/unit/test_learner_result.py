"""A finished job's result and a learner's refusal of its spec come from the learner container's
termination message only: a sidecar a template adds to the learner's pod cannot write either."""

from __future__ import annotations

from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, InvalidJob, Problem
from kuberl.operator.pods import LEARNER_CONTAINER, PodView
from kuberl.operator.status import parse_learner_metrics

REAL = "# TYPE kuberl_episodes_total counter\nkuberl_episodes_total 100\nkuberl_job_finished 1\n"
FORGED = "# TYPE kuberl_episodes_total counter\nkuberl_episodes_total 999999999\nkuberl_job_finished 1\n"


def _pod(phase: str, *containers: tuple[str, int, str]) -> dict:
    return {"metadata": {"name": "ttt-learner", "labels": {"kuberl.dev/component": "learner"}},
            "status": {"phase": phase, "containerStatuses": [
                {"name": name, "state": {"terminated": {"exitCode": code, "message": message}}}
                for name, code, message in containers]}}


def test_the_learner_container_is_the_operators_own():
    assert LEARNER_CONTAINER == "learner"


def test_a_sidecars_forged_result_loses_to_the_learners_in_either_order():
    for statuses in ([("side", 0, FORGED), (LEARNER_CONTAINER, 0, REAL)],
                     [(LEARNER_CONTAINER, 0, REAL), ("side", 0, FORGED)]):
        message = PodView.from_pod(_pod("Succeeded", *statuses)).final_message
        assert message == REAL
        assert parse_learner_metrics(message, job_name="ttt").progress.episodes == 100


def test_a_sidecars_result_alone_is_no_result():
    assert PodView.from_pod(_pod("Succeeded", ("side", 0, FORGED))).final_message is None
    # The learner ended without a message of its own: the sidecar's still does not stand in for it.
    assert PodView.from_pod(_pod("Succeeded", ("side", 0, FORGED), (LEARNER_CONTAINER, 0, ""))).final_message is None


def test_only_the_learner_refuses_its_spec():
    report = InvalidJob([Problem("spec.environment.id", "no such environment")], source="ttt").report()
    forged = _pod("Failed", ("side", INVALID_SPEC_EXIT_CODE, report), (LEARNER_CONTAINER, 1, "Traceback ..."))
    assert PodView.from_pod(forged).invalid_spec is None
    other = InvalidJob([Problem("spec.image", "forged")], source="ttt").report()
    real = _pod("Failed", ("side", INVALID_SPEC_EXIT_CODE, other), (LEARNER_CONTAINER, INVALID_SPEC_EXIT_CODE, report))
    assert PodView.from_pod(real).invalid_spec == report

"""Autoscaling training end to end: the BDQ example (AutoscalingMulti-v0, macro/micro encoders, async
collection) on a short budget through Ray, with its random and threshold baseline suites in
evaluation.json; the baseline suite runner on its own; and the slow check that the DQN example
beats the best threshold autoscaler."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from conftest import REPO
from kuberl.api.load import parse_job

EXAMPLES = REPO / "examples"


def _example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"autoscaling-{name}.yaml").read_text())


def test_short_bdq_job_trains_asynchronously_and_reports_baselines(tmp_path):
    from kuberl.trainer.run import TrainOptions, train

    job_dict = _example("bdq")
    spec = job_dict["spec"]
    spec["algorithm"]["bdq"].update(learningStarts=500, bufferSize=5000)
    spec["environment"]["kwargs"]["episode_length"] = 50
    spec["stopping"] = {"maxEnvSteps": 4_000}
    spec["checkpointing"] = {"enabled": False}
    spec["evaluation"]["episodes"] = 4
    for suite in spec["evaluation"]["suites"]:
        suite["episodes"] = 4
        if suite["baseline"] == "threshold":  # a small grid keeps the test fast: tier and priority fixed
            suite["baselineParams"] = {"tier": 0, "priority": 2, "tuning_episodes": 2}
    job = parse_job(job_dict)
    assert job.spec.collection.mode.value == "async"
    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False))
    assert result.ok and result.reason == "max_env_steps"
    assert result.counters.gradient_updates > 0

    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert set(evaluation) == {"deterministic", "threshold", "random"}
    for name in ("deterministic", "threshold", "random"):
        assert evaluation[name]["episodes"] == 4 and evaluation[name]["mean_length"] == 50
    threshold = evaluation["threshold"]
    assert threshold["params"]["tier"] == 0 and threshold["params"]["priority"] == 2
    assert threshold["params"]["lower"] < threshold["params"]["upper"]
    assert threshold["tuning_seeds"] == [10_004, 10_005]  # after the evaluation seeds, never among them
    assert threshold["mean_return"] > evaluation["random"]["mean_return"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 4_000


def test_baseline_suites_run_on_the_policy_evaluation_seeds():
    from kuberl.trainer.envs.baselines import ThresholdPolicy, evaluate_policy
    from kuberl.trainer.evaluation.baselines import baseline_suite

    job_dict = _example("dqn")
    job_dict["spec"]["environment"]["kwargs"] = {"load_pattern": "SPIKE", "episode_length": 40}
    job_dict["spec"]["evaluation"] = {"episodes": 3, "seed": 7, "suites": [
        {"name": "fixed", "kind": "baseline", "baseline": "threshold", "episodes": 3,
         "baselineParams": {"upper": 0.9, "lower": 0.5}},
        {"name": "tuned", "kind": "baseline", "baseline": "threshold", "episodes": 3,
         "baselineParams": {"tuning_episodes": 2}},
        {"name": "typo", "kind": "baseline", "baseline": "threshold", "episodes": 3,
         "baselineParams": {"uper": 0.9}},
    ]}
    spec = parse_job(job_dict).spec
    fixed, tuned, typo = spec.evaluation.suites
    got = baseline_suite(spec, fixed, None, None, -1)
    expected = evaluate_policy("kuberl/Autoscaling-v0", {"load_pattern": "SPIKE", "episode_length": 40},
                               ThresholdPolicy(0.9, 0.5), [7, 8, 9])
    assert got["mean_return"] == pytest.approx(expected)
    assert got["params"] == {"upper": 0.9, "lower": 0.5} and "tuning_seeds" not in got
    tuned_result = baseline_suite(spec, tuned, None, None, -1)
    assert tuned_result["tuning_seeds"] == [10, 11]
    with pytest.raises(ValueError, match=r"suites\[typo\].baselineParams: key 'uper' is not allowed"):
        baseline_suite(spec, typo, None, None, -1)
    single_env_tier = typo.model_copy(update={"baseline_params": {"tier": 1}})
    with pytest.raises(ValueError, match=r"key 'tier' is not allowed; allowed keys: upper, lower, tuning_episodes"):
        baseline_suite(spec, single_env_tier, None, None, -1)

    other = copy.deepcopy(job_dict)
    other["spec"]["environment"] = {"id": "CartPole-v1"}
    other["spec"]["algorithm"] = {"name": "DQN"}
    cartpole = parse_job(other).spec
    with pytest.raises(ValueError, match="threshold needs kuberl/Autoscaling-v0"):
        baseline_suite(cartpole, cartpole.evaluation.suites[0], None, None, -1)


@pytest.mark.slow
def test_dqn_example_beats_the_best_threshold_autoscaler(tmp_path):
    from kuberl.trainer.run import TrainOptions, train

    job = parse_job(_example("dqn"))
    result = train(job, TrainOptions(run_dir=tmp_path, metrics_port=0, progress=False))
    evaluation = result.evaluation
    assert evaluation["deterministic"]["mean_return"] > evaluation["threshold"]["mean_return"], evaluation
    assert evaluation["threshold"]["mean_return"] > evaluation["random"]["mean_return"]

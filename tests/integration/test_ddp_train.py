"""Data-parallel learners training for real on the embedded Ray: rank 0 (this process) and rank 1 (a Ray
actor on a learner slot) average gradients over gloo. CartPole PPO reaches its target with two learners;
the autoscaling BDQ example (async collection, a replay shard per learner) trains, checkpoints, and a
restart resumes both learners from rank 0's checkpoint."""

from __future__ import annotations

import json

import pytest
import ray
import yaml
from conftest import REPO
from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train


@pytest.fixture(autouse=True)
def no_ray_left():
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.slow
def test_ppo_with_two_learners_learns_cartpole(job_dict, tmp_path):
    job_dict["spec"]["stopping"] = {"targetReturn": 195, "returnWindow": 100, "maxEnvSteps": 150_000}
    job_dict["spec"]["evaluation"] = {"episodes": 20}
    job_dict["spec"]["learner"] = {"replicas": 2}
    result = train(parse_job(job_dict), TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False))
    assert result.reason == "target_return", f"mean return {result.mean_return} after {result.counters.env_steps} steps"
    assert result.evaluation["deterministic"]["mean_return"] >= 195


def test_bdq_with_two_learners_trains_async_and_resumes_both_from_rank_0s_checkpoint(tmp_path):
    job_dict = yaml.safe_load((REPO / "examples" / "autoscaling-bdq.yaml").read_text())
    spec = job_dict["spec"]
    spec["learner"] = {"replicas": 2}
    # The example carries the preference head, which runs with one learner (the job model refuses both).
    spec["algorithm"]["bdq"].pop("preference")
    spec["algorithm"]["bdq"].update(learningStarts=500, bufferSize=5000)
    spec["environment"]["kwargs"]["episode_length"] = 50
    spec["stopping"] = {"maxEnvSteps": 3_000}
    spec["checkpointing"] = {"enabled": True, "intervalIterations": 5}
    spec["evaluation"] = {"enabled": False}
    first = train(parse_job(job_dict), TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False))
    assert first.ok and first.reason == "max_env_steps" and first.counters.gradient_updates > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == first.counters.iterations  # rank 0 alone writes the rows: one per iteration
    spec["stopping"] = {"maxEnvSteps": 5_000}
    second = train(parse_job(job_dict), TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                                     resume=True))
    assert second.counters.env_steps >= 5_000 and second.counters.iterations > first.counters.iterations
    assert second.counters.gradient_updates > first.counters.gradient_updates

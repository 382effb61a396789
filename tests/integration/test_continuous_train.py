"""SAC and TD3 learn Pendulum-v1 on a short budget the way a user trains it: `kuberl train`'s path, an
embedded Ray, a rollout actor acting with the numpy actor, the learner's replay and its updates."""

from __future__ import annotations

import pytest
import ray
import yaml
from conftest import REPO

from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train

#: A policy that has learned nothing scores about -1,200 to -1,500 on Pendulum-v1 (the untrained actor's
#: greedy episodes and uniformly random ones alike); swinging up and holding scores above -200.
LEARNED = -500.0


@pytest.mark.parametrize("algorithm, steps", [("SAC", 4_000), ("TD3", 6_000)])
def test_learns_pendulum_on_a_short_budget(algorithm, steps, tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    job = yaml.safe_load((REPO / "examples" / "pendulum-sac.yaml").read_text())
    # The shortest budget that still shows learning: 1,000 random steps, then one update per env step.
    # Two 64-unit layers instead of the default 256: Pendulum needs no more, and each update is ~4x cheaper.
    job["spec"]["algorithm"] = {"name": algorithm, algorithm.lower(): {
        "learningStarts": 1_000, "network": {"hiddenSizes": [64, 64], "activation": "relu"}}}
    job["spec"]["stopping"] = {"maxEnvSteps": steps}
    job["spec"]["evaluation"] = {"episodes": 10}
    result = train(parse_job(job), TrainOptions(run_dir=tmp_path, workers=1, metrics_port=0, progress=False))
    assert result.reason == "max_env_steps"
    assert result.counters.gradient_updates >= steps - 1_000 - 400  # one per env step after the warm-up
    returns = result.evaluation["deterministic"]["mean_return"]
    assert returns >= LEARNED, f"{algorithm}: greedy mean return {returns:.1f} after {steps} env steps"


#: InvertedPendulum-v5 pays 1 a step while the pole stands: holding still (a zero action, what an untrained
#: actor's mean is near) keeps it up 21 to 33 steps on the evaluation's seeds (25.6 on average), uniformly
#: random actions 3 to 18; balancing it longer than twice that is learning.
HOLDING_STILL = 25.6


def test_sac_learns_a_mujoco_task_on_a_short_budget(tmp_path):
    """MuJoCo through gymnasium (the trainer extra's `gymnasium[mujoco]`): SAC on InvertedPendulum-v5 as a user
    trains it, its physics stepped by DeepMind's simulator in the rollout actor."""
    if ray.is_initialized():
        ray.shutdown()
    job = yaml.safe_load((REPO / "examples" / "pendulum-sac.yaml").read_text())
    job["spec"]["environment"] = {"id": "InvertedPendulum-v5"}
    job["spec"]["algorithm"] = {"name": "SAC", "sac": {
        "learningStarts": 1_000, "network": {"hiddenSizes": [64, 64], "activation": "relu"}}}
    job["spec"]["stopping"] = {"maxEnvSteps": 4_000}
    job["spec"]["evaluation"] = {"episodes": 10}
    result = train(parse_job(job), TrainOptions(run_dir=tmp_path, workers=1, metrics_port=0, progress=False))
    assert result.reason == "max_env_steps"
    returns = result.evaluation["deterministic"]["mean_return"]
    assert returns >= 2 * HOLDING_STILL, f"greedy mean return {returns:.1f} after 4,000 env steps"

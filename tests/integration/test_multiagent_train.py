"""Many agents, one shared policy: PPO and DQN learn PettingZoo's MPE simple_spread (three agents covering
three landmarks) on a short budget the way a user trains it (`kuberl train`'s path, an embedded Ray, two
rollout actors stepping a vector of agents), then `kuberl export` writes the policy one agent acts with."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import REPO

from kuberl.api.load import parse_job
from kuberl.trainer.rollout import make_vector_env
from kuberl.trainer.run import TrainOptions, train
from kuberl.trainer.serving.export import export

pytestmark = [pytest.mark.slow]

EVAL_EPISODES = 30


def _random_return(job) -> float:
    """A uniformly random policy's mean agent return on the evaluation's seeds: what learning must beat."""
    env_spec = job.spec.environment
    env = make_vector_env(env_spec.id, env_spec.kwargs, EVAL_EPISODES, multi_agent=env_spec.multi_agent.model_dump())
    rng = np.random.default_rng(0)
    env.reset(seed=list(range(EVAL_EPISODES)))
    total, done = np.zeros(env.num_envs), np.zeros(env.num_envs, bool)
    while not done.all():
        _, reward, terminated, truncated, _ = env.step(rng.integers(0, 5, env.num_envs))
        total += np.where(done, 0.0, reward)
        done |= terminated | truncated
    return float(total.mean())


@pytest.mark.parametrize(("algorithm", "steps", "margin"), [("PPO", 60_000, 2.0), ("DQN", 30_000, 2.0)])
def test_a_shared_policy_learns_simple_spread_on_a_short_budget(algorithm, steps, margin, local_ray, tmp_path):
    job_dict = yaml.safe_load((REPO / "examples" / "spread-ppo.yaml").read_text())
    job_dict["spec"]["algorithm"] = {"name": algorithm}
    job_dict["spec"]["stopping"] = {"maxEnvSteps": steps}
    job_dict["spec"]["evaluation"] = {"episodes": EVAL_EPISODES}
    job = parse_job(job_dict)
    result = train(job, TrainOptions(run_dir=tmp_path / "run", workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert result.ok and result.reason == "max_env_steps"
    # Env steps are agent steps: three agents, 25 steps an episode, so 75 per episode of the env.
    assert result.counters.episodes * 25 == pytest.approx(result.counters.env_steps, rel=0.05)
    evaluation = result.evaluation["deterministic"]
    assert evaluation["episodes"] == 3 * EVAL_EPISODES  # one per agent per seed
    baseline = _random_return(job)
    assert evaluation["mean_return"] >= baseline + margin, (algorithm, evaluation["mean_return"], baseline)
    policy = export(tmp_path / "run")
    manifest = yaml.safe_load((policy / "policy.json").read_text())
    assert manifest["observation"]["shape"] == [18 + 3] and manifest["action"] == {"type": "Discrete", "n": 5,
                                                                                   "start": 0}


@pytest.mark.parametrize(("algorithm", "steps"), [("DQN", 30_000), ("PPO", 60_000)])
def test_self_play_learns_pettingzoo_tictactoe_against_frozen_copies_of_itself(algorithm, steps, local_ray, tmp_path):
    """The self-play example (classic/tictactoe-v3 under policies: selfPlay) on a short budget, with its DQN and
    with PPO's defaults: the greedy policy beats uniformly random play from both seats by far more than random
    play does (X wins 58.5% of random games and O 28.8%), and the suites count its games seat by seat."""
    job_dict = yaml.safe_load((REPO / "examples" / "tictactoe-selfplay-dqn.yaml").read_text())
    if algorithm == "PPO":
        job_dict["spec"]["algorithm"] = {"name": "PPO"}
        job_dict["spec"]["collection"] = {"mode": "sync"}  # PPO learns on-policy
    job_dict["spec"]["stopping"] = {"maxEnvSteps": steps}
    for suite in job_dict["spec"]["evaluation"]["suites"]:
        suite["episodes"] = 300
    job = parse_job(job_dict)
    result = train(job, TrainOptions(run_dir=tmp_path / "run", metrics_port=0, progress=False, shutdown_ray=False))
    assert result.ok and result.reason == "max_env_steps"
    first, second = result.evaluation["vs-random-first"], result.evaluation["vs-random-second"]
    assert first["games"] == second["games"] == result.evaluation["self-play"]["games"] == 300
    assert first["win_rate"] >= 0.75 and second["win_rate"] >= 0.5, (first, second)
    # Tic-Tac-Toe's episodes are games of at most 5 of the learner's moves, and at least 3.
    assert 3 <= result.counters.env_steps / result.counters.episodes <= 5

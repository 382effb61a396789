"""Many agents, one shared policy: PPO and DQN learn PettingZoo's MPE simple_spread (three agents covering
three landmarks) on a short budget the way a user trains it (`kuberl train`'s path, an embedded Ray, two
rollout actors stepping a vector of agents), then `kuberl export` writes the policy one agent acts with."""

from __future__ import annotations

import functools
import json

import gymnasium as gym
import numpy as np
import pytest
import yaml
from conftest import REPO
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from kuberl.api.load import parse_job
from kuberl.trainer.rollout import make_vector_env
from kuberl.trainer.run import TrainOptions, train
from kuberl.trainer.serving.export import export

pytestmark = [pytest.mark.slow]

EVAL_EPISODES = 30
#: The policy-groups example's budget in its test.
GROUP_STEPS = 90_000


def _random_returns(job) -> dict[str, float]:
    """A uniformly random policy's mean agent return on the evaluation's seeds, over all agents ("all") and per
    policy group: what learning must beat."""
    env_spec = job.spec.environment
    env = make_vector_env(env_spec.id, env_spec.kwargs, EVAL_EPISODES, multi_agent=env_spec.multi_agent.model_dump())
    rng = np.random.default_rng(0)
    env.reset(seed=list(range(EVAL_EPISODES)))
    total, done = np.zeros(env.num_envs), np.zeros(env.num_envs, bool)
    while not done.all():
        _, reward, terminated, truncated, _ = env.step(rng.integers(0, 5, env.num_envs))
        total += np.where(done, 0.0, reward)
        done |= terminated | truncated
    agent = np.arange(env.num_envs) % env.n_agents
    return {"all": float(total.mean()),
            **{g.name: float(total[np.isin(agent, g.agents)].mean()) for g in env.groups}}


def _random_return(job) -> float:
    return _random_returns(job)["all"]


def _train_example(name: str, steps: int, tmp_path, **spec: object):
    """An example trained as `kuberl train` trains it, on `steps` env steps and the evaluation's seeds, with
    `spec`'s fields over its own; (the job, its result), which reached its step budget."""
    job_dict = yaml.safe_load((REPO / "examples" / name).read_text())
    job_dict["spec"].update(spec, stopping={"maxEnvSteps": steps}, evaluation={"episodes": EVAL_EPISODES})
    job = parse_job(job_dict)
    result = train(job, TrainOptions(run_dir=tmp_path / "run", workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert result.ok and result.reason == "max_env_steps"
    return job, result


@pytest.mark.parametrize(("algorithm", "steps", "margin"), [("PPO", 60_000, 2.0), ("DQN", 30_000, 2.0)])
def test_a_shared_policy_learns_simple_spread_on_a_short_budget(algorithm, steps, margin, local_ray, tmp_path):
    job, result = _train_example("spread-ppo.yaml", steps, tmp_path, algorithm={"name": algorithm})
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


def test_policy_groups_each_learn_their_own_policy_in_simple_adversary(local_ray, tmp_path):
    """The policy-groups example (MPE simple_adversary: the adversary, and two good agents sharing their group's
    policy; the groups see different observations) on a short budget: it trains to its end, the adversary's
    greedy policy beats a uniformly random one on its own return, and each group's return is in the metrics rows,
    the evaluation and summary.json. (The good agents' return is measured against an adversary that learns too,
    so a random baseline does not bound it; `Roles` below shows every group learning its own part.)"""
    job, result = _train_example("adversary-ppo-groups.yaml", GROUP_STEPS, tmp_path)
    evaluation = result.evaluation["deterministic"]
    assert evaluation["episodes"] == 3 * EVAL_EPISODES and set(evaluation["by_policy"]) == {"adversary", "good"}
    baseline = _random_returns(job)
    assert evaluation["by_policy"]["adversary"] >= baseline["adversary"] + 5.0, (evaluation, baseline)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("mean_return/adversary" in r and "mean_return/good" in r for r in rows[2:]), rows[-1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["evaluation"]["deterministic"]["by_policy"] == evaluation["by_policy"]


class Roles(ParallelEnv):
    """Two roles that see and act differently: a "lead" sees 4 numbers and has 5 actions, two "helpers" see 2
    and have 3. Each agent is paid 1 a step for its role's right action, which its observation tells it: the
    lead's is its observation's argmax, a helper's its first number's sign (0, 1 or 2 for -, 0, +). Episodes last
    8 steps, so a perfect policy earns 8 and a uniformly random one 1.6 (lead) or 2.7 (helper)."""

    metadata = {"name": "roles_v0"}
    possible_agents = ["lead", "helper_0", "helper_1"]

    def __init__(self):
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.obs: dict[str, np.ndarray] = {}

    @functools.cache  # noqa: B019 (PettingZoo wants one space object per agent)
    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (4 if agent == "lead" else 2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return gym.spaces.Discrete(5 if agent == "lead" else 3)

    def _draw(self):
        self.obs = {a: self.rng.uniform(-1, 1, self.observation_space(a).shape).astype(np.float32)
                    for a in self.possible_agents}
        for a in self.possible_agents[1:]:
            self.obs[a][0] = self.rng.choice([-1.0, 0.0, 1.0])
        return dict(self.obs)

    def _right(self, agent) -> int:
        return int(self.obs[agent].argmax()) if agent == "lead" else int(self.obs[agent][0]) + 1

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._draw(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: float(int(actions[a]) == self._right(a)) for a in self.agents}
        self.t += 1
        over = self.t >= 8
        obs = self._draw()
        terminated, truncated = {a: over for a in self.agents}, {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


@pytest.mark.parametrize(("algorithm", "steps"), [("PPO", 60_000), ("DQN", 30_000)])
def test_policy_groups_in_different_spaces_each_learn_their_own_part(algorithm, steps, local_ray, tmp_path):
    """Groups that no shared policy could serve (their observation widths and action counts differ) each learn
    their own rule on a short budget, with PPO and with DQN, the two helpers sharing their group's policy."""
    parallel_api_test(Roles(), num_cycles=10)
    job = parse_job({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "roles"},
                     "spec": {"algorithm": {"name": algorithm},
                              "environment": {"id": f"{__name__}:Roles", "multiAgent": {
                                  "policies": "groups", "groups": {"lead": ["lead"],
                                                                   "helpers": ["helper_0", "helper_1"]}}},
                              "rolloutWorkers": {"replicas": 2, "envsPerWorker": 8},
                              "stopping": {"maxEnvSteps": steps}, "evaluation": {"episodes": EVAL_EPISODES}}})
    result = train(job, TrainOptions(run_dir=tmp_path / "run", workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert result.ok and result.reason == "max_env_steps"
    by_policy = result.evaluation["deterministic"]["by_policy"]
    # Random play earns 1.6 and 2.7 of the 8 a perfect policy earns.
    assert by_policy["lead"] >= 6.0 and by_policy["helpers"] >= 7.0, by_policy

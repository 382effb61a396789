"""Policy groups (environment.multiAgent.policies: groups): the vector env of agents lays out groups whose spaces
differ (rows padded to the widest group, the smaller action set masked), the refusals name the groups field, the
acting policy gives each group's rows to that group's policy alone, and each group's update is exactly the one a
lone PPO (or DQN) makes from that group's agents' steps (its own networks, optimizer, random stream, replay)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test
from prometheus_client import generate_latest

from kuberl.api.job import CollectionMode, PPOConfig
from kuberl.api.load import InvalidJob, parse_job
from kuberl.api.semantics import check_registered
from kuberl.trainer.accounting import Counters, Tally, publish_iteration
from kuberl.trainer.algorithms import PolicyGroups, algorithm_for_env
from kuberl.trainer.algorithms.dqn import DQN
from kuberl.trainer.algorithms.groups import group_batch
from kuberl.trainer.algorithms.ppo import PPO
from kuberl.trainer.envs.multiagent import AgentEntries, MultiAgentEnvError
from kuberl.trainer.envs.resolve import check_environment
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from kuberl.trainer.policies import make_policy
from kuberl.trainer.rollout import GreedyEvaluator, Sampler
from kuberl.trainer.spaces import space_info
from kuberl.trainer.tensorboard_log import row_scalars

GROUPS = {"big": ["big"], "small": ["s0", "s1"]}


class Mixed(ParallelEnv):
    """Three agents in two shapes: "big" sees 3 numbers and has 4 actions (paid 1 for action 3), "s0" and "s1"
    see 2 and have 2 (paid 1 for action 1). Episodes last 5 steps."""

    metadata = {"name": "mixed_v0"}
    possible_agents = ["big", "s0", "s1"]

    def __init__(self, odd_small: bool = False):
        self.odd_small = odd_small
        self.agents: list[str] = []
        self.t = 0

    @functools.cache  # noqa: B019 (PettingZoo's test wants one space object per agent)
    def observation_space(self, agent):
        width = 3 if agent == "big" or (self.odd_small and agent == "s1") else 2
        return gym.spaces.Box(-10.0, 10.0, (width,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return gym.spaces.Discrete(4 if agent == "big" else 2)

    def _obs(self, agent):
        width = self.observation_space(agent).shape[0]
        return np.full(width, self.t + self.possible_agents.index(agent) / 10, np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(int(actions[a]) == (3 if a == "big" else 1)) for a in self.agents}
        over = self.t >= 5
        obs, infos = {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}
        terminated, truncated = {a: over for a in self.agents}, {a: False for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def _job(groups=GROUPS, algorithm: str = "PPO") -> object:
    return parse_job({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "mixed"},
                      "spec": {"algorithm": {"name": algorithm},
                               "environment": {"id": f"{__name__}:Mixed",
                                               "multiAgent": {"policies": "groups", "groups": groups}},
                               "stopping": {"maxEnvSteps": 10_000}}})


def test_the_test_env_passes_pettingzoos_own_api_test():
    parallel_api_test(Mixed(), num_cycles=10)


def test_the_entries_are_padded_to_the_widest_group_and_the_smaller_action_set_is_masked():
    env = AgentEntries(Mixed, copies=2, groups=GROUPS)
    assert [(g.name, g.agents) for g in env.groups] == [("big", (0,)), ("small", (1, 2))]
    assert env.single_observation_space.shape == (3,) and env.single_action_space == gym.spaces.Discrete(4)
    obs, info = env.reset(seed=[1, 2])
    # Copy by copy, agents in possible_agents order: big's row is its own 3 numbers, a small agent's its 2 then 0.
    np.testing.assert_allclose(obs[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(obs[1], [0.1, 0.1, 0.0])
    np.testing.assert_allclose(obs[5], [0.2, 0.2, 0.0])
    assert info["action_mask"].tolist() == [[True] * 4, [True, True, False, False], [True, True, False, False]] * 2
    obs, reward, *_ = env.step(np.array([3, 1, 0, 0, 1, 1]))
    assert reward.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_agent_ids_count_within_each_group():
    env = AgentEntries(Mixed, copies=1, agent_id_in_observation=True, groups=GROUPS)
    obs, _ = env.reset(seed=[0])
    # big: 3 numbers and its one-hot of 1; the small ones: 2 numbers and their one-hot of 2, padded to 4.
    assert env.single_observation_space.shape == (4,)
    np.testing.assert_allclose(obs, [[0, 0, 0, 1], [0.1, 0.1, 1, 0], [0.2, 0.2, 0, 1]], atol=1e-6)


@pytest.mark.parametrize(("groups", "says"), [
    ({"big": ["big"], "small": ["s0", "s9"]}, "['s9'] are not agents of the env"),
    ({"big": ["big", "s0"], "small": ["s0", "s1"]}, "['s0'] are in more than one group"),
    ({"big": ["big"], "small": ["s0"]}, "['s1'] are in no group"),
])
def test_each_agent_must_be_in_exactly_one_group(groups, says):
    with pytest.raises(MultiAgentEnvError) as err:
        AgentEntries(Mixed, copies=1, groups=groups)
    assert says in str(err.value) and err.value.field == "spec.environment.multiAgent.groups"
    assert "['big', 's0', 's1']" in str(err.value)  # what the env's agents are


@pytest.mark.parametrize("name", ["Big", "1st", "a" * 32, "with space", "x/y"])
def test_a_group_name_must_suit_a_metric_label_and_is_refused_at_its_key(name):
    with pytest.raises(InvalidJob) as err:
        _job({name: ["big"], "small": ["s0", "s1"]})
    [problem] = err.value.problems
    assert problem.path == f"spec.environment.multiAgent.groups.{name}" and "is not valid" in problem.message


def test_the_agents_of_a_group_must_share_their_spaces():
    with pytest.raises(MultiAgentEnvError) as err:
        AgentEntries(functools.partial(Mixed, odd_small=True), copies=1, groups=GROUPS)
    assert "'s0' and 's1' have different observation spaces" in str(err.value)
    assert "group 'small'" in str(err.value) and err.value.field == "spec.environment.multiAgent.groups"


def test_the_learner_builds_one_algorithm_per_group_in_the_groups_own_spaces():
    algo = algorithm_for_env(_job().spec, torch.device("cpu"), 0, 10_000)
    assert isinstance(algo, PolicyGroups)
    shapes = {name: (info.obs_dim, info.action_dims) for name, _, info, _ in algo.groups}
    assert shapes == {"big": (3, (4,)), "small": (2, (2,))}
    big, small = (a for _, _, _, a in algo.groups)
    assert big.weights()["actor.0.weight"].shape[1] == 3 and small.weights()["actor.0.weight"].shape[1] == 2
    assert set(algo.weights()) == {f"g0/{k}" for k in big.weights()} | {f"g1/{k}" for k in small.weights()}


def test_other_algorithms_and_async_collection_are_refused_at_their_fields():
    said = "spec.algorithm.name: policies: groups trains with PPO or DQN; BDQ trains one shared policy"
    with pytest.raises(ValueError, match=said):
        algorithm_for_env(_job(algorithm="BDQ").spec, torch.device("cpu"), 0, 10_000)
    # `kuberl validate` (the full check) and the operator's own check say the same, at the field.
    assert [(p.path, p.message[:39]) for p in check_environment(_job(algorithm="BDQ").spec)] == \
        [("spec.algorithm.name", "policies: groups trains with PPO or DQN")]
    assert [p.path for p in check_registered(_job(algorithm="BDQ").spec)] == ["spec.algorithm.name"]
    job = _job(algorithm="DQN")
    job.spec.collection.mode = CollectionMode.ASYNC
    assert [p.path for p in check_registered(job.spec)] == ["spec.collection.mode"]


def _sampled(copies: int = 3, steps: int = 16):
    algo = algorithm_for_env(_job().spec, torch.device("cpu"), 0, 10_000)
    env = AgentEntries(Mixed, copies=copies, groups=GROUPS)
    info = space_info(env.single_observation_space, env.single_action_space)
    policy = make_policy(info, algo.policy_config())
    policy.load(algo.weights())
    batch = Sampler(env, info, list(range(copies))).onpolicy(policy, np.random.default_rng(0), steps, 0.99)
    return algo, env, info, policy, batch


def test_each_groups_rows_are_acted_on_by_that_groups_policy_alone():
    algo, env, _, policy, _ = _sampled()
    obs, info = env.reset(seed=[0, 1, 2])
    rows = {"big": [0, 3, 6], "small": [1, 2, 4, 5, 7, 8]}
    greedy = policy.greedy(obs, info["action_mask"])
    values = policy.value(obs)
    for name, _, group_info, group_algo in algo.groups:
        alone = make_policy(group_info, group_algo.policy_config())
        alone.load(group_algo.weights())
        mine = obs[rows[name], :group_info.obs_dim]
        np.testing.assert_array_equal(greedy[rows[name]], alone.greedy(mine, None))
        np.testing.assert_allclose(values[rows[name]], alone.value(mine), rtol=1e-6)
    assert set(greedy[rows["small"]]) <= {0, 1}  # never an action the small agents do not have


def test_each_groups_update_is_what_a_lone_ppo_makes_from_its_agents_steps():
    algo, _, _, _, batch = _sampled()
    small_cols = [1, 2, 4, 5, 7, 8]
    cut = group_batch(batch, np.array([1, 2]), 3, algo.groups[1][2])
    assert cut["obs"].shape == (16, 6, 2) and cut["masks"].shape == (16, 6, 2)
    np.testing.assert_array_equal(cut["actions"], batch["actions"][:, small_cols])
    np.testing.assert_array_equal(cut["last_values"], batch["last_values"][small_cols])
    assert len(cut["episode_returns"]) == 2 * len(batch["episode_returns"]) // 3  # two of every three agents
    # Lone PPOs built as the groups' are (their seeds), trained on each group's cut of the same batch.
    lone = [PPO(PPOConfig(), info, torch.device("cpu"), 1_000 * i, 10_000) for i, (_, _, info, _) in
            enumerate(algo.groups)]
    expected = [ppo.learn([group_batch(batch, agents, 3, info)], 5_000) for ppo, (_, agents, info, _) in
                zip(lone, algo.groups, strict=True)]
    stats = algo.learn([batch], 5_000)
    for ppo, (_, _, _, group_algo) in zip(lone, algo.groups, strict=True):
        for name, value in ppo.net.state_dict().items():
            torch.testing.assert_close(group_algo.net.state_dict()[name], value, rtol=0, atol=0)
    assert stats.gradient_updates == sum(e.gradient_updates for e in expected)
    assert stats.extra["approx_kl/small"] == expected[1].extra["approx_kl"]
    # Each group's mean return in the iteration: big earns 1 a step for action 3 of 4, a small agent for 1 of 2.
    assert stats.extra["mean_return/big"] == pytest.approx(np.mean(cut_returns(batch, [0])))
    assert stats.extra["mean_return/small"] == pytest.approx(np.mean(cut_returns(batch, [1, 2])))


def test_each_groups_dqn_update_is_what_a_lone_dqn_makes_from_its_agents_transitions():
    job = _job(algorithm="DQN")
    job.spec.algorithm.dqn.learning_starts, job.spec.algorithm.dqn.batch_size = 0, 16
    algo = algorithm_for_env(job.spec, torch.device("cpu"), 0, 10_000)
    env = AgentEntries(Mixed, copies=3, groups=GROUPS)
    info = space_info(env.single_observation_space, env.single_action_space)
    policy = make_policy(info, algo.policy_config())
    policy.load(algo.weights())
    batch = Sampler(env, info, [0, 1, 2]).offpolicy(policy, np.random.default_rng(0), 16, 0.5, 0.99, 3)
    assert set(batch["entries"] % 3) == {0, 1, 2}
    small = group_batch(batch, np.array([1, 2]), 3, algo.groups[1][2])
    assert small["obs"].shape[1] == 2 and small["next_masks"].shape[1] == 2 and set(small["actions"]) <= {0, 1}
    big = group_batch(batch, np.array([0]), 3, algo.groups[0][2])
    # A group's env steps are its agents' transitions (what its replay ratio counts); the groups' make the batch's.
    assert small["env_steps"] == len(small["rewards"])
    assert big["env_steps"] + small["env_steps"] == len(batch["rewards"])
    lone = [DQN(job.spec.algorithm.dqn, info_g, torch.device("cpu"), 1_000 * i, 10_000) for i, (_, _, info_g, _) in
            enumerate(algo.groups)]
    expected = [dqn.learn([group_batch(batch, agents, 3, info_g)], 5_000) for dqn, (_, agents, info_g, _) in
                zip(lone, algo.groups, strict=True)]
    stats = algo.learn([batch], 5_000)
    assert stats.gradient_updates == sum(e.gradient_updates for e in expected) > 0
    for dqn, (_, _, _, group_algo) in zip(lone, algo.groups, strict=True):
        for name, value in dqn.q.state_dict().items():
            torch.testing.assert_close(group_algo.q.state_dict()[name], value, rtol=0, atol=0)
    assert algo.exploration(5_000) == lone[0].exploration(5_000) and algo.n_step == 3


def cut_returns(batch, agents) -> list[float]:
    return [r for r, e in zip(batch["episode_returns"], batch["episode_entries"], strict=True) if e % 3 in agents]


def test_a_checkpoint_restores_every_group_and_refuses_other_groups():
    algo, _, _, _, batch = _sampled()
    algo.learn([batch], 5_000)
    restored = algorithm_for_env(_job().spec, torch.device("cpu"), 0, 10_000)
    restored.load_state_dict(algo.state_dict())
    for key, value in algo.weights().items():
        np.testing.assert_array_equal(restored.weights()[key], value)
    assert restored.gradient_updates == algo.gradient_updates
    other = algorithm_for_env(_job({"big": ["big"], "little": ["s0", "s1"]}).spec, torch.device("cpu"), 0, 10_000)
    with pytest.raises(ValueError, match=r"holds policy groups \['big', 'small'\] and the job has \['big', 'little'\]"):
        other.load_state_dict(algo.state_dict())


def test_returns_per_policy_reach_the_metrics_tensorboard_and_the_evaluation():
    metrics = LearnerMetrics(JobLabels("mixed", "ns", "PPO", "env"))
    tally = Tally(env_steps=10, episodes=2, gradient_updates=1, worker_restarts=0, learner_wait=0.0, worker_wait=0.0,
                  worker_nodes=1, episodes_per_second=1.0, env_steps_per_second=1.0, mean_return=0.5, loss=0.1,
                  last_loss=0.1, extra={"mean_return/big": 2.5, "mean_return/small": -1.0})
    publish_iteration(metrics, Counters(), tally)
    text = generate_latest(metrics.registry).decode()
    assert 'policy="big"} 2.5' in text and 'policy="small"} -1.0' in text, text
    assert row_scalars({"mean_return/small": -1.0}) == {"rollout/mean_return/small": -1.0}
    _, env, info, policy, _ = _sampled()
    evaluator = GreedyEvaluator(f"{__name__}:Mixed", {}, None, info, env.single_observation_space,
                                {"policies": "groups", "groups": GROUPS})
    played = evaluator.episodes(policy, [1, 2])
    assert played["policies"] == ["big", "small", "small"] * 2 and len(played["returns"]) == 6

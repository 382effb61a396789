"""PettingZoo environments under one shared policy (environment.multiAgent): the vector env of agents
against PettingZoo stepping the same copies itself, agents that leave before the others (they sit out,
uncounted and untrained on, until their copy resets), PPO leaving those steps out, DQN's transitions,
evaluation per agent, and the checks `kuberl validate` and the learner make (module:factory, PettingZoo's
own refusal of a turn-based AEC env, agents whose spaces differ, the job model's rule)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_spread_v3
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from kuberl.api.load import parse_job
from kuberl.api.semantics import check_registered
from kuberl.trainer.algorithms.ppo import PPO
from kuberl.trainer.envs.multiagent import AgentEntries
from kuberl.trainer.envs.resolve import check_environment
from kuberl.trainer.networks import ActorCritic, QNetwork, numpy_params
from kuberl.trainer.policies import make_policy
from kuberl.trainer.rollout import GreedyEvaluator, Sampler, make_vector_env
from kuberl.trainer.spaces import space_info


class Relay(ParallelEnv):
    """Two agents that leave at different times: a0 is done after `lifetimes[0]` steps, a1 after
    `lifetimes[1]`. Each step pays an agent 1 + its action; it observes (its step, its index)."""

    metadata = {"name": "relay_v0"}

    def __init__(self, lifetimes=(2, 4)):
        self.possible_agents = ["a0", "a1"]
        self.lifetimes = dict(zip(self.possible_agents, lifetimes, strict=True))
        self.agents: list[str] = []
        self.t = 0

    @functools.cache  # noqa: B019 (PettingZoo's test wants one space object per agent)
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 100.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _obs(self, agent):
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: 1.0 + float(actions[a]) for a in self.agents}
        terminated = {a: self.t >= self.lifetimes[a] for a in self.agents}
        truncated = {a: False for a in self.agents}
        obs, infos = {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terminated[a]]
        return obs, rewards, terminated, truncated, infos


def _random_params(module, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0, 0.5, v.shape).astype(np.float32) for k, v in numpy_params(module).items()}


def _ppo_policy(info):
    policy = make_policy(info, {"kind": "ppo", "n_layers": 2, "activation": "tanh"})
    policy.load(_random_params(ActorCritic(info, [16, 16], "tanh")))
    return policy


def test_the_test_env_passes_pettingzoos_own_api_test():
    parallel_api_test(Relay(), num_cycles=10)


def test_each_agent_of_each_copy_is_an_entry_stepped_as_pettingzoo_steps_it():
    env = make_vector_env("mpe2.simple_spread_v3:parallel_env", {"N": 3, "max_cycles": 10}, 2,
                          multi_agent={"agent_id_in_observation": True})
    reference = [simple_spread_v3.parallel_env(N=3, max_cycles=10) for _ in range(2)]
    agents = reference[0].possible_agents
    assert env.num_envs == 6 and env.single_observation_space.shape == (18 + 3,)
    obs, info = env.reset(seed=[5, 6])
    expected = [r.reset(seed=s)[0] for r, s in zip(reference, [5, 6], strict=True)]
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(25):  # two and a half episodes: the copies reset themselves at max_cycles
        for c in range(2):
            for i, agent in enumerate(agents):
                np.testing.assert_array_equal(obs[c * 3 + i], np.concatenate([expected[c][agent], np.eye(3)[i]]))
        assert info["alive"].all()
        actions = rng.integers(0, 5, 6)
        obs, rewards, terminated, truncated, info = env.step(actions)
        for c, ref in enumerate(reference):
            expected[c], want, _, trunc, _ = ref.step({a: actions[c * 3 + i] for i, a in enumerate(agents)})
            np.testing.assert_allclose(rewards[c * 3:c * 3 + 3], [want[a] for a in agents])
            if all(trunc.values()):  # the episode's last step: its observation is the final one
                assert truncated[c * 3:c * 3 + 3].all() and not terminated.any()
                for i, agent in enumerate(agents):
                    np.testing.assert_array_equal(info["final_obs"][c * 3 + i][:18], expected[c][agent])
                expected[c] = ref.reset()[0]
                ends += 1
    assert ends == 4


def test_an_agent_gone_before_the_others_sits_out_uncounted_until_its_copy_resets():
    env = AgentEntries(Relay, copies=2)
    info = space_info(env.single_observation_space, env.single_action_space)
    sampler = Sampler(env, info, seeds=[1, 2])
    batch = sampler.onpolicy(_ppo_policy(info), np.random.default_rng(0), num_steps=8, gamma=0.99)
    # Entries: copy 0's a0, a1, copy 1's a0, a1. a0 acts for 2 steps of each 4-step episode, a1 for all 4.
    a0 = [True, True, False, False] * 2
    np.testing.assert_array_equal(batch["alive"][:, 0], a0)
    np.testing.assert_array_equal(batch["alive"][:, 1], [True] * 8)
    assert batch["env_steps"] == 2 * (4 + 8) == sampler.env_steps
    # An agent's episode is its own steps: a0's are 2 long, a1's 4; a sat-out step pays nothing.
    assert sorted(batch["episode_lengths"].tolist()) == [2] * 4 + [4] * 4
    assert batch["rewards"][2:4, 0].tolist() == [0.0, 0.0] and batch["rewards"][4:6, 0].min() >= 1.0
    # A sat-out step is an episode end of its own, so no advantage runs across it.
    assert batch["dones"][:, 0].tolist() == [0, 1, 1, 1, 0, 1, 1, 1]


def test_ppo_learns_from_the_steps_agents_acted_in_only():
    env = AgentEntries(Relay, copies=1)
    info = space_info(env.single_observation_space, env.single_action_space)
    batch = Sampler(env, info, seeds=[0]).onpolicy(_ppo_policy(info), np.random.default_rng(1), 8, 0.99)
    job = parse_job(_job({"id": "x:y", "multiAgent": {}}))
    ppo = PPO(job.spec.algorithm.ppo, info, torch.device("cpu"), 0, 1000)
    seen = []
    evaluate = ppo.net.evaluate
    ppo.net.evaluate = lambda obs, *rest: seen.append(obs.shape[0]) or evaluate(obs, *rest)
    ppo.learn([batch], env_steps=batch["env_steps"])
    cfg = job.spec.algorithm.ppo
    acted = int(batch["alive"].sum())
    assert acted == 12 and sum(seen) == cfg.epochs * (acted // cfg.minibatches) * cfg.minibatches


def test_dqn_transitions_are_the_acting_agents_only():
    env = AgentEntries(Relay, copies=1)
    info = space_info(env.single_observation_space, env.single_action_space)
    policy = make_policy(info, {"kind": "dqn", "n_layers": 2, "activation": "relu", "dueling": False})
    policy.load(_random_params(QNetwork(info, [16, 16], "relu", False)))
    for n_step in (1, 3):
        sampler = Sampler(env, info, seeds=[0])
        batch = sampler.offpolicy(policy, np.random.default_rng(0), 8, epsilon=0.5, gamma=0.9, n_step=n_step)
        # 8 steps: a0 acts in 4 (two 2-step lives), a1 in 8; every transition is one of theirs.
        assert batch["env_steps"] == 12
        if n_step == 1:
            assert len(batch["rewards"]) == 12 and batch["rewards"].min() >= 1.0
            # a0's second step ends its life: terminal there, not at the steps it sat out.
            assert batch["dones"].sum() == 4
        else:
            assert len(batch["rewards"]) == 12  # every life ends inside the 8 steps: nothing left pending
            # Terminal: a0's four (each emitted at its end), and three of each of a1's two 4-step lives.
            assert batch["dones"].sum() == 4 + 2 * 3


def test_evaluation_plays_one_episode_per_agent_per_seed():
    env = AgentEntries(Relay, copies=1)
    info = space_info(env.single_observation_space, env.single_action_space)
    evaluator = GreedyEvaluator("unused:Relay", {}, None, info, env.single_observation_space, {})
    policy = _ppo_policy(info)
    result = evaluator._play_side_by_side(policy, AgentEntries(Relay, copies=3), [1, 2, 3])
    assert sorted(result[1]) == [2, 2, 2, 4, 4, 4]


def _job(environment: dict, algorithm: str = "PPO") -> dict:
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "agents"},
            "spec": {"algorithm": {"name": algorithm}, "environment": environment,
                     "stopping": {"maxEnvSteps": 1000}}}


def test_an_id_of_pettingzoos_registry_trains_its_parallel_version():
    """Rock, paper, scissors: two agents, Discrete observations (one-hot here), PettingZoo's own parallel env;
    the operator leaves a PettingZoo id to the learner, which checks it in full."""
    job = parse_job(_job({"id": "classic/rps-v2", "multiAgent": {"agentIdInObservation": True}}))
    assert check_registered(job.spec) == [] and check_environment(job.spec) == []
    env = make_vector_env("classic/rps-v2", {}, 2, multi_agent={"agent_id_in_observation": True})
    obs, _ = env.reset(seed=[0, 1])
    assert env.num_envs == 4 and obs.shape == (4, 4 + 2) and (obs[:, :4].sum(axis=1) == 1).all()
    _, rewards, *_ = env.step(np.array([0, 1, 2, 2]))  # rock loses to paper; scissors tie
    assert rewards.tolist() == [-1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize(("environment", "path", "words"), [
    ({"id": "mpe2.simple_spread_v3:nothing_here"}, "spec.environment.id", "has no callable 'nothing_here'"),
    ({"id": "no_such_pkg.envs:parallel_env"}, "spec.environment.id", "cannot import the environment's module"),
    ({"id": "gymnasium.envs.classic_control:CartPoleEnv"}, "spec.environment.id", "needs a PettingZoo env"),
    ({"id": "classic/tictactoe-v3"}, "spec.environment.id", "is_parallelizable"),
    ({"id": "classic/tictactoe-v9"}, "spec.environment.id", "did you mean classic/tictactoe-v3"),
    ({"id": "mpe2.simple_adversary_v3:parallel_env"}, "spec.environment.multiAgent.policies",
     "different observation spaces"),
    ({"id": "mpe2.simple_spread_v3:parallel_env", "kwargs": {"N": "three"}}, "spec.environment.kwargs",
     "rejected its kwargs"),
])
def test_the_full_check_names_the_field_and_says_why(environment, path, words):
    job = parse_job(_job({**environment, "multiAgent": {}}))
    problems = check_environment(job.spec)
    assert [p.path for p in problems] == [path] and words in problems[0].message, problems


def test_the_full_check_applies_the_space_rules_to_one_agents_spaces():
    ok = parse_job(_job({"id": "mpe2.simple_spread_v3:parallel_env", "multiAgent": {}}))
    assert check_environment(ok.spec) == []
    sac = parse_job(_job({"id": "mpe2.simple_spread_v3:parallel_env", "multiAgent": {}}, algorithm="SAC"))
    (problem,) = check_environment(sac.spec)
    assert problem.path == "spec.algorithm.name" and "Discrete action space" in problem.message

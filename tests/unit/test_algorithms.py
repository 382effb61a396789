"""Learner math against hand-computed values: GAE, double/dueling DQN targets, n-step returns,
the replay ring, and the numpy acting policies against their torch twins."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from kuberl.trainer.algorithms.dqn import td_targets
from kuberl.trainer.algorithms.ppo import compute_gae
from kuberl.trainer.buffers import ReplayBuffer
from kuberl.trainer.networks import ActorCritic, QNetwork, numpy_params
from kuberl.trainer.policies import ActorCriticPolicy, QPolicy
from kuberl.trainer.rollout import _NStepAccumulator
from kuberl.trainer.spaces import space_info


def test_every_algorithm_the_job_model_names_has_a_learner():
    from kuberl.api.job import AlgorithmName
    from kuberl.trainer.algorithms import ALGORITHMS

    assert set(ALGORITHMS) == set(AlgorithmName)


def test_gae_matches_hand_computation():
    # One env, three steps, episode ends after step 1 (index 1); gamma=0.9, lambda=0.8.
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[0.5], [1.0], [1.5]], np.float32)
    dones = np.array([[0.0], [1.0], [0.0]], np.float32)
    last_values = np.array([2.0], np.float32)
    adv, ret = compute_gae(rewards, values, dones, last_values, gamma=0.9, lam=0.8)
    d2 = 3.0 + 0.9 * 2.0 - 1.5  # 3.3, bootstraps from last_values
    d1 = 2.0 - 1.0  # 1.0, episode ended: no bootstrap, no carry
    d0 = 1.0 + 0.9 * 1.0 - 0.5  # 1.4
    a2, a1 = d2, d1
    a0 = d0 + 0.9 * 0.8 * a1
    np.testing.assert_allclose(adv[:, 0], [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [a0 + 0.5, a1 + 1.0, a2 + 1.5], rtol=1e-6)


def test_gae_with_lambda_one_is_discounted_return_minus_value():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(5, 2)).astype(np.float32)
    values = rng.normal(size=(5, 2)).astype(np.float32)
    dones = np.zeros((5, 2), np.float32)
    last = rng.normal(size=2).astype(np.float32)
    adv, _ = compute_gae(rewards, values, dones, last, gamma=0.95, lam=1.0)
    expected = np.zeros((5, 2))
    for t in range(5):
        g = sum(0.95**k * rewards[t + k] for k in range(5 - t)) + 0.95 ** (5 - t) * last
        expected[t] = g - values[t]
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)


def test_double_dqn_target_uses_online_argmax_and_target_value():
    q_online = torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 9.0]])
    q_target = torch.tensor([[10.0, 3.0, 7.0], [4.0, 6.0, 1.0]])
    rewards = torch.tensor([1.0, 2.0])
    dones = torch.tensor([0.0, 1.0])
    discounts = torch.tensor([0.9, 0.81])
    y = td_targets(q_online, q_target, rewards, dones, discounts, double_q=True)
    # row 0: online picks a=1, target says 3 -> 1 + 0.9*3; row 1 terminal -> reward only
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 3.0, 2.0]))
    y_plain = td_targets(q_online, q_target, rewards, dones, discounts, double_q=False)
    torch.testing.assert_close(y_plain, torch.tensor([1.0 + 0.9 * 10.0, 2.0]))


def test_dqn_target_ignores_illegal_actions():
    q_online = torch.tensor([[1.0, 5.0, 2.0]])
    q_target = torch.tensor([[10.0, 3.0, 7.0]])
    mask = torch.tensor([[True, False, True]])
    y = td_targets(q_online, q_target, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([1.0]),
                   double_q=True, next_masks=mask)
    torch.testing.assert_close(y, torch.tensor([7.0]))  # online best legal is a=2 (2.0 > 1.0)


def test_dueling_head_is_value_plus_centred_advantage():
    info = space_info(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4))
    net = QNetwork(info, [8], "relu", dueling=True)
    obs = torch.randn(5, 3)
    h = net.trunk(obs)
    v, a = net.value(h), net.advantage(h)
    torch.testing.assert_close(net(obs), v + a - a.mean(dim=1, keepdim=True))
    # Centred advantages: the mean over actions of Q equals V.
    torch.testing.assert_close(net(obs).mean(dim=1, keepdim=True), v)


def test_nstep_accumulator_sums_discounted_rewards_and_flushes_on_episode_end():
    acc = _NStepAccumulator(n=3, gamma=0.5, num_envs=1)
    obs = lambda k: np.array([[float(k)]], np.float32)  # noqa: E731
    no = np.array([False])
    for t in range(4):  # rewards 1, 2, 4, 8; no episode end yet
        acc.add(obs(t), np.array([t]), np.array([2.0**t]), obs(t + 1), no, no, None)
    acc.add(obs(4), np.array([4]), np.array([16.0]), obs(99), np.array([True]), np.array([True]), None)
    b = acc.drain()
    np.testing.assert_allclose(b["rewards"], [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4 + 0.25 * 8,
                                              4 + 0.5 * 8 + 0.25 * 16, 8 + 0.5 * 16, 16])
    np.testing.assert_allclose(b["next_obs"][:, 0], [3, 4, 99, 99, 99])
    np.testing.assert_allclose(b["dones"], [0, 0, 1, 1, 1])
    np.testing.assert_allclose(b["discounts"], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(b["actions"], [0, 1, 2, 3, 4])


@pytest.mark.parametrize("with_masks", [False, True])
def test_one_step_accumulator_whole_arrays_equal_the_per_env_path(with_masks):
    rng = np.random.default_rng(4)
    fast, per_env = (_NStepAccumulator(n=1, gamma=0.9, num_envs=5) for _ in range(2))
    for _ in range(30):
        obs, next_obs = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
        actions, rewards = rng.integers(0, 4, 5), rng.normal(size=5)
        terminated, truncated = rng.random(5) < 0.2, rng.random(5) < 0.1
        masks = rng.random((5, 4)) < 0.7 if with_masks else None
        fast.add(obs, actions, rewards, next_obs, terminated, terminated | truncated, masks)
        per_env._add_per_env(obs, actions, rewards, next_obs, terminated, terminated | truncated, masks)
    a, b = fast.drain(), per_env.drain()
    assert a.keys() == b.keys() and ("next_masks" in a) == with_masks
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(a["rewards"]) == 150 and fast.drain()["rewards"].shape == (0,)


def test_replay_buffer_wraps_around_and_keeps_the_newest():
    buf = ReplayBuffer(capacity=5, obs_dim=1, action_shape=(), device=torch.device("cpu"))

    def batch(start, n):
        x = np.arange(start, start + n, dtype=np.float32)
        return {"obs": x[:, None], "next_obs": x[:, None] + 1, "actions": x.astype(np.int64), "rewards": x,
                "dones": np.zeros(n, np.float32), "discounts": np.ones(n, np.float32)}

    buf.add(batch(0, 3))
    assert (buf.size, buf.pos) == (3, 3)
    buf.add(batch(3, 4))  # 3,4 fill the end, 5,6 overwrite 0,1
    assert (buf.size, buf.pos) == (5, 2)
    assert sorted(buf.rewards.tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert buf.obs[:2, 0].tolist() == [5.0, 6.0]
    buf.add(batch(100, 12))  # larger than capacity: only the newest five survive
    assert sorted(buf.rewards.tolist()) == [107.0, 108.0, 109.0, 110.0, 111.0]
    sample = buf.sample(64, torch.Generator().manual_seed(0))
    assert set(sample["rewards"].tolist()) <= {107.0, 108.0, 109.0, 110.0, 111.0}
    torch.testing.assert_close(sample["next_obs"], sample["obs"] + 1)


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([3, 2]),
                                          gym.spaces.Box(-2, 2, (2,))], ids=lambda s: type(s).__name__)
def test_numpy_actor_critic_matches_torch(action_space):
    info = space_info(gym.spaces.Box(-1, 1, (4,)), action_space)
    net = ActorCritic(info, [16, 16], "tanh")
    policy = ActorCriticPolicy(info, 2, "tanh")
    policy.load(numpy_params(net))
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    actions, logp, value = policy.act(np.random.default_rng(1), obs, None)
    t_logp, _, t_value = net.evaluate(torch.as_tensor(obs), torch.as_tensor(actions))
    np.testing.assert_allclose(value, t_value.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logp, t_logp.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_numpy_q_policy_matches_torch_and_respects_masks():
    info = space_info(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(5))
    for dueling in (True, False):
        net = QNetwork(info, [16, 16], "relu", dueling)
        policy = QPolicy(info, 2, "relu", dueling)
        policy.load(numpy_params(net))
        obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
        np.testing.assert_allclose(policy.q_values(obs), net(torch.as_tensor(obs)).detach().numpy(),
                                   rtol=1e-4, atol=1e-5)
    mask = np.zeros((16, 5), bool)
    mask[:, 3] = True
    rng = np.random.default_rng(0)
    assert (policy.act(rng, obs, mask, epsilon=0.0) == 3).all()
    assert (policy.act(rng, obs, mask, epsilon=1.0) == 3).all()  # exploration stays legal

"""BDQ: targets against hand-computed values, the numpy acting policy against the torch network
(flat and macro/micro Dict observations, one-branch Discrete with masks), and a factored bandit that
only a per-branch learner solves from few samples."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from kuberl.api.job import BDQConfig, QNetworkSpec
from kuberl.trainer.algorithms.bdq import BDQ, bdq_targets
from kuberl.trainer.networks import BranchingQNetwork
from kuberl.trainer.policies import BranchingQPolicy, make_policy
from kuberl.trainer.spaces import space_info

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Two branches (3 and 2 actions), three transitions; the last one is terminal.
Q_ONLINE = [torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 9.0], [7.0, 0.0, 0.0]]),
            torch.tensor([[3.0, 1.0], [0.0, 2.0], [0.0, 7.0]])]
Q_TARGET = [torch.tensor([[10.0, 3.0, 7.0], [4.0, 6.0, 1.0], [99.0, 99.0, 99.0]]),
            torch.tensor([[2.0, 8.0], [5.0, -1.0], [99.0, 99.0]])]
REWARDS = torch.tensor([1.0, 2.0, 3.0])
DONES = torch.tensor([0.0, 0.0, 1.0])
DISCOUNTS = torch.tensor([0.9, 0.81, 0.9])


def test_bdq_mean_target_averages_target_q_at_online_argmax_over_branches():
    y = bdq_targets(Q_ONLINE, Q_TARGET, REWARDS, DONES, DISCOUNTS, "mean")
    # row 0: online picks a0=1 (target 3) and a1=0 (target 2): mean 2.5 -> 1 + 0.9 * 2.5
    # row 1: online picks a0=2 (target 1) and a1=1 (target -1): mean 0 -> 2 + 0.81 * 0
    # row 2: terminal -> reward only; every branch shares the one target
    expected = torch.tensor([[3.25, 3.25], [2.0, 2.0], [3.0, 3.0]])
    torch.testing.assert_close(y, expected)


def test_bdq_max_and_independent_targets():
    y_max = bdq_targets(Q_ONLINE, Q_TARGET, REWARDS, DONES, DISCOUNTS, "max")
    torch.testing.assert_close(y_max, torch.tensor([[1 + 0.9 * 3, 1 + 0.9 * 3], [2 + 0.81 * 1, 2 + 0.81 * 1],
                                                    [3.0, 3.0]]))
    y_ind = bdq_targets(Q_ONLINE, Q_TARGET, REWARDS, DONES, DISCOUNTS, "independent")
    torch.testing.assert_close(y_ind, torch.tensor([[1 + 0.9 * 3, 1 + 0.9 * 2], [2 + 0.81 * 1, 2 - 0.81 * 1],
                                                    [3.0, 3.0]]))


def test_bdq_target_without_double_q_takes_the_target_max():
    y = bdq_targets(Q_ONLINE, Q_TARGET, REWARDS, DONES, DISCOUNTS, "mean", double_q=False)
    torch.testing.assert_close(y[0], torch.tensor([1 + 0.9 * (10 + 8) / 2] * 2))


def test_single_branch_target_ignores_illegal_next_actions():
    mask = torch.tensor([[True, False, True]])
    y = bdq_targets([torch.tensor([[1.0, 5.0, 2.0]])], [torch.tensor([[10.0, 3.0, 7.0]])], torch.tensor([0.0]),
                    torch.tensor([0.0]), torch.tensor([1.0]), "mean", next_masks=mask)
    torch.testing.assert_close(y, torch.tensor([[7.0]]))  # online's best legal action is 2


def test_update_minimises_the_branch_averaged_loss_against_those_targets():
    info = space_info(gym.spaces.Box(-1, 1, (4,)), gym.spaces.MultiDiscrete([3, 2]))
    cfg = BDQConfig(batch_size=8, buffer_size=64, network=QNetworkSpec(hidden_sizes=[16], activation="relu"),
                    branch_hidden_size=8, loss="mse")
    algo = BDQ(cfg, info, CPU, seed=0, total_env_steps=1000)
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(8, 4)).astype(np.float32), "next_obs": rng.normal(size=(8, 4)).astype(np.float32),
             "actions": np.stack([rng.integers(0, 3, 8), rng.integers(0, 2, 8)], axis=1),
             "rewards": rng.normal(size=8).astype(np.float32), "dones": np.zeros(8, np.float32),
             "discounts": np.full(8, 0.99, np.float32)}
    algo.buffer.add(batch)
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    q = algo.q(t["obs"])
    taken = algo.q_values_taken(t["obs"], t["actions"])
    assert taken.shape == (8, 2)
    torch.testing.assert_close(taken[:, 1], q[1].gather(1, t["actions"][:, 1:2]).squeeze(1))
    target = bdq_targets(algo.q(t["next_obs"]), algo.q_target(t["next_obs"]), t["rewards"], t["dones"],
                         t["discounts"], "mean")
    torch.testing.assert_close(algo.targets(t), target)
    # update() samples with the algorithm's generator: replay the draw to know its minibatch.
    state = algo.generator.get_state()
    idx = torch.randint(0, 8, (8,), generator=algo.generator)
    algo.generator.set_state(state)
    sampled = {k: v[idx] for k, v in t.items()}
    errors = algo.q_values_taken(sampled["obs"], sampled["actions"]) - algo.targets(sampled)
    assert algo.update() == pytest.approx((errors**2).mean().item(), rel=1e-5)  # mean over batch and branches


@pytest.mark.parametrize("obs_space", [
    gym.spaces.Box(-1, 1, (6,)),
    gym.spaces.Dict({"macro": gym.spaces.Box(-1, 1, (5,)), "micro": gym.spaces.Box(-1, 1, (3,))}),
], ids=["flat", "macro-micro"])
@pytest.mark.parametrize("hidden", [[32], [32, 16]], ids=["one-layer", "two-layers"])
def test_numpy_branching_policy_matches_torch(obs_space, hidden):
    info = space_info(obs_space, gym.spaces.MultiDiscrete([3, 4, 2]))
    cfg = BDQConfig(network=QNetworkSpec(hidden_sizes=hidden, activation="tanh"), branch_hidden_size=8)
    algo = BDQ(cfg, info, CPU, seed=1, total_env_steps=1000)
    if isinstance(obs_space, gym.spaces.Dict):
        assert set(algo.q.encoders) == {"macro", "micro"}  # one encoder per part, fused after
    policy = make_policy(info, algo.policy_config())
    assert isinstance(policy, BranchingQPolicy)
    policy.load(algo.weights())
    obs = np.random.default_rng(0).normal(size=(32, info.obs_dim)).astype(np.float32)
    torch_q = algo.q(torch.as_tensor(obs))
    for numpy_q, tq in zip(policy.q_values(obs), torch_q):
        np.testing.assert_allclose(numpy_q, tq.detach().numpy(), rtol=1e-4, atol=1e-5)
    greedy = policy.act(np.random.default_rng(0), obs, None, epsilon=0.0)
    assert greedy.shape == (32, 3)
    np.testing.assert_array_equal(greedy, np.stack([tq.argmax(1).numpy() for tq in torch_q], axis=1))


def test_macro_and_micro_parts_are_encoded_separately():
    obs_space = gym.spaces.Dict({"macro": gym.spaces.Box(-1, 1, (5,)), "micro": gym.spaces.Box(-1, 1, (3,))})
    info = space_info(obs_space, gym.spaces.MultiDiscrete([3, 3]))
    net = BranchingQNetwork(info, [16], "relu", 8)
    obs = torch.randn(4, 8)
    changed = obs.clone()
    changed[:, 5:] += 1.0  # only the micro part
    macro_code = net.encoders["macro"](obs[:, :5])
    torch.testing.assert_close(net.encoders["macro"](changed[:, :5]), macro_code)
    assert not torch.allclose(net.features(changed), net.features(obs))


def test_exploration_is_per_branch_and_one_branch_discrete_respects_masks():
    info = space_info(gym.spaces.Box(-1, 1, (4,)), gym.spaces.MultiDiscrete([3, 5]))
    algo = BDQ(BDQConfig(network=QNetworkSpec(hidden_sizes=[8], activation="tanh")), info, CPU, seed=0,
               total_env_steps=1000)
    policy = make_policy(info, algo.policy_config())
    policy.load(algo.weights())
    obs = np.zeros((4000, 4), np.float32)
    actions = policy.act(np.random.default_rng(0), obs, None, epsilon=1.0)
    for d, n in enumerate((3, 5)):  # uniform over each branch's actions, independently
        counts = np.bincount(actions[:, d], minlength=n)
        assert counts.min() > 4000 / n * 0.8
    assert abs(np.corrcoef(actions[:, 0], actions[:, 1])[0, 1]) < 0.05

    one = space_info(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(5))
    algo = BDQ(BDQConfig(network=QNetworkSpec(hidden_sizes=[8], activation="tanh")), one, CPU, seed=0,
               total_env_steps=1000)
    policy = make_policy(one, algo.policy_config())
    policy.load(algo.weights())
    mask = np.zeros((16, 5), bool)
    mask[:, 2] = True
    rng = np.random.default_rng(0)
    for eps in (0.0, 1.0):
        chosen = policy.act(rng, obs[:16], mask, epsilon=eps)
        assert chosen.shape == (16,) and (chosen == 2).all()


def test_bdq_learns_a_factored_bandit_from_few_samples():
    """Three branches of 4 actions (64 joint actions); each branch's best action depends on a
    binary context. Reward = number of branches right. 600 random samples: about 9 per joint
    action, but 150 per branch action, which is what a branching learner needs."""
    info = space_info(gym.spaces.Box(0, 1, (2,)), gym.spaces.MultiDiscrete([4, 4, 4]))
    best = np.array([[0, 3, 1], [2, 1, 3]])
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, 2, 600)
    obs = np.eye(2, dtype=np.float32)[ctx]
    actions = rng.integers(0, 4, (600, 3))
    rewards = (actions == best[ctx]).sum(axis=1).astype(np.float32)
    cfg = BDQConfig(batch_size=64, buffer_size=1000, learning_rate=3e-3, learning_starts=0, train_frequency=1,
                    network=QNetworkSpec(hidden_sizes=[32], activation="relu"), branch_hidden_size=16,
                    target_aggregation="independent")
    algo = BDQ(cfg, info, CPU, seed=0, total_env_steps=1000)
    algo.buffer.add({"obs": obs, "next_obs": obs, "actions": actions, "rewards": rewards,
                     "dones": np.ones(600, np.float32), "discounts": np.ones(600, np.float32)})
    for _ in range(400):
        algo.update()
    policy = make_policy(info, algo.policy_config())
    policy.load(algo.weights())
    np.testing.assert_array_equal(policy.act(rng, np.eye(2, dtype=np.float32), None), best)

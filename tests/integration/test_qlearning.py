"""Tabular Q-learning: observation discretisation, the update against Q* of a tiny chain, and a real
run through Ray on deterministic FrozenLake that reaches the optimal return and start-state value."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from kuberl.api.job import QLearningConfig
from kuberl.api.load import parse_job
from kuberl.trainer.algorithms.qlearning import QLearning
from kuberl.trainer.policies import make_policy
from kuberl.trainer.policies.tabular import Discretiser
from kuberl.trainer.spaces import space_info

CPU = torch.device("cpu")


def test_box_observations_are_cut_into_equal_bins_and_clipped():
    info = space_info(gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32)), gym.spaces.Discrete(2))
    d = Discretiser.from_spec(info, bins=[4, 2], low=[], high=[])
    assert d.n_states == 8
    obs = np.array([[0.0, -1.0], [0.26, 0.5], [0.99, -0.1], [5.0, 9.0], [-3.0, -9.0]], np.float32)
    # row = cell0 * 2 + cell1; out-of-range values land in the edge cells
    np.testing.assert_array_equal(d(obs), [0, 3, 6, 7, 0])
    one_entry = Discretiser.from_spec(info, bins=[3], low=[0.0], high=[0.5])  # one entry: every dimension
    assert one_entry.n_states == 9
    np.testing.assert_array_equal(one_entry(np.array([[0.2, 0.2], [0.4, 0.0]], np.float32)), [1 * 3 + 1, 2 * 3 + 0])


def test_discrete_observations_index_the_table_directly():
    info = space_info(gym.spaces.Discrete(5), gym.spaces.Discrete(2))
    d = Discretiser.from_spec(info, bins=[], low=[], high=[])
    assert d.n_states == 5
    np.testing.assert_array_equal(d(np.eye(5, dtype=np.float32)[[3, 0, 4]]), [3, 0, 4])


def test_infinite_bounds_without_low_high_are_a_clear_error():
    env = gym.make("CartPole-v1")  # velocities (dimensions 1 and 3) are unbounded
    info = space_info(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match=r"qLearning.low/high.*dimensions \[1, 3\].*infinite"):
        Discretiser.from_spec(info, bins=[6], low=[], high=[])
    # One bin ignores a dimension, so its bounds do not matter; explicit bounds fix the rest.
    assert Discretiser.from_spec(info, bins=[6, 1, 6, 1], low=[], high=[]).n_states == 36
    assert Discretiser.from_spec(info, bins=[6], low=[-2.4, -3, -0.21, -3], high=[2.4, 3, 0.21, 3]).n_states == 6**4
    with pytest.raises(ValueError, match=r"qLearning.bins: needs 1 entry or 4"):
        Discretiser.from_spec(info, bins=[6, 6], low=[], high=[])
    with pytest.raises(ValueError, match=r"table entries"):
        QLearning(QLearningConfig(bins=[1000], low=[-1.0], high=[1.0]), info, CPU, 0, 1000)


def _chain_transitions(n_states: int, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Uniformly random moves on a chain 0..n-1: action 1 right, 0 left (walls hold); reaching the
    last state pays 1 and ends the episode (it restarts at 0)."""
    rows = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "dones", "discounts")}
    s = 0
    for _ in range(count):
        a = int(rng.integers(0, 2))
        s2 = min(s + 1, n_states - 1) if a == 1 else max(s - 1, 0)
        done = s2 == n_states - 1
        for key, value in (("obs", np.eye(n_states)[s]), ("actions", a), ("rewards", float(done)),
                           ("next_obs", np.eye(n_states)[s2]), ("dones", float(done)), ("discounts", 0.9)):
            rows[key].append(value)
        s = 0 if done else s2
    return {k: np.asarray(v, np.float32 if k != "actions" else np.int64) for k, v in rows.items()}


def test_table_converges_to_q_star_on_a_chain():
    n, gamma = 5, 0.9
    info = space_info(gym.spaces.Discrete(n), gym.spaces.Discrete(2))
    algo = QLearning(QLearningConfig(learning_rate=0.5, gamma=gamma), info, CPU, seed=0, total_env_steps=10_000)
    batch = _chain_transitions(n, 20_000, np.random.default_rng(0))
    for start in range(0, 20_000, 1_000):  # as rollout batches arrive
        part = {k: v[start : start + 1_000] for k, v in batch.items()}
        stats = algo.learn([{**part, "env_steps": 1_000}], env_steps=start + 1_000)
        assert stats.gradient_updates == 1_000  # one table update per transition
    v_star = np.array([gamma ** (n - 2 - s) for s in range(n - 1)])  # V*(s) for the non-terminal states
    q_right = v_star  # stepping right from s reaches V*(s+1), i.e. gamma^(n-2-s) counting the final reward
    q_left = gamma * v_star[[0, 0, 1, 2]]  # left from 0 bumps the wall
    np.testing.assert_allclose(algo.table[: n - 1, 1], q_right, atol=1e-3)
    np.testing.assert_allclose(algo.table[: n - 1, 0], q_left, atol=1e-3)
    assert algo.gradient_updates == 20_000
    policy = make_policy(info, algo.policy_config())
    policy.load(algo.weights())
    assert policy.act(np.random.default_rng(0), np.eye(n, dtype=np.float32)[: n - 1], None).tolist() == [1] * 4


def test_staleness_budget_holds_transitions_back_in_order():
    info = space_info(gym.spaces.Discrete(5), gym.spaces.Discrete(2))
    algo = QLearning(QLearningConfig(), info, CPU, seed=0, total_env_steps=1000)
    batch = {**_chain_transitions(5, 100, np.random.default_rng(1)), "env_steps": 100}
    assert algo.learn([batch], 100, max_updates=30).gradient_updates == 30
    assert len(algo.pending["states"]) == 70
    assert algo.learn([], 100).gradient_updates == 70
    state = algo.state_dict()
    clone = QLearning(QLearningConfig(), info, CPU, seed=0, total_env_steps=1000)
    clone.load_state_dict(state)
    np.testing.assert_array_equal(clone.table, algo.table)


def test_frozen_lake_reaches_the_optimum_through_ray(tmp_path):
    """Deterministic 4x4 FrozenLake: the shortest path is 6 moves, so V*(start) = gamma^5 and the
    greedy policy always reaches the goal."""
    from kuberl.trainer.run import TrainOptions, train

    gamma = 0.9
    job = parse_job({
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "frozen-lake"},
        "spec": {
            "algorithm": {"name": "QLearning", "qLearning": {"learningRate": 0.5, "gamma": gamma,
                                                               "explorationFraction": 0.6}},
            "environment": {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}},
            "rolloutWorkers": {"replicas": 2, "envsPerWorker": 4},
            "collection": {"fragmentSteps": 64},
            "stopping": {"maxEnvSteps": 30_000},
            "evaluation": {"episodes": 10},
            "checkpointing": {"enabled": False},
        },
    })
    seen = {}
    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                     on_iteration=lambda row, loop: seen.update(algo=loop.algo)))
    assert result.ok and result.counters.gradient_updates == result.counters.env_steps
    table = seen["algo"].table
    assert table[0].max() == pytest.approx(gamma**5, abs=0.01)
    assert result.evaluation["deterministic"]["mean_return"] == 1.0

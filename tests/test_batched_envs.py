"""The numpy-batched environments run the same episodes as their per-env reference under the same
seeds, step for step; and a rollout worker's vectorised evaluation equals the one-env-at-a-time one."""

from __future__ import annotations

import numpy as np
import pytest

from kuberl.trainer.envs.batched import CartPoleBatch, make_batched
from kuberl.trainer.rollout import RolloutWorker, make_vector_env


def _compare(reference, batched, seeds, steps: int, n: int, seed: int = 0) -> int:
    oa, _ = reference.reset(seed=seeds)
    ob, _ = batched.reset(seed=seeds)
    np.testing.assert_array_equal(oa, ob)
    rng = np.random.default_rng(seed)
    episodes = 0
    for t in range(steps):
        actions = rng.integers(0, 2, n)
        obs_a, rew_a, term_a, trunc_a, info_a = reference.step(actions)
        obs_b, rew_b, term_b, trunc_b, info_b = batched.step(actions)
        np.testing.assert_allclose(obs_a, obs_b, atol=1e-6, err_msg=f"step {t}")
        np.testing.assert_array_equal(rew_a, rew_b)
        np.testing.assert_array_equal(term_a, term_b)
        np.testing.assert_array_equal(trunc_a, trunc_b)
        done = term_a | trunc_a
        if done.any():
            episodes += int(done.sum())
            idx = np.nonzero(done)[0]
            final_a = np.stack([info_a["final_obs"][i] for i in idx])
            np.testing.assert_allclose(final_a, info_b["final_obs"][idx], atol=1e-6)
    return episodes


@pytest.mark.parametrize("seeds", [[3 * i for i in range(16)], 5])
def test_cartpole_batch_equals_gymnasium_cartpole_step_by_step(seeds):
    n = 16
    reference = make_vector_env("CartPole-v1", {}, n, batched=False)
    batched = make_vector_env("CartPole-v1", {}, n)
    assert isinstance(batched, CartPoleBatch)
    episodes = _compare(reference, batched, seeds, 2_000, n)
    assert episodes > 100  # random actions end episodes often: resets are compared too


def test_cartpole_batch_time_limit_and_kwargs():
    n = 4
    reference = make_vector_env("CartPole-v1", {"sutton_barto_reward": True}, n, max_episode_steps=7, batched=False)
    batched = make_vector_env("CartPole-v1", {"sutton_barto_reward": True}, n, max_episode_steps=7)
    assert isinstance(batched, CartPoleBatch)
    _compare(reference, batched, list(range(n)), 60, n)


def test_unknown_kwargs_fall_back_to_the_reference():
    assert make_batched("CartPole-v1", {"render_mode": "rgb_array"}, 2, None) is None
    assert make_batched("Acrobot-v1", {}, 2, None) is None


def test_vectorised_evaluation_equals_sequential_reference():
    policy = {"kind": "ppo", "n_layers": 2, "activation": "tanh"}
    worker = RolloutWorker("CartPole-v1", {}, num_envs=4, seed=1, policy=policy)
    from kuberl.trainer.networks import ActorCritic, numpy_params

    rng = np.random.default_rng(0)
    shapes = numpy_params(ActorCritic(worker.info, [16, 16], "tanh"))
    params = {name: rng.normal(0, 0.7, size=value.shape).astype(np.float32) for name, value in shapes.items()}
    seeds = list(range(100, 130))
    vectorised = worker.evaluate(params, 1, seeds)
    sequential = worker.evaluate_sequential(params, 1, seeds)
    assert vectorised["lengths"] == sequential["lengths"]
    np.testing.assert_allclose(vectorised["returns"], sequential["returns"])


def test_latency_batch_equals_per_env_reference():
    from kuberl.trainer.envs.latency import LatencyBatch

    env_id = "kuberl.trainer.envs.latency:LatencyEnv"
    kwargs = {"step_seconds": 0.0, "episode_steps": 5}
    reference = make_vector_env(env_id, kwargs, 3, batched=False)
    batched = make_vector_env(env_id, kwargs, 3)
    assert isinstance(batched, LatencyBatch)
    assert _compare(reference, batched, [7, 8, 9], 23, 3) == 12

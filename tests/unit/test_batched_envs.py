"""The numpy-batched environments run the same episodes as their per-env reference under the same
seeds, step for step (autoreset, final_obs / final_info and per-copy seeding included); and a rollout
worker's vectorised evaluation equals the one-env-at-a-time one. Tic-Tac-Toe's and the autoscaling
envs' two versions run one implementation of the rules (tictactoe_games.py, autoscaling_service.py);
tests/unit/test_golden_envs.py holds both to the episodes recorded before they did."""

from __future__ import annotations

import numpy as np
import pytest
from kuberl.trainer.envs.batched import CartPoleBatch, make_batched
from kuberl.trainer.rollout import RolloutWorker, make_env, make_vector_env
from kuberl.trainer.spaces import flatten_obs


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


def _batch_of_one(raw):
    """One env's observation as a vector env's batch of one (a Dict observation: each part)."""
    if isinstance(raw, dict):
        return {k: np.asarray(v)[None] for k, v in raw.items()}
    return np.asarray(raw)[None]


def sequential_greedy_episodes(worker: RolloutWorker, seeds: list[int]) -> dict[str, list]:
    """The reference for `RolloutWorker.evaluate` (after it loaded its weights): one env, one seed after
    another, one greedy action at a time. Discrete actions only."""
    evaluator = worker.evaluator
    env = make_env(evaluator.env_id, evaluator.env_kwargs, evaluator.max_episode_steps)
    n_actions = worker.info.action_dims[0]
    returns, lengths = [], []
    try:
        for seed in seeds:
            raw, info = env.reset(seed=seed)
            total, steps, done = 0.0, 0, False
            while not done:
                obs = flatten_obs(env.observation_space, _batch_of_one(raw), 1)
                mask = info.get("action_mask")
                mask = None if mask is None else np.asarray(mask, bool).reshape(1, n_actions)
                action = worker.policy.greedy(obs, mask)[0]
                raw, reward, terminated, truncated, info = env.step(int(action))
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return {"returns": returns, "lengths": lengths}


def test_vectorised_evaluation_equals_sequential_reference():
    policy = {"kind": "ppo", "n_layers": 2, "activation": "tanh"}
    worker = RolloutWorker("CartPole-v1", {}, num_envs=4, seed=1, policy=policy)
    from kuberl.trainer.networks import ActorCritic, numpy_params

    rng = np.random.default_rng(0)
    shapes = numpy_params(ActorCritic(worker.info, [16, 16], "tanh"))
    params = {name: rng.normal(0, 0.7, size=value.shape).astype(np.float32) for name, value in shapes.items()}
    seeds = list(range(100, 130))
    vectorised = worker.evaluate(params, 1, seeds)
    sequential = sequential_greedy_episodes(worker, seeds)
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


# --- Tic-Tac-Toe -------------------------------------------------------------------------------


class _LowestScoringCell:
    """A deterministic opponent for comparisons: the free cell with the highest fixed score, asked
    once per game by the per-env env and for all games at once (`batch`) by the batched one."""

    SCORES = np.array([3.0, 1.0, 3.5, 1.5, 4.0, 0.5, 2.5, 2.0, 3.2])

    def __init__(self):
        self.calls = 0
        self.batch_calls = 0

    def __call__(self, obs, mask):
        self.calls += 1
        return int(np.argmax(np.where(mask, self.SCORES + obs[:9] * 0.1, -np.inf)))

    def batch(self, obs, mask):
        self.batch_calls += 1
        return np.argmax(np.where(mask, self.SCORES + obs[:, :9] * 0.1, -np.inf), axis=1)


def _compare_tictactoe(reference, batched, seeds, steps: int, n: int, policy_seed: int = 0) -> dict[str, int]:
    """Step both with the same actions (uniform over free cells, some illegal ones mixed in);
    everything a rollout worker reads must be equal. Returns counts of how episodes ended."""
    oa, ia = reference.reset(seed=seeds)
    ob, ib = batched.reset(seed=seeds)
    np.testing.assert_array_equal(oa, ob)
    np.testing.assert_array_equal(ia["action_mask"], ib["action_mask"])
    mask = ib["action_mask"]
    rng = np.random.default_rng(policy_seed)
    ends = {"win": 0, "loss": 0, "draw": 0, "illegal": 0}
    for t in range(steps):
        scores = rng.random((n, 9)) + np.where(mask, 1.0, 0.0) * (rng.random((n, 1)) > 0.03)
        actions = np.argmax(scores, axis=1)  # ~3% of games try any cell, legal or not
        obs_a, rew_a, term_a, trunc_a, info_a = reference.step(actions)
        obs_b, rew_b, term_b, trunc_b, info_b = batched.step(actions)
        np.testing.assert_array_equal(obs_a, obs_b, err_msg=f"step {t}")
        np.testing.assert_array_equal(rew_a, rew_b, err_msg=f"step {t}")
        np.testing.assert_array_equal(term_a, term_b, err_msg=f"step {t}")
        np.testing.assert_array_equal(trunc_a, trunc_b)
        np.testing.assert_array_equal(info_a["action_mask"], info_b["action_mask"], err_msg=f"step {t}")
        if term_a.any():
            idx = np.flatnonzero(term_a)
            np.testing.assert_array_equal(np.stack([info_a["final_obs"][i] for i in idx]), info_b["final_obs"][idx])
            np.testing.assert_array_equal(info_a["final_info"]["action_mask"][idx],
                                          info_b["final_info"]["action_mask"][idx])
            np.testing.assert_array_equal(info_a["final_info"]["illegal_move"][idx],
                                          info_b["final_info"]["illegal_move"][idx])
            for i in idx:
                ends[str(info_a["final_info"]["outcome"][i])] += 1
        mask = info_b["action_mask"]
    return ends


@pytest.mark.parametrize("kwargs", [
    {},
    {"agent_first": "alternate"},
    {"agent_first": "random", "opponent": "mix", "opponent_mix": 0.4, "opponent_epsilon": 0.3},
    {"agent_first": False, "opponent": "self", "opponent_epsilon": 0.5, "illegal_move_reward": -2.0},
    {"agent_first": "alternate", "opponent": "self"},
])
def test_tictactoe_batch_equals_per_env_tictactoe_step_by_step(kwargs):
    from kuberl.trainer.envs.tictactoe import TicTacToeBatch

    n = 24
    reference = make_vector_env("kuberl/TicTacToe-v0", kwargs, n, batched=False)
    batched = make_vector_env("kuberl/TicTacToe-v0", kwargs, n)
    assert isinstance(batched, TicTacToeBatch)
    opponent = _LowestScoringCell()
    if kwargs.get("opponent") in ("self", "mix"):
        for env in reference.envs:
            env.unwrapped.set_opponent_policy(opponent)
        batched.set_opponent_policy(opponent)
    ends = _compare_tictactoe(reference, batched, [11 * i for i in range(n)], 600, n)
    # Every way a game ends happened, so each was compared (and the reset that follows it).
    assert min(ends.values()) > 0, ends
    if kwargs.get("opponent") in ("self", "mix"):
        assert opponent.calls > 0 and opponent.batch_calls > 0


def test_tictactoe_batch_without_an_installed_opponent_falls_back_as_the_reference():
    n = 8
    reference = make_vector_env("kuberl/TicTacToe-v0", {"opponent": "self"}, n, batched=False)
    batched = make_vector_env("kuberl/TicTacToe-v0", {"opponent": "self"}, n)
    _, info = batched.reset(seed=3)
    assert info["opponent_fallback"].all()
    _compare_tictactoe(reference, batched, 3, 200, n)


def test_tictactoe_batch_refuses_what_the_reference_refuses():
    from kuberl.trainer.envs.tictactoe import TicTacToeBatch

    env = TicTacToeBatch(2, opponent="self")
    env.set_opponent_policy(lambda obs, mask: int(np.flatnonzero(~mask)[0]) if (~mask).any() else 0)
    with pytest.raises(ValueError, match="action=9 is not allowed"):
        env.reset(seed=0)
        env.step([0, 9])
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="opponent policy chose cell 0, which is not free"):
        env.step([0, 0])
    with pytest.raises(ValueError, match="opponent='nobody' is not allowed"):
        TicTacToeBatch(2, opponent="nobody")
    assert make_batched("kuberl/TicTacToe-v0", {"render_mode": "ansi"}, 2, None) is None
    assert make_batched("kuberl/TicTacToe-v0", {}, 2, 9) is None  # a time limit: the reference wraps it


# --- autoscaling -------------------------------------------------------------------------------

_AUTOSCALING_INFO = ("t", "arrivals", "served", "dropped", "queue", "running_instances", "booting_instances",
                     "instances", "capacity", "utilisation", "latency_ms", "slo_violation", "cost_instances",
                     "cost_slo", "cost_dropped", "scaling_blocked")


def _assert_obs_equal(a, b, msg: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{msg} {key}")
    else:
        np.testing.assert_array_equal(a, b, err_msg=msg)


def _compare_autoscaling(reference, batched, seeds, steps: int, n: int, multi: bool) -> int:
    """Same actions to both; observations, rewards and every info value must be equal, bit for bit."""
    oa, ia = reference.reset(seed=seeds)
    ob, ib = batched.reset(seed=seeds)
    _assert_obs_equal(oa, ob, "reset")
    keys = _AUTOSCALING_INFO + (("dropped_low_priority", "priority_weight") if multi else ())
    for key in keys:
        np.testing.assert_array_equal(ia[key], ib[key], err_msg=f"reset {key}")
    rng = np.random.default_rng(1)
    high = batched.single_action_space.nvec if multi else 3
    episodes = 0
    for t in range(steps):
        actions = rng.integers(0, high, (n, 3) if multi else n)
        obs_a, rew_a, term_a, trunc_a, info_a = reference.step(actions)
        obs_b, rew_b, term_b, trunc_b, info_b = batched.step(actions)
        _assert_obs_equal(obs_a, obs_b, f"step {t}")
        np.testing.assert_array_equal(rew_a, rew_b, err_msg=f"step {t}")
        np.testing.assert_array_equal(term_a, term_b)
        np.testing.assert_array_equal(trunc_a, trunc_b)
        for key in keys:
            np.testing.assert_array_equal(info_a[key], info_b[key], err_msg=f"step {t} {key}")
        if trunc_a.any():
            idx = np.flatnonzero(trunc_a)
            episodes += len(idx)
            for i in idx:
                _assert_obs_equal(info_a["final_obs"][i], {k: v[i] for k, v in info_b["final_obs"].items()}
                                  if isinstance(info_b["final_obs"], dict) else info_b["final_obs"][i], f"final {t}")
                for key in keys:
                    assert info_a["final_info"][key][i] == info_b["final_info"][key][i], (t, key)
    return episodes


@pytest.mark.parametrize("pattern", ["SINE_CURVE", "SINUSOIDAL", "STEADY", "SPIKE", "POISSON", "RANDOM"])
def test_autoscaling_batch_equals_per_env_autoscaling_step_by_step(pattern):
    from kuberl.trainer.envs.autoscaling import AutoscalingBatch

    n = 12
    kwargs = {"load_pattern": pattern, "episode_length": 37, "max_instances": 9, "min_instances": 2,
              "max_queue": 60.0, "load_params": {"base_load": 55.0, "period": 20}}
    reference = make_vector_env("kuberl/Autoscaling-v0", kwargs, n, batched=False)
    batched = make_vector_env("kuberl/Autoscaling-v0", kwargs, n)
    assert isinstance(batched, AutoscalingBatch)
    assert _compare_autoscaling(reference, batched, [5 * i for i in range(n)], 150, n, multi=False) == 4 * n


@pytest.mark.parametrize("kwargs", [
    {},
    {"observation_split": False, "startup_delay": 0, "initial_instances": 3, "episode_length": 25},
    {"load_pattern": "SPIKE", "tiers": [[1, 1], [3, 2.5]], "priority_weights": [0.0, 0.3, 0.7, 1.0],
     "low_priority_fraction": 0.6, "max_instances": 6, "episode_length": 30},
])
def test_autoscaling_multi_batch_equals_per_env_step_by_step(kwargs):
    from kuberl.trainer.envs.autoscaling import AutoscalingBatch

    n = 10
    reference = make_vector_env("kuberl/AutoscalingMulti-v0", kwargs, n, batched=False)
    batched = make_vector_env("kuberl/AutoscalingMulti-v0", kwargs, n)
    assert isinstance(batched, AutoscalingBatch) and batched.multi
    assert batched.single_observation_space == reference.single_observation_space
    episodes = _compare_autoscaling(reference, batched, 17, 260, n, multi=True)
    assert episodes >= n


def test_autoscaling_batch_refuses_bad_actions_and_falls_back_when_it_must():
    from kuberl.trainer.envs.autoscaling import AutoscalingBatch

    env = AutoscalingBatch(2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action=3 is not allowed"):
        env.step([1, 3])
    multi = AutoscalingBatch(2, multi=True)
    multi.reset(seed=0)
    with pytest.raises(ValueError, match=r"action=\[2, 5, 0\] is outside"):
        multi.step([[1, 0, 0], [2, 5, 0]])
    assert make_batched("kuberl/Autoscaling-v0", {"render_mode": "ansi"}, 2, None) is None
    assert make_batched("kuberl/Autoscaling-v0", {}, 2, 50) is None

"""Tic-Tac-Toe self-play in the rollout worker (no Ray): the frozen opponent is installed, plays only
legal cells, stays frozen between refreshes and is refreshed on the configured schedule; and the
`opponent` evaluation suite counts games correctly against fixed policies."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from kuberl.api.job import DQNConfig, EvaluationSuite, QNetworkSpec
from kuberl.api.load import parse_job
from kuberl.trainer.algorithms.dqn import DQN
from kuberl.trainer.envs import validate_env_kwargs
from kuberl.trainer.envs.baselines import MinimaxPolicy
from kuberl.trainer.envs.tictactoe import TicTacToeBatch, TicTacToeEnv
from kuberl.trainer.rollout import RolloutWorker
from kuberl.trainer.evaluation.opponent import opponent_games, opponent_suite
from kuberl.trainer.selfplay import FrozenOpponent
from kuberl.trainer.spaces import space_info

TTT = "kuberl/TicTacToe-v0"
POLICY = {"kind": "dqn", "n_layers": 1, "activation": "relu", "dueling": True}


def q_weights(seed: int) -> dict[str, np.ndarray]:
    """Weights of a randomly initialised Q-network shaped like POLICY."""
    info = space_info(gym.spaces.Box(0.0, 1.0, (18,), np.float32), gym.spaces.Discrete(9))
    cfg = DQNConfig(network=QNetworkSpec(hidden_sizes=[32], activation="relu"))
    return DQN(cfg, info, torch.device("cpu"), seed, 10_000).weights()


def make_worker(num_envs: int = 4, **kwargs) -> RolloutWorker:
    return RolloutWorker(TTT, kwargs, num_envs=num_envs, seed=0, policy=POLICY)


def sample(worker: RolloutWorker, params, version: int, steps: int = 40) -> dict:
    return worker.sample_offpolicy(params, version, steps, epsilon=0.2, gamma=0.9, n_step=1)


def first_free(obs, mask) -> int:
    return int(np.flatnonzero(mask)[0])


def free_cells_boards(n: int, seed: int):
    """`n` random positions mid-game (obs from the mover's side, mask), some with one free cell."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        marks = int(rng.integers(0, 9))
        cells = rng.permutation(9)[:marks]
        obs = np.zeros(18, np.float32)
        for k, cell in enumerate(cells):
            obs[cell if k % 2 == 0 else 9 + cell] = 1.0
        yield obs, obs[:9] + obs[9:] == 0


@pytest.mark.parametrize("opponent", ["self", "mix"])
def test_self_play_opponent_is_installed_in_every_env_copy_with_the_first_weights(opponent):
    worker = make_worker(opponent=opponent, opponent_mix=0.5)
    frozen = worker.self_play_opponent
    assert isinstance(frozen, FrozenOpponent) and frozen.version is None
    sample(worker, q_weights(0), version=0)
    assert frozen.version == 0
    assert isinstance(worker.env, TicTacToeBatch)  # one opponent for all the worker's games
    assert worker.env._opponent_policy is frozen
    sample(worker, None, version=0, steps=200)
    assert frozen.calls > 100  # it played the opponent's moves


def test_self_play_opponent_is_installed_in_every_copy_of_a_per_env_vector_env(monkeypatch):
    import kuberl.trainer.envs.batched as batched

    monkeypatch.setattr(batched, "make_batched", lambda *args: None)  # as for an env with no batched version
    worker = make_worker(opponent="self")
    assert isinstance(worker.env, gym.vector.SyncVectorEnv)
    sample(worker, q_weights(0), version=0)
    frozen = worker.self_play_opponent
    assert all(env.unwrapped._opponent_policy is frozen for env in worker.env.envs)
    sample(worker, None, version=0, steps=100)
    assert frozen.calls > 50


def test_no_self_play_opponent_against_random_or_on_other_envs():
    worker = make_worker(opponent="random")
    assert worker.self_play_opponent is None and worker.hooks == []
    cartpole = RolloutWorker("CartPole-v1", {}, num_envs=2, seed=0, policy={**POLICY})
    assert cartpole.self_play_opponent is None


def test_frozen_copy_plays_the_policy_greedily_and_only_legal_cells():
    worker = make_worker(opponent="self")
    sample(worker, q_weights(1), version=0)
    frozen = worker.self_play_opponent
    for obs, mask in free_cells_boards(500, seed=3):
        if not mask.any():
            continue
        cell = frozen(obs, mask)
        assert mask[cell], "the frozen opponent chose an occupied cell"
        assert cell == worker.policy.greedy(obs[None], mask[None])[0]
    # Thousands of training moves with a random network: the env raises if the opponent ever
    # picks an occupied cell.
    sample(worker, None, version=0, steps=1_000)


def test_opponent_is_refreshed_every_n_updates_and_frozen_in_between():
    worker = make_worker(opponent="self", opponent_refresh_updates=10)
    frozen = worker.self_play_opponent
    w0, w5, w12 = q_weights(0), q_weights(5), q_weights(12)
    sample(worker, w0, version=0)
    snapshot = {k: v.copy() for k, v in frozen.policy.params.items()}
    sample(worker, w5, version=5)
    assert frozen.version == 0  # 5 updates newer: not yet
    for k, v in frozen.policy.params.items():
        np.testing.assert_array_equal(v, snapshot[k])  # the worker's new weights did not leak in
    sample(worker, w12, version=12)
    assert frozen.version == 12
    np.testing.assert_array_equal(frozen.policy.params["trunk.0.weight"], w12["trunk.0.weight"])


def test_refresh_zero_replaces_the_opponent_on_every_weights_change():
    worker = make_worker(opponent="mix", opponent_refresh_updates=0)
    frozen = worker.self_play_opponent
    for version in (0, 1, 2):
        sample(worker, q_weights(version), version=version)
        assert frozen.version == version


@pytest.mark.parametrize("epsilon", [0.0, 0.5, 1.0])
def test_opponent_epsilon_mixes_random_moves_into_self_play(epsilon):
    calls = []

    def opponent(obs, mask):
        calls.append(1)
        return first_free(obs, mask)

    env = TicTacToeEnv(opponent="self", opponent_epsilon=epsilon, agent_first=False)
    env.set_opponent_policy(opponent)
    moves = 0
    for seed in range(200):
        _, info = env.reset(seed=seed)
        done = False
        while not done:
            free = np.flatnonzero(info["action_mask"])
            _, _, done, _, info = env.step(int(free[-1]))
        moves += env.board.count(1)  # the opponent plays X
    share = len(calls) / moves
    assert {0.0: share == 1.0, 0.5: 0.4 < share < 0.6, 1.0: share == 0.0}[epsilon], share


def test_refresh_interval_is_a_validated_env_kwarg():
    assert validate_env_kwargs(TTT, {"opponent_refresh_updates": 50}).opponent_refresh_updates == 50
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="opponent_refresh_updates"):
            TicTacToeEnv(opponent_refresh_updates=bad)
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="opponent_epsilon"):
            TicTacToeEnv(opponent_epsilon=bad)


# --- the opponent evaluation suite -----------------------------------------------------------


def test_perfect_play_never_loses_to_random_either_side_and_draws_itself():
    perfect = MinimaxPolicy()
    first = opponent_games(perfect, "random", True, 500, seed=1)
    second = opponent_games(perfect, "random", False, 500, seed=1)
    for res in (first, second):
        assert res["wins"] + res["draws"] + res["losses"] == res["games"] == 500
        assert res["losses"] == 0 and res["loss_rate"] == 0.0
        assert res["win_rate"] == res["wins"] / 500
    assert first["win_rate"] > 0.95 and second["win_rate"] > 0.7
    mirror = opponent_games(perfect, "self", True, 20, seed=0)
    assert (mirror["draws"], mirror["x_wins"], mirror["o_wins"], mirror["draw_rate"]) == (20, 0, 0, 1.0)


def test_counts_are_from_the_agents_side():
    # First-free-cell against itself: X takes 0, 2, 4, 6 and wins on the 2-4-6 diagonal every time.
    as_x = opponent_games(first_free, "self", True, 7, seed=0)
    as_o = opponent_games(first_free, "self", False, 7, seed=0)
    assert (as_x["wins"], as_x["losses"], as_x["x_wins"]) == (7, 0, 7)
    assert (as_o["wins"], as_o["losses"], as_o["o_wins"]) == (0, 7, 0)
    # Against random, the same seed gives the same games.
    again = opponent_games(first_free, "random", True, 200, 5)
    assert again == opponent_games(first_free, "random", True, 200, 5)
    with pytest.raises(ValueError, match="opponent='minimax'"):
        opponent_games(first_free, "minimax", True, 1, 0)


class LocalWorkers:
    """WorkerSet's interface over in-process RolloutWorkers (the runner's Ray path, without Ray)."""

    def __init__(self, workers):
        self.workers = workers

    def ready(self):
        return [types.SimpleNamespace(index=i) for i in range(len(self.workers))]

    def call(self, method, per_worker_args):
        return {i: getattr(self.workers[i], method)(*args) for i, args in per_worker_args.items()}


def ttt_spec(**suite) -> tuple:
    job = parse_job({
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "ttt"},
        "spec": {"algorithm": {"name": "DQN"}, "environment": {"id": TTT}, "stopping": {"maxEpisodes": 10},
                 "evaluation": {"suites": [{"name": "s", "kind": "opponent", **suite}]}},
    })
    return job.spec, job.spec.evaluation.suites[0]


def test_suite_runner_plays_on_a_worker_with_the_final_weights():
    spec, suite = ttt_spec(opponent="random", agentFirst=False, episodes=300)
    worker = make_worker(opponent="random")
    weights = q_weights(7)
    res = opponent_suite(spec, suite, LocalWorkers([worker]), weights, 42)
    assert worker.weights_version == 42
    assert res["games"] == 300 and res["wins"] + res["draws"] + res["losses"] == 300
    assert res["agent_first"] is False and res["opponent"] == "random"
    # The same games played here with the same greedy policy give the same counts.
    greedy = FrozenOpponent()
    greedy.refresh(worker.policy, 42)
    assert opponent_games(greedy, "random", False, 300, spec.evaluation.seed) == res


def test_suite_runner_rejects_what_it_cannot_play():
    spec, suite = ttt_spec(episodes=5)
    with pytest.raises(ValueError, match=r"suites\[s\]\.opponent: required"):
        opponent_suite(spec, suite, LocalWorkers([make_worker()]), q_weights(0), 0)
    spec.environment.id = "CartPole-v1"
    suite = EvaluationSuite(name="s", kind="opponent", opponent="random")
    with pytest.raises(ValueError, match="two-player env"):
        opponent_suite(spec, suite, LocalWorkers([]), None, 0)

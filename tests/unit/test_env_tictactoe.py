"""Tic-Tac-Toe env rules, masking, opponents, determinism, and the evaluation helpers."""

from __future__ import annotations

import importlib
import random
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from kuberl.trainer import envs
from kuberl.trainer.envs.baselines import MinimaxPolicy, RandomMovePolicy
from kuberl.trainer.envs.tictactoe import (
    LINES,
    TicTacToeEnv,
    evaluate_self_play,
    evaluate_vs_random,
    legal_moves,
    play_game,
    winner,
)


def scripted(moves):
    """An opponent policy playing `moves` in order."""
    it = iter(moves)
    return lambda obs, mask: next(it)


def self_env(opponent_moves, **kwargs) -> TicTacToeEnv:
    env = TicTacToeEnv(opponent="self", **kwargs)
    env.set_opponent_policy(scripted(opponent_moves))
    return env


def test_ids_registered_and_registration_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envs.register_envs()
        importlib.reload(envs)
    assert set(envs.ENV_IDS) == {"kuberl/TicTacToe-v0", "kuberl/Autoscaling-v0", "kuberl/AutoscalingMulti-v0"}
    assert all(env_id in gym.registry for env_id in envs.ENV_IDS)


def test_env_checker_passes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make("kuberl/TicTacToe-v0").unwrapped)
        check_env(gym.make("kuberl/TicTacToe-v0", agent_first=False, opponent="mix").unwrapped)


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("side", [1, -1])
def test_winner_finds_every_row_column_and_diagonal(line, side):
    board = [0] * 9
    for cell in line:
        board[cell] = side
    assert winner(board) == side
    assert winner(np.array(board)) == side


def test_winner_reports_draw_and_game_in_progress():
    draw = [1, -1, 1, 1, -1, -1, -1, 1, 1]
    assert winner(draw) == 0
    assert winner([1, -1, 0, 0, 0, 0, 0, 0, 0]) is None
    assert legal_moves([1, -1, 0, 0, 1, 0, 0, 0, -1]) == [2, 3, 5, 6, 7]


def test_agent_wins_a_row():
    env = self_env([3, 4])
    env.reset(seed=0)
    for cell in (0, 1):
        _, reward, terminated, _, info = env.step(cell)
        assert (reward, terminated, info["outcome"]) == (0.0, False, "")
    obs, reward, terminated, truncated, info = env.step(2)
    assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, "win")
    assert obs[[0, 1, 2]].tolist() == [1, 1, 1] and obs[[12, 13]].tolist() == [1, 1]


def test_agent_loses_to_a_column():
    env = self_env([1, 4, 7])
    env.reset(seed=0)
    env.step(0)
    env.step(2)
    _, reward, terminated, _, info = env.step(6)
    assert (reward, terminated, info["outcome"]) == (-1.0, True, "loss")


def test_full_board_without_line_is_a_draw():
    # X: 0 2 3 7 8, O: 1 4 5 6 -> no line.
    env = self_env([1, 4, 5, 6])
    env.reset(seed=0)
    for cell in (0, 2, 3, 7):
        assert env.step(cell)[2] is False
    _, reward, terminated, _, info = env.step(8)
    assert (reward, terminated, info["outcome"]) == (0.0, True, "draw")
    assert not info["action_mask"].any()


def test_illegal_move_ends_episode_with_penalty_and_is_not_played():
    env = self_env([4])
    obs, info = env.reset(seed=0)
    obs, *_, info = env.step(0)
    assert info["action_mask"].tolist() == [c not in (0, 4) for c in range(9)]
    board_before = env.board
    obs_after, reward, terminated, truncated, info = env.step(4)  # the opponent's cell
    assert (reward, terminated, truncated, info["illegal_move"], info["outcome"]) == (
        -1.0,
        True,
        False,
        True,
        "illegal",
    )
    assert env.board == board_before
    np.testing.assert_array_equal(obs_after, obs)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)


def test_illegal_move_reward_is_configurable():
    env = self_env([4], illegal_move_reward=-2.0)
    env.reset(seed=0)
    env.step(0)
    assert env.step(0)[1] == -2.0


@pytest.mark.parametrize("agent_first", [True, False])
def test_mask_matches_board_and_opponent_only_plays_free_cells(agent_first):
    env = TicTacToeEnv(agent_first=agent_first)
    rng = random.Random(0)
    for episode in range(200):
        obs, info = env.reset(seed=episode)
        marks = 0 if agent_first else 1
        while True:
            mask = info["action_mask"]
            np.testing.assert_array_equal(mask, env.action_masks())
            np.testing.assert_array_equal(mask, obs[:9] + obs[9:] == 0)
            assert (obs[:9] * obs[9:] == 0).all(), "a cell carries both marks"
            assert obs.sum() == marks
            obs, _, terminated, _, info = env.step(rng.choice(np.flatnonzero(mask).tolist()))
            assert not info["illegal_move"]
            if terminated:
                assert obs.sum() in (marks + 1, marks + 2)
                break
            marks += 2  # the agent's mark and exactly one opponent mark, on a free cell


def test_agent_second_sees_opponent_opening_and_opponent_sees_its_own_side():
    seen = []

    def opponent(obs, mask):
        seen.append(obs.copy())
        return int(np.flatnonzero(mask)[0])

    env = TicTacToeEnv(opponent="self", agent_first=False)
    env.set_opponent_policy(opponent)
    obs, info = env.reset(seed=0)
    assert info["agent_first"] is False and info["opponent"] == "self"
    assert obs[9] == 1 and obs.sum() == 1  # the opponent (X) took cell 0; it is "theirs" to the agent
    assert not info["action_mask"][0]
    assert env.board[0] == 1  # X
    env.step(4)
    assert seen[1][0] == 1 and seen[1][9 + 4] == 1  # opponent's view: its mark in plane 0, ours in plane 1


def test_agent_as_o_can_win():
    env = self_env([0, 1, 8], agent_first=False)
    env.reset(seed=0)
    env.step(3)
    env.step(4)
    _, reward, terminated, _, info = env.step(5)
    assert (reward, terminated, info["outcome"]) == (1.0, True, "win")


def test_alternate_mix_and_fallback():
    env = TicTacToeEnv(agent_first="alternate")
    firsts = [env.reset(seed=0 if i == 0 else None)[1]["agent_first"] for i in range(4)]
    assert firsts == [True, False, True, False]

    env = TicTacToeEnv(opponent="self")
    info = env.reset(seed=0)[1]
    assert (info["opponent"], info["opponent_fallback"]) == ("random", True)
    env.set_opponent_policy(lambda obs, mask: int(np.flatnonzero(mask)[0]))
    info = env.reset()[1]
    assert (info["opponent"], info["opponent_fallback"]) == ("self", False)

    for mix, kind in ((1.0, "self"), (0.0, "random")):
        env = TicTacToeEnv(opponent="mix", opponent_mix=mix)
        env.set_opponent_policy(lambda obs, mask: int(np.flatnonzero(mask)[0]))
        assert {env.reset(seed=s)[1]["opponent"] for s in range(10)} == {kind}
    env = TicTacToeEnv(opponent="mix", opponent_mix=0.5, agent_first="random")
    env.set_opponent_policy(lambda obs, mask: int(np.flatnonzero(mask)[0]))
    infos = [env.reset(seed=s)[1] for s in range(40)]
    assert {i["opponent"] for i in infos} == {"self", "random"}
    assert {i["agent_first"] for i in infos} == {True, False}


def test_installed_policy_choosing_an_occupied_cell_raises():
    env = self_env([0, 0])
    env.reset(seed=0)
    env.step(1)
    with pytest.raises(RuntimeError, match="cell 0, which is not free"):
        env.step(2)


def _trajectory(seed: int) -> list:
    env = TicTacToeEnv(agent_first="random")
    out = []
    for episode in range(20):
        obs, info = env.reset(seed=seed if episode == 0 else None)
        out.append(obs.tolist())
        while True:
            obs, reward, terminated, _, info = env.step(int(np.flatnonzero(info["action_mask"])[-1]))
            out.append((obs.tolist(), reward))
            if terminated:
                break
    return out


def test_deterministic_under_seed():
    assert _trajectory(7) == _trajectory(7)
    assert _trajectory(7) != _trajectory(8)


def test_bad_kwargs_name_the_kwarg_value_and_allowed_values():
    with pytest.raises(ValueError, match=r"opponent='minimax'.*random, self, mix"):
        TicTacToeEnv(opponent="minimax")
    with pytest.raises(ValueError, match=r"agent_first='second'.*alternate"):
        TicTacToeEnv(agent_first="second")
    with pytest.raises(ValueError, match=r"opponent_mix=1.5"):
        TicTacToeEnv(opponent_mix=1.5)
    with pytest.raises(ValueError, match=r"'oponent'.*allowed kwargs: opponent"):
        gym.make("kuberl/TicTacToe-v0", oponent="self")
    with pytest.raises(ValueError, match=r"'oponent'"):
        envs.validate_env_kwargs("kuberl/TicTacToe-v0", {"oponent": "self"})
    assert (
        envs.validate_env_kwargs("kuberl/TicTacToe-v0", {"agent_first": "alternate"}).agent_first
        == "alternate"
    )


def test_play_game_and_evaluation_helpers():
    perfect = MinimaxPolicy()
    assert play_game(perfect, perfect) == 0
    assert evaluate_self_play(perfect, games=5) == {"x_win": 0, "draw": 5, "o_win": 0}
    first = evaluate_vs_random(perfect, games=200, agent_first=True, seed=1)
    second = evaluate_vs_random(perfect, games=200, agent_first=False, seed=1)
    assert first["loss"] == 0 and second["loss"] == 0
    assert sum(first.values()) == 200 and first["win"] > 190
    assert evaluate_vs_random(perfect, games=50, seed=3) == evaluate_vs_random(perfect, games=50, seed=3)
    # Random against random: X wins ~58%, O ~29%.
    outcomes = [play_game(None, RandomMovePolicy(10_000 + s), random.Random(s)) for s in range(2000)]
    assert 0.53 < outcomes.count(1) / 2000 < 0.64 and 0.24 < outcomes.count(-1) / 2000 < 0.34
    with pytest.raises(ValueError, match="policy_o chose cell 0"):
        play_game(lambda obs, mask: 0, lambda obs, mask: 0)

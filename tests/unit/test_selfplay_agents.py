"""Self-play in a PettingZoo env (environment.multiAgent.policies: selfPlay): the learner's agent of each game is
one entry of the vector env, frozen copies of its policy play the others.

Checked on PettingZoo's own Tic-Tac-Toe (the board read back from the game after every step) and on a small
AEC game of this file (checked with PettingZoo's api_test) whose rewards come from the other agents' moves, in
which an agent leaves early; and the refusals, each naming the job's field.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from kuberl.api.load import InvalidJob, load_job_text
from kuberl.trainer.envs.multiagent import MultiAgentEnvError
from kuberl.trainer.envs.resolve import agents_vector
from kuberl.trainer.envs.selfplay_agents import SelfPlayAgents, play_games
from pettingzoo import AECEnv
from pettingzoo.test import api_test
from pettingzoo.utils import AgentSelector

SELF_PLAY = {"policies": "selfPlay"}


class RoundGame(AECEnv):
    """`n` agents move in turn for `rounds` rounds. A move of action k gives every other agent a reward of k;
    the mover gets nothing. The agent `leaves` (an index) is done after the first round. With `stuck`, the
    turn never leaves agent 0."""

    metadata = {"name": "round_game_v0", "is_parallelizable": False}

    def __init__(self, n: int = 3, rounds: int = 4, leaves: int | None = None, stuck: bool = False,
                 actions: int = 3):
        super().__init__()
        self.possible_agents = [f"a{i}" for i in range(n)]
        self.rounds, self.leaves, self.stuck = rounds, leaves, stuck
        self._obs_space = gym.spaces.Box(0.0, float(rounds), (2,), np.float32)
        self._act_space = gym.spaces.Discrete(actions)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def observe(self, agent):
        return np.array([self.round, self.last_move], np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.round, self.moves, self.last_move = 0, 0, 0
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: (float(action) if a != agent else 0.0) for a in self.agents}
        self.last_move = int(action)
        self.moves += 1
        if self.stuck:
            self._accumulate_rewards()
            return
        if self._selector.is_last():
            self.round += 1
            if self.round == 1 and self.leaves is not None and f"a{self.leaves}" in self.agents:
                self.terminations[f"a{self.leaves}"] = True
            if self.round >= self.rounds:
                self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()
        # An agent done stays selected until it steps out (PettingZoo's dead step); the living skip it otherwise.
        while (not all(self.terminations.values()) and self.terminations[self.agent_selection]
               and self.agent_selection != agent):
            self.agent_selection = self._selector.next()
        if any(self.terminations.values()):
            self._deads_step_first()


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def has_line(marks: np.ndarray) -> bool:
    return any(all(marks[i] for i in line) for line in LINES)


class Scripted:
    """An opponent's policy that always answers `move`, counting the positions it was asked about."""

    def __init__(self, move: int):
        self.move, self.asked = move, 0

    def batch(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        self.asked += len(obs)
        return np.full(len(obs), self.move, np.int64)


def test_the_round_game_is_a_valid_aec_env():
    api_test(RoundGame(), num_cycles=20)
    api_test(RoundGame(leaves=2), num_cycles=20)


def test_the_learner_earns_what_the_others_moves_gave_it_and_its_seat_goes_round():
    env = SelfPlayAgents(lambda: RoundGame(n=3, rounds=4), 3, opponent_epsilon=0.0)
    opponent = Scripted(2)
    env.set_opponent_policy(opponent)
    _, info = env.reset(seed=[0, 1, 2])
    assert list(info["seat"]) == [0, 1, 2]
    total, lengths = np.zeros(3), np.zeros(3, int)
    for step in range(4):
        _, reward, terminated, truncated, info = env.step(np.ones(3, np.int64))
        total += reward
        lengths += 1
        # The two opponents moved 2 each since the learner's move (the moves before its first one were before
        # its episode began: a gymnasium reset gives no reward); in the last round only those after its seat.
        assert list(reward) == ([4.0, 4.0, 4.0] if step < 3 else [4.0, 2.0, 0.0]), (step, reward)
        assert list(terminated) == [step == 3] * 3
        assert not truncated.any()
    assert list(total) == [16.0, 14.0, 12.0] and list(lengths) == [4, 4, 4]
    # The next games: each copy's learner in the next seat, and the opponents played every move but its.
    assert list(info["seat"]) == [1, 2, 0]
    assert env.opponents.moves == opponent.asked
    assert env.opponents.moves == 3 * 8 + (1 + 2 + 0)  # 8 in each game, then those before its next first move


def test_an_opponent_that_leaves_early_steps_out_and_gives_nothing_after():
    env = SelfPlayAgents(lambda: RoundGame(n=3, rounds=3, leaves=2), 1, opponent_epsilon=0.0, seat=0)
    env.set_opponent_policy(Scripted(1))
    env.reset(seed=[5])
    rewards = [env.step(np.array([0]))[1][0] for _ in range(3)]
    # Round one: a1 and a2 move (1 each); a2 is done after it, so from round two only a1 gives (1).
    assert rewards == [2.0, 1.0, 1.0]


def test_opponent_epsilon_one_never_asks_the_frozen_policy_and_plays_legal_moves():
    env = agents_vector("classic/tictactoe-v3", {}, {"policies": "selfPlay", "self_play": {"opponent_epsilon": 1.0}}, 4)
    frozen = Scripted(0)  # cell 0: illegal once taken, so a move from it would show
    env.set_opponent_policy(frozen)
    obs, info = env.reset(seed=[0, 1, 2, 3])
    rng = np.random.default_rng(3)
    for _ in range(200):
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in info["action_mask"]])
        obs, _, _, _, info = env.step(actions)
    assert frozen.asked == 0 and env.opponents.moves > 300


def test_tictactoe_the_learners_view_is_the_board_its_return_the_games_outcome_and_steps_its_own_moves():
    """Random play on both sides, the PettingZoo game read back after every step: the learner's observation
    and legal moves are the board's from its side, its return is the winner, its steps are its own moves."""
    env = agents_vector("classic/tictactoe-v3", {}, SELF_PLAY, 4)
    obs, info = env.reset(seed=[10, 11, 12, 13])
    rng = np.random.default_rng(0)
    total, moves = np.zeros(4), np.zeros(4, int)
    outcomes = {0: [], 1: []}
    for _ in range(400):
        seats = info["seat"].copy()
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in info["action_mask"]])
        obs, reward, terminated, truncated, info = env.step(actions)
        total += reward
        moves += 1
        assert not truncated.any()
        for copy in range(4):
            game = env.games[copy].unwrapped
            if terminated[copy]:
                final = info["final_obs"][copy].reshape(9, 2)
                mine, theirs = final[:, 0], final[:, 1]
                assert mine.sum() == moves[copy] and abs(theirs.sum() - mine.sum()) <= 1
                assert total[copy] == (1.0 if has_line(mine) else -1.0 if has_line(theirs) else 0.0)
                outcomes[int(seats[copy])].append(total[copy])
                total[copy], moves[copy] = 0.0, 0
            else:
                board = np.array(game.board.squares)
                me = int(seats[copy]) + 1
                view = obs[copy].reshape(9, 2)
                assert np.array_equal(view[:, 0], (board == me).astype(np.float32))
                assert np.array_equal(view[:, 1], ((board != me) & (board != 0)).astype(np.float32))
                assert np.array_equal(info["action_mask"][copy], board == 0)
    # Uniformly random play: X (seat 0) wins about 58% of games, O about 29% (every game enumerated).
    first, second = np.array(outcomes[0]), np.array(outcomes[1])
    assert len(first) > 100 and len(second) > 100
    assert (first > 0).mean() > (second > 0).mean()


def test_evaluation_games_seat_the_policy_where_asked_and_count_from_its_side():
    env = agents_vector("classic/tictactoe-v3", {}, SELF_PLAY, 8, seat=1)
    env.opponents.epsilon = 0.0

    class FirstFree:
        def batch(self, obs, masks):
            return np.argmax(masks, axis=1)

    counts = play_games(env, FirstFree(), 50, seed=0)
    assert sum(counts.values()) == 50
    # Against itself (the opponent the same first-free-cell player) every game is the same game: X takes cells
    # 0, 2, 4 and 6, a diagonal, and wins; the policy is O here and loses every game.
    env.set_opponent_policy(FirstFree())
    assert play_games(env, FirstFree(), 20, seed=0) == {"win": 0, "draw": 0, "loss": 20}


@pytest.mark.parametrize("make, field, words", [
    (lambda: RoundGame(n=1), "spec.environment.multiAgent.policies", "two or more agents"),
    (lambda: RoundGame(n=2, stuck=True), "spec.environment.multiAgent.policies", "got no turn"),
])
def test_games_self_play_cannot_use_are_refused_naming_the_field(make, field, words):
    with pytest.raises(MultiAgentEnvError) as err:
        env = SelfPlayAgents(make, 1, opponent_epsilon=0.0, seat=1 if "turn" in words else None)
        env.reset(seed=[0])
    assert err.value.field == field and words in str(err.value)


def test_continuous_actions_are_refused_for_self_play():
    with pytest.raises(MultiAgentEnvError) as err:
        agents_vector("mpe2.simple_spread_v3:parallel_env", {"continuous_actions": True}, SELF_PLAY, 1)
    assert err.value.field == "spec.environment.multiAgent.policies" and "Discrete" in str(err.value)


def test_self_play_settings_without_self_play_are_refused_at_the_field():
    text = """
apiVersion: kuberl.dev/v1alpha1
kind: RLTrainingJob
metadata: {name: spread}
spec:
  algorithm: {name: PPO}
  environment:
    id: mpe2.simple_spread_v3:parallel_env
    multiAgent: {policies: shared, selfPlay: {refreshUpdates: 5}}
  stopping: {maxEnvSteps: 1000}
"""
    with pytest.raises(InvalidJob) as err:
        load_job_text(text)
    assert "spec.environment.multiAgent" in str(err.value) and "selfPlay is set only with policies: selfPlay" in \
        str(err.value)

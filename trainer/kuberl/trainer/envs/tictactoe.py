"""Tic-Tac-Toe against a built-in opponent (uniform random, a frozen copy of the learner, or a mix).

Observation: float32 Box of 18, two planes seen from the side to move: cells 0-8 hold 1.0 where the
agent has a mark, cells 9-17 where the opponent has one (cell = 3 * row + col). Action: Discrete(9),
the cell to mark. Reward: +1 win, 0 draw, -1 loss, given on the final step.

Illegal moves are never played: `info["action_mask"]` (bool, 9) and `action_masks()` say which
cells are free, and an action on an occupied cell ends the episode at once with
`illegal_move_reward` (default -1, the same as a loss) and `info["illegal_move"] = True`, leaving
the board as it was. Ending rather than ignoring the move keeps every step a real move, so a learner
that ignores the mask sees the cost instead of a silent no-op.

The game rules and the opponent are implemented once, in tictactoe_games.py: `TicTacToeEnv` plays
one game on Python numbers, `TicTacToeBatch` n games on numpy arrays.

Pure-python helpers for evaluation: `winner`, `legal_moves`, `play_game`, `evaluate_vs_random`,
`evaluate_self_play`. A policy is a callable `policy(obs, mask) -> cell` seeing the board from the
side it plays, exactly as the env's opponent and a learner's frozen copy do.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from kuberl.trainer.envs.elementwise import Arrays, Numbers
from kuberl.trainer.envs.kwargs import config_from_kwargs
from kuberl.trainer.envs.seeding import per_env_seeds
from kuberl.trainer.envs.tictactoe_games import LINES, Games

Policy = Callable[[np.ndarray, np.ndarray], Any]

_LINES_THROUGH = tuple(tuple(line for line in LINES if cell in line) for cell in range(9))
OPPONENTS = ("random", "self", "mix")
AGENT_FIRST_VALUES = (True, False, "alternate", "random")
OBS_SIZE = 18


@dataclass(frozen=True)
class TicTacToeConfig:
    """Keyword arguments of kuberl/TicTacToe-v0."""

    opponent: str = "random"
    """"random": uniform over free cells; "self": the policy installed with set_opponent_policy
    (uniform random until one is installed, reported as info["opponent_fallback"]); "mix": self
    with probability opponent_mix, drawn per episode."""
    opponent_mix: float = 0.5
    """With opponent="mix": chance that an episode is played against the installed policy."""
    opponent_epsilon: float = 0.0
    """When the installed policy plays ("self", or "mix" when drawn): chance, per move, that it
    plays a uniformly random free cell instead, so self-play also reaches positions the policy
    would not play into itself and still punishes mistakes there."""
    opponent_refresh_updates: int = 100
    """Self-play in training ("self" or "mix"): each rollout worker installs a greedy copy of its
    current policy as the opponent and replaces it once the learner's weights are this many
    gradient updates newer; 0 replaces it on every weights change."""
    agent_first: bool | str = True
    """true: the agent plays X and moves first; false: it plays O; "alternate": X on the first
    episode after a seeded reset, then O, X, ...; "random": drawn per episode."""
    illegal_move_reward: float = -1.0
    """Reward for marking an occupied cell, which ends the episode."""

    def __post_init__(self) -> None:
        if self.opponent not in OPPONENTS:
            raise ValueError(
                f"opponent={self.opponent!r} is not allowed; allowed values: {', '.join(OPPONENTS)}"
            )
        if (
            isinstance(self.opponent_mix, bool)
            or not isinstance(self.opponent_mix, (int, float))
            or not (0.0 <= self.opponent_mix <= 1.0)
        ):
            raise ValueError(f"opponent_mix={self.opponent_mix!r}: must be a number within [0, 1]")
        if (
            isinstance(self.opponent_epsilon, bool)
            or not isinstance(self.opponent_epsilon, (int, float))
            or not (0.0 <= self.opponent_epsilon <= 1.0)
        ):
            raise ValueError(f"opponent_epsilon={self.opponent_epsilon!r}: must be a number within [0, 1]")
        if (
            isinstance(self.opponent_refresh_updates, bool)
            or not isinstance(self.opponent_refresh_updates, int)
            or self.opponent_refresh_updates < 0
        ):
            raise ValueError(
                f"opponent_refresh_updates={self.opponent_refresh_updates!r}: must be an integer >= 0"
            )
        if not any(
            self.agent_first is v if isinstance(v, bool) else self.agent_first == v
            for v in AGENT_FIRST_VALUES
        ):
            raise ValueError(
                f"agent_first={self.agent_first!r} is not allowed; allowed values: true, false, alternate, random"
            )
        if isinstance(self.illegal_move_reward, bool) or not isinstance(
            self.illegal_move_reward, (int, float)
        ):
            raise ValueError(f"illegal_move_reward={self.illegal_move_reward!r}: must be a number")  # noqa: TRY004

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> TicTacToeConfig:
        """Build from env kwargs; an unknown name or a bad value raises ValueError naming it."""
        return config_from_kwargs(cls, kwargs)


# --- pure helpers ------------------------------------------------------------------------------


def winner(board: Sequence[int]) -> int | None:
    """+1 if X (1) has a line, -1 if O (-1) has one, 0 for a full board without one (a draw),
    None while the game goes on. `board` is 9 cells of 1 / -1 / 0 (empty)."""
    cells = [int(c) for c in board]
    for a, b, c in LINES:
        if cells[a] != 0 and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return 0 if all(cells) else None


def legal_moves(board: Sequence[int]) -> list[int]:
    """Free cells of a 9-cell board, in increasing order."""
    return [i for i in range(9) if int(board[i]) == 0]


def encode(board: Sequence[int], side: int) -> np.ndarray:
    """The env's observation of `board` for the player marking `side` (1 for X, -1 for O)."""
    obs = np.zeros(OBS_SIZE, dtype=np.float32)
    for i in range(9):
        if board[i] == side:
            obs[i] = 1.0
        elif board[i] == -side:
            obs[9 + i] = 1.0
    return obs


def _completes_line(board: list[int], cell: int, side: int) -> bool:
    for a, b, c in _LINES_THROUGH[cell]:
        if board[a] == side and board[b] == side and board[c] == side:
            return True
    return False


class RandomMovePolicy:
    """Uniform over the cells the mask allows; reproducible under `seed`."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> int:
        return self._rng.choice(np.flatnonzero(mask).tolist())


def play_game(policy_x: Policy | None, policy_o: Policy | None, rng: random.Random | None = None) -> int:
    """Play one game, X first; returns +1 (X wins), 0 (draw) or -1 (O wins).

    A policy of None plays uniformly at random with `rng` (a `random.Random` or a numpy Generator).
    A policy that picks an occupied cell raises ValueError: evaluation reports what a policy does
    when it respects the mask, and a policy that does not is a bug to surface.
    """
    if (policy_x is None or policy_o is None) and rng is None:
        raise ValueError("rng is required when policy_x or policy_o is None (uniform random)")
    board = [0] * 9
    side = 1
    for _ in range(9):
        policy = policy_x if side == 1 else policy_o
        free = [i for i in range(9) if board[i] == 0]
        if policy is None:
            cell = (
                free[int(rng.integers(len(free)))]
                if isinstance(rng, np.random.Generator)
                else rng.choice(free)
            )
        else:
            mask = np.zeros(9, dtype=bool)
            mask[free] = True
            cell = int(policy(encode(board, side), mask))
            if not (0 <= cell <= 8 and board[cell] == 0):
                name = "policy_x" if side == 1 else "policy_o"
                raise ValueError(f"{name} chose cell {cell}, which is not free; free cells: {free}")
        board[cell] = side
        if _completes_line(board, cell, side):
            return side
        side = -side
    return 0


def evaluate_vs_random(
    policy: Policy, games: int = 1000, agent_first: bool = True, seed: int = 0
) -> dict[str, int]:
    """Counts {"win", "draw", "loss"} of `policy` against a uniform-random opponent, from the policy's side."""
    opponent = RandomMovePolicy(seed)
    counts = {"win": 0, "draw": 0, "loss": 0}
    for _ in range(games):
        result = play_game(policy, opponent) if agent_first else -play_game(opponent, policy)
        counts["win" if result > 0 else "loss" if result < 0 else "draw"] += 1
    return counts


def evaluate_self_play(policy: Policy, games: int = 1000) -> dict[str, int]:
    """Counts {"x_win", "draw", "o_win"} of `policy` playing both sides (a greedy policy plays the same game
    each time)."""
    counts = {"x_win": 0, "draw": 0, "o_win": 0}
    for _ in range(games):
        result = play_game(policy, policy)
        counts["x_win" if result > 0 else "o_win" if result < 0 else "draw"] += 1
    return counts


# --- the environments: one game or n games (tictactoe_games.py) ------------------------------


class TicTacToeEnv(gym.Env):
    """kuberl/TicTacToe-v0: the agent plays one side against the configured opponent.

    One game of tictactoe_games.py on Python numbers: the code TicTacToeBatch runs on arrays. Its
    draws come from the env's `np_random`, so a game is the one a batched copy seeded alike plays."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed values: None, ansi")
        self.render_mode = render_mode
        self.config = TicTacToeConfig.from_kwargs(kwargs)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(OBS_SIZE,), dtype=np.float32)
        self.action_space = spaces.Discrete(9)
        self._games = Games(self.config, Numbers)
        self._seeded = False
        self._done = True

    def set_opponent_policy(self, policy: Policy | None) -> None:
        """Install the policy the "self" opponent plays, `policy(obs, mask) -> cell`, called with one
        observation (18,) from the opponent's side and its mask (9,); None uninstalls it. Takes
        effect from the next move."""
        self._games.policy = policy

    @property
    def _opponent_policy(self) -> Policy | None:
        return self._games.policy

    def action_masks(self) -> np.ndarray:
        """Free cells (bool, 9) of the current board."""
        return self._games.action_mask()

    @property
    def board(self) -> list[int]:
        """The board with X = 1, O = -1, 0 free (the helpers' convention)."""
        sign = 1 if self._games.agent_first else -1
        mine, theirs = self._games.mine, self._games.theirs
        return [sign if (mine >> c) & 1 else -sign if (theirs >> c) & 1 else 0 for c in range(9)]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            self._games.seed([self.np_random])  # draws start afresh from the (re)seeded np_random
            self._seeded = True
        games = self._games
        games.reset(True)
        self._done = False
        return games.observation(), {
            "action_mask": games.action_mask(),
            "agent_first": games.agent_first,
            "opponent": self._opponent_kind(),  # "random" or "self": who plays this episode
            "opponent_fallback": games.fallback,  # "self" was drawn but no policy is installed
        }

    def step(self, action):
        if self._done:
            raise RuntimeError("step() called on a finished game; call reset()")
        reward, terminated, illegal, win, loss = self._games.play(int(action))
        self._done = terminated
        # "" while the game goes on; "win", "draw", "loss" or "illegal" at its end
        outcome = "illegal" if illegal else "win" if win else "loss" if loss else "draw" if terminated else ""
        info = {"action_mask": self._games.action_mask(), "illegal_move": illegal, "outcome": outcome,
                "opponent": self._opponent_kind()}
        return self._games.observation(), reward, terminated, False, info

    def _opponent_kind(self) -> str:
        return "self" if self._games.opponent_self else "random"

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        symbols = {1: "X", -1: "O", 0: "."}
        board = self.board
        return "\n".join("".join(symbols[board[3 * r + c]] for c in range(3)) for r in range(3))


class TicTacToeBatch(VectorEnv):
    """`num_envs` Tic-Tac-Toe games: the games the per-env env plays on one game's numbers, played on
    arrays, so each is the game a `SyncVectorEnv` of `TicTacToeEnv` (autoreset in the same step)
    seeded alike plays, step for step (tests/unit/test_batched_envs.py, tests/unit/test_golden_envs.py).

    Each game draws from its own generator, seeded as `SyncVectorEnv` seeds its copies. A "self"
    opponent is asked for all games at once: `policy.batch(obs (M, 18), mask (M, 9)) -> cells (M,)`
    when the policy offers it, else one call per game. `info` carries `action_mask` (and
    `final_obs`, `final_info["action_mask"]` and `final_info["illegal_move"]` for ended games); the
    per-game strings (`outcome`, `opponent`) are left out.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        self.config = TicTacToeConfig.from_kwargs(kwargs)
        self.num_envs = num_envs
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(OBS_SIZE,), dtype=np.float32)
        self.single_action_space = spaces.Discrete(9)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._xp = Arrays(num_envs)
        self.games = Games(self.config, self._xp)
        self._seed_all([None] * num_envs)

    def set_opponent_policy(self, policy: Policy | None) -> None:
        """As `TicTacToeEnv.set_opponent_policy`, for every game; `policy.batch` is used when present."""
        self.games.policy = policy

    @property
    def _opponent_policy(self) -> Policy | None:
        return self.games.policy

    def _seed_all(self, seeds: list[int | None]) -> None:
        self.games.seed([gym.utils.seeding.np_random(s)[0] for s in seeds])

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._seed_all(per_env_seeds(seed, self.num_envs))
        games = self.games
        games.reset(self._xp.full(True))
        info = {"action_mask": games.action_mask(), "agent_first": games.agent_first.copy(),
                "opponent_fallback": games.fallback.copy()}
        return games.observation(), info

    def step(self, actions):
        (cells,) = self._xp.integers(actions, 1)
        reward, terminated, illegal, _win, _loss = self.games.play(cells)
        obs, mask = self.games.observation(), self.games.action_mask()
        info: dict[str, Any] = {"action_mask": mask}
        if terminated.any():
            # As SyncVectorEnv: an ended game's last step goes to final_obs / final_info (every
            # game ends there, so `illegal_move` is only in final_info), its reset takes its place.
            final_info = {"action_mask": mask, "_action_mask": terminated.copy(),
                          "illegal_move": illegal, "_illegal_move": terminated.copy()}
            info.update(final_obs=obs, _final_obs=terminated.copy(),
                        final_info=final_info, _final_info=terminated.copy())
            self.games.reset(terminated)
            obs, info["action_mask"] = self.games.observation(), self.games.action_mask()
        return obs, reward, terminated, np.zeros(self.num_envs, bool), info

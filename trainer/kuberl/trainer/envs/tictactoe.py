"""Tic-Tac-Toe against a built-in opponent (uniform random, a frozen copy of the learner, or a mix).

Observation: float32 Box of 18, two planes seen from the side to move: cells 0-8 hold 1.0 where the
agent has a mark, cells 9-17 where the opponent has one (cell = 3 * row + col). Action: Discrete(9),
the cell to mark. Reward: +1 win, 0 draw, -1 loss, given on the final step.

Illegal moves are never played: `info["action_mask"]` (bool, 9) and `action_masks()` say which
cells are free, and an action on an occupied cell ends the episode at once with
`illegal_move_reward` (default -1, the same as a loss) and `info["illegal_move"] = True`, leaving
the board as it was. Ending rather than ignoring the move keeps every step a real move, so a learner
that ignores the mask sees the cost instead of a silent no-op.

Pure-python helpers for evaluation: `winner`, `legal_moves`, `play_game`, `evaluate_vs_random`,
`evaluate_self_play`. A policy is a callable `policy(obs, mask) -> cell` seeing the board from the
side it plays, exactly as the env's opponent and a learner's frozen copy do.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from kuberl.trainer.envs.kwargs import config_from_kwargs
from kuberl.trainer.envs.seeding import per_env_seeds

Policy = Callable[[np.ndarray, np.ndarray], Any]

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_LINES_THROUGH = tuple(tuple(line for line in LINES if cell in line) for cell in range(9))
OPPONENTS = ("random", "self", "mix")
AGENT_FIRST_VALUES = (True, False, "alternate", "random")
OBS_SIZE = 18
#: Uniform draws an env takes from its np_random at a time (the batched env takes the same stream).
UNIFORM_BLOCK = 64


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
    """Counts {"x_win", "draw", "o_win"} of `policy` playing both sides (a greedy policy plays the same game each time)."""
    counts = {"x_win": 0, "draw": 0, "o_win": 0}
    for _ in range(games):
        result = play_game(policy, policy)
        counts["x_win" if result > 0 else "o_win" if result < 0 else "draw"] += 1
    return counts


# --- the environment --------------------------------------------------------------------------


class TicTacToeEnv(gym.Env):
    """kuberl/TicTacToe-v0: the agent plays one side against the configured opponent."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed values: None, ansi")
        self.render_mode = render_mode
        self.config = TicTacToeConfig.from_kwargs(kwargs)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(OBS_SIZE,), dtype=np.float32)
        self.action_space = spaces.Discrete(9)
        self._opponent_policy: Policy | None = None
        self._uniforms: list[float] = []
        self._next_uniform = UNIFORM_BLOCK
        self._seeded = False
        self._episode = 0
        # Board from the agent's side: 1 agent, -1 opponent, 0 free. Observation and mask are kept
        # in step with it so a step costs two array writes and two copies, not a re-encoding.
        self._board = [0] * 9
        self._obs = np.zeros(OBS_SIZE, dtype=np.float32)
        self._mask = np.ones(9, dtype=bool)
        self._free = 9
        self._done = True
        self._agent_first = True
        self._opponent_kind = "random"
        self._fallback = False

    # --- public API -----------------------------------------------------------------------------

    def set_opponent_policy(self, policy: Policy | None) -> None:
        """Install the policy the "self" opponent plays, `policy(obs, mask) -> cell`, called with one
        observation (18,) from the opponent's side and its mask (9,); None uninstalls it. Takes
        effect from the next move."""
        self._opponent_policy = policy

    def action_masks(self) -> np.ndarray:
        """Free cells (bool, 9) of the current board."""
        return self._mask.copy()

    @property
    def board(self) -> list[int]:
        """The board with X = 1, O = -1, 0 free (the helpers' convention)."""
        sign = 1 if self._agent_first else -1
        return [sign * c for c in self._board]

    # --- gymnasium --------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            self._next_uniform = UNIFORM_BLOCK  # the next draw starts a block from the (re)seeded np_random
            self._seeded = True
            self._episode = 0
        cfg = self.config
        if cfg.agent_first == "alternate":
            self._agent_first = self._episode % 2 == 0
        elif cfg.agent_first == "random":
            self._agent_first = self._uniform() < 0.5
        else:
            self._agent_first = bool(cfg.agent_first)
        wants_self = cfg.opponent == "self" or (cfg.opponent == "mix" and self._uniform() < cfg.opponent_mix)
        self._fallback = wants_self and self._opponent_policy is None
        self._opponent_kind = "self" if wants_self and not self._fallback else "random"
        self._episode += 1

        self._board = [0] * 9
        self._obs[:] = 0.0
        self._mask[:] = True
        self._free = 9
        self._done = False
        if not self._agent_first:
            self._opponent_move()
        return self._obs.copy(), self._reset_info()

    def step(self, action):
        if self._done:
            raise RuntimeError("step() called on a finished game; call reset()")
        cell = int(action)
        if not 0 <= cell <= 8:
            raise ValueError(f"action={action!r} is not allowed; allowed values: 0-8 (the cell to mark)")
        if self._board[cell] != 0:
            self._done = True
            return (
                self._obs.copy(),
                float(self.config.illegal_move_reward),
                True,
                False,
                self._info(True, "illegal"),
            )
        self._place(cell, 1)
        if _completes_line(self._board, cell, 1):
            return self._finish(1.0, "win")
        if self._free == 0:
            return self._finish(0.0, "draw")
        reply = self._opponent_move()
        if _completes_line(self._board, reply, -1):
            return self._finish(-1.0, "loss")
        if self._free == 0:
            return self._finish(0.0, "draw")
        return self._obs.copy(), 0.0, False, False, self._info(False, "")

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        symbols = {1: "X", -1: "O", 0: "."}
        board = self.board
        return "\n".join("".join(symbols[board[3 * r + c]] for c in range(3)) for r in range(3))

    # --- internals ----------------------------------------------------------------------------------

    def _place(self, cell: int, who: int) -> None:
        self._board[cell] = who
        self._obs[cell if who == 1 else 9 + cell] = 1.0
        self._mask[cell] = False
        self._free -= 1

    def _uniform(self) -> float:
        """The env's next uniform [0, 1) draw: np_random's stream, taken UNIFORM_BLOCK at a time."""
        if self._next_uniform == UNIFORM_BLOCK:
            self._uniforms = self.np_random.random(UNIFORM_BLOCK).tolist()
            self._next_uniform = 0
        u = self._uniforms[self._next_uniform]
        self._next_uniform += 1
        return u

    def _opponent_move(self) -> int:
        epsilon = self.config.opponent_epsilon
        if self._opponent_kind == "self" and not (epsilon and self._uniform() < epsilon):
            opponent_obs = np.concatenate((self._obs[9:], self._obs[:9]))
            cell = int(self._opponent_policy(opponent_obs, self._mask.copy()))
            if not (0 <= cell <= 8 and self._board[cell] == 0):
                raise RuntimeError(
                    f"the installed opponent policy chose cell {cell}, which is not free; "
                    f"free cells: {np.flatnonzero(self._mask).tolist()} (it must respect the mask)"
                )
        else:
            board = self._board
            free = [i for i in range(9) if board[i] == 0]
            cell = free[int(self._uniform() * len(free))]
        self._place(cell, -1)
        return cell

    def _finish(self, reward: float, outcome: str):
        self._done = True
        return self._obs.copy(), reward, True, False, self._info(False, outcome)

    def _info(self, illegal: bool, outcome: str) -> dict[str, Any]:
        return {
            "action_mask": self._mask.copy(),
            "illegal_move": illegal,
            "outcome": outcome,  # "" while the game goes on; "win", "draw", "loss" or "illegal" at its end
            "opponent": self._opponent_kind,
        }

    def _reset_info(self) -> dict[str, Any]:
        return {
            "action_mask": self._mask.copy(),
            "agent_first": self._agent_first,
            "opponent": self._opponent_kind,  # "random" or "self": who plays this episode
            "opponent_fallback": self._fallback,  # "self" was drawn but no policy is installed
        }


# --- the numpy-batched version ----------------------------------------------------------------

_LINES = np.array(LINES)


class TicTacToeBatch(VectorEnv):
    """`num_envs` Tic-Tac-Toe games stepped with array operations, the same games as a
    `SyncVectorEnv` of `TicTacToeEnv` (autoreset in the same step) under the same seeds.

    Each copy draws from its own generator, seeded as `SyncVectorEnv` seeds its copies, and takes
    the same uniform draws in the same order as the per-env env does, so both play the same
    episodes step for step (tests/test_batched_envs.py). A "self" opponent is asked for all games
    at once: `policy.batch(obs (M, 18), mask (M, 9)) -> cells (M,)` when the policy offers it,
    else one call per game. `info` carries `action_mask` (and `final_obs`, `final_info["action_mask"]`
    and `final_info["illegal_move"]` for ended games); the per-game strings (`outcome`, `opponent`)
    are left out.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        self.config = TicTacToeConfig.from_kwargs(kwargs)
        self.num_envs = num_envs
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(OBS_SIZE,), dtype=np.float32)
        self.single_action_space = spaces.Discrete(9)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._opponent_policy: Policy | None = None
        self.boards = np.zeros((num_envs, 9), np.int8)  # from the agent's side: 1 agent, -1 opponent
        self.agent_first = np.ones(num_envs, bool)
        self.opponent_self = np.zeros(num_envs, bool)  # this episode's opponent is the installed policy
        self.fallback = np.zeros(num_envs, bool)
        self.episode = np.zeros(num_envs, np.int64)
        self._seed_all([None] * num_envs)

    def set_opponent_policy(self, policy: Policy | None) -> None:
        """As `TicTacToeEnv.set_opponent_policy`, for every game; `policy.batch` is used when present."""
        self._opponent_policy = policy

    def _seed_all(self, seeds: list[int | None]) -> None:
        self.rngs = [gym.utils.seeding.np_random(s)[0] for s in seeds]
        self._uniforms = np.stack([rng.random(UNIFORM_BLOCK) for rng in self.rngs])
        self._next = np.zeros(self.num_envs, np.int64)
        self.episode[:] = 0

    def _draw(self, idx: np.ndarray) -> np.ndarray:
        """One uniform draw for each env in `idx` (distinct), in each env's own stream."""
        u = self._uniforms[idx, self._next[idx]]
        self._next[idx] += 1
        for i in idx[self._next[idx] == UNIFORM_BLOCK]:
            self._uniforms[i] = self.rngs[i].random(UNIFORM_BLOCK)
            self._next[i] = 0
        return u

    def _obs(self, boards: np.ndarray) -> np.ndarray:
        return np.concatenate((boards == 1, boards == -1), axis=1).astype(np.float32)

    def _reset_envs(self, idx: np.ndarray) -> None:
        cfg = self.config
        if isinstance(cfg.agent_first, bool):
            first = np.full(len(idx), cfg.agent_first)
        elif cfg.agent_first == "alternate":
            first = self.episode[idx] % 2 == 0
        else:  # "random"
            first = self._draw(idx) < 0.5
        if cfg.opponent == "self":
            wants_self = np.ones(len(idx), bool)
        elif cfg.opponent == "mix":
            wants_self = self._draw(idx) < cfg.opponent_mix
        else:
            wants_self = np.zeros(len(idx), bool)
        installed = self._opponent_policy is not None
        self.fallback[idx] = wants_self & (not installed)
        self.opponent_self[idx] = wants_self & installed
        self.agent_first[idx] = first
        self.episode[idx] += 1
        self.boards[idx] = 0
        second = idx[~first]
        if len(second):
            self._opponent_move(second)

    def _opponent_move(self, idx: np.ndarray) -> None:
        cells = np.empty(len(idx), np.int64)
        by_policy = self.opponent_self[idx]
        epsilon = self.config.opponent_epsilon
        if epsilon and by_policy.any():
            by_policy[by_policy] = self._draw(idx[by_policy]) >= epsilon
        if by_policy.any():
            played = idx[by_policy]
            boards = self.boards[played]
            obs = np.concatenate((boards == -1, boards == 1), axis=1).astype(np.float32)
            mask = boards == 0
            policy = self._opponent_policy
            batch = getattr(policy, "batch", None)
            if batch is not None:
                chosen = np.asarray(batch(obs, mask), np.int64).reshape(-1)
            else:
                chosen = np.array([int(policy(o, m)) for o, m in zip(obs, mask)], np.int64)
            bad = (chosen < 0) | (chosen > 8)
            bad |= ~mask[np.arange(len(played)), np.clip(chosen, 0, 8)]
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                raise RuntimeError(
                    f"the installed opponent policy chose cell {int(chosen[j])}, which is not free; "
                    f"free cells: {np.flatnonzero(mask[j]).tolist()} (it must respect the mask)"
                )
            cells[by_policy] = chosen
        if not by_policy.all():
            drawn = idx[~by_policy]
            free = self.boards[drawn] == 0
            k = (self._draw(drawn) * free.sum(axis=1)).astype(np.int64)  # as free[int(u * len(free))]
            cells[~by_policy] = np.argmax(np.cumsum(free, axis=1) > k[:, None], axis=1)
        self.boards[idx, cells] = -1

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._seed_all(per_env_seeds(seed, self.num_envs))
        self._reset_envs(np.arange(self.num_envs))
        return self._obs(self.boards), self._reset_info()

    def _reset_info(self) -> dict[str, Any]:
        return {"action_mask": self.boards == 0, "agent_first": self.agent_first.copy(),
                "opponent_fallback": self.fallback.copy()}

    def step(self, actions):
        cells = np.asarray(actions).astype(np.int64).reshape(self.num_envs)
        if ((cells < 0) | (cells > 8)).any():
            bad = int(cells[(cells < 0) | (cells > 8)][0])
            raise ValueError(f"action={bad!r} is not allowed; allowed values: 0-8 (the cell to mark)")
        rows = np.arange(self.num_envs)
        illegal = self.boards[rows, cells] != 0
        legal = rows[~illegal]
        self.boards[legal, cells[legal]] = 1
        win = np.zeros(self.num_envs, bool)
        win[legal] = (self.boards[legal][:, _LINES].sum(axis=2) == 3).any(axis=1)
        full = (self.boards != 0).all(axis=1)
        playing = ~illegal & ~win & ~full
        loss = np.zeros(self.num_envs, bool)
        replying = rows[playing]
        if len(replying):
            self._opponent_move(replying)
            loss[replying] = (self.boards[replying][:, _LINES].sum(axis=2) == -3).any(axis=1)
            full[replying] = (self.boards[replying] != 0).all(axis=1)
        terminated = illegal | win | loss | full
        reward = np.where(win, 1.0, np.where(loss, -1.0, 0.0))
        reward[illegal] = float(self.config.illegal_move_reward)
        obs = self._obs(self.boards)
        mask = self.boards == 0
        info: dict[str, Any] = {"action_mask": mask}
        if terminated.any():
            # As SyncVectorEnv: an ended game's last step goes to final_obs / final_info (every
            # game ends there, so `illegal_move` is only in final_info), its reset takes its place.
            ended = np.flatnonzero(terminated)
            info["final_obs"] = obs.copy()
            info["_final_obs"] = terminated.copy()
            info["final_info"] = {"action_mask": mask.copy(), "_action_mask": terminated.copy(),
                                  "illegal_move": illegal, "_illegal_move": terminated.copy()}
            info["_final_info"] = terminated.copy()
            self._reset_envs(ended)
            obs[ended] = self._obs(self.boards[ended])
            mask[ended] = self.boards[ended] == 0
        return obs, reward, terminated, np.zeros(self.num_envs, bool), info

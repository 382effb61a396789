"""Tic-Tac-Toe games against the built-in opponent: the only implementation of the rules
tictactoe.py's docstring describes, written once against `xp` (elementwise.py) so the gymnasium
env plays one game on Python numbers and the numpy-batched env `n` games on arrays.

A board is two 9-bit masks seen from the agent's side (bit c = cell c = 3 * row + col): `mine`,
the agent's marks, and `theirs`, the opponent's; a line, a free cell or the k-th free cell is a
lookup in a 512-entry table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
FULL = 0b111111111
UNIFORM_BLOCK = 64
"""Uniform draws a game takes from its generator at a time."""

_LINE_MASKS = [sum(1 << c for c in line) for line in LINES]
_HAS_LINE = np.array([any(b & m == m for m in _LINE_MASKS) for b in range(512)])
_CELLS = np.array([[(b >> c) & 1 for c in range(9)] for b in range(512)], dtype=bool)
_PLANES = (np.concatenate([_CELLS, 0 * _CELLS], axis=1).astype(np.float32),
           np.concatenate([0 * _CELLS, _CELLS], axis=1).astype(np.float32))
"""A mask's 18 observation entries: as the first plane (the mover's marks), as the second."""
_FREE_COUNT = _CELLS.sum(axis=1)
_NTH_CELL = np.zeros((512, 9), np.int64)
for _b in range(512):
    _NTH_CELL[_b, : _FREE_COUNT[_b]] = np.flatnonzero(_CELLS[_b])


def _observation(mover, other) -> np.ndarray:
    """Float32 planes seen by the player to move: 1.0 at its marks (0-8), then at the other's (9-17)."""
    return _PLANES[0][mover] + _PLANES[1][other]  # one add: cheaper than a concatenate for one game


class Uniforms:
    """Each game's uniform [0, 1) draws from its own generator, taken UNIFORM_BLOCK at a time."""

    def __init__(self, xp: Any, rngs: Sequence[np.random.Generator]) -> None:
        self.xp, self.rngs = xp, list(rngs)
        self._block = np.stack([rng.random(UNIFORM_BLOCK) for rng in self.rngs])
        self._next = xp.full(0)

    def draw(self, mask):
        """The next draw of each game where `mask` holds (0.0 elsewhere), in each game's own stream."""
        xp = self.xp
        u = xp.column(self._block, self._next)
        self._next = self._next + mask
        spent = self._next == UNIFORM_BLOCK
        if xp.any(spent):
            for i in xp.indices(spent):
                self._block[i] = self.rngs[i].random(UNIFORM_BLOCK)
            self._next = xp.where(spent, 0, self._next)
        return xp.where(mask, u, 0.0)


class Games:
    """The games of one env (`xp` Numbers) or of a batch (`xp` Arrays), from the agent's side.

    `policy` is the installed "self" opponent (None: none installed); `xp.ask` asks it for moves.
    Each game's random choices (who starts, which opponent, epsilon moves, random moves) are draws
    from its own generator (`seed`), taken in the same order whatever the number of games."""

    def __init__(self, config: Any, xp: Any) -> None:
        self.config, self.xp = config, xp
        self.policy = None
        self.mine = self.theirs = self.episode = xp.full(0)
        self.agent_first = xp.full(True)
        self.opponent_self = self.fallback = xp.full(False)
        self.uniforms: Uniforms | None = None

    def seed(self, rngs: Sequence[np.random.Generator]) -> None:
        self.uniforms = Uniforms(self.xp, rngs)
        self.episode = self.xp.full(0)

    def observation(self) -> np.ndarray:
        """The agent's: 1.0 at its marks (0-8), then at the opponent's (9-17)."""
        return _observation(self.mine, self.theirs)

    def action_mask(self) -> np.ndarray:
        return _CELLS[FULL ^ (self.mine | self.theirs)].copy()  # one game's row is a view of the table

    def reset(self, resetting) -> None:
        """New games where `resetting` holds: who moves first and which opponent plays are drawn
        per episode as configured, and an opponent that moves first does."""
        xp, cfg = self.xp, self.config
        if cfg.agent_first == "alternate":
            first = self.episode % 2 == 0
        elif cfg.agent_first == "random":
            first = self.uniforms.draw(resetting) < 0.5
        else:
            first = xp.full(bool(cfg.agent_first))
        if cfg.opponent == "mix":
            wants_self = self.uniforms.draw(resetting) < cfg.opponent_mix
        else:
            wants_self = xp.full(cfg.opponent == "self")
        installed = self.policy is not None
        self.agent_first = xp.where(resetting, first, self.agent_first)
        self.fallback = xp.where(resetting, wants_self & (not installed), self.fallback)
        self.opponent_self = xp.where(resetting, wants_self & installed, self.opponent_self)
        self.episode = self.episode + resetting
        self.mine, self.theirs = xp.where(resetting, 0, self.mine), xp.where(resetting, 0, self.theirs)
        second = resetting & xp.not_(first)
        if xp.any(second):
            self._opponent_moves(second)

    def play(self, cells) -> tuple[Any, Any, Any, Any, Any]:
        """The agent marks `cells`; the opponent replies where the game goes on. An occupied cell is
        not played: it ends the game with illegal_move_reward. Returns (reward, terminated,
        illegal, win, loss); a game that ends otherwise is a draw."""
        xp, cfg = self.xp, self.config
        bad = (cells < 0) | (cells > 8)
        if xp.any(bad):
            raise ValueError(
                f"action={int(xp.first(cells, bad))!r} is not allowed; allowed values: 0-8 (the cell to mark)"
            )
        bit = 1 << cells
        illegal = ((self.mine | self.theirs) & bit) != 0
        self.mine = mine = self.mine | xp.where(illegal, 0, bit)
        win = xp.lookup(_HAS_LINE, mine)
        moving = xp.not_(illegal | win | ((mine | self.theirs) == FULL))
        loss = self._opponent_moves(moving) if xp.any(moving) else moving
        terminated = illegal | win | loss | ((self.mine | self.theirs) == FULL)
        outcome_reward = xp.where(win, 1.0, xp.where(loss, -1.0, 0.0))
        reward = xp.where(illegal, float(cfg.illegal_move_reward), outcome_reward)
        return reward, terminated, illegal, win, loss

    def _opponent_moves(self, moving):
        """The opponent marks a cell in the games where `moving` holds: the installed policy's
        choice (but a uniformly random cell with probability opponent_epsilon), or a uniformly
        random free cell. Returns where it completed a line."""
        xp, epsilon = self.xp, self.config.opponent_epsilon
        asked = moving & self.opponent_self
        if epsilon and xp.any(asked):
            asked = asked & (self.uniforms.draw(asked) >= epsilon)
        randomly = moving & xp.not_(asked)
        free = FULL ^ (self.mine | self.theirs)
        cell = 0
        if xp.any(randomly):
            # The k-th free cell in increasing order, k = int(u * number of free cells).
            k = xp.to_int(self.uniforms.draw(randomly) * xp.lookup(_FREE_COUNT, free))
            cell = xp.lookup(_NTH_CELL, free, k)
        if xp.any(asked):
            cell = xp.where(asked, self._policy_moves(asked, free), cell)
        self.theirs = self.theirs | xp.where(moving, 1 << cell, 0)
        return moving & xp.lookup(_HAS_LINE, self.theirs)

    def _policy_moves(self, asked, free):
        """The installed policy's cells where `asked` holds, each seen from the opponent's side."""
        xp = self.xp
        theirs, mine = xp.gather(self.theirs, asked), xp.gather(self.mine, asked)
        obs = _observation(theirs, mine)
        cells = xp.ask(self.policy, asked, obs, _CELLS[xp.gather(free, asked)].copy())
        bad = asked & ((cells < 0) | (cells > 8) | (((free >> xp.minimum(xp.maximum(cells, 0), 8)) & 1) == 0))
        if xp.any(bad):
            left = int(xp.first(free, bad))
            raise RuntimeError(
                f"the installed opponent policy chose cell {int(xp.first(cells, bad))}, which is not free; "
                f"free cells: {[c for c in range(9) if (left >> c) & 1]} (it must respect the mask)"
            )
        return cells

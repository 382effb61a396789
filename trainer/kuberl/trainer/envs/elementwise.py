"""The few operations whose spelling differs between one env copy's Python numbers and a batch's
numpy arrays, so that each environment's rules are written once (autoscaling_service.py,
tictactoe_games.py), array-API style against an `xp` of either kind.

Arithmetic, comparisons and bitwise operators are the same for both; these are the rest. Why not
one numpy copy (n = 1) for the gymnasium env: a numpy call costs about a microsecond whatever the
size, a Python number operation tens of nanoseconds, and a step is a hundred or so operations, so
an n = 1 view steps about ten times slower than the same rules on Python numbers, which the
gymnasium env (SyncVectorEnv copies, evaluation) runs on.
Values that exist per tier are a list of T numbers for one copy and a (T, n) array for a batch.
"""

from __future__ import annotations

import math
import operator

import numpy as np

_ONE, _NONE = np.zeros(1, np.int64), np.zeros(0, np.int64)


class Numbers:
    """One copy: every per-copy value is a Python number (bool, int, float)."""

    n = 1
    minimum = staticmethod(min)
    maximum = staticmethod(max)
    not_ = staticmethod(operator.not_)
    any = staticmethod(bool)
    to_int = staticmethod(int)
    ceil_int = staticmethod(math.ceil)

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def integers(action, width: int) -> list[int]:
        """The copy's action (`width` numbers) as that many ints."""
        if width == 1 and isinstance(action, (int, np.integer)):
            return [int(action)]
        return [int(v) for v in np.asarray(action).reshape(width).tolist()]

    @staticmethod
    def full(value):
        return value

    @staticmethod
    def per_tier(tiers: int, value) -> list:
        return [value] * tiers

    @staticmethod
    def pick(per_tier: list, tier: int):
        return per_tier[tier]

    @staticmethod
    def put(per_tier: list, tier: int, value) -> None:
        per_tier[tier] = value

    @staticmethod
    def lookup(table: np.ndarray, *index):
        """table[index] as a Python number."""
        return table.item(*index)

    @staticmethod
    def column(matrix: np.ndarray, t: int):
        """The copy's entry of column t of a (1, length) matrix, as a Python number."""
        return matrix.item(0, t)

    @staticmethod
    def stack_float32(values: list) -> np.ndarray:
        """Per-copy values -> the copy's float32 vector."""
        return np.array(values, dtype=np.float32)

    @staticmethod
    def indices(mask: bool) -> np.ndarray:
        """The copies (0 or none) where `mask` holds, as an index array."""
        return _ONE if mask else _NONE

    @staticmethod
    def gather(values, mask: bool):
        return values

    @staticmethod
    def first(values, mask: bool):
        return values

    @staticmethod
    def ask(policy, asked: bool, obs: np.ndarray, mask: np.ndarray) -> int:
        """`policy(obs, mask) -> action` for the copy (asked only where `asked` holds)."""
        return int(policy(obs, mask))


class Arrays:
    """`n` copies: every per-copy value is a numpy array of shape (n,) (per tier: (T, n))."""

    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    not_ = staticmethod(np.logical_not)
    where = staticmethod(np.where)
    any = staticmethod(np.any)

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows = np.arange(n)

    def integers(self, actions, width: int) -> np.ndarray:
        """The copies' actions (`width` numbers each) as `width` int arrays, one per position."""
        return np.asarray(actions).reshape(self.n, width).astype(np.int64).T

    @staticmethod
    def to_int(x: np.ndarray) -> np.ndarray:
        return x.astype(np.int64)

    @staticmethod
    def ceil_int(x: np.ndarray) -> np.ndarray:
        return np.ceil(x).astype(np.int64)

    def full(self, value) -> np.ndarray:
        return np.full(self.n, value)

    def per_tier(self, tiers: int, value) -> np.ndarray:
        return np.full((tiers, self.n), value)

    def pick(self, per_tier: np.ndarray, tier: np.ndarray) -> np.ndarray:
        return per_tier[tier, self.rows]

    def put(self, per_tier: np.ndarray, tier: np.ndarray, value) -> None:
        per_tier[tier, self.rows] = value

    @staticmethod
    def lookup(table: np.ndarray, *index) -> np.ndarray:
        return table[index]

    def column(self, matrix: np.ndarray, t: np.ndarray) -> np.ndarray:
        return matrix[self.rows, t]

    @staticmethod
    def stack_float32(values: list) -> np.ndarray:
        return np.stack(values, axis=-1).astype(np.float32)

    @staticmethod
    def indices(mask: np.ndarray) -> np.ndarray:
        return np.flatnonzero(mask)

    @staticmethod
    def gather(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return values[mask]

    def scatter(self, mask: np.ndarray, values: np.ndarray, fill) -> np.ndarray:
        out = np.full(self.n, fill, dtype=np.asarray(values).dtype)
        out[mask] = values
        return out

    @staticmethod
    def first(values: np.ndarray, mask: np.ndarray):
        return values[mask][0]

    def ask(self, policy, asked: np.ndarray, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The actions of `policy` for the copies where `asked` holds (0 elsewhere), given their
        observations and masks stacked: one call for all (`policy.batch(obs, mask)`) when the
        policy offers it, else one `policy(obs, mask)` call per copy."""
        batch = getattr(policy, "batch", None)
        if batch is not None:
            chosen = np.asarray(batch(obs, mask), np.int64).reshape(-1)
        else:
            chosen = np.array([int(policy(o, m)) for o, m in zip(obs, mask, strict=False)], np.int64)
        return self.scatter(asked, chosen, 0)

"""Request-arrival traces for the autoscaling environments: six load patterns as pure functions.

A trace is generated whole, per episode, because two patterns are stateful (a random walk, a
flash crowd that lasts several intervals); `generate_load` is deterministic given its generator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

LOAD_PATTERNS = ("SINE_CURVE", "SINUSOIDAL", "STEADY", "SPIKE", "POISSON", "RANDOM")

# SINUSOIDAL: (harmonic of the base period, weight, phase). The faster cycles are harmonics, so the
# sum is periodic with `period` and the env's time-of-cycle features predict it exactly.
_SINUSOIDAL_CYCLES = ((1, 0.6, 0.0), (2, 0.3, 1.0), (5, 0.1, 2.0))


@dataclass(frozen=True)
class LoadParams:
    """Shape of the arrival trace; every pattern reads `base_load`, the others only where named."""

    base_load: float = 60.0
    """Mean requests per interval (the level STEADY, POISSON, SPIKE and RANDOM start from)."""
    amplitude: float = 0.5
    """SINE_CURVE, SINUSOIDAL: largest deviation from `base_load`, as a fraction of it."""
    period: int = 50
    """SINE_CURVE, SINUSOIDAL: intervals per cycle; also the env's time-of-cycle feature period."""
    noise: float = 0.05
    """SINE_CURVE, SINUSOIDAL, STEADY, SPIKE: std of multiplicative Gaussian noise on the rate."""
    spike_probability: float = 0.02
    """SPIKE: chance per interval that a flash crowd starts (when none is under way)."""
    spike_magnitude: float = 2.5
    """SPIKE: load during a flash crowd, as a multiple of `base_load`."""
    spike_duration: int = 8
    """SPIKE: intervals a flash crowd holds its peak; it then decays linearly over as many again."""
    walk_step: float = 0.08
    """RANDOM: std of each random-walk step, as a fraction of `base_load`."""
    walk_low: float = 0.3
    """RANDOM: lower bound of the walk, as a fraction of `base_load` (the walk reflects off it)."""
    walk_high: float = 2.0
    """RANDOM: upper bound of the walk, as a fraction of `base_load`."""

    def __post_init__(self) -> None:
        for name in ("period", "spike_duration"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"load_params.{name}={value!r}: must be an integer")  # noqa: TRY004
        positive = ("base_load", "period", "spike_magnitude", "spike_duration", "walk_high")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"load_params.{name}={getattr(self, name)!r}: must be > 0")
        for name in ("amplitude", "noise", "walk_step", "walk_low"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"load_params.{name}={getattr(self, name)!r}: must be >= 0")
        if not 0.0 <= self.spike_probability <= 1.0:
            raise ValueError(
                f"load_params.spike_probability={self.spike_probability!r}: must be within [0, 1]"
            )
        if not self.walk_low < self.walk_high:
            raise ValueError(
                f"load_params.walk_low={self.walk_low!r}: must be below walk_high={self.walk_high!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> LoadParams:
        """Build from a job spec's dict, naming any key that is not a field."""
        if values is None:
            return cls()
        if isinstance(values, LoadParams):
            return values
        allowed = tuple(f.name for f in dataclasses.fields(cls))
        for key in values:
            if key not in allowed:
                raise ValueError(
                    f"load_params key {key!r} is not allowed; allowed keys: {', '.join(allowed)}"
                )
        return cls(**values)


def check_pattern(name: str) -> str:
    if name not in LOAD_PATTERNS:
        raise ValueError(f"load_pattern={name!r} is not allowed; allowed values: {', '.join(LOAD_PATTERNS)}")
    return name


def generate_load(
    pattern: str, length: int, rng: np.random.Generator, params: LoadParams | None = None
) -> np.ndarray:
    """Requests arriving in each of `length` intervals (int64, >= 0) for one episode.

    SINE_CURVE  base * (1 + amplitude * sin(2 pi t / period)), with multiplicative noise.
    SINUSOIDAL  the same with harmonics 1, 2 and 5 of the period overlapping (weights .6/.3/.1).
    STEADY      base with multiplicative noise.
    SPIKE       STEADY plus flash crowds: the rate jumps to spike_magnitude * base, holds for
                spike_duration intervals, then decays linearly back over as many again.
    POISSON     counts drawn from Poisson(base): independent arrivals at a constant rate.
    RANDOM      a Gaussian random walk starting at base, reflected into [walk_low, walk_high] * base.
    """
    check_pattern(pattern)
    p = params if params is not None else LoadParams()
    if length < 1:
        raise ValueError(f"length={length!r}: must be >= 1")
    t = np.arange(length, dtype=np.float64)
    base = p.base_load

    if pattern == "POISSON":
        return rng.poisson(base, size=length).astype(np.int64)

    if pattern == "SINE_CURVE":
        rate = base * (1.0 + p.amplitude * np.sin(2.0 * math.pi * t / p.period))
    elif pattern == "SINUSOIDAL":
        wave = sum(w * np.sin(2.0 * math.pi * k * t / p.period + phase) for k, w, phase in _SINUSOIDAL_CYCLES)
        rate = base * (1.0 + p.amplitude * wave)
    elif pattern == "STEADY":
        rate = np.full(length, base)
    elif pattern == "SPIKE":
        rate = base * _spike_multiplier(length, rng, p)
    else:  # RANDOM
        return np.rint(_random_walk(length, rng, p)).astype(np.int64)

    noisy = rate * (1.0 + p.noise * rng.standard_normal(length)) if p.noise > 0 else rate
    return np.rint(np.maximum(noisy, 0.0)).astype(np.int64)


def _spike_multiplier(length: int, rng: np.random.Generator, p: LoadParams) -> np.ndarray:
    decay = p.spike_duration
    profile = np.concatenate(
        [np.full(p.spike_duration, p.spike_magnitude), np.linspace(p.spike_magnitude, 1.0, decay + 1)[1:]]
    )
    starts = rng.random(length) < p.spike_probability
    multiplier = np.ones(length)
    t = 0
    while t < length:
        if starts[t]:
            end = min(length, t + len(profile))
            multiplier[t:end] = profile[: end - t]
            t = end
        else:
            t += 1
    return multiplier


def _random_walk(length: int, rng: np.random.Generator, p: LoadParams) -> np.ndarray:
    low, high = p.walk_low * p.base_load, p.walk_high * p.base_load
    steps = rng.standard_normal(length) * (p.walk_step * p.base_load)
    level = min(max(p.base_load, low), high)
    out = np.empty(length)
    for i in range(length):
        out[i] = level
        level += steps[i]
        # Reflect rather than clamp, so the walk does not stick to a bound.
        if level > high:
            level = max(low, 2.0 * high - level)
        elif level < low:
            level = min(high, 2.0 * low - level)
    return out

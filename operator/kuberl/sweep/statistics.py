"""Aggregates over seeds as RL papers report them (Agarwal et al. 2021, rliable): the interquartile mean
of each configuration's runs, its 95% percentile-bootstrap interval (the runs of a configuration are its
own stratum: they are resampled among themselves), and, against the best configuration, the bootstrap
interval of the difference in IQM: a difference is significant when that interval leaves out zero.
SciPy computes all of it (trim_mean, bootstrap).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from kuberl.api.sweep import TrialState
from kuberl.sweep.engine import TrialInfo

CONFIDENCE = 0.95
RESAMPLES = 10_000


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """The mean of the middle half: a quarter of the runs cut from each end (scipy's trim_mean, as rliable)."""
    return float(stats.trim_mean(np.asarray(values, dtype=float), 0.25))


def _iqm_axis(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    return stats.trim_mean(sample, 0.25, axis=axis)


@dataclasses.dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


def iqm_interval(values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                 seed: int = 0) -> Interval:
    """The IQM with its percentile-bootstrap interval; one run gives no interval (low and high are nan)."""
    sample = np.asarray(values, dtype=float)
    if len(sample) < 2:
        return Interval(iqm(sample), math.nan, math.nan)
    result = stats.bootstrap((sample,), _iqm_axis, confidence_level=confidence, n_resamples=resamples,
                             method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return Interval(iqm(sample), float(result.confidence_interval.low), float(result.confidence_interval.high))


def difference_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
                        resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """IQM(a) - IQM(b) with the percentile-bootstrap interval of the difference, each sample resampled on its
    own (independent runs)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    estimate = iqm(x) - iqm(y)
    if len(x) < 2 or len(y) < 2:
        return Interval(estimate, math.nan, math.nan)

    def statistic(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
        return _iqm_axis(p, axis) - _iqm_axis(q, axis)

    result = stats.bootstrap((x, y), statistic, confidence_level=confidence, n_resamples=resamples,
                             method="percentile", vectorized=True, paired=False, rng=np.random.default_rng(seed))
    return Interval(estimate, float(result.confidence_interval.low), float(result.confidence_interval.high))


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One configuration in the ranking: its values, its finished runs' objective values, their IQM and
    interval, and how it compares with the best configuration."""

    rank: int | None  # None: no run finished (all pruned or failed)
    configuration: int
    params: dict[str, Any]
    values: list[float]
    trials: int
    interval: Interval | None
    versus_best: Interval | None = None

    @property
    def significant(self) -> bool | None:
        """Whether it differs from the best configuration (None for the best itself, or too few runs)."""
        diff = self.versus_best
        if diff is None or math.isnan(diff.low):
            return None
        return not diff.low <= 0.0 <= diff.high


def rank(trials: Sequence[TrialInfo], higher_is_better: bool = True, confidence: float = CONFIDENCE,
         resamples: int = RESAMPLES, seed: int = 0) -> list[Ranked]:
    """Configurations best first by the IQM of their completed runs; those with none come last."""
    groups: dict[int, list[TrialInfo]] = {}
    for trial in trials:
        groups.setdefault(trial.configuration, []).append(trial)
    scored = []
    for configuration, group in sorted(groups.items()):
        values = [t.value for t in group if t.state == TrialState.SUCCEEDED and t.value is not None]
        interval = iqm_interval(values, confidence, resamples, seed) if values else None
        scored.append(Ranked(None, configuration, group[0].params, values, len(group), interval))
    sign = -1.0 if higher_is_better else 1.0
    finished = sorted((r for r in scored if r.interval is not None),
                      key=lambda r: (sign * r.interval.estimate, r.configuration))  # type: ignore[union-attr]
    out = []
    for position, ranked in enumerate(finished, start=1):
        versus = None
        if position > 1:
            versus = difference_interval(ranked.values, finished[0].values, confidence, resamples, seed)
        out.append(dataclasses.replace(ranked, rank=position, versus_best=versus))
    return out + [r for r in scored if r.interval is None]


@dataclasses.dataclass(frozen=True)
class Band:
    """A configuration's learning curve over its runs: at each env-step point, the mean return and its
    bootstrap interval (over the runs that got that far)."""

    steps: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]


def curve_band(curves: Sequence[Sequence[tuple[float, float]]], points: int = 50, confidence: float = CONFIDENCE,
               resamples: int = 2000, seed: int = 0) -> Band:
    """Runs' (env steps, return) curves interpolated onto `points` shared steps; a step counts only the runs
    that reached it."""
    usable = [sorted(c) for c in curves if c]
    if not usable:
        return Band([], [], [], [])
    end = max(c[-1][0] for c in usable)
    start = min(c[0][0] for c in usable)
    grid = np.linspace(start, end, points)
    band = Band([], [], [], [])
    for step in grid:
        here = np.array([np.interp(step, [p[0] for p in c], [p[1] for p in c]) for c in usable
                         if c[0][0] <= step <= c[-1][0]])
        if len(here) == 0:
            continue
        low = high = math.nan
        if len(here) >= 2 and np.ptp(here) > 0:
            ci = stats.bootstrap((here,), np.mean, confidence_level=confidence, n_resamples=resamples,
                                 method="percentile", rng=np.random.default_rng(seed)).confidence_interval
            low, high = float(ci.low), float(ci.high)
        elif len(here) >= 2:
            low = high = float(here[0])
        band.steps.append(float(step))
        band.mean.append(float(here.mean()))
        band.low.append(low)
        band.high.append(high)
    return band

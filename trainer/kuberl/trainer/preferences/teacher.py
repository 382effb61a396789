"""The synthetic teacher: of two segments, the one that violates the spec's constraints less is
preferred (Christiano et al. 2017's synthetic labels; `mistakeRate` is BPref's "mistake" teacher)."""

from __future__ import annotations

import numpy as np

from kuberl.api.job import PreferenceTeacherSpec
from kuberl.trainer.preferences.steps import MEASURES

_FIELD = "spec.algorithm.bdq.preference.teacher"


def violation_scores(teacher: PreferenceTeacherSpec, measures: np.ndarray) -> np.ndarray:
    """Violation score per segment from its per-step `MEASURES` [S, L, K]: the weighted count of
    SLO-violation steps, overloaded steps and dropped low-priority requests."""
    def column(key: str, setting: str) -> np.ndarray:
        values = measures[..., MEASURES.index(key)]
        if np.isnan(values).any():
            raise ValueError(f"{_FIELD}.{setting} is above 0 but the environment's info has no {key!r}; "
                             f"set {setting} to 0 (or null), or use an env that reports {key}")
        return values

    score = np.zeros(measures.shape[0], np.float64)
    if teacher.slo_violation > 0:
        score += teacher.slo_violation * (column("slo_violation", "sloViolation") > 0).sum(axis=1)
    if teacher.overload is not None and teacher.overload.weight > 0:
        over = column("utilisation", "overload") > teacher.overload.utilisation_above
        score += teacher.overload.weight * over.sum(axis=1)
    if teacher.dropped_low_priority > 0:
        score += teacher.dropped_low_priority * column("dropped_low_priority", "droppedLowPriority").sum(axis=1)
    return score


def teacher_labels(teacher: PreferenceTeacherSpec, measures_a: np.ndarray, measures_b: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """P(A preferred) per pair: 1 when A violates less, 0 when more, 0.5 when equal; a strict label
    is flipped with probability `mistakeRate`."""
    a, b = violation_scores(teacher, measures_a), violation_scores(teacher, measures_b)
    labels = np.where(a < b, 1.0, np.where(a > b, 0.0, 0.5))
    if teacher.mistake_rate > 0:
        flip = (rng.random(len(labels)) < teacher.mistake_rate) & (labels != 0.5)
        labels = np.where(flip, 1.0 - labels, labels)
    return labels.astype(np.float32)

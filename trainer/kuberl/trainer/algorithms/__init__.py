"""Learning algorithms. Each module reads top to bottom: config -> networks -> update."""

from __future__ import annotations

from kuberl.trainer.algorithms.base import Algorithm, algorithm_for

__all__ = ["Algorithm", "algorithm_for"]

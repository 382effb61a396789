"""TensorBoard's own reader over a run's event files: what the integration and end-to-end tests read a
run's scalars with (a reader nobody here wrote)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def read_events(log_dir: Path) -> EventAccumulator:
    """Every point of every scalar under `log_dir`."""
    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return acc

"""TensorBoard event files for a run, in RUN_DIR/tensorboard/: every numeric field of every metrics.jsonl
row, and the final evaluation, as scalars whose step is the run's environment steps.

The writer is tensorboardX (its own dependencies are numpy, packaging and protobuf, all in the trainer
image already; torch's `SummaryWriter` needs the `tensorboard` package and its web server's
dependencies). It is imported and driven by a thread of its own: the training loop only queues a row
(microseconds), and neither the import nor the event encoding is on the learner's start-up or loop.
Events reach the file within `FLUSH_SECONDS`, so a live TensorBoard follows the run.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

from kuberl.trainer.metrics import POLICY_RETURN_PREFIX

log = logging.getLogger("kuberl.trainer")

SUBDIR = "tensorboard"
FLUSH_SECONDS = 1

#: A metrics row's fields by TensorBoard section; a field not listed here (an algorithm's own figure,
#: LearnStats.extra: approx_kl, epsilon, ...) goes to `train/`.
SECTIONS = {
    "rollout": ("mean_return", "episodes", "env_steps", "episodes_per_second", "env_steps_per_second",
                "workers_ready", "worker_nodes", "worker_wait"),
    "train": ("loss", "gradient_updates", "learner_wait"),
    "run": ("iteration", "wall_clock"),
}
_SECTION_OF = {key: section for section, keys in SECTIONS.items() for key in keys}


def _number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (None, NaN, text, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def row_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row as TensorBoard tags -> values. A field without a value this iteration (mean_return
    before the first episode, loss when no update was made: None or NaN) has no point."""
    out = {}
    for key, value in row.items():
        number = _number(value)
        if number is not None:
            section = "rollout" if key.startswith(POLICY_RETURN_PREFIX) else _SECTION_OF.get(key, "train")
            out[f"{section}/{key}"] = number
    return out


def evaluation_scalars(evaluation: dict[str, Any], prefix: str = "eval") -> dict[str, float]:
    """evaluation.json's numbers, nested names joined: `eval/deterministic/mean_return`, ..."""
    out = {}
    for key, value in evaluation.items():
        if isinstance(value, dict):
            out.update(evaluation_scalars(value, f"{prefix}/{key}"))
        elif (number := _number(value)) is not None:
            out[f"{prefix}/{key}"] = number
    return out


def clear(log_dir: Path) -> None:
    """A fresh (not resumed) run: remove the event files an earlier run left in `log_dir`."""
    for path in log_dir.glob("events.out.tfevents.*"):
        path.unlink(missing_ok=True)


class EventLog:
    """Scalars to TensorBoard event files, written by a background thread.

    `resumed_at`: the environment steps of the checkpoint a resumed run continues from. The new event
    file then starts with a purge at the next step, so TensorBoard drops what the interrupted run wrote
    after that checkpoint and the curves continue from it. Each start writes a new event file (named
    after the iteration it starts from); TensorBoard reads a directory's files in order.

    A writer that cannot start (tensorboardX missing, the directory not writable) logs a warning and the
    run goes on without event files.
    """

    def __init__(self, log_dir: Path, resumed_at: int | None = None, first_iteration: int = 0):
        self.log_dir = log_dir
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._purge_step = None if resumed_at is None else resumed_at + 1
        self._suffix = f".from-iteration-{first_iteration:09d}"
        self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
        self._thread.start()

    def add(self, step: int, scalars: dict[str, float]) -> None:
        """Queue one point per tag at `step` (wall time now); returns at once."""
        if scalars:
            self._queue.put((int(step), time.time(), scalars))

    def close(self, timeout: float = 60.0) -> None:
        """Write what is queued, close the file and end the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    def _open(self):
        """tensorboardX's writer (its file made, the purge written) and its Summary message, or None."""
        try:
            from tensorboardX import SummaryWriter
            from tensorboardX.proto.summary_pb2 import Summary

            self.log_dir.mkdir(parents=True, exist_ok=True)
            return SummaryWriter(str(self.log_dir), purge_step=self._purge_step, flush_secs=FLUSH_SECONDS,
                                 filename_suffix=self._suffix), Summary
        except Exception as err:  # noqa: BLE001 - (ImportError, OSError, ...): the run goes on without event files
            log.warning("no TensorBoard event files in %s: %s", self.log_dir, err)
            return None

    def _run(self) -> None:
        opened = self._open()
        while (item := self._queue.get()) is not None:
            if opened is None:
                continue
            writer, summary = opened
            step, wall_time, scalars = item
            # A row is one event holding all its scalars, as TensorBoard reads them from add_scalar's
            # one each: a sixth of the CPU time of 16 add_scalar calls (each an event of its own
            # through tensorboardX's multiprocessing queue).
            values = [summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
            try:
                writer.file_writer.add_summary(summary(value=values), step, wall_time)
            except Exception as err:  # noqa: BLE001 - a full disk, say: warn once and stop writing
                log.warning("TensorBoard event files stopped: %s", err)
                opened = None
        if opened is not None:
            try:
                opened[0].close()
            except Exception as err:  # noqa: BLE001 - (OSError: the last flush)
                log.warning("TensorBoard event files not closed: %s", err)

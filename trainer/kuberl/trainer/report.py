"""What a person sees: a progress bar while training; a summary table, learning curve, metrics JSONL/CSV,
evaluation and the resolved job spec in the run directory afterwards."""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from kuberl.api.load import dump_yaml
from kuberl.trainer import tensorboard_log, tracking
from kuberl.trainer.tensorboard_log import EventLog
from kuberl.trainer.tracking import Tracker

log = logging.getLogger("kuberl.trainer")


#: The run's files a tracker keeps, as artifacts of its run.
TRACKED_FILES = ("job.yaml", "summary.json", "evaluation.json", "metrics.csv", "learning_curve.svg")

PHASES = ("startup", "collection", "learning", "evaluation", "report", "shutdown")


class Timeline:
    """Where a run's wall clock goes, phase by phase, from process start (or `train()`'s) to the end.

    Phases follow each other: `mark(phase)` books the time since the previous mark to `phase`, so
    they sum to the total. start-up = imports, Ray, the learner's networks and the rollout actors;
    the training loop splits into collection (the learner waiting for batches) and learning (the
    rest of the loop: updates, accounting, checkpoints); then evaluation, report (final checkpoint
    and files) and shutdown.
    """

    def __init__(self, origin: float | None = None):
        now = time.perf_counter()
        self.origin = now if origin is None else origin
        self.last = self.origin
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.detail: dict[str, float] = {"before_train": now - self.origin}

    def mark(self, phase: str, **detail: float) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now
        self.detail.update(detail)

    def mark_split(self, first: str, first_seconds: float, second: str) -> None:
        """Book the time since the last mark to `first` (`first_seconds` of it) and `second` (the rest)."""
        now = time.perf_counter()
        span = now - self.last
        part = min(max(first_seconds, 0.0), span)
        self.seconds[first] = self.seconds.get(first, 0.0) + part
        self.seconds[second] = self.seconds.get(second, 0.0) + span - part
        self.last = now

    def as_dict(self) -> dict[str, Any]:
        return {"total": round(self.last - self.origin, 3),
                **{name: round(sec, 3) for name, sec in self.seconds.items()},
                "startup_detail": {name: round(sec, 3) for name, sec in self.detail.items()}}

    def line(self) -> str:
        parts = "  ".join(f"{name} {sec:.1f}" for name, sec in self.seconds.items())
        return f"{self.last - self.origin:.1f} s: {parts}"


class RunReport:
    """A run's files and console: job.yaml and metrics.jsonl (a row per iteration, written as it comes)
    and TensorBoard event files (tensorboard/, the same rows and the evaluation) with a progress bar (or
    a log line every 10 s) while training; then metrics.csv and the learning curve (drawn while the
    workers evaluate), evaluation.json, summary.json and the summary table."""

    def __init__(self, run_dir: Path, job, progress: bool, tracker: Tracker | None = None):
        self.run_dir = run_dir
        self.tracker = tracker
        self.job = job
        self.show_progress = progress
        self.metrics_path = run_dir / "metrics.jsonl"
        self._file = None
        self._progress = None
        self._task = None
        self._last_log = 0.0
        self._drawing: threading.Thread | None = None
        self._summary: dict[str, Any] | None = None
        self._events: EventLog | None = None

    def open(self, resumed: bool, env_steps: int = 0, iteration: int = 0) -> None:
        """Start the run's files; a resumed run (from a checkpoint at `env_steps`, `iteration`) appends."""
        (self.run_dir / "job.yaml").write_text(
            "# The job as resolved (defaults filled in) for this run.\n"
            + dump_yaml(self.job.manifest())
        )
        if not resumed and self.metrics_path.exists():
            self.metrics_path.unlink()
        self._file = self.metrics_path.open("a", buffering=1)
        events_dir = self.run_dir / tensorboard_log.SUBDIR
        if not resumed:
            tensorboard_log.clear(events_dir)
        self._events = EventLog(events_dir, env_steps if resumed else None, iteration)
        if self.tracker is not None:
            self.tracker.log_params(tracking.flat_params(self.job.manifest()["spec"]))
        if self.show_progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.job.metadata.name, total=100.0, stats="starting")

    def iteration(self, row: dict[str, Any]) -> None:
        if self._file:
            self._file.write(json.dumps(row) + "\n")
        if self._events is not None:
            self._events.add(row["env_steps"], tensorboard_log.row_scalars(row))
        if self.tracker is not None:
            self.tracker.log_metrics(row["env_steps"], tracking.row_metrics(row))
        ret = row.get("mean_return")
        stats = f"{row['episodes_per_second']:,.0f} ep/s  {row['env_steps_per_second']:,.0f} steps/s"
        if ret is not None:
            stats += f"  return {_readable(ret)}"
        if self._progress is not None:
            fraction = _progress_fraction(self.job.spec.stopping, row)
            self._progress.update(self._task, completed=fraction * 100.0, stats=stats)
        elif time.monotonic() - self._last_log > 10.0:
            self._last_log = time.monotonic()
            log.info("iteration %d: %d steps, %d episodes, %s", row["iteration"], row["env_steps"],
                     row["episodes"], stats)

    def checkpoint(self, path: Path) -> None:
        log.debug("checkpoint %s", path)

    def training_done(self) -> None:
        """Training is over: close the metrics file and write metrics.csv and the learning curve in the
        background while the workers evaluate."""
        if self._progress is not None:
            self._progress.update(self._task, completed=100.0)
            self._progress.stop()
            self._progress = None
        if self._file:
            self._file.close()
            self._file = None
        if self._drawing is None:
            self._drawing = threading.Thread(target=self._write_curves, name="learning-curve", daemon=True)
            self._drawing.start()

    def _write_curves(self) -> None:
        rows = self._rows()
        if rows:
            _write_csv(self.run_dir / "metrics.csv", rows)
        self._plot(rows)

    def finish(self, counters: dict[str, Any], mean_return: float | None, evaluation: dict[str, Any],
               reason: str, ray_seconds: float, timeline: Timeline | None = None) -> None:
        """Write evaluation.json, summary.json, metrics.csv and learning_curve.svg; `final` prints the table."""
        self.training_done()
        if self._events is not None:
            self._events.add(counters["env_steps"], tensorboard_log.evaluation_scalars(evaluation))
            self._events.close()
        self._drawing.join()
        summary = {"job": self.job.metadata.name, "stopped_by": reason, "mean_return": mean_return,
                   "ray_start_seconds": ray_seconds, **counters, "evaluation": evaluation}
        if timeline is not None:
            summary["time_split"] = timeline.as_dict()
        (self.run_dir / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n")
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self._summary = summary
        if timeline is None:
            _print_summary(summary, self.run_dir)

    def final(self, timeline: Timeline) -> None:
        """After shutdown: summary.json gets the whole time split, and the summary table is printed."""
        if self._summary is None:
            return
        self._summary["time_split"] = timeline.as_dict()
        (self.run_dir / "summary.json").write_text(json.dumps(self._summary, indent=2) + "\n")
        if self.tracker is not None:
            self.tracker.log_metrics(self._summary["env_steps"], tracking.final_metrics(self._summary))
            self.tracker.log_files(self.run_dir, TRACKED_FILES)
        _print_summary(self._summary, self.run_dir)

    def _rows(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def _plot(self, rows: list[dict[str, Any]]) -> None:
        pts = [(r["env_steps"], r["mean_return"]) for r in rows if r.get("mean_return") is not None]
        spec = self.job.spec
        svg = learning_curve_svg(
            pts, spec.stopping.target_return,
            title=f"{self.job.metadata.name}: {spec.algorithm.name.value} on {spec.environment.id}",
            xlabel="environment steps", ylabel=f"mean return (last {spec.stopping.return_window} episodes)")
        (self.run_dir / "learning_curve.svg").write_text(svg)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
        if self._drawing is not None:
            self._drawing.join()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._file:
            self._file.close()
            self._file = None


def _progress_fraction(stopping, row: dict[str, Any]) -> float:
    """How far a run is towards its nearest stopping rule, from 0 to 1."""
    fracs = []
    if stopping.max_env_steps:
        fracs.append(row["env_steps"] / stopping.max_env_steps)
    if stopping.max_episodes:
        fracs.append(row["episodes"] / stopping.max_episodes)
    if stopping.max_wall_clock_seconds:
        fracs.append(row["wall_clock"] / stopping.max_wall_clock_seconds)
    if stopping.target_return is not None and row.get("mean_return") is not None and stopping.target_return > 0:
        fracs.append(max(row["mean_return"], 0.0) / stopping.target_return)
    return min(max(fracs, default=0.0), 1.0)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    """The summary table on stdout, every number rounded for a person (summary.json keeps them whole)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KubeRL run {summary['job']}", show_header=False)
    for name, value in summary_rows(summary, run_dir):
        table.add_row(name, value)
    Console(file=sys.stdout).print(table)


def summary_rows(summary: dict[str, Any], run_dir: Path) -> list[tuple[str, str]]:
    """The summary table's rows: the policy's evaluation with each suite's beside it."""
    evaluation = dict(summary.get("evaluation") or {})
    greedy = evaluation.pop("deterministic", None)
    training_return = summary["mean_return"]
    wall = summary["wall_clock"] or 1e-9
    return [
        ("stopped by", summary["stopped_by"]),
        ("wall-clock", f"{summary['wall_clock']:.1f} s (Ray start {summary['ray_start_seconds']:.1f} s)"),
        ("env steps", f"{summary['env_steps']:,} ({summary['env_steps'] / wall:,.0f}/s)"),
        ("episodes", f"{summary['episodes']:,} ({summary['episodes'] / wall:,.1f}/s)"),
        ("gradient updates", f"{summary['gradient_updates']:,}"),
        ("mean training return", "-" if training_return is None else _readable(training_return)),
        ("evaluation", "-" if not greedy else _episodes_text(greedy)),
        *((("evaluation by policy", ", ".join(f"{name} {_readable(value)}" for name, value in by_policy.items())),)
          if (by_policy := (greedy or {}).get("by_policy")) else ()),
        *((f"eval: {name}", _suite_text(result)) for name, result in evaluation.items()),
        ("worker restarts", str(summary["worker_restarts"])),
        *_time_rows(summary.get("time_split")),
        ("run directory", str(run_dir)),
    ]


def _digits(value: float) -> int:
    """Decimals that show `value` to 0.1, or to 3 significant figures where that keeps more."""
    return 1 if value == 0 else max(1, 2 - math.floor(math.log10(abs(value))))


def _readable(value: Any) -> str:
    """A number as a person reads it: a float to 0.1, or to 3 significant figures where that keeps more,
    without trailing zeros past the first decimal (-207.77500000000003 -> -207.8, 0.93456 -> 0.935,
    0.7 -> 0.7); anything else as str() writes it."""
    if not isinstance(value, float) or not math.isfinite(value):
        return str(value)
    text = f"{value:.{_digits(value)}f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _episodes_text(result: dict[str, Any]) -> str:
    """A suite's episode summary (`evaluation.episodes.summarize`), mean and spread to the mean's decimals:
    `-207.8 ± 3.3 over 20 episodes`, `0.590 ± 0.722 over 100 episodes`."""
    count, mean = result["episodes"], result.get("mean_return")
    if mean is None:
        return "no episodes"
    digits = _digits(mean)
    episodes = "1 episode" if count == 1 else f"{count:,} episodes"
    return f"{mean:.{digits}f} ± {result['std_return']:.{digits}f} over {episodes}"


def _suite_text(result: dict[str, Any]) -> str:
    """One line for an evaluation suite's results, by what the suite played (`evaluation/`)."""
    if "baseline" in result:
        params = ", ".join(f"{key} {_readable(value)}" for key, value in result.get("params", {}).items())
        return f"{result['baseline']}{f' ({params})' if params else ''}: {_episodes_text(result)}"
    if "opponent" in result:
        if result["opponent"] == "self":
            side = "against itself, as X" if result["agent_first"] else "against itself, as O"
        else:
            side = f"against {result['opponent']}, moving {'first' if result['agent_first'] else 'second'}"
        return (f"{side}: {result['wins']:,} won, {result['draws']:,} drawn, {result['losses']:,} lost "
                f"of {result['games']:,} games ({result['win_rate']:.1%} won)")
    if "mean_return" in result:
        return _episodes_text(result)
    return ", ".join(f"{key} {_readable(value)}" for key, value in result.items())


def _time_rows(split: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not split:
        return []
    detail = split.get("startup_detail", {})
    startup = f"{split['startup']:.1f} s (Ray {detail.get('ray', 0.0):.1f} s" \
              f" alongside torch + networks {detail.get('learner_build', 0.0):.1f} s, then actors)"
    return [
        ("whole run", f"{split['total']:.1f} s from process start"),
        ("  start-up", startup),
        ("  collection / learning", f"{split['collection']:.1f} s / {split['learning']:.1f} s"),
        ("  evaluation / report", f"{split['evaluation']:.1f} s / {split['report']:.1f} s"),
        ("  shutdown", f"{split['shutdown']:.1f} s"),
    ]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten."""
    span = high - low
    if span <= 0:
        return [low]
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def learning_curve_svg(points: list[tuple[float, float]], target: float | None, title: str, xlabel: str,
                       ylabel: str, width: int = 700, height: int = 400,
                       band: list[tuple[float, float, float]] | None = None) -> str:
    """The learning curve as a standalone SVG: mean return over env steps, the target as a dashed
    line, axes with round ticks; with `band` ((x, low, high) points), an interval shaded around it (a
    sweep's configuration over its seeds). Plain text, no plotting library: it is written while the
    workers evaluate, and matplotlib's import alone takes longer than the evaluation."""
    band = band or []
    left, right, top, bottom = 70, 20, 40, 50
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for p in points] + [b[0] for b in band] or [0.0, 1.0]
    ys = [p[1] for p in points] + [y for b in band for y in b[1:]] + ([target] if target is not None else [])
    ys = ys or [0.0, 1.0]
    x0, x1 = min(0.0, min(xs)), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 <= x0:
        x1 = x0 + 1.0
    if y1 <= y0:
        y0, y1 = y0 - 1.0, y1 + 1.0
    pad = 0.05 * (y1 - y0)
    y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.1f}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for x in _ticks(x0, x1):
        out.append(f'<line x1="{sx(x):.1f}" y1="{top}" x2="{sx(x):.1f}" y2="{top + ph}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{sx(x):.1f}" y="{top + ph + 16}" text-anchor="middle">{_label(x)}</text>')
    for y in _ticks(y0, y1):
        out.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + pw}" y2="{sy(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_label(y)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    if target is not None:
        out.append(f'<line x1="{left}" y1="{sy(target):.1f}" x2="{left + pw}" y2="{sy(target):.1f}" '
                   f'stroke="#d62728" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{left + pw - 4}" y="{sy(target) - 5:.1f}" text-anchor="end" fill="#d62728">'
                   f'target {target:g}</text>')
    if band:
        upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, _, hi in band)
        lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, _ in reversed(band))
        out.append(f'<polygon points="{upper} {lower}" fill="#1f77b4" fill-opacity="0.2" stroke="none"/>')
    if points:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

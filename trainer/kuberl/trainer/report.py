"""What a person sees: a progress bar while training; a summary table, learning curve, metrics JSONL/CSV,
evaluation and the resolved job spec in the run directory afterwards."""

from __future__ import annotations

import csv
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("kuberl.trainer")


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
    def __init__(self, run_dir: Path, job, progress: bool):
        self.run_dir = run_dir
        self.job = job
        self.show_progress = progress
        self.metrics_path = run_dir / "metrics.jsonl"
        self._file = None
        self._progress = None
        self._task = None
        self._last_log = 0.0
        self._last_row: dict[str, Any] = {}
        self._drawing: threading.Thread | None = None
        self._summary: dict[str, Any] | None = None

    def open(self, resumed: bool) -> None:
        (self.run_dir / "job.yaml").write_text(
            "# The job as resolved (defaults filled in) for this run.\n"
            + yaml.safe_dump(self.job.manifest(), sort_keys=False)
        )
        if not resumed and self.metrics_path.exists():
            self.metrics_path.unlink()
        self._file = self.metrics_path.open("a", buffering=1)
        if self.show_progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.job.metadata.name, total=100.0, stats="starting")

    def iteration(self, row: dict[str, Any]) -> None:
        self._last_row = row
        if self._file:
            self._file.write(json.dumps(row) + "\n")
        ret = row.get("mean_return")
        stats = (f"{row['episodes_per_second']:,.0f} ep/s  {row['env_steps_per_second']:,.0f} steps/s  "
                 f"return {ret:.1f}" if ret is not None else
                 f"{row['episodes_per_second']:,.0f} ep/s  {row['env_steps_per_second']:,.0f} steps/s")
        if self._progress is not None:
            self._progress.update(self._task, completed=self._fraction(row) * 100.0, stats=stats)
        elif time.monotonic() - self._last_log > 10.0:
            self._last_log = time.monotonic()
            log.info("iteration %d: %d steps, %d episodes, %s", row["iteration"], row["env_steps"],
                     row["episodes"], stats)

    def _fraction(self, row: dict[str, Any]) -> float:
        st = self.job.spec.stopping
        fracs = []
        if st.max_env_steps:
            fracs.append(row["env_steps"] / st.max_env_steps)
        if st.max_episodes:
            fracs.append(row["episodes"] / st.max_episodes)
        if st.max_wall_clock_seconds:
            fracs.append(row["wall_clock"] / st.max_wall_clock_seconds)
        if st.target_return is not None and row.get("mean_return") is not None and st.target_return > 0:
            fracs.append(max(row["mean_return"], 0.0) / st.target_return)
        return min(max(fracs, default=0.0), 1.0)

    def checkpoint(self, path: Path) -> None:
        log.debug("checkpoint %s", path)

    def training_done(self) -> None:
        """Training is over: close the metrics file and draw the learning curve in the background
        (matplotlib takes about a second to import) while the workers evaluate."""
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
        self._write_csv(rows)
        self._plot(rows)

    def finish(self, counters: dict[str, Any], mean_return: float | None, evaluation: dict[str, Any],
               reason: str, ray_seconds: float, timeline: Timeline | None = None) -> None:
        """Write evaluation.json, summary.json, metrics.csv and learning_curve.png; `final` prints the table."""
        self.training_done()
        self._drawing.join()
        summary = {"job": self.job.metadata.name, "stopped_by": reason, "mean_return": mean_return,
                   "ray_start_seconds": ray_seconds, **counters, "evaluation": evaluation}
        if timeline is not None:
            summary["time_split"] = timeline.as_dict()
        (self.run_dir / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n")
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self._summary = summary
        if timeline is None:
            self._print_summary(summary)

    def final(self, timeline: Timeline) -> None:
        """After shutdown: summary.json gets the whole time split, and the summary table is printed."""
        if self._summary is None:
            return
        self._summary["time_split"] = timeline.as_dict()
        (self.run_dir / "summary.json").write_text(json.dumps(self._summary, indent=2) + "\n")
        self._print_summary(self._summary)

    def _rows(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with (self.run_dir / "metrics.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)

    def _plot(self, rows: list[dict[str, Any]]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pts = [(r["env_steps"], r["mean_return"]) for r in rows if r.get("mean_return") is not None]
        fig, ax = plt.subplots(figsize=(7, 4))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color="#1f77b4")
        target = self.job.spec.stopping.target_return
        if target is not None:
            ax.axhline(target, color="#d62728", linestyle="--", linewidth=1, label=f"target {target:g}")
            ax.legend(loc="lower right")
        spec = self.job.spec
        ax.set_title(f"{self.job.metadata.name}: {spec.algorithm.name.value} on {spec.environment.id}")
        ax.set_xlabel("environment steps")
        ax.set_ylabel(f"mean return (last {spec.stopping.return_window} episodes)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.run_dir / "learning_curve.png", dpi=100)
        plt.close(fig)

    def _print_summary(self, summary: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"KubeRL run {summary['job']}", show_header=False)
        ev = summary.get("evaluation", {}).get("deterministic") or {}
        wall = summary["wall_clock"] or 1e-9
        rows = [
            ("stopped by", summary["stopped_by"]),
            ("wall-clock", f"{summary['wall_clock']:.1f} s (Ray start {summary['ray_start_seconds']:.1f} s)"),
            ("env steps", f"{summary['env_steps']:,} ({summary['env_steps'] / wall:,.0f}/s)"),
            ("episodes", f"{summary['episodes']:,} ({summary['episodes'] / wall:,.1f}/s)"),
            ("gradient updates", f"{summary['gradient_updates']:,}"),
            ("mean training return", "-" if summary["mean_return"] is None else f"{summary['mean_return']:.2f}"),
            ("evaluation", "-" if not ev else f"{ev['mean_return']:.2f} ± {ev['std_return']:.2f} over {ev['episodes']} episodes"),
            ("worker restarts", str(summary["worker_restarts"])),
            *_time_rows(summary.get("time_split")),
            ("run directory", str(self.run_dir)),
        ]
        for name, res in summary.get("evaluation", {}).items():
            if name != "deterministic":
                rows.append((f"eval: {name}", json.dumps(res)))
        for k, v in rows:
            table.add_row(k, v)
        Console(file=sys.stdout).print(table)

    def close(self) -> None:
        if self._drawing is not None:
            self._drawing.join()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._file:
            self._file.close()
            self._file = None


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

"""What `kuberl sweep` shows and leaves: the live table of trials, then the configurations ranked by IQM
with 95% bootstrap intervals (rounded for people), results.csv and ranking.json (full precision), and a
learning-curve plot per configuration (mean return over its runs, with the interval as a band)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Protocol

from kuberl.api.sweep import Metric, RLSweep, TrialState
from kuberl.sweep.engine import SweepEngine, TrialInfo
from kuberl.sweep.statistics import Band, Ranked, curve_band, rank
from kuberl.trainer.report import _readable, learning_curve_svg

#: Most trials the live table lists: those running, then the latest finished.
LIVE_ROWS = 30


@dataclasses.dataclass
class TrialRow:
    """What the live table and results.csv show of a trial."""

    info: TrialInfo
    run_dir: Path
    env_steps: int = 0
    mean_return: float | None = None
    #: TrialState's value, or what the runner is doing to it (pruning, stopping).
    state: str = TrialState.RUNNING.value
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    objective: float | None = None
    error: str | None = None


class SweepRun(Protocol):
    """What the report reads of a running sweep (kuberl.trainer.sweep.SweepRun)."""

    sweep: RLSweep
    directory: Path
    engine: SweepEngine
    rows: dict[int, TrialRow]
    running: dict[int, Any]


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{path.rsplit('.', 1)[-1]}={_readable(value)}" for path, value in params.items())


def _number(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else _readable(
        float(value) if isinstance(value, (int, float)) else value)


class LiveTable:
    """The trials as they run (rich's Live), redrawn after each poll; a plain log line per trial when
    stderr is no terminal."""

    def __init__(self, run: SweepRun, enabled: bool):
        self.run = run
        self.enabled = enabled
        self._live: Any = None
        self._reported: set[int] = set()

    def __enter__(self) -> LiveTable:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=sys.stderr), refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)

    def update(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        for number, row in self.run.rows.items():
            if number not in self._reported and number not in self.run.running:
                self._reported.add(number)
                print(f"trial {number}: {_params_text(row.info.params)} seed {row.info.seed}: {row.state}, "
                      f"{row.env_steps:,} steps, return {_number(row.mean_return)}", file=sys.stderr, flush=True)

    def _table(self) -> Any:
        from rich.table import Table

        run = self.run
        finished = sum(1 for n in run.rows if n not in run.running)
        table = Table(title=f"sweep {run.sweep.metadata.name}: {finished}/{run.engine.max_trials} trials done, "
                      f"{len(run.running)} running")
        for column in ("trial", "parameters", "seed", "steps", "return", "state"):
            table.add_column(column, justify="right" if column in ("trial", "seed", "steps", "return") else "left")
        rows = sorted(run.rows.values(), key=lambda r: (r.info.number not in run.running, -r.info.number))
        for row in sorted(rows[:LIVE_ROWS], key=lambda r: r.info.number):
            table.add_row(str(row.info.number), _params_text(row.info.params), str(row.info.seed),
                          f"{row.env_steps:,}", _number(row.mean_return), row.state)
        return table


# ---- results ------------------------------------------------------------------------------------------------


def write_results(run: SweepRun) -> list[Ranked]:
    """results.csv, ranking.json, curves/, and the ranking table on stdout."""
    rows = [run.rows[n] for n in sorted(run.rows)]
    _write_csv(run.directory / "results.csv", rows)
    metric = run.sweep.spec.objective.metric
    ranking = rank([r.info for r in rows], higher_is_better=metric != Metric.ENV_STEPS_TO_TARGET)
    (run.directory / "ranking.json").write_text(json.dumps(
        {"objective": metric.value, "confidence": 0.95, "configurations": [_ranked_json(r) for r in ranking]},
        indent=2) + "\n")
    _write_curves(run, rows)
    print_ranking(run, ranking)
    return ranking


def _write_csv(path: Path, rows: list[TrialRow]) -> None:
    paths = sorted({p for r in rows for p in r.info.params})
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "configuration", *paths, "seed", "state", "env_steps", "mean_return",
                         "evaluation_return", "objective", "stopped_by", "run_dir", "error"])
        for r in rows:
            evaluation = ((r.summary.get("evaluation") or {}).get("deterministic") or {}).get("mean_return")
            writer.writerow([r.info.number, r.info.configuration, *(r.info.params.get(p) for p in paths),
                             r.info.seed, r.state, r.env_steps, _repr(r.mean_return), _repr(evaluation),
                             _repr(r.objective), r.summary.get("stopped_by", ""), str(r.run_dir), r.error or ""])


def _repr(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _ranked_json(r: Ranked) -> dict[str, Any]:
    def interval(i: Any) -> Any:
        return None if i is None else {"estimate": i.estimate, "low": _finite(i.low), "high": _finite(i.high)}

    return {"rank": r.rank, "configuration": r.configuration, "params": r.params, "trials": r.trials,
            "completed": len(r.values), "values": r.values, "iqm": interval(r.interval),
            "versus_best": interval(r.versus_best), "significant": r.significant}


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def print_ranking(run: SweepRun, ranking: list[Ranked]) -> None:
    from rich.console import Console
    from rich.table import Table

    metric = run.sweep.spec.objective.metric.value
    table = Table(title=f"sweep {run.sweep.metadata.name}: configurations by IQM of {metric} (95% bootstrap CI)")
    widest = max((len(_params_text(r.params)) for r in ranking), default=10)
    for column in ("rank", "parameters", "runs", "IQM", "95% CI", "vs best", "significant"):
        # The parameters say which configuration a row is: on a narrow terminal the numbers wrap instead.
        table.add_column(column, justify="left" if column in ("parameters", "significant") else "right",
                         min_width=widest if column == "parameters" else None)
    for r in ranking:
        runs = f"{len(r.values)}/{r.trials}"
        if r.interval is None:
            table.add_row("-", _params_text(r.params), runs, "-", "-", "-", "no run finished")
            continue
        ci = "-" if math.isnan(r.interval.low) else f"[{_readable(r.interval.low)}, {_readable(r.interval.high)}]"
        versus = "-" if r.versus_best is None else f"{r.versus_best.estimate:+.1f}" + (
            "" if math.isnan(r.versus_best.low) else
            f" [{_readable(r.versus_best.low)}, {_readable(r.versus_best.high)}]")
        significant = {None: "best" if r.rank == 1 else "-", True: "yes", False: "no"}[r.significant]
        table.add_row(str(r.rank), _params_text(r.params), runs, _readable(r.interval.estimate), ci, versus,
                      significant)
    # Wide enough for the parameters and intervals when stdout is a file or a pipe (rich assumes 80 columns).
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(f"significant: the 95% bootstrap interval of the IQM difference to the best leaves out 0. "
                  f"Results in {run.directory}/results.csv, ranking.json and curves/")


def _write_curves(run: SweepRun, rows: list[TrialRow]) -> None:
    out = run.directory / "curves"
    out.mkdir(exist_ok=True)
    by_configuration: dict[int, list[TrialRow]] = {}
    for r in rows:
        by_configuration.setdefault(r.info.configuration, []).append(r)
    for configuration, group in sorted(by_configuration.items()):
        curves = [_curve(r.run_dir / "metrics.jsonl") for r in group]
        band = curve_band(curves)
        title = f"{run.sweep.metadata.name} configuration {configuration}: {_params_text(group[0].info.params)}"
        (out / f"configuration-{configuration}.svg").write_text(band_svg(band, title, len(group)))


def _curve(path: Path) -> list[tuple[float, float]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(float(r["env_steps"]), float(r["mean_return"])) for r in rows if r.get("mean_return") is not None]


def band_svg(band: Band, title: str, runs: int) -> str:
    """A configuration's mean return over env steps with its 95% interval as a shaded band."""
    points = [(x, y) for x, y in zip(band.steps, band.mean, strict=True) if not math.isnan(y)]
    shaded = [(x, lo, hi) for x, lo, hi in zip(band.steps, band.low, band.high, strict=True) if not math.isnan(lo)]
    return learning_curve_svg(points, None, title, "environment steps",
                              f"mean return over {runs} run(s), 95% CI band", band=shaded)

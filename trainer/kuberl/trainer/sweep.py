"""`kuberl sweep`: an RLSweep's trials on one embedded Ray, as many at once as the cores allow, each trial
one `kuberl train` run of the template with its values and seed; the engine (kuberl.sweep) decides what
runs next and what stops early, from the rows each run writes to its metrics.jsonl.

The sweep directory holds the study's journal (what `--resume` reads), each trial's run directory under
trials/, and at the end results.csv, ranking.json and a learning-curve plot per configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kuberl.api.sweep import RLSweep, TrialState
from kuberl.sweep.engine import SweepEngine, TrialInfo, TrialOutcome
from kuberl.trainer.sweep_report import LiveTable, TrialRow, write_results
from kuberl.trainer.tracking import EXIT_WAIT_SECONDS, flat_params, sweep_tracker

#: A file in a trial's run directory that asks it to stop after its iteration (pruned, or past the deadline).
STOP_FILE = "STOP"
JOURNAL = "study.journal"
POLL_SECONDS = 0.5
#: Seconds the sweep waits for MLflow to make its parent run before starting trials without one.
PARENT_RUN_WAIT = 10.0
#: The sweep's files its MLflow parent run keeps (write_results' tables and ranking).
RESULT_FILES = ("results.csv", "ranking.json")


@dataclasses.dataclass
class SweepOptions:
    directory: Path | None = None
    resume: bool = False
    parallel: int | None = None  # at most this many trials at once (else spec.parallelism, within the cores)
    live: bool = True


def run_trial(job_data: dict[str, Any], run_dir: str, tracking_parent: str | None = None) -> dict[str, Any]:
    """One trial in a Ray worker process: `train` on the sweep's Ray, its console in the run directory,
    stopping after an iteration once the sweep leaves STOP_FILE there; returns its summary.json."""
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stop_file = directory / STOP_FILE

    def on_iteration(row: dict[str, Any], loop: Any) -> None:
        if stop_file.exists():
            loop.stop_signal["set"] = True

    job = parse_job(job_data, source=job_data["metadata"]["name"])
    logger = logging.getLogger("kuberl")
    level = logger.level
    with (directory / "console.txt").open("w") as console, contextlib.redirect_stdout(console):
        logger.setLevel(logging.WARNING)
        try:
            # Port 0: trials running side by side each serve their metrics on a free port.
            train(job, TrainOptions(run_dir=directory, progress=False, shutdown_ray=False, metrics_port=0,
                                    on_iteration=on_iteration, tracking_parent=tracking_parent))
        finally:  # a process that runs more than a trial (a test) logs as before after it
            logger.setLevel(level)
    return json.loads((directory / "summary.json").read_text())


@dataclasses.dataclass
class _Running:
    row: TrialRow
    ref: Any
    read: int = 0  # bytes of metrics.jsonl already reported
    stopping: TrialState | None = None  # STOPPED (the pruner) or FAILED (the deadline) once asked to stop


class SweepRun:
    """The runner's state: the engine, the trials started, those running now."""

    def __init__(self, sweep: RLSweep, options: SweepOptions):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        self.sweep, self.options = sweep, options
        self.directory = Path(options.directory or Path("sweeps") / sweep.metadata.name)
        journal = self.directory / JOURNAL
        if journal.exists() and not options.resume:
            raise FileExistsError(f"{self.directory} holds a sweep already: pass --resume to continue it, or "
                                  "--dir for a new directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        storage = JournalStorage(JournalFileBackend(str(journal)))
        self.engine = SweepEngine(sweep, storage, resume=options.resume)
        self.rows: dict[int, TrialRow] = {info.number: _finished_row(self, info) for info in self.engine.trials()}
        self.running: dict[int, _Running] = {}
        replicas = sweep.spec.template.rollout_workers.replicas
        cores = os.cpu_count() or 1
        self.concurrency = max(1, min(options.parallel or sweep.spec.parallelism, cores // replicas or 1))
        self.started = time.monotonic()
        self.tracker = sweep_tracker(sweep, self.directory, resume=options.resume)
        self.tracking_parent: str | None = None
        if self.tracker is not None:
            # The search itself; each trial's run has its job, the template with its values, as parameters.
            self.tracker.log_params(flat_params(sweep.spec.model_dump(mode="json", by_alias=True,
                                                                      exclude={"template"})))
            self.tracking_parent = self.tracker.run_id_within(PARENT_RUN_WAIT)
            if self.tracking_parent is None:
                logging.getLogger("kuberl.trainer").warning(
                    "MLflow has not answered in %.0f s: the trials are logged without their sweep's parent run",
                    PARENT_RUN_WAIT)

    def trial_dir(self, info: TrialInfo) -> Path:
        return self.directory / "trials" / f"t{info.number:04d}"

    def start_trials(self, remote: Any) -> None:
        while len(self.running) < self.concurrency and not self.past_deadline():
            info = self.engine.next_trial()
            if info is None:
                return
            row = TrialRow(info, self.trial_dir(info))
            (row.run_dir / STOP_FILE).unlink(missing_ok=True)
            self.rows[info.number] = row
            self.running[info.number] = _Running(row, remote.remote(self.engine.trial_job(info), str(row.run_dir),
                                                                    self.tracking_parent))

    def past_deadline(self) -> bool:
        deadline = self.sweep.spec.active_deadline_seconds
        return deadline is not None and time.monotonic() - self.started > deadline

    def observe(self) -> None:
        """Each running trial's new iterations, told to the pruner; a trial to prune is asked to stop."""
        for number, running in self.running.items():
            rows, running.read = _new_rows(running.row.run_dir / "metrics.jsonl", running.read)
            for row in rows:
                running.row.env_steps, running.row.mean_return = row["env_steps"], row.get("mean_return")
                if running.stopping is None and self.engine.report(number, row["env_steps"], row.get("mean_return")):
                    self._stop(running, TrialState.STOPPED)
            if running.stopping is None and self.past_deadline():
                self._stop(running, TrialState.FAILED)

    def _stop(self, running: _Running, why: TrialState) -> None:
        running.stopping = why
        running.row.state = "pruning" if why == TrialState.STOPPED else "stopping"
        (running.row.run_dir / STOP_FILE).touch()

    def collect(self, done: list[Any]) -> None:
        """Trials whose run has returned: their state and objective, told to the engine."""
        import ray

        for number, running in list(self.running.items()):
            if running.ref not in done:
                continue
            row = running.row
            try:
                row.summary = ray.get(running.ref)
            except Exception as err:  # noqa: BLE001 - a trial's failure is its row's, the sweep goes on
                row.error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
            self.rows[number] = row
            self._settle(running)
            del self.running[number]

    def _settle(self, running: _Running) -> None:
        row = running.row
        if row.summary:
            row.env_steps, row.mean_return = row.summary["env_steps"], row.summary.get("mean_return")
        if row.error is not None or running.stopping == TrialState.FAILED:
            state = TrialState.FAILED
            row.error = row.error or "stopped: spec.activeDeadlineSeconds passed"
        elif running.stopping == TrialState.STOPPED:
            state = TrialState.STOPPED
        else:
            row.objective = self.engine.final_value(TrialOutcome.from_summary(row.summary))
            state = TrialState.SUCCEEDED if row.objective is not None else TrialState.FAILED
        row.state = state.value
        self.engine.finish(row.info.number, state, row.objective)
        row.info = next(t for t in self.engine.trials() if t.number == row.info.number)


def _finished_row(run: SweepRun, info: TrialInfo) -> TrialRow:
    """A trial a previous process ran, as its run directory left it."""
    row = TrialRow(info, run.trial_dir(info), state=info.state.value,
                   objective=info.value if info.state == TrialState.SUCCEEDED else None)
    summary_path = row.run_dir / "summary.json"
    if summary_path.exists():
        row.summary = json.loads(summary_path.read_text())
        row.env_steps, row.mean_return = row.summary["env_steps"], row.summary.get("mean_return")
    return row


def _new_rows(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Whole lines of a growing metrics.jsonl past `offset`; a line still being written waits."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


class _Interrupt:
    """Ctrl-C (SIGINT) as a flag the sweep's loop reads after each wait. Python's own KeyboardInterrupt can be
    lost here: Ray's driver checks for signals while it waits, and a SIGINT that lands inside its wait was seen
    to be taken as the trial's failure, the sweep going on with the rest (under load, in the suite)."""

    def __init__(self) -> None:
        self.seen = False
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._set)

    def _set(self, _signum: int, _frame: Any) -> None:
        self.seen = True

    def __call__(self) -> bool:
        return self.seen

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def run_sweep(sweep: RLSweep, options: SweepOptions | None = None) -> SweepRun:
    """Every trial of the budget (those a previous process finished are kept), then the results."""
    import ray

    from kuberl.api.learner_slots import extra_learners
    from kuberl.trainer.workers import start_ray

    run = SweepRun(sweep, options or SweepOptions())
    template = sweep.spec.template
    start_ray(None, run.concurrency * template.rollout_workers.replicas,
              run.concurrency * extra_learners(template.learner.replicas))
    # A fresh process per trial: a run's module-level state (torch threads, seeds) never reaches the next.
    remote = ray.remote(num_cpus=0, max_calls=1)(run_trial)
    interrupted = _Interrupt()
    try:
        with LiveTable(run, enabled=run.options.live) as table:
            run.start_trials(remote)
            while run.running:
                done, _ = ray.wait([r.ref for r in run.running.values()], num_returns=1, timeout=POLL_SECONDS)
                if interrupted():
                    raise KeyboardInterrupt
                run.observe()
                run.collect(done)
                run.start_trials(remote)
                table.update()
    except BaseException:
        if run.tracker is not None:
            run.tracker.close("KILLED", wait=EXIT_WAIT_SECONDS)
        raise
    finally:
        interrupted.restore()
        ray.shutdown()
    write_results(run)
    if run.tracker is not None:
        run.tracker.log_files(run.directory, RESULT_FILES)
        run.tracker.close("FINISHED")
    return run

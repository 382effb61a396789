"""A sweep's decisions, one call at a time: which trial to start next, whether a running trial should stop
early, and what a finished trial scored. Optuna's samplers and pruners decide; its study (in memory, or a
journal file that `--resume` reads back) remembers every trial.

A trial is one run: a configuration (the parameters' values) on one seed. Configurations come from the
sampler on their first seed; their other seeds are queued with the same values, seed by seed across
configurations, so a pruner compares trials that started on equal terms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import math
import random
from typing import Any

import optuna

from kuberl.api.sweep import (
    DistributionType,
    Metric,
    Pruner,
    RLSweep,
    Sampler,
    TrialState,
    TrialStatus,
    configurations,
    param_values,
    resolve_path,
    trial_job,
    trial_name,
)

#: A trial's state (the one vocabulary: the runner's, the operator's, the sweep's status), and as the study
#: holds it.
RECORDED = {TrialState.RUNNING: optuna.trial.TrialState.RUNNING, TrialState.SUCCEEDED: optuna.trial.TrialState.COMPLETE,
            TrialState.STOPPED: optuna.trial.TrialState.PRUNED, TrialState.FAILED: optuna.trial.TrialState.FAIL}
_FROM_STUDY = {study: state for state, study in RECORDED.items()}


@dataclasses.dataclass(frozen=True)
class TrialInfo:
    """One trial: its number, configuration, values, seed, and (once reported) where it stands."""

    number: int
    configuration: int
    params: dict[str, Any]
    seed: int
    state: TrialState
    value: float | None = None
    last_step: int | None = None
    last_report: float | None = None


@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """What a finished run measured, whichever way it ran: a local run's summary.json (`from_summary`), or a
    trial job's status on a cluster (`kuberl.sweep.cluster`)."""

    #: The training return over its window at the end, and the deterministic evaluation's (None: not run).
    mean_return: float | None
    evaluation_return: float | None
    env_steps: int
    #: It stopped because it reached spec.stopping.targetReturn.
    reached_target: bool

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> TrialOutcome:
        evaluation = ((summary.get("evaluation") or {}).get("deterministic") or {}).get("mean_return")
        return cls(summary.get("mean_return"), evaluation, int(summary.get("env_steps") or 0),
                   summary.get("stopped_by") == "target_return")


def spec_digest(sweep: RLSweep) -> str:
    """What a resumed sweep must match: its spec, not its name or labels."""
    text = json.dumps(sweep.spec.model_dump(mode="json", by_alias=True), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SweepChanged(ValueError):
    """The sweep file differs from the one its study was started with."""


class SweepEngine:
    """The study of one sweep. `storage` is Optuna's: None keeps it in memory; a JournalStorage on a file
    lets a later process continue it (`resume=True`)."""

    def __init__(self, sweep: RLSweep, storage: optuna.storages.BaseStorage | None = None, resume: bool = False):
        optuna.logging.set_verbosity(logging.WARNING)
        self.sweep = sweep
        spec = sweep.spec
        self.metric = spec.objective.metric
        self.seeds = spec.seeds
        self.configurations = configurations(spec)
        self.max_trials = self.configurations * spec.seeds
        self.every = spec.early_stopping.every_env_steps
        self.study = optuna.create_study(
            storage=storage, sampler=_sampler(sweep), pruner=_pruner(sweep), study_name=sweep.metadata.name,
            direction="minimize" if self.metric == Metric.ENV_STEPS_TO_TARGET else "maximize",
            load_if_exists=resume)
        digest = spec_digest(sweep)
        known = self.study.user_attrs.get("spec_digest")
        if known is None:
            self.study.set_user_attr("spec_digest", digest)
        elif known != digest:
            raise SweepChanged(f"the sweep {sweep.metadata.name} was started from a different spec: run it in a "
                               "new directory, or put the file back as it was")
        self._distributions = {p.path: _distribution(p) for p in spec.parameters}
        #: A grid's points in the order they run (`_grid`); None for a sampler's draws.
        self._grid = _grid(sweep) if spec.search.sampler == Sampler.GRID else None
        self._trials: dict[int, optuna.trial.Trial] = {}
        if resume:
            _requeue_interrupted(self.study)

    @classmethod
    def from_record(cls, sweep: RLSweep, trials: list[TrialStatus]) -> SweepEngine:
        """The study as a record left it (the operator keeps one in the sweep's status, so that a restarted
        operator goes on where it was), with Optuna's public calls only: each trial added in order of number,
        with its values, state, objective and pruner reports; a running trial asked again (from the queue, so
        with its values) and its reports made again, so it can report on and be finished. The sampler is
        seeded by how many trials there are, so each new configuration is a fresh draw, the same one for the
        same record."""
        engine = cls(sweep)
        for number, record in enumerate(sorted(trials, key=lambda t: t.number)):
            if record.number != number:
                raise ValueError(f"the record's trials must be numbered 0, 1, ...: found {record.number} at {number}")
            params = {p.path: record.parameters[p.path] for p in sweep.spec.parameters}
            attrs = {"configuration": record.configuration, "seed": record.seed}
            reports = {int(step): value for step, value in record.reports.items()}
            if record.state == TrialState.RUNNING:
                engine.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)
                trial = engine.study.ask(engine._distributions)
                for step in sorted(reports):
                    trial.report(reports[step], step)
                engine._trials[trial.number] = trial
                continue
            state = RECORDED[record.state]
            engine.study.add_trial(optuna.trial.create_trial(
                state=state, value=record.objective if state == optuna.trial.TrialState.COMPLETE else None,
                params=params, distributions=engine._distributions, user_attrs=attrs, intermediate_values=reports))
        if engine._grid is None:
            engine.study.sampler = _sampler(sweep, offset=len(trials))
        return engine

    # ---- the step-by-step interface --------------------------------------------------------------------

    def next_trial(self) -> TrialInfo | None:
        """The next trial to start, or None when every trial of the budget has started."""
        frozen = self.study.get_trials(deepcopy=False)
        if len(_runs(frozen)) >= self.max_trials:
            return None
        if not any(t.state == optuna.trial.TrialState.WAITING for t in frozen):
            found = {t.user_attrs["configuration"] for t in frozen if "configuration" in t.user_attrs}
            if len(found) >= self.configurations:
                _queue_next_seed(self.study, frozen, self.sweep.spec.template.seed, self.seeds)
            elif self._grid is not None:
                _queue_next_point(self.study, frozen, self._grid)
        trial = self.study.ask(self._distributions)
        if "configuration" not in trial.user_attrs:  # a new configuration from the sampler, on its first seed
            configuration = len({t.user_attrs.get("configuration") for t in frozen} - {None})
            trial.set_user_attr("configuration", configuration)
            trial.set_user_attr("seed", self.sweep.spec.template.seed)
        self._trials[trial.number] = trial
        return self._info(trial.number)

    def report(self, number: int, env_steps: int, value: float | None) -> bool:
        """A running trial's objective so far (its training return, or what it lacks to the target) at
        `env_steps`; True when the pruner says stop it. Reports are kept at each multiple of
        earlyStopping.everyEnvSteps, so trials are compared at the same steps whatever their batch size."""
        trial = self._trials[number]
        if value is None or not math.isfinite(value):
            return False
        step = (env_steps // self.every) * self.every
        if step == 0 or step in self.study.get_trials(deepcopy=False)[number].intermediate_values:
            return False
        trial.report(self._intermediate(value), step)
        return trial.should_prune()

    def finish(self, number: int, state: TrialState, value: float | None = None) -> None:
        """A trial ended: SUCCEEDED with its objective, STOPPED by the pruner (its last report stands), or
        FAILED."""
        trial = self._trials.pop(number)
        if state == TrialState.SUCCEEDED and value is not None and math.isfinite(value):
            self.study.tell(trial, value)
        elif state == TrialState.STOPPED:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def trials(self) -> list[TrialInfo]:
        """Every trial started, in order; of a run interrupted and started again, the last."""
        latest = _runs(self.study.get_trials(deepcopy=False))
        return [self._info(number) for number in sorted(latest.values())]

    def trial_job(self, info: TrialInfo) -> dict[str, Any]:
        """The RLTrainingJob manifest a trial runs: the template, its values and its seed."""
        return trial_job(self.sweep, trial_name(self.sweep.metadata.name, info.number), info.params, info.seed)

    # ---- objective values --------------------------------------------------------------------------------

    def final_value(self, outcome: TrialOutcome) -> float | None:
        """A finished run's objective."""
        if self.metric == Metric.MEAN_RETURN:
            return outcome.mean_return
        if self.metric == Metric.EVALUATION_RETURN:
            return outcome.evaluation_return
        if outcome.reached_target:
            return float(outcome.env_steps)
        # Never reached the target: it counts its whole budget (at least what it ran).
        budget = self.sweep.spec.template.stopping.max_env_steps
        return float(max(budget or 0, outcome.env_steps))

    def _intermediate(self, mean_return: float) -> float:
        """What a running trial reports: its return, or for envStepsToTarget what it lacks to the target
        (smaller is better either way the study is directed)."""
        if self.metric == Metric.ENV_STEPS_TO_TARGET:
            target = self.sweep.spec.template.stopping.target_return
            return max(0.0, float(target or 0.0) - mean_return)
        return mean_return

    # ---- inside ----------------------------------------------------------------------------------------

    def _info(self, number: int) -> TrialInfo:
        t = self.study.get_trials(deepcopy=False)[number]
        steps = sorted(t.intermediate_values)
        last = t.intermediate_values[steps[-1]] if steps else None
        return TrialInfo(t.number, t.user_attrs["configuration"], dict(t.params), t.user_attrs["seed"],
                         _FROM_STUDY.get(t.state, TrialState.RUNNING), t.value, steps[-1] if steps else None, last)


def _queue_next_seed(study: optuna.Study, frozen: list[optuna.trial.FrozenTrial], base: int, seeds: int) -> None:
    """Every configuration's next seed not yet run (of `seeds` from `base`), in configuration order."""
    runs: dict[int, tuple[dict[str, Any], set[int]]] = {}
    for t in frozen:
        configuration = t.user_attrs.get("configuration")
        if configuration is not None:
            runs.setdefault(configuration, (t.params, set()))[1].add(t.user_attrs["seed"])
    # Only the configurations that ran fewest seeds: a study rebuilt from a record (which keeps no queue)
    # goes on seed by seed as the one that queued them would.
    fewest = min((len(ran) for _params, ran in runs.values()), default=0)
    for configuration in sorted(runs):
        params, ran = runs[configuration]
        missing = [seed for seed in range(base, base + seeds) if seed not in ran]
        if missing and len(ran) == fewest:
            study.enqueue_trial(params, user_attrs={"configuration": configuration, "seed": missing[0]},
                                skip_if_exists=False)


def _queue_next_point(study: optuna.Study, frozen: list[optuna.trial.FrozenTrial],
                      grid: list[dict[str, Any]] | None) -> None:
    """A grid's next point not yet run: its first seed, as a new configuration."""
    seen = [t.params for t in frozen if "configuration" in t.user_attrs]
    point = next((point for point in grid or [] if point not in seen), None)
    if point is not None:
        study.enqueue_trial(point, skip_if_exists=False)


def _requeue_interrupted(study: optuna.Study) -> None:
    """Trials that were running when the last process stopped fail, and run again from the start."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"configuration": t.user_attrs["configuration"],
                                                  "seed": t.user_attrs["seed"]}, skip_if_exists=False)


def _runs(frozen: list[optuna.trial.FrozenTrial]) -> dict[tuple[int, int], int]:
    """The trial number of each (configuration, seed) started: the latest where one ran twice, none where
    its latest is still queued (an interrupted trial waiting to run again)."""
    latest = {(t.user_attrs["configuration"], t.user_attrs["seed"]): t for t in frozen
              if "configuration" in t.user_attrs}
    return {run: t.number for run, t in latest.items() if t.state != optuna.trial.TrialState.WAITING}


def _choices(param) -> list[Any]:
    field = resolve_path(param.path)
    return [c.value if hasattr(c, "value") else c for c in param_values(param, field.annotation)]


def _distribution(param) -> optuna.distributions.BaseDistribution:
    if param.distribution is not None:
        dist = param.distribution
        if dist.type == DistributionType.INT:
            return optuna.distributions.IntDistribution(int(dist.low), int(dist.high))
        return optuna.distributions.FloatDistribution(dist.low, dist.high,
                                                      log=dist.type == DistributionType.LOG_UNIFORM)
    return optuna.distributions.CategoricalDistribution(_choices(param))


def _grid(sweep: RLSweep) -> list[dict[str, Any]]:
    """Every point of a grid sweep, in a shuffled order that its search seed fixes (as Optuna's grid sampler
    draws its points): the engine queues them itself, one configuration at a time, so that a study rebuilt
    from a record knows which points ran from the trials' values alone."""
    paths = [p.path for p in sweep.spec.parameters]
    points = [dict(zip(paths, values, strict=True))
              for values in itertools.product(*(_choices(p) for p in sweep.spec.parameters))]
    random.Random(sweep.spec.search.seed).shuffle(points)
    return points


def _sampler(sweep: RLSweep, offset: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler of new configurations. A grid's come from the queue (`_grid`), which a sampler does not
    consult; it still needs one."""
    search = sweep.spec.search
    if search.sampler in (Sampler.RANDOM, Sampler.GRID):
        return optuna.samplers.RandomSampler(seed=search.seed + offset)
    startup = min(10, max(1, sweep.spec.max_trials // sweep.spec.seeds // 3))
    return optuna.samplers.TPESampler(seed=search.seed + offset, n_startup_trials=startup)


def _pruner(sweep: RLSweep) -> optuna.pruners.BasePruner:
    stopping = sweep.spec.early_stopping
    if stopping.pruner == Pruner.SUCCESSIVE_HALVING:
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=stopping.min_env_steps,
                                                      reduction_factor=stopping.reduction_factor)
    if stopping.pruner == Pruner.MEDIAN:
        return optuna.pruners.MedianPruner(n_startup_trials=stopping.startup_trials,
                                           n_warmup_steps=stopping.min_env_steps)
    return optuna.pruners.NopPruner()

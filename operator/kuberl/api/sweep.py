"""The RLSweep model: a job template, the parameters to vary and how, seeds per configuration, search,
early stopping and budget; and the checks that refuse a sweep, naming the field, before any trial runs.

`spec.template` is an RLTrainingJob spec (the job model itself, as a Deployment holds a pod template), and
each parameter's path is resolved against that model, so its type and bounds judge every value the sweep
may try. The CRD (`kuberl.api.crd.sweep_crd`) comes from this model too.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, WithJsonSchema

from kuberl.api import job as m
from kuberl.api import load
from kuberl.api.kube import JOB_NAME_MAX_LENGTH
from kuberl.api.problems import InvalidJob, Problem
from kuberl.api.rules import Rule
from kuberl.api.tenancy import Tenancy

KIND = "RLSweep"
PLURAL = "rlsweeps"
SINGULAR = "rlsweep"
SHORT_NAMES = ["rlsw"]
#: Trials are RLTrainingJobs named `<sweep>-t<number>`: the sweep's name leaves room for the suffix.
TRIAL_SUFFIX_LENGTH = len("-t0000")
SWEEP_NAME_MAX_LENGTH = JOB_NAME_MAX_LENGTH - TRIAL_SUFFIX_LENGTH
MAX_TRIALS = 1000
#: A grid's points, and a list's values, for one parameter.
MAX_VALUES = 100


def _most(model: type[BaseModel], field: str) -> int:
    return next(item.le for item in model.model_fields[field].metadata if getattr(item, "le", None) is not None)


#: The most pods one sweep may have at once: as many as the largest single job (its head, the most learners
#: and the most rollout workers), so that a sweep's parallelism cannot multiply what one job may ask for.
MAX_SWEEP_PODS = 1 + _most(m.LearnerSpec, "replicas") + _most(m.RolloutWorkersSpec, "replicas")


class InvalidSweep(InvalidJob):
    """A sweep file that cannot run; carries every problem found, each naming its field."""

    def report(self) -> str:
        return "\n".join([f"error: {self.source} is not a valid {KIND} ({len(self.problems)} problem(s)):",
                          *(f"  - {problem}" for problem in self.problems)])


# ---- the model ------------------------------------------------------------------------------------------


class Sampler(str, enum.Enum):
    GRID = "grid"
    RANDOM = "random"
    TPE = "tpe"


class Pruner(str, enum.Enum):
    NONE = "none"
    SUCCESSIVE_HALVING = "successiveHalving"
    MEDIAN = "median"


class Metric(str, enum.Enum):
    MEAN_RETURN = "meanReturn"
    EVALUATION_RETURN = "evaluationReturn"
    ENV_STEPS_TO_TARGET = "envStepsToTarget"


class Scale(str, enum.Enum):
    LINEAR = "linear"
    LOG = "log"


class DistributionType(str, enum.Enum):
    UNIFORM = "uniform"
    LOG_UNIFORM = "logUniform"
    INT = "int"


#: A value a parameter may take: any scalar of the job's fields (a number, a bool, an enum's name).
ParameterValue = Annotated[Union[bool, int, float, str], WithJsonSchema({"x-kuberl-any-value": True})]


class GridSpec(m._Model):
    """Evenly spaced points from low to high, both included."""

    RULES = (Rule("self.low < self.high", "low must be less than high", lambda g: g.low < g.high,
                  lambda g: f"low {g.low:g}, high {g.high:g}"),
             Rule("!has(self.scale) || self.scale != 'log' || self.low > 0", "a log grid needs low > 0",
                  lambda g: g.scale != Scale.LOG or g.low > 0, lambda g: f"low {g.low:g}"))
    low: float = Field(description="First point.")
    high: float = Field(description="Last point.")
    count: int = Field(default=3, ge=2, le=MAX_VALUES, description="Number of points.")
    scale: Scale = Field(default=Scale.LINEAR, description="linear: equal differences; log: equal ratios.")

    def points(self) -> list[float]:
        if self.scale == Scale.LOG:
            lo, hi = math.log(self.low), math.log(self.high)
            return [math.exp(lo + (hi - lo) * i / (self.count - 1)) for i in range(self.count)]
        return [self.low + (self.high - self.low) * i / (self.count - 1) for i in range(self.count)]


class DistributionSpec(m._Model):
    """Values drawn by the search (random or tpe): uniform or log-uniform floats, or integers."""

    RULES = (Rule("self.low < self.high", "low must be less than high", lambda d: d.low < d.high,
                  lambda d: f"low {d.low:g}, high {d.high:g}"),
             Rule("self.type != 'logUniform' || self.low > 0", "logUniform needs low > 0",
                  lambda d: d.type != DistributionType.LOG_UNIFORM or d.low > 0, lambda d: f"low {d.low:g}"),
             Rule("self.type != 'int' || (self.low == double(int(self.low)) && self.high == double(int(self.high)))",
                  "an int distribution needs whole-number low and high",
                  lambda d: d.type != DistributionType.INT
                  or (float(d.low).is_integer() and float(d.high).is_integer()),
                  lambda d: f"low {d.low:g}, high {d.high:g}"))
    type: DistributionType = Field(description="uniform, logUniform (equal odds per factor) or int.")
    low: float = Field(description="Smallest value.")
    high: float = Field(description="Largest value.")


#: The API server's half of "exactly one source": its CEL cannot see `values` (a list of any scalar has no type
#: in the schema, and CEL leaves untyped fields out), so it refuses a grid with a distribution, and the model
#: (the operator's check, as `kuberl sweep`'s) the rest.
_ONE_SOURCE = "!(has(self.grid) && has(self.distribution))"


class ParameterSpec(m._Model):
    """One field of the template to vary, and the values it takes."""

    RULES = (Rule(_ONE_SOURCE, "give exactly one of values, grid or distribution",
                  lambda p: [p.values is not None, p.grid is not None, p.distribution is not None].count(True) == 1),)
    path: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*)*$", max_length=256,
                      description="The field in the template, as in a job's spec: algorithm.ppo.learningRate.")
    values: list[ParameterValue] | None = Field(default=None, min_length=1, max_length=MAX_VALUES,
                                                description="The values to try.")
    grid: GridSpec | None = Field(default=None, description="Evenly spaced values to try.")
    distribution: DistributionSpec | None = Field(default=None, description="Values drawn by random or tpe search.")


class SearchSpec(m._Model):
    sampler: Sampler = Field(default=Sampler.GRID, description="grid: every combination; random; tpe: "
                             "Optuna's tree-structured Parzen estimator, which favours what scored well.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the sampler's own choices.")


class ObjectiveSpec(m._Model):
    metric: Metric = Field(default=Metric.MEAN_RETURN, description="meanReturn: the training return window at "
                           "the end; evaluationReturn: the final evaluation's mean return; envStepsToTarget: "
                           "env steps until stopping.targetReturn (fewer is better; a trial that never gets "
                           "there counts its whole budget).")


class EarlyStoppingSpec(m._Model):
    pruner: Pruner = Field(default=Pruner.NONE, description="none; successiveHalving: keep the best 1/reductionFactor "
                           "at each rung; median: stop a trial below the median of finished trials at the same step.")
    every_env_steps: int = Field(default=10_000, ge=1, description="A trial reports its return to the pruner at "
                                 "each multiple of this many env steps.")
    min_env_steps: int = Field(default=20_000, ge=1, description="No trial is stopped before this many env steps "
                               "(successive halving's first rung; the median pruner's warm-up).")
    reduction_factor: int = Field(default=3, ge=2, le=10, description="Successive halving: 1 in this many "
                                  "trials goes on at each rung.")
    startup_trials: int = Field(default=5, ge=0, le=MAX_TRIALS, description="Median: trials that finish before "
                                "any is stopped.")


class RLSweepSpec(m._Model):
    template: m.RLTrainingJobSpec = Field(description="The RLTrainingJob spec every trial runs, with the "
                                          "parameters and its seed applied.")
    parameters: list[ParameterSpec] = Field(min_length=1, max_length=16, description="The fields to vary.")
    seeds: int = Field(default=5, ge=1, le=100, description="Trials per configuration, with seeds template.seed, "
                       "template.seed + 1, ...")
    search: SearchSpec = Field(default_factory=SearchSpec, description="How configurations are chosen.")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What ranks configurations.")
    early_stopping: EarlyStoppingSpec = Field(default_factory=EarlyStoppingSpec,
                                              description="Stopping trials that are clearly worse.")
    max_trials: int = Field(ge=1, le=MAX_TRIALS, description="Most trials (configurations x seeds) the sweep runs.")
    parallelism: int = Field(default=2, ge=1, le=100, description="Most trials running at once (locally: also "
                             "no more than the cores allow). On a cluster a sweep may have at most "
                             f"{MAX_SWEEP_PODS} pods at once (as many as the largest job): parallelism x a trial's "
                             "pods (1 head + learner.replicas + rolloutWorkers.replicas, at the most any parameter "
                             "sets), plus the serving pods of every trial when the template serves (they stay "
                             "after a trial succeeds).")
    active_deadline_seconds: int | None = Field(default=None, ge=1, description="Stop starting and running trials "
                                                "this long after the sweep starts.")


class RLSweep(m._Model):
    model_config = ConfigDict(extra="ignore")
    api_version: Literal["kuberl.dev/v1alpha1"] = Field(alias="apiVersion", description=m.API_VERSION)
    kind: Literal["RLSweep"] = Field(description=KIND)
    metadata: m.ObjectMeta
    spec: RLSweepSpec


# ---- status: the operator's record of a sweep on a cluster --------------------------------------------


class SweepPhase(str, enum.Enum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (SweepPhase.SUCCEEDED, SweepPhase.FAILED)


class TrialState(str, enum.Enum):
    """A trial as the sweep shows it. Stopped: the pruner stopped it (its job is Suspended, kept)."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    STOPPED = "Stopped"
    FAILED = "Failed"


#: Pruner reports a trial keeps in the status (the newest): they bound the status's size.
MAX_REPORTS = 32
#: Configurations the status ranks (the best first); the rest are in the trials.
MAX_RANKED = 10


class TrialStatus(m._Model):
    """One trial: its job, configuration, seed, state, what it reported to the pruner and what it scored."""

    number: int = Field(ge=0, description="The trial's number; its job is <sweep>-t<number>.")
    name: str = Field(description="The trial's RLTrainingJob.")
    configuration: int = Field(ge=0, description="Which configuration (trials of one share its values).")
    parameters: dict[str, ParameterValue] = Field(description="Each parameter's value, by path.")
    seed: int = Field(description="The trial's seed.")
    state: TrialState = Field(default=TrialState.RUNNING, description="Running, Succeeded, Stopped (by the "
                              "pruner; its job is Suspended), Failed.")
    env_steps: int = Field(default=0, ge=0, description="Env steps, from its job's progress.")
    mean_return: float | None = Field(default=None, description="Mean return, from its job's progress.")
    objective: float | None = Field(default=None, description="What it scored (spec.objective), once it "
                                    "succeeded.")
    reports: dict[str, float] = Field(default_factory=dict, description="What it told the pruner, by env step.")
    message: str | None = Field(default=None, description="Why it failed or was stopped.")


class ConfigurationResult(m._Model):
    """A configuration ranked by the interquartile mean of its finished runs, with a 95% bootstrap interval."""

    rank: int = Field(ge=1, description="1 is the best.")
    configuration: int = Field(ge=0, description="Which configuration.")
    parameters: dict[str, ParameterValue] = Field(description="Its values, by path.")
    iqm: float = Field(description="Interquartile mean of its runs' objective.")
    ci_low: float | None = Field(default=None, description="Low end of the 95% interval (none with one run).")
    ci_high: float | None = Field(default=None, description="High end of the 95% interval.")
    runs: int = Field(ge=0, description="Runs that finished and scored.")
    summary: str = Field(default="", description="Its values and score on one line, for kubectl get.")


class TrialCounts(m._Model):
    running: int = Field(default=0, ge=0, description="Trials running.")
    succeeded: int = Field(default=0, ge=0, description="Trials finished with a score.")
    stopped: int = Field(default=0, ge=0, description="Trials the pruner stopped.")
    failed: int = Field(default=0, ge=0, description="Trials that failed.")


class RLSweepStatus(m._Model):
    phase: SweepPhase = Field(default=SweepPhase.RUNNING, description="Running, Succeeded or Failed.")
    conditions: list[m.Condition] = Field(default_factory=list, description="Complete, Failed, and Degraded: "
                                          "True while the operator's passes of the sweep fail (it retries).")
    observed_generation: int | None = Field(default=None, description="Last spec generation acted on.")
    start_time: datetime | None = Field(default=None, description="When the first trial was created.")
    completion_time: datetime | None = Field(default=None, description="When the sweep finished.")
    trials_by_state: TrialCounts = Field(default_factory=TrialCounts, description="Trials by state.")
    progress: str = Field(default="0/0", description="Trials finished/budget, for kubectl get.")
    best: ConfigurationResult | None = Field(default=None, description="The best configuration so far.")
    ranking: list[ConfigurationResult] = Field(default_factory=list, description=f"The best {MAX_RANKED} "
                                               "configurations, best first.")
    trials: list[TrialStatus] = Field(default_factory=list, description="Every trial started, by number.")
    reason: str | None = Field(default=None, description="Why the sweep failed (CamelCase).")
    message: str | None = Field(default=None, description="Detail of the failure.")


def trial_name(sweep_name: str, number: int) -> str:
    """A trial's job: `<sweep>-t<number>`, within a job name's length (the sweep's name leaves room)."""
    return f"{sweep_name}-t{number:04d}"


# ---- parameters resolved against the job model ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TemplateField:
    """A template field a parameter names: its Python type and the constraints the job model puts on it."""

    annotation: Any
    metadata: tuple[Any, ...]

    @property
    def adapter(self) -> TypeAdapter:
        form: Any = Annotated[(self.annotation, *self.metadata)] if self.metadata else self.annotation
        return TypeAdapter(form)

    def bounds(self) -> tuple[float, float]:
        low, high = -math.inf, math.inf
        for item in self.metadata:
            for attr in ("ge", "gt"):
                if getattr(item, attr, None) is not None:
                    low = max(low, getattr(item, attr))
            for attr in ("le", "lt"):
                if getattr(item, attr, None) is not None:
                    high = min(high, getattr(item, attr))
        return low, high


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def resolve_path(path: str) -> TemplateField:
    """The field of RLTrainingJobSpec at `path` (camelCase keys); ValueError says what is wrong."""
    model: type[BaseModel] = m.RLTrainingJobSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = {info.alias or name: (name, info) for name, info in model.model_fields.items()}
        where = ".".join(parts[:i]) or "the template"
        if part not in fields:
            raise ValueError(f"{where} has no field {part!r}; its fields: {', '.join(sorted(fields))}")
        info = fields[part][1]
        annotation = _unwrap_optional(info.annotation)
        if typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if i == len(parts) - 1:
                raise ValueError(f"{path} is a section, not a value: name one of its fields "
                                 f"({', '.join(sorted(f.alias or n for n, f in annotation.model_fields.items()))})")
            model = annotation
            continue
        if i != len(parts) - 1:
            raise ValueError(f"{'.'.join(parts[: i + 1])} is a value, not a section: it has no field {parts[i + 1]!r}")
        if annotation not in (bool, int, float, str) and not (isinstance(annotation, type)
                                                               and issubclass(annotation, enum.Enum)):
            raise ValueError(f"{path} is not a number, a bool or a name: a sweep varies those only")
        return TemplateField(annotation, tuple(info.metadata))
    raise ValueError("empty path")  # (the pattern refuses it first)


def _kind(field: TemplateField) -> str:
    if field.annotation is bool:
        return "a bool"
    if field.annotation is int:
        return "an integer"
    if field.annotation is float:
        return "a number"
    return "a name"


def _distribution_problems(at: str, field: TemplateField, dist: DistributionSpec) -> list[Problem]:
    if dist.type == DistributionType.INT and field.annotation is not int:
        hint = "use uniform or logUniform" if field.annotation is float else "use values"
        return [Problem(f"{at}.distribution.type", f"the field is {_kind(field)}, not an integer: {hint}",
                        dist.type.value)]
    if dist.type != DistributionType.INT and field.annotation is not float:
        hint = "use type: int" if field.annotation is int else "use values"
        return [Problem(f"{at}.distribution.type", f"the field is {_kind(field)}, not a number: {hint}",
                        dist.type.value)]
    return _bounds_problems(f"{at}.distribution", field, dist.low, dist.high)


def _bounds_problems(at: str, field: TemplateField, low: float, high: float) -> list[Problem]:
    problems = []
    for name, value in (("low", low), ("high", high)):
        candidate = int(value) if field.annotation is int else value
        try:
            field.adapter.validate_python(candidate)
        except ValidationError as err:
            lo, hi = field.bounds()
            allowed = " and ".join(x for x in (f">= {lo:g}" if lo > -math.inf else "",
                                               f"<= {hi:g}" if hi < math.inf else "") if x)
            problems.append(Problem(f"{at}.{name}", f"outside the field's bounds ({err.errors()[0]['msg']}"
                                    + (f"; the field allows {allowed}" if allowed else "") + ")", value))
    return problems


def parameter_problems(spec: RLSweepSpec) -> list[Problem]:
    """Each parameter's path resolved against the job model, and every value it may take checked by that
    field's own type and bounds."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    template = template_data(spec)
    for i, param in enumerate(spec.parameters):
        at = f"spec.parameters[{i}]"
        if param.path == "seed":
            problems.append(Problem(f"{at}.path", "the seed is the sweep's own: spec.seeds sets it per trial",
                                    param.path))
            continue
        if param.path in seen:
            problems.append(Problem(f"{at}.path", f"spec.parameters[{seen[param.path]}] varies it already",
                                    param.path))
            continue
        seen[param.path] = i
        try:
            field = resolve_path(param.path)
        except ValueError as err:
            problems.append(Problem(f"{at}.path", str(err), param.path))
            continue
        blocked = blocking_section(template, param.path)
        if blocked is not None:
            problems.append(Problem(f"{at}.path", blocked, param.path))
            continue
        if param.distribution is not None:
            problems += _distribution_problems(at, field, param.distribution)
            if spec.search.sampler == Sampler.GRID:
                problems.append(Problem(f"{at}.distribution", "search.sampler grid needs values or a grid: "
                                        "a distribution is drawn by random or tpe", has_value=False))
        elif param.grid is not None:
            if field.annotation not in (int, float):
                problems.append(Problem(f"{at}.grid", f"the field is {_kind(field)}: a grid is for numbers; "
                                        "use values", has_value=False))
            elif field.annotation is int and len(set(param_values(param, int))) < param.grid.count:
                problems.append(Problem(f"{at}.grid.count", "an integer field: the grid's points round to the "
                                        "same integers; fewer points or a wider range", param.grid.count))
            else:
                problems += _bounds_problems(f"{at}.grid", field, param.grid.low, param.grid.high)
        else:
            for j, value in enumerate(param.values or []):
                try:
                    field.adapter.validate_python(value, strict=field.annotation is not float
                                                  and not _is_enum(field))
                except ValidationError as err:
                    problems.append(Problem(f"{at}.values[{j}]", f"not a value of {param.path}: "
                                            f"{err.errors()[0]['msg']}", value))
    return problems


def _is_enum(field: TemplateField) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, enum.Enum)


def param_values(param: ParameterSpec, kind: type | None = None) -> list[Any]:
    """A list or grid parameter's values (ints for an integer field)."""
    if param.grid is not None:
        points = param.grid.points()
        return [round(p) for p in points] if kind is int else points
    return list(param.values or [])


def grid_size(spec: RLSweepSpec) -> int:
    """Configurations of a grid search: the product of each parameter's number of values."""
    size = 1
    for param in spec.parameters:
        size *= len(param_values(param))
    return size


def configurations(spec: RLSweepSpec) -> int:
    """Configurations the sweep runs: every point of a grid; maxTrials / seeds drawn by random or tpe."""
    return grid_size(spec) if spec.search.sampler == Sampler.GRID else spec.max_trials // spec.seeds


def budget_problems(spec: RLSweepSpec) -> list[Problem]:
    if spec.search.sampler == Sampler.GRID:
        configurations = grid_size(spec)
        needed = configurations * spec.seeds
        if needed > spec.max_trials:
            return [Problem("spec.maxTrials", f"the grid has {configurations} configuration(s) x {spec.seeds} "
                            f"seed(s) = {needed} trials, more than maxTrials allows: raise maxTrials to {needed}, "
                            "or fewer values or seeds", spec.max_trials)]
        return []
    if spec.max_trials % spec.seeds:
        return [Problem("spec.maxTrials", f"{spec.search.sampler.value} search runs every configuration on all "
                        f"{spec.seeds} seeds: maxTrials must be a multiple of spec.seeds", spec.max_trials)]
    return []


def objective_problems(spec: RLSweepSpec) -> list[Problem]:
    template = spec.template
    problems = []
    if spec.objective.metric == Metric.ENV_STEPS_TO_TARGET and template.stopping.target_return is None:
        problems.append(Problem("spec.objective.metric", "envStepsToTarget needs spec.template.stopping."
                                "targetReturn", spec.objective.metric.value))
    if spec.objective.metric == Metric.EVALUATION_RETURN and not template.evaluation.enabled:
        problems.append(Problem("spec.objective.metric", "evaluationReturn needs spec.template.evaluation.enabled",
                                spec.objective.metric.value))
    limit = template.stopping.max_env_steps
    stopping = spec.early_stopping
    if stopping.pruner != Pruner.NONE and limit is not None and stopping.min_env_steps >= limit:
        problems.append(Problem("spec.earlyStopping.minEnvSteps", f"no trial could be stopped early: the template "
                                f"stops every trial at {limit} env steps (stopping.maxEnvSteps)",
                                stopping.min_env_steps))
    return problems


def pod_problems(spec: RLSweepSpec) -> list[Problem]:
    """The pods the sweep may have at once, within MAX_SWEEP_PODS: its running trials' (each at the most replicas
    any parameter sets) and, when the template serves, every trial's serving pods, which stay after it succeeds.
    Run on parameters that passed `parameter_problems`."""
    template = spec.template
    learners = _most_replicas(spec, "learner.replicas", template.learner.replicas)
    workers = _most_replicas(spec, "rolloutWorkers.replicas", template.rollout_workers.replicas)
    per_trial = 1 + learners + workers
    total = spec.parallelism * per_trial
    parts = (f"{spec.parallelism} trial(s) at once x {per_trial} pods each (1 head, {learners} learner(s), "
             f"{workers} rollout worker(s), at the most the parameters set)")
    if template.serving is not None or any(p.path.startswith("serving.") for p in spec.parameters):
        replicas = _most_replicas(spec, "serving.replicas", template.serving.replicas if template.serving else 1)
        trials = configurations(spec) * spec.seeds
        total += trials * replicas
        parts += f" + {trials} trial(s) x {replicas} serving pod(s), kept after each trial succeeds"
    if total <= MAX_SWEEP_PODS:
        return []
    return [Problem("spec.parallelism", f"{parts} = {total} pods, more than the {MAX_SWEEP_PODS} a sweep may have "
                    "at once (as many as the largest job): lower parallelism or the replicas", spec.parallelism)]


def _most_replicas(spec: RLSweepSpec, path: str, template_value: int) -> int:
    """The largest value of an integer field any trial gets: the template's, or the parameter's largest."""
    param = next((p for p in spec.parameters if p.path == path), None)
    if param is None:
        return template_value
    if param.distribution is not None:
        return int(param.distribution.high)
    return max(int(v) for v in param_values(param, int))


def template_data(spec: RLSweepSpec) -> dict[str, Any]:
    """The template as the sweep's author wrote it (a job spec as data): what each trial starts from."""
    return spec.template.model_dump(mode="json", by_alias=True, exclude_unset=True)


def blocking_section(template: dict[str, Any], path: str) -> str | None:
    """Why a parameter cannot set `path` in `template`, or None when it can: each section along the path must
    be a mapping or left out (a left-out section is made, as a job's default would be); `serving: null` is
    neither, and a value under it would silently turn it on."""
    node: Any = template
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        node = node.get(part, {})
        if not isinstance(node, dict):
            section = ".".join(parts[: i + 1])
            shown = "null" if node is None else f"a {type(node).__name__}"
            return (f"spec.template.{section} is {shown}, so no trial can set {path} under it: give "
                    f"{section} as a mapping in the template (or leave it out), or vary another field")
    return None


def trial_spec(template: dict[str, Any], params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The template (a job spec as data) with each parameter's value at its path and the trial's seed.
    InvalidSweep, naming the field, when a section on a parameter's path is no mapping."""
    spec = copy.deepcopy(template)
    for path, value in params.items():
        blocked = blocking_section(spec, path)
        if blocked is not None:
            raise InvalidSweep([Problem("spec.parameters", blocked, path)], KIND)
        node = spec
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    spec["seed"] = seed
    return spec


def trial_job(sweep: RLSweep, name: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One trial's RLTrainingJob manifest (data; `parse_job` validates it)."""
    template = template_data(sweep.spec)
    labels = {**sweep.metadata.labels, "kuberl.dev/sweep": sweep.metadata.name}
    return {"apiVersion": m.API_VERSION, "kind": m.KIND,
            "metadata": {"name": name, "namespace": sweep.metadata.namespace, "labels": labels},
            "spec": trial_spec(template, params, seed)}


def _corner_problems(sweep: RLSweep) -> list[Problem]:
    """The template with each parameter at each end of its range still makes a valid job: a value that fits
    its field may still break a rule across fields (collection.mode async with PPO)."""
    problems: list[Problem] = []
    for i, param in enumerate(sweep.spec.parameters):
        field = resolve_path(param.path)
        if param.distribution is not None:
            low, high = param.distribution.low, param.distribution.high
            ends = [int(low), int(high)] if field.annotation is int else [low, high]
        else:
            ends = param_values(param, field.annotation)
        for value in ends:
            data = trial_job(sweep, trial_name(sweep.metadata.name, 0), {param.path: value}, sweep.spec.template.seed)
            try:
                m.RLTrainingJob.model_validate(data)
            except ValidationError as err:
                problems.append(Problem(f"spec.parameters[{i}]", f"with {param.path} = {value!r} the template is "
                                        f"not a valid job: {load.problems_from_validation_error(err, data, {})[0]}",
                                        has_value=False))
                break
    return problems


# ---- reading a sweep --------------------------------------------------------------------------------------


def template_job_problems(sweep: RLSweep, *, source: str = "sweep", check: load.SpecCheck | None = None,
                          tenancy: Tenancy | None = None) -> list[Problem]:
    """The template as a job of the sweep's namespace, judged by `load.parse_job` as the job's own loop will
    judge each trial: what its pod templates may do there (`tenancy`) and its environment (`check`). Problems
    are named in the sweep (`spec.template.<field>`)."""
    first = trial_job(sweep, trial_name(sweep.metadata.name, 0), {}, sweep.spec.template.seed)
    try:
        load.parse_job(first, source=source, check=check, tenancy=tenancy)
    except InvalidJob as err:
        return [dataclasses.replace(p, path=_in_template(p.path), line=None) for p in err.problems]
    return []


def _in_template(path: str) -> str:
    if path == "spec" or path.startswith(("spec.", "spec[")):
        return "spec.template" + path.removeprefix("spec")
    return path


def parse_sweep(data: Any, *, text: str | None = None, source: str = "sweep", check: load.SpecCheck | None = None,
                tenancy: Tenancy | None = None) -> RLSweep:
    """Validate a sweep (data from YAML or the API): the schema, the template as a job, each parameter
    against its field, the pods it may have at once, the objective against the template, the budget, and
    then the template as a job of the sweep's namespace (`template_job_problems`, with `tenancy` and `check`).
    `kuberl validate`, `kuberl sweep` and the operator all judge a sweep here."""
    try:
        load.check_limits(data, source, text)
    except InvalidJob as err:
        raise InvalidSweep(err.problems, source) from None
    lines = load._line_index(text) if text else {}
    if not isinstance(data, dict):
        raise InvalidSweep([Problem("<document>", f"a sweep file must be a YAML mapping (an {KIND} manifest)",
                                    type(data).__name__)], source)
    problems: list[Problem] = []
    if data.get("apiVersion") != m.API_VERSION:
        problems.append(Problem("apiVersion", f"must be {m.API_VERSION}", data.get("apiVersion")))
    if data.get("kind") != KIND:
        problems.append(Problem("kind", f"must be {KIND}", data.get("kind")))
    name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) else None
    if isinstance(name, str) and len(name) > SWEEP_NAME_MAX_LENGTH:
        problems.append(Problem("metadata.name", f"at most {SWEEP_NAME_MAX_LENGTH} characters: each trial is a "
                                f"job named <sweep>-t<number>, and a job's name is at most {JOB_NAME_MAX_LENGTH}",
                                name))
    try:
        sweep = RLSweep.model_validate(data)
    except ValidationError as err:
        problems += [p for p in load.problems_from_validation_error(err, data, lines)
                     if p.path not in ("apiVersion", "kind")]
        raise InvalidSweep(_with_lines(problems, lines), source) from None
    problems += parameter_problems(sweep.spec)
    if not problems:
        problems += _corner_problems(sweep) + pod_problems(sweep.spec)
    problems += budget_problems(sweep.spec) + objective_problems(sweep.spec)
    if not problems:
        problems = template_job_problems(sweep, source=source, check=check, tenancy=tenancy)
    if problems:
        raise InvalidSweep(_with_lines(problems, lines), source)
    return sweep


def _with_lines(problems: list[Problem], lines: Any) -> list[Problem]:
    return [dataclasses.replace(p, line=p.line or load._nearest_line(p.path, lines)) for p in problems]


def load_sweep_file(path: str | Path, **kwargs: Any) -> RLSweep:
    """A sweep file, read within a job file's limits and judged by `parse_sweep` (`kwargs`: its check and
    tenancy)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(load.MAX_JOB_BYTES + 1)
    except OSError as err:
        raise InvalidSweep([Problem("<file>", f"cannot read {p}: {err.strerror}", has_value=False)],
                           str(p)) from None
    return load_sweep_text(raw.decode("utf-8-sig", errors="replace"), str(p), **kwargs)


def load_sweep_text(text: str, source: str = "sweep", **kwargs: Any) -> RLSweep:
    try:
        load._check_size(text, source)
        load._YamlScan(source).run(text)
        docs = [d for d in yaml.load_all(text, Loader=load._LOADER) if d is not None]
    except InvalidJob as err:
        raise InvalidSweep(err.problems, source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InvalidSweep([Problem("<yaml>", f"YAML error: {getattr(err, 'problem', None) or err}",
                                    line=mark.line + 1 if mark else None, has_value=False)], source) from None
    if len(docs) != 1:
        raise InvalidSweep([Problem("<document>", f"expected exactly one YAML document, found {len(docs)}",
                                    has_value=False)], source)
    return parse_sweep(docs[0], text=text, source=source, **kwargs)


__all__ = ["InvalidSweep", "RLSweep", "RLSweepSpec", "RLSweepStatus", "SweepPhase", "TrialState", "TrialStatus",
           "trial_name", "load_sweep_file", "load_sweep_text",
           "parse_sweep", "resolve_path", "template_job_problems", "trial_job"]

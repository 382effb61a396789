"""Any sweep a tenant can write is either run or refused with problems that name its fields, never a crash:
generated sweeps (seeded, so a failure is the same on every run) go through what the operator calls on
every pass, `parse_sweep` with the namespace's tenancy and the registered environments, then the first
pass's plan, each trial's job as the job's own loop parses it, and the trial builder with values the
parameters never offered."""

from __future__ import annotations

import copy
import enum
import math
import os
import random
from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from kuberl.api import job as m
from kuberl.api.load import InvalidJob, parse_job
from kuberl.api.semantics import check_registered
from kuberl.api.sweep import InvalidSweep, parse_sweep, resolve_path, trial_job, trial_name
from kuberl.api.tenancy import Tenancy
from kuberl.sweep.cluster import plan_pass

#: A fixed seed in CI; KUBERL_PROPERTY_SEED explores others.
SEED = int(os.environ.get("KUBERL_PROPERTY_SEED", "20261125"))
CASES = 400
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
#: Where a problem may point: a field of the sweep, or the document itself.
FIELD_ROOTS = ("spec", "metadata", "apiVersion", "kind", "<document>")

BASE_TEMPLATE = {"algorithm": {"name": "PPO"}, "environment": {"id": "CartPole-v1"},
                 "rolloutWorkers": {"replicas": 1}, "stopping": {"maxEnvSteps": 10_000},
                 "checkpointing": {"volume": {"claimName": "checkpoints"}}}
#: Values of every kind a YAML file or the API can hold, the odd ones included.
ODD_VALUES = (None, True, False, 0, 1, -1, 3, 64, 513, 2**31, 2**63, 0.5, -0.0, 1e308, "", "x", "PPO", "async",
              [], [1], {}, {"a": 1})


def _paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """Every field under the job spec, sections and values alike, with its annotation."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        annotation = info.annotation
        args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        inner = args[0] if len(args) == 1 else annotation
        out.append((path, inner))
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out += _paths(inner, f"{path}.")
    return out


PATHS = _paths(m.RLTrainingJobSpec)
SECTIONS = [path for path, annotation in PATHS if isinstance(annotation, type) and issubclass(annotation, BaseModel)]
ROLES = ("head", "learner", "rolloutWorkers", "serving")


def _varies(path: str) -> bool:
    try:
        resolve_path(path)
    except ValueError:
        return False
    return path != "seed"


#: The fields a parameter may vary.
SCALARS = [path for path, _ in PATHS if _varies(path)]


class Draw:
    """Seeded draws; `wild` is the odds of an odd value wherever one may stand (0: a sweep that may well run)."""

    def __init__(self, rng: random.Random, wild: float):
        self.rng, self.wild = rng, wild

    def odd(self) -> Any:
        return copy.deepcopy(self.rng.choice(ODD_VALUES))

    def maybe(self, usual: Any) -> Any:
        return self.odd() if self.rng.random() < self.wild else usual

    def fitting(self, path: Any) -> Any:
        """A value the field at `path` takes (within its bounds), or an odd one."""
        rng = self.rng
        try:
            field = resolve_path(path)
        except (ValueError, AttributeError):  # no field there, or no path at all
            return self.odd()
        low, high = field.bounds()
        if field.annotation is bool:
            return rng.random() < 0.5
        if field.annotation is int:
            low = 0 if low == -math.inf else math.ceil(low)
            return rng.randint(low, int(min(high, low + 8)))
        if field.annotation is float:
            low = 0.0 if low == -math.inf else low
            return rng.uniform(low, min(high, low + 1.0))
        if isinstance(field.annotation, type) and issubclass(field.annotation, enum.Enum):
            return rng.choice(list(field.annotation)).value
        return rng.choice(("CartPole-v1", "x", "checkpoints"))


def set_at(data: dict, path: str, value: Any) -> None:
    """`value` at `path`, making (or replacing) the sections on the way."""
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def remove_at(data: dict, path: str) -> None:
    parent, _, leaf = path.rpartition(".")
    node: Any = data
    for part in filter(None, parent.split(".")):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def template(draw: Draw) -> Any:
    rng = draw.rng
    data = copy.deepcopy(BASE_TEMPLATE)
    for _ in range(rng.choice((0, 1, 1, 2, 4))):
        path = rng.choice([*ROLES, *SECTIONS, *(SCALARS if not draw.wild else (p for p, _ in PATHS))])
        roll = rng.random()
        if roll < 0.3:  # a role or section set to null, as a merge patch or the API's nullable fields allow
            set_at(data, path, None)
        elif roll < 0.5:
            remove_at(data, path)
        elif roll < 0.6:
            set_at(data, path, {})
        else:
            set_at(data, path, draw.maybe(draw.fitting(path)))
    return draw.maybe(data)


def parameter(draw: Draw, sampler: str) -> Any:
    rng = draw.rng
    roll = rng.random()
    path = (rng.choice(SCALARS) if roll < 0.7 or not draw.wild else rng.choice([p for p, _ in PATHS]) if roll < 0.9
            else rng.choice(("seed", "learner.nope", "seed.x", "a..b", "", "Learner.replicas")) if roll < 0.95
            else draw.odd())
    param: dict[str, Any] = {"path": path}
    numeric = path in SCALARS and resolve_path(path).annotation in (int, float)
    kinds = ("values",) * 6 + (("grid", "grid") if numeric or draw.wild else ())
    kinds += ("distribution", "distribution") if (numeric and sampler != "grid") or draw.wild else ()
    kind = rng.choice(kinds + (("none", "two") if draw.wild else ()))
    if kind in ("values", "two"):
        n = draw.maybe(rng.choice((1, 2, 3)))
        n = n if isinstance(n, int) and 0 <= n <= 101 else 101
        param["values"] = [draw.maybe(draw.fitting(path)) for _ in range(n)]
    if kind in ("grid", "two"):
        low = draw.maybe(draw.fitting(path))
        high = low + rng.choice((1, 4, 0.5, -1)) if isinstance(low, (int, float)) else draw.odd()
        param["grid"] = {"low": low, "high": high, "count": draw.maybe(rng.choice((2, 3, 5))),
                         "scale": draw.maybe(rng.choice(("linear", "log")))}
    if kind == "distribution" or (kind == "two" and sampler != "grid"):
        low = draw.maybe(draw.fitting(path))
        high = low + rng.choice((1, 8, 0.5, -1)) if isinstance(low, (int, float)) else draw.odd()
        param["distribution"] = {"type": draw.maybe(rng.choice(("uniform", "logUniform", "int"))), "low": low,
                                 "high": high}
    return draw.maybe(param)


def sweep(draw: Draw) -> dict[str, Any]:
    rng = draw.rng
    sampler = rng.choice(("grid", "grid", "random", "tpe"))
    seeds = draw.maybe(rng.choice((1, 2, 3)))
    spec: dict[str, Any] = {
        "template": template(draw),
        "parameters": [parameter(draw, sampler) for _ in range(
            rng.choice((1, 1, 2, 3)) if rng.random() >= draw.wild else rng.choice((0, 17)))],
        "seeds": seeds,
        "search": draw.maybe({"sampler": draw.maybe(sampler), "seed": draw.maybe(rng.randint(0, 9))}),
        "objective": draw.maybe({"metric": rng.choice(("meanReturn",) * 4 + ("evaluationReturn", "envStepsToTarget"))}),
        "earlyStopping": draw.maybe({"pruner": rng.choice(("none", "median", "successiveHalving")),
                                     "everyEnvSteps": draw.maybe(1000), "minEnvSteps": draw.maybe(2000)}),
        "maxTrials": draw.maybe(rng.choice((6, 12, 30, 300)) * (seeds if isinstance(seeds, int) else 1)),
        "parallelism": draw.maybe(rng.choice((1, 2, 4, 100))),
    }
    for key in list(spec):
        if key != "template" and rng.random() < draw.wild / 4:
            del spec[key]
    metadata = draw.maybe({"name": draw.maybe("s"), "namespace": "tenant"})
    return {"apiVersion": draw.maybe("kuberl.dev/v1alpha1"), "kind": draw.maybe("RLSweep"), "metadata": metadata,
            "spec": draw.maybe(spec)}


def judged(data: Any) -> Any:
    """The sweep as the operator judges it, or None when refused (with problems that name fields)."""
    try:
        return parse_sweep(data, source="s", check=check_registered, tenancy=Tenancy())
    except InvalidSweep as err:
        assert err.problems, data
        for problem in err.problems:
            assert isinstance(problem.path, str) and problem.path.startswith(FIELD_ROOTS), (problem, data)
            assert problem.message, (problem, data)
        return None


def planned_trials(s: Any, rng: random.Random, *, second_pass: bool) -> None:
    """The operator's first pass (and its second, every trial scored); each trial's job parsed as the job's
    loop parses it."""
    first = plan_pass(s, [], {}, NOW, NOW, ranked=True)
    assert first.create, "a valid sweep starts trials"
    jobs = {}
    for manifest in first.create:
        try:
            parse_job(manifest, check=check_registered, tenancy=Tenancy())
        except InvalidJob as err:  # a value between the corners that breaks a rule: the trial fails as a job
            assert all(p.path for p in err.problems)
        jobs[manifest["metadata"]["name"]] = {"status": {"phase": "Succeeded", "progress": {
            "envSteps": 10_000, "meanReturn": rng.uniform(0, 500)}}}
    if second_pass:
        plan_pass(s, first.trials, jobs, NOW, NOW, ranked=True)


def odd_trial(s: Any, rng: random.Random) -> None:
    """The trial builder given any value at any path: a manifest, or the sweep's own refusal."""
    params = {rng.choice([p for p, _ in PATHS]): Draw(rng, 1.0).odd() for _ in range(rng.randint(1, 3))}
    try:
        trial_job(s, trial_name(s.metadata.name, 0), params, 0)
    except InvalidSweep as err:
        assert all(p.path.startswith("spec.") for p in err.problems)


def test_every_generated_sweep_is_run_or_refused_naming_a_field():
    rng = random.Random(SEED)
    valid = refused = 0
    for case in range(CASES):
        data = sweep(Draw(rng, wild=rng.choice((0.0, 0.0, 0.0, 0.02, 0.1, 0.3))))
        try:
            s = judged(copy.deepcopy(data))
            if s is None:
                refused += 1
                continue
            valid += 1
            if valid <= 40:  # Optuna's study and SciPy's bootstrap are the slow part: a sample of the valid sweeps
                planned_trials(s, rng, second_pass=valid <= 10)
            odd_trial(s, rng)
        except AssertionError:
            raise
        except Exception as err:
            raise AssertionError(f"case {case} (seed {SEED}) raised {type(err).__name__}: {err}\n{data}") from err
    # The generator reaches both sides, or it tests little.
    assert valid >= 30 and refused >= 200, (valid, refused)


def test_a_parameter_under_each_role_and_section_set_to_null_is_refused_naming_it_and_left_out_is_made():
    """Each role and section set to null, or left out, with a parameter on each of its values: null is refused
    naming the section (by the schema, or for a nullable one by the parameter's check); left out, the section
    is made with its defaults, and the sweep runs or is refused like any other."""
    for section in [*ROLES, *SECTIONS]:
        for path, _annotation in PATHS:
            if not path.startswith(f"{section}.") or path not in SCALARS:
                continue
            for form in ("null", "missing"):
                spec = copy.deepcopy(BASE_TEMPLATE)
                set_at(spec, section, None)
                if form == "missing":
                    remove_at(spec, section)
                draw = Draw(random.Random(f"{SEED}{path}"), wild=0.0)
                data = {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLSweep",
                        "metadata": {"name": "s", "namespace": "tenant"},
                        "spec": {"template": spec, "maxTrials": 6, "seeds": 1,
                                 "parameters": [{"path": path, "values": [draw.fitting(path)]}]}}
                try:
                    result = judged(copy.deepcopy(data))
                except Exception as err:
                    raise AssertionError(f"{section} {form}, parameter {path}: {type(err).__name__}: {err}") from err
                if form == "null":
                    assert result is None, (section, path)
                    with pytest.raises(InvalidSweep) as err:
                        parse_sweep(data)
                    assert any(p.path == f"spec.template.{section}" or f"spec.template.{section} is null"
                               in p.message for p in err.value.problems), (section, path, err.value.problems)

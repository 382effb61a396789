"""An RLSweep file: the example is valid, every kind of bad input is refused before anything runs with a
problem naming its field, and the committed CRD is the model's."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from kuberl.api.crd import crd_yaml, sweep_crd, sweep_crd_yaml
from kuberl.api.sweep import InvalidSweep, load_sweep_text, parse_sweep

EXAMPLE = REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml"


@pytest.fixture
def sweep() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def problems(data: dict) -> dict[str, str]:
    with pytest.raises(InvalidSweep) as err:
        parse_sweep(data)
    return {p.path: p.message for p in err.value.problems}


def test_the_example_is_valid(sweep):
    parsed = parse_sweep(sweep)
    assert parsed.spec.template.algorithm.name.value == "PPO"
    assert parsed.spec.parameters[0].values == [0.0003, 0.0025, 0.01]
    assert parsed.spec.seeds * 3 == parsed.spec.max_trials == 15


@pytest.mark.parametrize("path", sorted((REPO / "examples" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_sweep_is_valid(path):
    # A sweep that `kuberl sweep` would refuse (a name too long for its trials' jobs, say) fails here, not when
    # a user or a benchmark first runs it.
    parse_sweep(yaml.safe_load(path.read_text()))


def test_an_unknown_path_names_the_parameter_and_lists_the_fields(sweep):
    sweep["spec"]["parameters"][0]["path"] = "algorithm.ppo.learningRat"
    found = problems(sweep)
    assert list(found) == ["spec.parameters[0].path"]
    assert "no field 'learningRat'" in found["spec.parameters[0].path"]
    assert "learningRate" in found["spec.parameters[0].path"]


def test_a_path_to_a_section_or_through_a_value_is_refused(sweep):
    sweep["spec"]["parameters"][0]["path"] = "algorithm.ppo"
    assert "a section, not a value" in problems(sweep)["spec.parameters[0].path"]
    sweep["spec"]["parameters"][0]["path"] = "seed.x"
    assert "a value, not a section" in problems(sweep)["spec.parameters[0].path"]


def test_the_seed_is_the_sweeps_own(sweep):
    sweep["spec"]["parameters"][0] = {"path": "seed", "values": [1, 2]}
    assert "spec.seeds" in problems(sweep)["spec.parameters[0].path"]


def test_a_distribution_that_does_not_fit_the_fields_type(sweep):
    sweep["spec"]["search"]["sampler"] = "random"
    sweep["spec"]["parameters"] = [
        {"path": "rolloutWorkers.envsPerWorker", "distribution": {"type": "uniform", "low": 1, "high": 8}},
        {"path": "algorithm.ppo.gamma", "distribution": {"type": "int", "low": 0, "high": 1}},
        {"path": "algorithm.ppo.normalizeAdvantages", "distribution": {"type": "uniform", "low": 0, "high": 1}},
    ]
    found = problems(sweep)
    assert "an integer, not a number: use type: int" in found["spec.parameters[0].distribution.type"]
    assert "not an integer" in found["spec.parameters[1].distribution.type"]
    assert "a bool" in found["spec.parameters[2].distribution.type"]


def test_a_distribution_outside_the_fields_bounds(sweep):
    sweep["spec"]["search"]["sampler"] = "random"
    sweep["spec"]["parameters"][0] = {"path": "algorithm.ppo.learningRate",
                                      "distribution": {"type": "logUniform", "low": 1e-5, "high": 3}}
    found = problems(sweep)
    assert list(found) == ["spec.parameters[0].distribution.high"]
    assert "<= 1" in found["spec.parameters[0].distribution.high"]


def test_a_value_of_the_wrong_type_or_out_of_bounds(sweep):
    sweep["spec"]["parameters"][0]["values"] = [0.001, 2.0, "fast"]
    found = problems(sweep)
    assert set(found) == {"spec.parameters[0].values[1]", "spec.parameters[0].values[2]"}
    assert "less than or equal to 1" in found["spec.parameters[0].values[1]"]


def test_a_distribution_needs_a_sampler_that_draws(sweep):
    sweep["spec"]["parameters"][0] = {"path": "algorithm.ppo.learningRate",
                                      "distribution": {"type": "logUniform", "low": 1e-4, "high": 1e-2}}
    assert "random or tpe" in problems(sweep)["spec.parameters[0].distribution"]


def test_one_of_values_grid_or_distribution(sweep):
    sweep["spec"]["parameters"][0]["grid"] = {"low": 0.001, "high": 0.01}
    assert "exactly one of values, grid or distribution" in problems(sweep)["spec.parameters[0]"]


def test_an_invalid_template_names_its_field(sweep):
    sweep["spec"]["template"]["algorithm"]["name"] = "PPX"
    sweep["spec"]["template"]["rolloutWorkers"]["replicas"] = 0
    found = problems(sweep)
    assert set(found) == {"spec.template.algorithm.name", "spec.template.rolloutWorkers.replicas"}


def test_values_that_break_a_rule_across_the_templates_fields(sweep):
    sweep["spec"]["parameters"].append({"path": "collection.mode", "values": ["sync", "async"]})
    sweep["spec"]["maxTrials"] = 30
    found = problems(sweep)
    assert "collection.mode = 'async'" in found["spec.parameters[1]"]
    assert "off-policy" in found["spec.parameters[1]"]


def test_more_trials_than_the_budget_allows(sweep):
    sweep["spec"]["maxTrials"] = 10
    found = problems(sweep)
    assert "3 configuration(s) x 5 seed(s) = 15 trials" in found["spec.maxTrials"]
    sweep["spec"]["maxTrials"] = 5000
    assert "less than or equal to 1000" in problems(sweep)["spec.maxTrials"]
    sweep["spec"]["maxTrials"], sweep["spec"]["search"]["sampler"] = 12, "random"
    assert "multiple of spec.seeds" in problems(sweep)["spec.maxTrials"]


def test_an_objective_the_template_cannot_measure(sweep):
    sweep["spec"]["objective"]["metric"] = "envStepsToTarget"
    assert "targetReturn" in problems(sweep)["spec.objective.metric"]
    sweep["spec"]["objective"]["metric"] = "evaluationReturn"
    assert "evaluation.enabled" in problems(sweep)["spec.objective.metric"]


def test_a_name_leaves_room_for_the_trials(sweep):
    sweep["metadata"]["name"] = "a" * 36
    assert "at most 34 characters" in problems(sweep)["metadata.name"]


def test_problems_carry_the_files_lines(sweep):
    sweep["spec"]["parameters"][0]["path"] = "algorithm.ppo.nope"
    with pytest.raises(InvalidSweep) as err:
        load_sweep_text(yaml.safe_dump(sweep, sort_keys=False), "sweep.yaml")
    problem = err.value.problems[0]
    assert problem.path == "spec.parameters[0].path" and problem.line is not None
    assert err.value.report().startswith("error: sweep.yaml is not a valid RLSweep (1 problem(s)):")


@pytest.mark.parametrize("change", [
    lambda s: s["spec"]["parameters"][0].update(path="algorithm.ppo.learningRat"),
    lambda s: s["spec"].update(maxTrials=3),
    lambda s: s["spec"]["template"]["environment"].update(id="CartPole-v99"),
], ids=["unknown path", "over budget", "unknown environment"])
def test_kuberl_sweep_refuses_bad_input_before_anything_runs(sweep, change, tmp_path):
    change(sweep)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "sweep", str(path), "--dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "is not a valid RLSweep" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_committed_sweep_crd_matches_the_model():
    assert (REPO / "crds" / "rlsweep.yaml").read_text() == sweep_crd_yaml(), \
        "crds/rlsweep.yaml is stale: run `kuberl crd --kind RLSweep -o crds/rlsweep.yaml`"
    assert (REPO / "crds" / "rltrainingjob.yaml").read_text() == crd_yaml()


def test_the_sweep_crd_is_a_valid_structural_schema_around_the_jobs():
    import kubernetes_validate

    doc = copy.deepcopy(sweep_crd())
    kubernetes_validate.validate(doc, "1.32", strict=True)
    assert doc["spec"]["names"]["kind"] == "RLSweep" and doc["spec"]["names"]["shortNames"] == ["rlsw"]
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]
    assert template["properties"]["rolloutWorkers"]["properties"]["replicas"]["minimum"] == 1
    parameter = spec["properties"]["parameters"]["items"]
    assert parameter["properties"]["values"]["items"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert parameter["x-kubernetes-validations"][0]["message"] == "give exactly one of values, grid or distribution"
    assert spec["properties"]["search"]["properties"]["sampler"]["enum"] == ["grid", "random", "tpe"]


def test_kuberl_validate_judges_a_sweep_file_as_a_sweep(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "validate", str(EXAMPLE)], capture_output=True,
                        text=True, timeout=120, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: cartpole-ppo-lr: 1 parameter(s), 5 seed(s)"), ok.stderr
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["seeds"] = 0
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    refused = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "validate", str(path)], capture_output=True,
                             text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "spec.seeds" in refused.stderr and "RLSweep" in refused.stderr

"""The job model: good files parse, every bad case is reported with its field path, value and what is
allowed, via the real `kuberl validate` command; the committed CRD matches the model."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import types
import typing

import pytest
import yaml
from conftest import REPO
from kuberl.api.crd import crd, crd_yaml, sweep_crd
from kuberl.api.job import AlgorithmName, RLTrainingJob
from kuberl.api.load import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_TEXT,
    InvalidJob,
    Override,
    load_job_text,
    parse_job,
    parse_with_overrides,
)
from kuberl.trainer.envs.resolve import check_environment
from pydantic import BaseModel


def _validate(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "validate", str(path)],
                          capture_output=True, text=True)


def _problems(data: dict) -> list:
    with pytest.raises(InvalidJob) as err:
        parse_job(data, check=check_environment)
    return err.value.problems


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_valid(path):
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "validate", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: ")


def test_defaults_are_filled_and_camel_case_round_trips(job_dict):
    job = parse_job(job_dict)
    assert job.spec.algorithm.name is AlgorithmName.PPO
    assert job.spec.algorithm.ppo.clip_coef == 0.2
    manifest = job.manifest()
    assert manifest["spec"]["rolloutWorkers"]["envsPerWorker"] == 8
    assert RLTrainingJob.model_validate(manifest).spec == job.spec


def test_unknown_algorithm_lists_the_allowed_ones(job_dict, tmp_path):
    job_dict["spec"]["algorithm"]["name"] = "A3C"
    proc = _validate(tmp_path, yaml.safe_dump(job_dict))
    assert proc.returncode == 2
    assert "spec.algorithm.name" in proc.stderr
    assert "'A3C'" in proc.stderr
    for allowed in ("PPO", "DQN", "BDQ", "QLearning"):
        assert allowed in proc.stderr


def test_negative_replicas_names_field_value_and_bound(job_dict):
    job_dict["spec"]["rolloutWorkers"]["replicas"] = -1
    (p,) = _problems(job_dict)
    assert p.path == "spec.rolloutWorkers.replicas"
    assert p.value == -1
    assert "greater than or equal to 1" in p.message


def test_unknown_gymnasium_id_suggests_close_matches(job_dict, tmp_path):
    job_dict["spec"]["environment"]["id"] = "CartPol-v1"
    proc = _validate(tmp_path, yaml.safe_dump(job_dict))
    assert proc.returncode == 2
    assert "spec.environment.id" in proc.stderr and "CartPol-v1" in proc.stderr
    assert "did you mean CartPole-v1" in proc.stderr


def test_discrete_only_algorithm_on_continuous_actions(job_dict):
    job_dict["spec"]["algorithm"]["name"] = "DQN"
    job_dict["spec"]["environment"]["id"] = "Pendulum-v1"
    (p,) = _problems(job_dict)
    assert p.path == "spec.algorithm.name"
    assert "DQN cannot act in Pendulum-v1's Box action space" in p.message
    assert "(DQN acts in Discrete)" in p.message
    assert p.message.endswith("choose one that can: PPO, SAC, TD3")


def test_yaml_syntax_error_reports_the_line(tmp_path):
    text = "apiVersion: kuberl.dev/v1alpha1\nkind: RLTrainingJob\nmetadata:\n  name: x\nspec: [unclosed\n"
    proc = _validate(tmp_path, text)
    assert proc.returncode == 2
    assert "YAML syntax error" in proc.stderr
    assert "line 6" in proc.stderr or "line 5" in proc.stderr


def test_wrong_api_version_and_kind_are_both_reported(job_dict):
    job_dict["apiVersion"] = "kuberl.dev/v1"
    job_dict["kind"] = "TrainingJob"
    paths = {p.path: p for p in _problems(job_dict)}
    assert "must be kuberl.dev/v1alpha1" in paths["apiVersion"].message
    assert paths["apiVersion"].value == "kuberl.dev/v1"
    assert "must be RLTrainingJob" in paths["kind"].message


def test_every_problem_is_reported_at_once_with_line_numbers(job_dict):
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 0
    job_dict["spec"]["rolloutWorkers"]["envPerWorker"] = 4  # typo
    job_dict["spec"]["algorithm"]["ppo"] = {"gamma": 1.5}
    text = yaml.safe_dump(job_dict, sort_keys=False)
    with pytest.raises(InvalidJob) as err:
        load_job_text(text)
    paths = {p.path: p for p in err.value.problems}
    assert set(paths) == {"spec.rolloutWorkers.replicas", "spec.rolloutWorkers.envPerWorker",
                          "spec.algorithm.ppo.gamma"}
    assert "unknown field" in paths["spec.rolloutWorkers.envPerWorker"].message
    lines = text.splitlines()
    assert "replicas: 0" in lines[paths["spec.rolloutWorkers.replicas"].line - 1]
    assert "gamma: 1.5" in lines[paths["spec.algorithm.ppo.gamma"].line - 1]


def test_missing_stopping_limit_is_explained(job_dict):
    job_dict["spec"]["stopping"] = {"targetReturn": 475}
    (p,) = _problems(job_dict)
    assert p.path == "spec.stopping"
    assert "maxEpisodes, maxEnvSteps or maxWallClockSeconds" in p.message


def test_async_collection_needs_an_off_policy_algorithm(job_dict):
    job_dict["spec"]["collection"] = {"mode": "async"}
    (p,) = _problems(job_dict)
    assert "off-policy" in p.message


def test_invalid_file_starts_nothing(job_dict, tmp_path):
    job_dict["spec"]["rolloutWorkers"]["replicas"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(job_dict))
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(path), "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "spec.rolloutWorkers.replicas" in proc.stderr
    assert not run_dir.exists()  # no run directory, no Ray, no checkpoint


def test_committed_crd_matches_the_model():
    committed = (REPO / "crds" / "rltrainingjob.yaml").read_text()
    assert committed == crd_yaml(), "crds/rltrainingjob.yaml is stale: run `kuberl crd -o crds/rltrainingjob.yaml`"


def _keywords(node, path="") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        found = [(path, k) for k in node if k in ("patternProperties", "definitions", "dependencies", "$ref",
                                                   "$schema", "additionalItems", "id")]
        for key, value in node.items():
            # A property may be named like a keyword (`id`); what is under `properties` are names, not keywords.
            found += [f for name, sub in (value.items() if key == "properties" else [(key, value)])
                      for f in _keywords(sub, f"{path}.{name}")]
        return found
    if isinstance(node, list):
        return [f for item in node for f in _keywords(item, path)]
    return []


def test_the_crd_schemas_use_no_keyword_the_api_server_refuses():
    # The API server refuses these in a CRD's schema (apiextensions' structural rules): a dict whose keys carry
    # a pattern becomes patternProperties in pydantic's schema, and the whole CRD fails to install.
    for doc in (crd(), sweep_crd()):
        schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert not _keywords(schema), _keywords(schema)


def test_crd_shape_and_schema_validity():
    import kubernetes_validate

    doc = crd()
    kubernetes_validate.validate(doc, "1.32", strict=True)
    version = doc["spec"]["versions"][0]
    assert doc["spec"]["names"]["shortNames"] == ["rltj"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for name in ("Phase", "Workers", "Episodes", "Episodes/s", "Return", "Age"):
        assert name in columns
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    replicas = spec["properties"]["rolloutWorkers"]["properties"]["replicas"]
    assert replicas["minimum"] == 1 and replicas["default"] == 2 and replicas["description"]
    assert spec["properties"]["algorithm"]["properties"]["name"]["enum"] == ["PPO", "DQN", "BDQ", "QLearning", "SAC", "TD3"]


def test_every_spec_field_is_described():
    # A pod template's fields are Kubernetes' own: described down to the pod spec's fields (tolerations,
    # affinity, ...), whose own fields are Kubernetes' documented PodSpec (kuberl.api.pod_schema's size note).
    def walk(node, path):
        if "properties" in node:
            for key, child in node["properties"].items():
                if path.endswith(".template.spec") or path.endswith(".template.metadata"):
                    continue
                assert child.get("description"), f"{path}.{key} has no description (kubectl explain shows it)"
                walk(child, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], path + "[]")

    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")


# ---- numbers and sizes any job must keep to (kuberl.api.load's limits) ----------------------------------------


def _float_fields(model: type[BaseModel], path: tuple = ()) -> list[tuple[tuple, bool]]:
    """(alias path, is a list) of every float field of `model` and the models inside it."""
    found = []
    for name, field in model.model_fields.items():
        here = path + (field.alias or name,)
        union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)  # (X | None)
        for kind in typing.get_args(field.annotation) if union else (field.annotation,):
            if kind is float:
                found.append((here, False))
            elif typing.get_origin(kind) is list and typing.get_args(kind) == (float,):
                found.append((here, True))
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                found += _float_fields(kind, here)
    return found


FLOAT_FIELDS = _float_fields(RLTrainingJob)


def _set(data: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def test_the_float_fields_are_found():
    paths = {".".join(path) for path, _ in FLOAT_FIELDS}
    assert {"spec.stopping.maxWallClockSeconds", "spec.algorithm.ppo.learningRate", "spec.algorithm.bdq.tau",
            "spec.algorithm.qLearning.high", "status.progress.meanReturn"} <= paths
    assert len(paths) > 30


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_every_float_field_refuses_a_non_finite_number(job_dict, value):
    for path, is_list in FLOAT_FIELDS:
        data = copy.deepcopy(job_dict)
        _set(data, path, [value] if is_list else value)
        expected = ".".join(path) + ("[0]" if is_list else "")
        problems = {p.path: p.message for p in _problems(data)}
        assert problems.get(expected) == "Input should be a finite number", (expected, problems)


def test_integers_past_int64_are_refused_anywhere_and_int64_itself_is_not(job_dict):
    job_dict["spec"]["stopping"]["maxEnvSteps"] = 2**63
    job_dict["spec"]["environment"]["kwargs"] = {"low": -(2**63), "high": 2**63 - 1, "past": [-(2**63) - 1]}
    problems = _problems(job_dict)
    assert [(p.path, p.value) for p in problems] == [("spec.environment.kwargs.past[0]", -(2**63) - 1),
                                                     ("spec.stopping.maxEnvSteps", 2**63)]
    assert all("integers must be between -9223372036854775808 and 9223372036854775807" in p.message
               for p in problems)


def _nested(levels: int) -> dict:
    inner: dict = {}
    for _ in range(levels - 1):
        inner = {"x": inner}
    return inner


def test_a_job_dict_nests_at_most_max_depth_levels(job_dict):
    # kwargs is the fourth level (the document, spec, environment, kwargs)
    job_dict["spec"]["environment"]["kwargs"] = _nested(MAX_DEPTH - 3)
    parse_job(job_dict)
    job_dict["spec"]["environment"]["kwargs"] = _nested(MAX_DEPTH - 2)
    (p,) = _problems(job_dict)
    assert p.path == "spec.environment.kwargs" + ".x" * (MAX_DEPTH - 3)
    assert p.message == f"mappings and lists are nested {MAX_DEPTH + 1} levels deep here; a job may nest at most " \
                        f"{MAX_DEPTH}"


def test_a_cyclic_dict_is_refused_not_walked_forever(job_dict):
    loop: dict = {}
    loop["self"] = loop
    job_dict["spec"]["environment"]["kwargs"] = loop
    (p,) = _problems(job_dict)
    assert p.path.startswith("spec.environment.kwargs.self.self") and "a job may nest at most" in p.message


def test_a_dict_that_shares_its_lists_counts_each_use(job_dict):
    # What an alias bomb becomes once loaded: 9 levels of 9 references to one list, 387 million strings.
    level: list = ["lol"] * 9
    for _ in range(8):
        level = [level] * 9
    job_dict["spec"]["environment"]["kwargs"] = {"bomb": level}
    (p,) = _problems(job_dict)
    assert p.path.startswith("spec.environment.kwargs.bomb")
    assert f"the job holds more than {MAX_NODES} values" in p.message


def test_a_dict_holds_at_most_max_text_characters(job_dict):
    job_dict["spec"]["environment"]["kwargs"] = {"s": "x" * MAX_TEXT}
    (p,) = _problems(job_dict)
    assert p.path == "spec.environment.kwargs.s"
    assert f"more than {MAX_TEXT} characters of keys and values" in p.message


def test_a_huge_mapping_is_refused_at_its_path(job_dict):
    job_dict["spec"]["environment"]["kwargs"] = {f"k{i}": i for i in range(MAX_NODES)}
    (p,) = _problems(job_dict)
    assert p.path == "spec.environment.kwargs" and f"a job may hold at most {MAX_NODES}" in p.message


def test_an_override_is_validated_with_the_job_and_names_its_flag(job_dict):
    text = yaml.safe_dump(job_dict, sort_keys=False)
    workers = Override("--workers", ("spec", "rolloutWorkers", "replicas"), 1000)
    with pytest.raises(InvalidJob) as err:
        load_job_text(text, overrides=(workers,))
    (p,) = err.value.problems
    assert str(p) == "--workers (spec.rolloutWorkers.replicas): Input should be less than or equal to 512 " \
                     "[given: 1000]"  # no line: the file's line holds the value the flag replaced
    job = parse_with_overrides(job_dict, (dataclasses.replace(workers, value=3),))
    assert job.spec.rollout_workers.replicas == 3
    assert job_dict["spec"]["rolloutWorkers"]["replicas"] == 2  # the caller's dict is left alone


@pytest.mark.parametrize(("algorithm", "example", "width"), [("dqn", "cartpole-dqn.yaml", 128),
                                                           ("sac", "pendulum-sac.yaml", 256)])
def test_a_network_given_only_its_sizes_keeps_the_algorithms_activation(algorithm, example, width):
    """DQN's and SAC's networks are ReLU by default (PPO's tanh): a job that sets only hiddenSizes keeps ReLU,
    and one that sets nothing keeps the default widths too."""
    data = yaml.safe_load((REPO / "examples" / example).read_text())
    data["spec"]["algorithm"][algorithm] = {"network": {"hiddenSizes": [64, 64]}}
    network = getattr(parse_job(data).spec.algorithm, algorithm).network
    assert (network.hidden_sizes, network.activation) == ([64, 64], "relu")
    data["spec"]["algorithm"][algorithm] = {}
    network = getattr(parse_job(data).spec.algorithm, algorithm).network
    assert (network.hidden_sizes, network.activation) == ([width, width], "relu")

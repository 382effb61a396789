"""The CRD's CEL rules (`x-kubernetes-validations`) and patterns, evaluated as an API server would.

A real API server refuses a bad job at `kubectl apply` with these rules; here cel-python (celpy)
evaluates every rule of the committed CRD at the place in the schema where it stands, against good
and bad jobs, and the job model must agree with it on each. The schema's regex patterns are matched
with RE2 (google-re2, celpy's engine and the API server's) against the model's own checks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import celpy
import pytest
import re2
import yaml
from conftest import REPO
from kuberl.api import kube
from kuberl.api.load import InvalidJob, parse_job

CRD = yaml.safe_load((REPO / "crds" / "rltrainingjob.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLE = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    return _PROGRAMS[rule]


def _rules(schema: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, child in (schema.get("properties") or {}).items():
        yield from _rules(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _rules(schema["additionalProperties"], f"{path}[*]")
    if isinstance(schema.get("items"), dict):
        yield from _rules(schema["items"], f"{path}[*]")


ALL_RULES = [(path, rule["rule"]) for path, rule in _rules(SCHEMA)]


def cel_violations(value: Any, schema: dict = SCHEMA, path: str = "") -> list[tuple[str, str]]:
    """(schema path, message) of every rule the value breaks, walking the schema as the API server does."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, celpy.CELEvalError):  # an API server reports a rule that errors, too
            pytest.fail(f"rule at {path or '<root>'} failed to evaluate: {rule['rule']}: {result}")
        if not result:
            out.append((path, rule["message"]))
    if isinstance(value, dict):
        for key, item in value.items():
            child = (schema.get("properties") or {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                out += cel_violations(item, child, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += cel_violations(item, schema["items"], f"{path}[{i}]")
    return out


def job(change: Callable[[dict], Any]) -> dict:
    manifest = copy.deepcopy(EXAMPLE)
    change(manifest)
    return manifest


def spec(**fields: Any) -> Callable[[dict], Any]:
    return lambda m: m["spec"].update(fields)


def part(name: str, **fields: Any) -> Callable[[dict], Any]:
    return lambda m: m["spec"].setdefault(name, {}).update(fields)


def name(value: str) -> Callable[[dict], Any]:
    return lambda m: m["metadata"].update(name=value)


GPU = "nvidia.com/gpu"
BAD = {
    "name-starts-with-digit": (name("7-cartpole"), "", "metadata.name must be a DNS-1035 label"),
    "name-with-dot": (name("cartpole.ppo"), "", "metadata.name must be a DNS-1035 label"),
    "name-41-characters": (name("a" * 41), "", "metadata.name must be a DNS-1035 label"),
    "resource-without-domain": (part("learner", resources={"requests": {"gpu": "1"}}),
                                "spec.learner.resources", "requests: resource names must be"),
    "kubernetes-io-resource": (part("learner", resources={"limits": {"kubernetes.io/gpu": "1"}}),
                               "spec.learner.resources", "limits: resource names must be"),
    "hugepages-without-size": (part("head", resources={"limits": {"hugepages-big": "1Gi", "memory": "1Gi"}}),
                               "spec.head.resources", "limits: resource names must be"),
    "gpu-request-without-limit": (part("learner", resources={"requests": {GPU: "1"}}),
                                  "spec.learner.resources", "needs a limit of the same value"),
    "gpu-request-other-limits": (part("rolloutWorkers", resources={"requests": {GPU: "1"}, "limits": {"cpu": "1"}}),
                                 "spec.rolloutWorkers.resources", "needs a limit of the same value"),
    "hugepages-alone": (part("head", resources={"limits": {"hugepages-2Mi": "1Gi"}}),
                        "spec.head.resources", "hugepages need a cpu or memory"),
    "worker-node-selector-key": (part("rolloutWorkers", nodeSelector={"node pool": "a"}),
                                 "spec.rolloutWorkers.nodeSelector", "node selector keys must be label keys"),
    "learner-node-selector-prefix": (part("learner", nodeSelector={"Example.com/pool": "a"}),
                                     "spec.learner.nodeSelector", "node selector keys must be label keys"),
    "head-node-selector-long-key": (part("head", nodeSelector={"k" * 64: "a"}),
                                    "spec.head.nodeSelector", "node selector keys must be label keys"),
    "claim-and-size-limit": (lambda m: m["spec"]["checkpointing"].update(
        volume={"claimName": "checkpoints", "sizeLimit": "1Gi"}),
        "spec.checkpointing.volume", "claimName and sizeLimit exclude each other"),
    "s3-checkpoints-disabled": (lambda m: m["spec"]["checkpointing"].update(
        enabled=False, s3={"uri": "s3://ckpt/run"}), "spec.checkpointing", "with enabled: false there are none"),
    "s3-resume-from-itself": (lambda m: m["spec"]["checkpointing"].update(
        s3={"uri": "s3://ckpt/run", "resumeFrom": "s3://ckpt/run"}), "spec.checkpointing.s3",
        "resumeFrom names another run's checkpoints"),
    "s3-dot-dot-in-uri": (lambda m: m["spec"]["checkpointing"].update(s3={"uri": "s3://ckpt/../other/run"}),
                          "spec.checkpointing.s3", "a path has no '..' segment"),
    "s3-dot-dot-in-resume-from": (lambda m: m["spec"]["checkpointing"].update(
        s3={"uri": "s3://ckpt/run", "resumeFrom": "s3://ckpt/runs/.."}), "spec.checkpointing.s3",
        "a path has no '..' segment"),
    **{f"metrics-port-{port}": (spec(metrics={"port": port}), "spec.metrics.port", "must not be one of Ray's ports")
       for port in (6379, 6380, 8265, 10001, 10002, 15000, 19999, 52365)},
    "no-stopping-limit": (spec(stopping={"targetReturn": 475}), "spec.stopping", "at least one of maxEpisodes"),
    "async-ppo": (spec(collection={"mode": "async"}), "spec", "async needs an off-policy algorithm"),
    "serving-without-claim": (spec(serving={}), "spec", "serving needs checkpointing.volume.claimName"),
    "preference-file-and-config-map": (lambda m: m["spec"]["algorithm"].update(name="BDQ", bdq={"preference": {
        "pairsFile": "p.jsonl", "configMap": "pairs"}}), "spec.algorithm.bdq.preference",
        "pairsFile and configMap exclude each other"),
    "replicas-qlearning": (lambda m: (m["spec"]["algorithm"].update(name="QLearning"),
                                      m["spec"].update(learner={"replicas": 2})),
                           "spec", "needs a gradient-based algorithm"),
    "replicas-sac": (lambda m: (m["spec"]["algorithm"].update(name="SAC"), m["spec"]["environment"].update(
        id="Pendulum-v1"), m["spec"].update(learner={"replicas": 2})), "spec", "is not built for SAC and TD3 yet"),
    "replicas-td3": (lambda m: (m["spec"]["algorithm"].update(name="TD3"), m["spec"]["environment"].update(
        id="Pendulum-v1"), m["spec"].update(learner={"replicas": 2})), "spec", "is not built for SAC and TD3 yet"),
    "replicas-preference": (lambda m: (m["spec"]["algorithm"].update(name="BDQ", bdq={"preference": {}}),
                                       m["spec"].update(learner={"replicas": 2})),
                            "spec", "cannot be combined with algorithm.bdq.preference"),
    "self-play-settings-shared": (lambda m: m["spec"]["environment"].update(id="mpe2.simple_spread_v3:parallel_env",
        multiAgent={"policies": "shared", "selfPlay": {"refreshUpdates": 10}}), "spec.environment.multiAgent",
        "selfPlay is set only with policies: selfPlay"),
    "groups-without-policies-groups": (lambda m: m["spec"]["environment"].update(
        id="mpe2.simple_adversary_v3:parallel_env", multiAgent={"groups": {"a": ["adversary_0"], "b": ["agent_0"]}}),
        "spec.environment.multiAgent", "groups goes with policies: groups"),
    "policies-groups-without-groups": (lambda m: m["spec"]["environment"].update(
        id="mpe2.simple_adversary_v3:parallel_env", multiAgent={"policies": "groups"}),
        "spec.environment.multiAgent", "groups goes with policies: groups"),
    "serving-ports-equal": (lambda m: m["spec"].update(serving={"port": 9000, "metricsPort": 9000}, checkpointing={
        "volume": {"claimName": "checkpoints"}}), "spec.serving", "port and metricsPort must differ"),
}
GOOD = {
    "example": lambda m: None,
    "name-one-letter": name("a"),
    "name-40-characters": name("a" + "-b" * 19 + "c"),
    "metrics-ports-around-ray": spec(metrics={"port": 10000}),
    "metrics-port-20000": spec(metrics={"port": 20000}),
    "metrics-port-0": spec(metrics={"port": 0}),
    "serving-with-claim": lambda m: m["spec"].update(serving={"replicas": 2}, checkpointing={
        "volume": {"claimName": "checkpoints"}}),
    "gpu-request-equals-limit": part("learner", resources={"requests": {GPU: "1", "cpu": "1"},
                                                           "limits": {GPU: "1", "memory": "4Gi"}}),
    "gpu-limit-only": part("learner", resources={"limits": {GPU: "2"}}),
    "hugepages-with-memory": part("head", resources={"requests": {"hugepages-2Mi": "1Gi", "memory": "1Gi"},
                                                     "limits": {"hugepages-2Mi": "1Gi", "memory": "2Gi"}}),
    "extended-resource": part("rolloutWorkers", resources={"limits": {"example.com/fpga": "1", "cpu": "2"}}),
    "ephemeral-storage": part("rolloutWorkers", resources={"requests": {"ephemeral-storage": "1Gi"}}),
    "node-selectors": part("learner", nodeSelector={"kubernetes.io/arch": "amd64", "pool": "",
                                                    "node.kubernetes.io/instance-type": "g5.xlarge"}),
    "claim-only": lambda m: m["spec"]["checkpointing"].update(volume={"claimName": "ckpt.example"}),
    "size-limit-only": lambda m: m["spec"]["checkpointing"].update(volume={"sizeLimit": "500Mi"}),
    "async-dqn": lambda m: (m["spec"].update(collection={"mode": "async"}),
                            m["spec"]["algorithm"].update(name="DQN")),
    "episodes-only": spec(stopping={"maxEpisodes": 10}),
    "replicas-two-bdq": lambda m: (m["spec"]["algorithm"].update(name="BDQ"), m["spec"].update(learner={"replicas": 2})),
    "self-play": lambda m: m["spec"]["environment"].update(id="classic/tictactoe-v3", multiAgent={
        "policies": "selfPlay", "selfPlay": {"refreshUpdates": 0, "opponentEpsilon": 1}}),
    "self-play-defaults": lambda m: m["spec"]["environment"].update(id="classic/tictactoe-v3",
                                                                    multiAgent={"policies": "selfPlay"}),
    "policy-groups": lambda m: m["spec"]["environment"].update(id="mpe2.simple_adversary_v3:parallel_env", multiAgent={
        "policies": "groups", "groups": {"adversary": ["adversary_0"], "good": ["agent_0", "agent_1"]}}),
    "preference-config-map": lambda m: m["spec"]["algorithm"].update(name="BDQ", bdq={"preference": {
        "configMap": "pairs"}}),
}


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_passes_every_rule(path):
    assert cel_violations(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize("case", sorted(GOOD))
def test_good_job_passes_the_rules_and_the_model(case):
    manifest = job(GOOD[case])
    assert cel_violations(manifest) == []
    parse_job(manifest)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_job_is_refused_by_the_rule_and_by_the_model(case):
    change, where, message = BAD[case]
    manifest = job(change)
    violations = cel_violations(manifest)
    assert any(path == where and message in text for path, text in violations), violations
    with pytest.raises(InvalidJob):
        parse_job(manifest)


def test_every_rule_in_the_crd_is_exercised_by_a_bad_job():
    fired = set()
    for change, _, _ in BAD.values():
        manifest = job(change)
        for path, message in cel_violations(manifest):
            fired |= {(p, r["rule"]) for p, r in _rules(SCHEMA) if r["message"] == message and p == path}
    # Rules repeated on several resources and node selectors count once per place they stand.
    assert {rule for _, rule in ALL_RULES} == {rule for _, rule in fired}
    assert len(ALL_RULES) >= 10


# ---- the schema's patterns (RE2, as the API server matches them) agree with the model's checks ---------


def _agrees(pattern: str, check: Callable[[str], Any], samples: list[str], max_length: int | None = None) -> None:
    compiled = re2.compile(pattern)
    for sample in samples:
        try:
            check(sample)
            model_ok = True
        except ValueError:
            model_ok = False
        schema_ok = compiled.search(sample) is not None and (max_length is None or len(sample) <= max_length)
        assert schema_ok == model_ok, (pattern, sample, schema_ok, model_ok)


def test_quantity_pattern_agrees_with_the_model():
    _agrees(kube.QUANTITY_PATTERN, kube.check_quantity,
            ["1", "500m", "1.5", ".5", "1.", "2Gi", "4096Mi", "1e3", "1E-2", "+1", "0", "100n", "1u",
             "two", "2GB", "2 Gi", "-1", "1.2.3", "Gi", "", "1e", "1ki", "1e1.5"],
            max_length=kube.QUANTITY_MAX_LENGTH)


def test_label_value_pattern_agrees_with_the_model():
    _agrees(kube.LABEL_VALUE_PATTERN, kube.check_label_value,
            ["", "a", "amd64", "g5.xlarge", "A_b-c.d", "v" * 63, "v" * 64, "-a", "a-", "gpu nodes", "a/b"],
            max_length=63)


def test_claim_name_pattern_agrees_with_the_model():
    _agrees(kube.DNS_SUBDOMAIN_PATTERN, kube.check_dns_subdomain,
            ["c", "checkpoints", "ckpt.example.com", "a-b", "c" * 253, "c" * 254, "My_Claim", "-a", "a.", "a..b"],
            max_length=253)


def test_image_pattern_agrees_with_the_model():
    _agrees(kube.IMAGE_PATTERN, kube.check_image,
            ["busybox", "kuberl-trainer:test", "ghcr.io/kuberl/kuberl-trainer:0.1.0", "localhost:5000/a/b:tag",
             "registry.example.com/a__b/c-d:v1.2_3", "ghcr.io/kuberl/trainer@sha256:" + "a" * 64,
             "ghcr.io/kuberl/trainer:1@sha256:" + "0" * 64,
             "Ghcr.io/KubeRL/Trainer:1", "kuberl trainer:1", "ghcr.io/kuberl/trainer:-rc1", "a/b@sha256:xyz",
             "a:", "/a", "a//b", "a:b:c"])


def test_job_name_rule_and_resource_name_rule_agree_with_the_model():
    root = next(r["rule"] for r in SCHEMA["x-kubernetes-validations"])
    for sample in ["a", "cartpole-ppo", "a" * 40, "a" * 41, "7-up", "cartpole.ppo", "a-", "Abc"]:
        try:
            kube.check_job_name(sample)
            model_ok = True
        except ValueError:
            model_ok = False
        cel_ok = bool(_program(root).evaluate({"self": celpy.json_to_cel({"metadata": {"name": sample}})}))
        assert cel_ok == model_ok, sample
    resources = SCHEMA["properties"]["spec"]["properties"]["learner"]["properties"]["resources"]
    names_rule = resources["x-kubernetes-validations"][1]["rule"]  # the limits' names
    for sample in ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi", GPU, "example.com/fpga",
                   "gpu", "kubernetes.io/gpu", "node.kubernetes.io/x", "hugepages-big", "Example.com/x", "a/b/c"]:
        try:
            kube.check_resource_name(sample)
            model_ok = True
        except ValueError:
            model_ok = False
        cel_ok = bool(_program(names_rule).evaluate({"self": celpy.json_to_cel({"limits": {sample: "1"}})}))
        assert cel_ok == model_ok, sample


# ---- one declaration per rule: the CRD's CEL and the model's check agree on every job ---------------------


def _rule_messages() -> set[str]:
    return {rule["message"] for _, rule in _rules(SCHEMA)}


def _agreement_cases() -> dict[str, dict]:
    cases = {f"example-{p.stem}": yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))}
    cases.update({f"good-{name}": job(change) for name, change in GOOD.items()})
    cases.update({f"bad-{name}": job(change) for name, (change, _, _) in BAD.items()})
    for path in sorted((REPO / "tests" / "data" / "malformed").glob("*.yaml")):
        text = path.read_text(errors="replace")
        if "&" in text or "*" in text:
            continue  # YAML aliases: the loader refuses a bomb before expanding it; no rule reads it
        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError):
            continue  # refused before any rule could read it (YAML itself)
        if isinstance(data, dict):
            cases[f"malformed-{path.stem}"] = data
    return cases


AGREEMENT = _agreement_cases()


@pytest.mark.parametrize("case", sorted(AGREEMENT))
def test_the_crds_rules_and_the_models_checks_agree(case):
    """Each rule is declared once (kuberl.api.rules): where CEL refuses a job, the model refuses it at the
    same place with the same words; where the model refuses with a rule's words, CEL refuses it there."""
    manifest = AGREEMENT[case]
    try:
        cel = cel_violations(manifest)
    except Exception:  # noqa: BLE001 - a value CEL cannot even read (a YAML date, a huge int) has no rule result
        pytest.skip("not JSON data: the API server refuses it before any rule runs")
    try:
        parse_job(copy.deepcopy(manifest))
        model: list = []
    except InvalidJob as err:
        model = err.problems
    messages = _rule_messages()
    for path, message in cel:
        assert any(p.path.startswith(path) for p in model), (case, path, message, [str(p) for p in model])
        ran = [p for p in model if p.path == path and any(m in p.message for m in messages)]
        if ran:  # the model's own rule ran there (no field error came first): the same words
            assert any(message in p.message for p in ran), (case, message, [str(p) for p in ran])
    for problem in model:
        for message in messages:
            if message in problem.message:
                assert (problem.path, message) in cel, (case, problem.path, message, cel)

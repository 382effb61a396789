"""Malformed jobs (tests/data/malformed/*.yaml): refused with the field path, the value and what is allowed,
with the same text by `kuberl validate` and by the operator, and, on a real API server, either refused by
the server itself (the CRD's schema and CEL rules) or failed by the operator as InvalidSpec, before any pod,
Service or NetworkPolicy exists.

Each file names what it expects in its header: `# expect-path:` (a problem's field path) and
`# expect-message:` (a fragment of that problem's message); `# expect-given: no` marks a problem with the
document's shape (its size, nesting, characters) that has no single value to quote; `# cluster: no` marks
YAML-only mistakes that kubectl and the API server turn into JSON before an operator could see them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bed.common import wait_until
from bed.real_cluster import ApiError, ClusterNamespace
from conftest import REPO

from kuberl.api.load import InvalidJob, load_job_file
from kuberl.operator import lifecycle
from kuberl.operator.builders import BuildOptions
from kuberl.operator.jobs import JobLoop
from kuberl.trainer import cli
from kuberl.trainer.envs.resolve import check_environment

MALFORMED = sorted((REPO / "tests" / "data" / "malformed").glob("*.yaml"))
NS = "kuberl-malformed"


def expectation(path: Path) -> dict[str, str]:
    header = dict(re.findall(r"^# (expect-path|expect-message|expect-given|cluster): (.*)$", path.read_text(), re.MULTILINE))
    assert {"expect-path", "expect-message"} <= set(header), f"{path.name} names no expectation"
    return header


def on_cluster(path: Path) -> bool:
    return not expectation(path).get("cluster", "").startswith("no")


def cli_problems(path: Path, capsys) -> list[str]:
    """What `kuberl validate FILE` prints, one problem a line, without the line numbers only a file has."""
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is not a valid RLTrainingJob")
    return [re.sub(r" \(line \d+\)", "", line[4:], count=1) for line in err.splitlines()[1:]]


def operator_problems(body: dict) -> list[str]:
    """What the operator finds in the same job: its loop's validation, then what the builders check."""
    body = {**body, "metadata": {**body["metadata"], "namespace": NS, "uid": "u-1"}}
    from kuberl.operator.runtime import OperatorConfig, Runtime

    loop = JobLoop(Runtime(OperatorConfig()), body, logging.getLogger("test"))  # parsing makes no API call
    job, problems = loop._parse(body, json.dumps(body.get("spec"), sort_keys=True))
    if job is not None and not problems:
        problems = lifecycle.buildable(job, BuildOptions())
    return [str(problem) for problem in problems]


def test_there_are_at_least_30_malformed_jobs_each_naming_what_it_expects():
    assert len(MALFORMED) >= 30
    for path in MALFORMED:
        expectation(path)
    assert sum(on_cluster(p) for p in MALFORMED) >= 30


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.stem)
def test_malformed_job_is_refused_naming_field_value_and_what_is_allowed(path, capsys):
    expected = expectation(path)
    with pytest.raises(InvalidJob) as err:
        load_job_file(path, check=check_environment)
    matching = [p for p in err.value.problems if p.path == expected["expect-path"]]
    assert matching, f"no problem at {expected['expect-path']}: {err.value}"
    assert any(expected["expect-message"] in p.message for p in matching), str(err.value)
    problem = next(p for p in matching if expected["expect-message"] in p.message)
    if expected.get("expect-given") == "no":
        assert not problem.has_value
    elif problem.path != "spec":  # (a rule over the whole spec names the values it compared instead)
        assert problem.has_value and "[given: " in str(problem)
    assert problem.line is not None  # the file's line, for the user to find it

    # The same job, through `kuberl validate` and through the operator's validation: the same text.
    printed = cli_problems(path, capsys)
    assert any(expected["expect-path"] in line and expected["expect-message"] in line for line in printed)
    if on_cluster(path):  # as the operator gets it from the API server: JSON
        assert operator_problems(json.loads(json.dumps(yaml.safe_load(path.read_text())))) == printed


# ---- the operator for real: every malformed job against one operator ----------------------------------------


@pytest.fixture(scope="module")
def refused(cluster_session, tmp_path_factory) -> Iterator[tuple[ClusterNamespace, dict[str, dict]]]:
    """One namespace on the real API server and one operator; every malformed job created at once. Each
    ends either refused by the API server itself (the CRD's schema and CEL rules, nothing stored) or
    created and waited for until the operator failed it: {stem: {"refused": message} or the job's status}."""
    import kubernetes
    from bed.kopf_thread import run_kopf_in_thread

    from kuberl.operator.controllers import build_registry, memo_for
    from kuberl.operator.metrics import OperatorMetrics
    from kuberl.operator.runtime import OperatorConfig, Runtime

    cluster = ClusterNamespace(cluster_session, cluster_session.namespace_name("malformed"),
                               tmp_path_factory.mktemp("malformed"))
    cluster.create_namespace()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("KUBECONFIG", str(cluster.operator_kubeconfig))
            mp.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.operator_kubeconfig))
            runtime = Runtime(OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                                             build=BuildOptions(trainer_image="kuberl-trainer:test")),
                              api_client=cluster.operator_api_client(), metrics=OperatorMetrics())
            with run_kopf_in_thread(build_registry(login=False), namespaces=[cluster.namespace],
                                    memo=memo_for(runtime)):
                outcomes: dict[str, dict] = {}
                jobs = {p.stem: yaml.safe_load(p.read_text()) for p in MALFORMED if on_cluster(p)}
                for stem, body in jobs.items():
                    body["metadata"]["namespace"] = cluster.namespace
                    try:  # as `kubectl apply` sends it: unknown fields are refused, not pruned away
                        cluster.create(body, fieldValidation="Strict")
                    except ApiError as err:
                        # 400: strict decoding (an unknown field); 422: the schema or a CEL rule
                        assert err.status in (400, 422), err
                        outcomes[stem] = {"refused": err.body["message"]}
                for stem, body in jobs.items():
                    if stem not in outcomes:
                        outcomes[stem] = cluster.wait_for(
                            "rltj", body["metadata"]["name"],
                            lambda obj: (obj.get("status") or {}).get("phase") == "Failed", timeout=60)["status"]
                yield cluster, outcomes
    finally:
        cluster.tear_down()


@pytest.mark.parametrize("path", [p for p in MALFORMED if on_cluster(p)], ids=lambda p: p.stem)
def test_the_server_or_the_operator_refuses_the_malformed_job_before_any_child_exists(refused, path, capsys):
    cluster, outcomes = refused
    expected = expectation(path)
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    outcome = outcomes[path.stem]
    if "refused" in outcome:
        # `kubectl apply` would print this: the server's own message, naming the field or the one holding it
        # (a CEL rule over a map names the map, not the key).
        assert names_the_field(expected["expect-path"], outcome["refused"]), outcome["refused"]
        assert cluster.get("rltj", name) is None
    else:
        assert outcome["reason"] == "InvalidSpec"
        assert expected["expect-path"] in outcome["message"] and expected["expect-message"] in outcome["message"]
        assert outcome["message"] == "; ".join(cli_problems(path, capsys))  # word for word `kuberl validate`
        failed = next(c for c in outcome["conditions"] if c["type"] == "Failed")
        assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
        # Every status the job ever had was Failed: it never went through Pending or Starting.
        phases = {(version.get("status") or {}).get("phase") for version in cluster.history("rltj", name) if version}
        assert phases <= {None, "Failed"}
        # kopf posts Events from a queue of its own, so the Event may land after the Failed status.
        wait_until(lambda: "InvalidSpec" in [e["reason"] for e in cluster.events(involved_name=name)], 60, 0.2,
                   f"the InvalidSpec Event of {name}")
    # Nothing was created for it, or for any other malformed job: not a pod, Service or NetworkPolicy.
    created = [e["requestURI"] for e in cluster.requests()
               if e["verb"] == "create" and e["objectRef"]["resource"] in ("pods", "services", "networkpolicies",
                                                                           "poddisruptionbudgets")]
    assert created == []
    assert cluster.list("pods") == [] and cluster.list("services") == []


def names_the_field(path: str, message: str) -> bool:
    """Whether a server's refusal names the field at `path` (our wording) or the map or object holding it."""
    segments = [segment for segment in re.sub(r"\[[^\]]*\]", "", path).split(".") if segment]
    return any(segment in message for segment in segments[-3:])  # (a map key may hold dots itself)

"""Malformed jobs (tests/data/malformed/*.yaml): refused with the field path, the value and what is allowed,
with the same text by `kuberl validate` and by the operator, and - through the operator running for real
against the API emulator - failed as InvalidSpec before any pod, Service or NetworkPolicy exists.

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

import kmock
import pytest
import yaml
from bed.k8s_emulator import ALL_VERBS, EmulatedCluster, KubernetesApiEmulator, load_crds
from conftest import REPO
from kuberl.api.load import InvalidJob, load_job_file
from kuberl.operator import lifecycle
from kuberl.operator.builders import BuildOptions
from kuberl.operator.handlers import JobLoop
from kuberl.trainer import cli
from kuberl.trainer.envs.resolve import check_environment

MALFORMED = sorted((REPO / "tests" / "data" / "malformed").glob("*.yaml"))
NS = "kuberl-malformed"
NETWORK_POLICIES = kmock.resource("networking.k8s.io", "v1", "networkpolicies")


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
def refused(tmp_path_factory) -> Iterator[tuple[EmulatedCluster, dict[str, dict]]]:
    """One API emulator and one operator; every malformed job created at once, each waited for until Failed."""
    import kubernetes
    from bed.k8s_fixtures import run_kopf_in_thread
    from kuberl.operator.handlers import build_registry, memo_for
    from kuberl.operator.metrics import OperatorMetrics
    from kuberl.operator.runtime import OperatorConfig, Runtime

    emulator = KubernetesApiEmulator(
        crds=load_crds(), namespaces=["default", NS],
        extra_resources={NETWORK_POLICIES: kmock.ResourceInfo(
            kind="NetworkPolicy", singular="networkpolicy", namespaced=True, verbs=ALL_VERBS,
            shortnames={"netpol"}, categories=set(), subresources=set())})
    with pytest.MonkeyPatch.context() as mp, \
            EmulatedCluster(emulator, tmp_path_factory.mktemp("k8s"), namespace=NS) as cluster:
        mp.setenv("KUBECONFIG", str(cluster.kubeconfig))
        mp.setenv("KUBECACHEDIR", str(cluster.kubecache_dir))
        mp.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
        runtime = Runtime(OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                                         build=BuildOptions(trainer_image="kuberl-trainer:test")),
                          api_client=cluster.api_client(), metrics=OperatorMetrics())
        with run_kopf_in_thread(build_registry(login=False), namespaces=[NS], memo=memo_for(runtime)):
            jobs = {p.stem: yaml.safe_load(p.read_text()) for p in MALFORMED if on_cluster(p)}
            for body in jobs.values():
                cluster.create(body, namespace=NS)
            statuses = {
                stem: cluster.wait_for("rltj", body["metadata"]["name"],
                                       lambda obj: (obj.get("status") or {}).get("phase") == "Failed",
                                       timeout=60)["status"]
                for stem, body in jobs.items()
            }
            yield cluster, statuses
    assert not emulator.internal_errors, emulator.internal_errors


@pytest.mark.parametrize("path", [p for p in MALFORMED if on_cluster(p)], ids=lambda p: p.stem)
def test_operator_fails_the_malformed_job_as_invalid_spec_before_any_pod_exists(refused, path, capsys):
    cluster, statuses = refused
    expected = expectation(path)
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    status = statuses[path.stem]
    assert status["reason"] == "InvalidSpec"
    assert expected["expect-path"] in status["message"] and expected["expect-message"] in status["message"]
    assert status["message"] == "; ".join(cli_problems(path, capsys))  # word for word what `kuberl validate` says
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    # Every status the job ever had was Failed: it never went through Pending or Starting.
    phases = {(version.get("status") or {}).get("phase") for version in cluster.history("rltj", name) if version}
    assert phases <= {None, "Failed"}
    assert "InvalidSpec" in [e["reason"] for e in cluster.events(NS, involved_name=name)]
    # Nothing was created for it, or for any other malformed job: not a pod, Service or NetworkPolicy.
    created = [(r.resource.plural, r.url) for r in cluster.emulator
               if r.method == "POST" and r.resource and r.resource.plural in ("pods", "services", "networkpolicies")]
    assert created == []
    assert cluster.list("pods", namespace=NS) == [] and cluster.list("services", namespace=NS) == []

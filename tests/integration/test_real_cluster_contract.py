"""What only a real API server can say about KubeRL's manifests and the operator's children.

On the session's control plane (tests/bed/control_plane.py): the chart installs with `helm install`, CRD
included, and Pod Security `restricted` admits the operator's pod; every example applies as `kubectl apply`
sends it; `kubectl explain` answers from the server's schema; a template's labels and annotations survive
pruning; every object the operator creates for every example is admitted in a `restricted` namespace; a
dozen realistic template mistakes each end refused or InvalidSpec with no child; `kubectl delete rltj`
leaves nothing behind and the namespace deletes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from bed.real_cluster import ApiError, ClusterNamespace, Rest, volume_claim
from conftest import REPO
from integration.test_operator_integration import (  # noqa: F401 (fixtures)
    HEAD,
    JOB,
    LEARNER,
    WAIT,
    children,
    cluster,
    job_manifest,
    operator,
    start_operator,
    wait_pods,
    wait_until,
    worker,
)

from kuberl.api.load import parse_job
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
#: The CRD's budget, as JSON: the docs install it server-side (no 256 KiB last-applied annotation) or with
#: the chart, whose release Secret holds it gzipped within its 1 MiB; etcd takes requests up to 1.5 MiB.
CRD_BUDGET_BYTES = 1024 * 1024


def test_the_crd_stays_in_its_budget_and_the_docs_apply_it_server_side():
    crd = yaml.safe_load((REPO / "crds" / "rltrainingjob.yaml").read_text())
    assert len(json.dumps(crd, separators=(",", ":"))) < CRD_BUDGET_BYTES
    install = (REPO / "docs" / "install.md").read_text()
    assert "kubectl apply --server-side -f charts/kuberl-operator/crds/" in install
    assert "kubectl apply -f charts/kuberl-operator/crds/" not in install


def test_helm_install_of_the_chart_and_pod_security_admits_the_operator(cluster: ClusterNamespace):
    """`helm install` for real (the CRD is there already: helm leaves it), then the Deployment controller's
    pod for the operator passes Pod Security `restricted` in the release namespace."""
    from tools import helm_binary

    # (a namespace name is a DNS label: at most 63 characters, ending in a letter or digit)
    release, namespace = "contract", f"{cluster.namespace[:60].rstrip('-')}-op"
    helm = [str(helm_binary()), f"--kubeconfig={cluster.kubeconfig}"]
    done = subprocess.run([*helm, "install", release, str(REPO / "charts" / "kuberl-operator"), "-n", namespace,
                           "--create-namespace"],
                          capture_output=True, text=True, timeout=120, check=False)
    try:
        assert done.returncode == 0, done.stderr
        pods = wait_until(lambda: cluster.list("pods", namespace), what="the operator's pod from its ReplicaSet")
        (pod,) = pods
        assert pod["spec"]["serviceAccountName"].startswith(release)
        events = [e["message"] for e in cluster.events(namespace) if e["reason"] == "FailedCreate"]
        assert events == []
    finally:
        subprocess.run([*helm, "uninstall", release, "-n", namespace], capture_output=True, timeout=120, check=False)
        cluster.delete("namespaces", namespace)


def test_every_example_applies_as_kubectl_sends_it(cluster: ClusterNamespace):
    for example in EXAMPLES:
        done = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-n", cluster.namespace,
                               "-f", str(example), check=False)
        assert done.returncode == 0, f"{example.name}: {done.stderr}"
        assert "serverside-applied (server dry run)" in done.stdout, done.stdout


def test_kubectl_explain_answers_from_the_server(cluster: ClusterNamespace):
    explained = cluster.kubectl("explain", "rltj.spec.learner.template").stdout
    assert "FIELD: template" in explained and "metadata" in explained and "spec" in explained


def test_template_labels_and_annotations_survive_pruning(cluster: ClusterNamespace, job_dict):
    metadata = {"labels": {"team": "rl", "cost-center": "4711"}, "annotations": {"example.com/owner": "ana"}}
    job_dict["spec"]["learner"] = {**job_dict["spec"].get("learner", {}), "template": {"metadata": metadata}}
    created = cluster.create(job_dict, fieldValidation="Strict")
    assert created["spec"]["learner"]["template"]["metadata"] == metadata
    assert cluster.get("rltj", JOB)["spec"]["learner"]["template"]["metadata"] == metadata


def test_ephemeral_containers_which_no_pod_is_created_with_are_no_template_field(cluster: ClusterNamespace, job_dict):
    """The API server refuses a pod created with ephemeral containers, so the templates' schema leaves them out
    (kuberl.api.pod_schema.generate): a template giving them is refused at apply, not at the pod's creation."""
    from kuberl.api.pod_schema import EPHEMERAL_CONTAINERS

    container = {"name": "debug", "image": "busybox"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "with-ephemeral"},
           "spec": {"containers": [{"name": "main", "image": "busybox"}], EPHEMERAL_CONTAINERS: [container]}}
    with pytest.raises(ApiError) as refused:
        cluster.create(pod, cluster.namespace, dryRun="All")
    assert refused.value.status == 422 and EPHEMERAL_CONTAINERS in str(refused.value), refused.value
    job_dict["spec"]["learner"] = {**job_dict["spec"].get("learner", {}),
                                   "template": {"spec": {EPHEMERAL_CONTAINERS: [container]}}}
    with pytest.raises(ApiError) as unknown:
        cluster.create(job_dict, fieldValidation="Strict", dryRun="All")
    assert unknown.value.status == 400 and f"unknown field \"spec.learner.template.spec.{EPHEMERAL_CONTAINERS}\"" \
        in str(unknown.value), unknown.value


def _objects_of(job_body: dict, namespace: str) -> list[dict]:
    """Every object the operator creates for a job (`builders.every_object`, as `kuberl validate --server`)."""
    job = parse_job({**job_body, "metadata": {**job_body["metadata"], "namespace": namespace}})
    return builders.every_object(job, BuildOptions(trainer_image="ghcr.io/kuberl/kuberl-trainer:0.1.0"),
                                 ray_token="t" * 64)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_everything_the_operator_creates_for_an_example_is_admitted_in_a_restricted_namespace(
        cluster: ClusterNamespace, example):
    """Server-side dry runs as the operator's ServiceAccount: validation, Pod Security `restricted` (the
    namespace is labelled so), quota and the operator's RBAC, for every object of every example job."""
    body = yaml.safe_load(example.read_text())
    for name in {pod["spec"].get("priorityClassName") for pod in _objects_of(body, cluster.namespace)
                 if pod["kind"] == "Pod"} - {None}:
        # A PriorityClass an example names is the platform team's to create, once per cluster.
        if cluster.get("priorityclasses", name) is None:
            cluster.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name}, "value": 1000})
    operator = Rest(cluster.plane, cluster.operator_token)
    refused = []
    for manifest in _objects_of(body, cluster.namespace):
        resource = {"Pod": "pods", "Service": "services", "NetworkPolicy": "networkpolicies",
                    "PodDisruptionBudget": "poddisruptionbudgets",
                    "Secret": "secrets", "ConfigMap": "configmaps", "Deployment": "deployments"}[manifest["kind"]]
        try:
            operator.call("POST", operator.url(resource, cluster.namespace), body=manifest,
                          params={"dryRun": "All", "fieldValidation": "Strict"})
        except ApiError as err:
            refused.append(f"{manifest['kind']} {manifest['metadata']['name']}: {err}")
    assert refused == []


#: Realistic mistakes in a learner's pod template that only the API server knows, each with a fragment
#: of the server's own words.
TEMPLATE_MISTAKES = {
    "mount-of-an-undeclared-volume": ({"spec": {"containers": [{"name": "learner", "volumeMounts": [
        {"name": "data", "mountPath": "/data"}]}]}}, 'Not found: "data"'),
    "toleration-effect-that-does-not-exist": (
        {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "Sometimes"}]}}, "Sometimes"),
    "label-value-of-64-characters": ({"metadata": {"labels": {"team": "x" * 64}}}, "must be no more than 63"),
    "annotation-key-with-a-space": ({"metadata": {"annotations": {"bad key": "v"}}}, "bad key"),
    "two-volumes-of-one-name": ({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}},
                                                      {"name": "scratch", "emptyDir": {}}]}}, "Duplicate value"),
    "a-volume-of-two-kinds": ({"spec": {"volumes": [{"name": "both", "emptyDir": {},
                                                     "configMap": {"name": "settings"}}]}},
                              "may not specify more than 1 volume type"),
    "container-port-out-of-range": ({"spec": {"containers": [{"name": "learner", "ports": [
        {"containerPort": 70000}]}]}}, "70000"),
    "node-selector-value-with-spaces": ({"spec": {"nodeSelector": {"pool": "gpu pool"}}}, "gpu pool"),
    "dns-policy-that-does-not-exist": ({"spec": {"dnsPolicy": "Whatever"}}, "Whatever"),
    "host-alias-with-a-bad-address": ({"spec": {"hostAliases": [{"ip": "10.0.0.300", "hostnames": ["db"]}]}},
                                      "10.0.0.300"),
    "env-var-name-with-an-equals-sign": ({"spec": {"containers": [{"name": "learner", "env": [
        {"name": "A=B", "value": "1"}]}]}}, "A=B"),
    "hostname-with-an-underscore": ({"spec": {"hostname": "learner_1"}}, "learner_1"),
}


def test_a_dozen_template_mistakes_each_end_refused_or_invalid_with_no_child(cluster: ClusterNamespace, operator,
                                                                              job_dict):
    """Each job either never exists (`kubectl apply` refuses it) or the operator's dry run of its children
    fails it InvalidSpec with the server's message; in both cases no object of it exists."""
    names = {}
    for i, (what, (template, _)) in enumerate(TEMPLATE_MISTAKES.items()):
        body = json.loads(json.dumps(job_dict))
        body["metadata"] = {"name": f"mistake-{i}", "namespace": cluster.namespace}
        body["spec"]["learner"] = {**body["spec"].get("learner", {}), "template": template}
        body["spec"]["rolloutWorkers"]["replicas"] = 1
        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
        names[what] = (body["metadata"]["name"], done)
    outcomes = {}
    for what, (name, applied) in names.items():
        if applied.returncode != 0:
            outcomes[what] = applied.stderr
            continue
        status = cluster.wait_for("rltj", name, lambda o: (o.get("status") or {}).get("phase") == "Failed",
                                  timeout=WAIT)["status"]
        assert status["reason"] == "InvalidSpec", (what, status)
        outcomes[what] = status["message"]
    for what, (_, fragment) in TEMPLATE_MISTAKES.items():
        assert fragment in outcomes[what], (what, outcomes[what])
    # Most of them only the server knows (its dry run of the children); a few our own checks catch first.
    by_server = [what for what, message in outcomes.items() if "the API server refused" in message]
    assert len(by_server) >= 9, outcomes
    assert [e["requestURI"] for e in cluster.requests() if e["verb"] == "create"
            and e["objectRef"]["resource"] != "events" and "dryRun=" not in e["requestURI"]] == []
    assert cluster.list("pods") == [] and cluster.list("services") == []


def test_kubectl_delete_leaves_nothing_and_the_namespace_deletes(cluster: ClusterNamespace, operator, job_dict):
    """The garbage collector removes a deleted job's children by their ownerReferences; then the namespace
    deletion finishes (nothing holds it: no finalizer left behind)."""
    for manifest in volume_claim("cartpole-checkpoints", cluster.namespace):
        cluster.create(manifest)
    job_dict["spec"]["checkpointing"] = {"volume": {"claimName": "cartpole-checkpoints"}}
    cluster.create(job_manifest(job_dict, replicas=2), namespace=cluster.namespace)
    wait_pods(cluster, {HEAD, LEARNER, worker(0), worker(1)})
    assert len(children(cluster)) > 4
    cluster.kubectl("delete", "rltj", JOB, "--wait=true", "--timeout=25s")
    wait_until(lambda: children(cluster) == [], what="every child of the job gone")
    cluster.delete("namespaces", cluster.namespace)
    cluster.wait_for_absent("namespaces", cluster.namespace, timeout=60)


def test_the_operator_credentials_cannot_read_secrets(cluster: ClusterNamespace):
    operator = Rest(cluster.plane, cluster.operator_token)
    with pytest.raises(ApiError) as refused:
        operator.call("GET", operator.url("secrets", cluster.namespace))
    assert refused.value.status == 403


def test_kuberl_validate_server_asks_the_api_server_and_creates_nothing(cluster: ClusterNamespace, tmp_path,
                                                                          job_dict):
    import os
    import sys
    from pathlib import Path

    kuberl = [str(Path(sys.executable).parent / "kuberl"), "validate", "--server"]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}  # a person's context, in the test's namespace
    good = subprocess.run([*kuberl, str(REPO / "examples" / "cartpole-ppo.yaml")], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert good.returncode == 0, good.stderr
    assert f"accepts cartpole-ppo in namespace {cluster.namespace}" in good.stdout

    job_dict["spec"]["learner"] = {"template": {"spec": {"tolerations": [
        {"key": "gpu", "operator": "Exists", "effect": "Sometimes"}]}}}
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(job_dict))
    bad = subprocess.run([*kuberl, str(bad_file)], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "the API server refuses the Pod cartpole-ppo-learner the operator would create" in bad.stderr
    assert "Sometimes" in bad.stderr
    assert cluster.list("rltrainingjobs") == [] and cluster.list("pods") == []

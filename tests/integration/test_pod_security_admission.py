"""Our Pod Security check held to the API server's own admission: a generated corpus of pod templates
(tests/pod_security_corpus.py, seeded) goes through both.

- Ours: what the operator decides before it creates anything, `kuberl.api.tenancy.template_problems` (the
  template merged onto the role's pod, checked at the namespace's level), its Pod Security part.
- The server's: the pod the operator would create (the builders' pod with the template merged, as
  `kuberl.operator.builders` does it), sent as a server-side dry run to namespaces that enforce `baseline`
  and `restricted` at `latest`, the newest policy version this kube-apiserver has.

Every case where one admits and the other refuses is a disagreement; the test fails on any that is not in
DELIBERATELY_STRICTER (each listed, with its reason, in docs/security.md). A pod the API refuses as
invalid (422) is not counted: neither check reaches it. The corpus is known to reach every control: each
was drawn, and each refusing draw was refused by the server at least once.

The chart's ValidatingAdmissionPolicy (kuberl.operator.admission_policy) is held to the same corpus: in
namespaces whose Pod Security admission enforces nothing, it alone must refuse exactly what our check
refuses at the allowance the chart's `tenancy` values give each namespace; and a user who may create pods
cannot create one labelled as a job's that the allowance refuses.

KUBERL_PSA_CORPUS=N sets the corpus size (CI: 240); KUBERL_PSA_RESULTS=path writes the tally there
(`bench/bench_pod_security.py` runs this module so, with a larger corpus).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from bed.common import OPERATOR_NAMESPACE, wait_until
from bed.real_cluster import ApiError, Rest
from conftest import REPO
from tools import helm_binary
from pod_security_corpus import CONTROLS, Corpus

from kuberl.api import pod_security, pod_template, tenancy
from kuberl.api.load import parse_job
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions

SEED = 20261127
SIZE = int(os.environ.get("KUBERL_PSA_CORPUS", "240"))
LEVELS = (pod_security.BASELINE, pod_security.RESTRICTED)
ROLES = ("head", "rolloutWorkers", "learner", "serving")
#: (control, level) pairs where ours refuses what the server admits on purpose: docs/security.md says why.
DELIBERATELY_STRICTER: dict[tuple[str, str], str] = {}
#: Controls no valid template of ours can bring to the server's admission; kuberl.api.pod_security still
#: checks them (tests/unit/test_pod_security.py), and docs/security.md lists them.
UNREACHABLE = {
    "windowsHostProcess": "the API refuses hostProcess except on a Windows pod whose containers are all HostProcess "
                          "with hostNetwork, and the operator's pods carry Linux-only fields",
    "appArmorProfile": "the field came in Kubernetes 1.30; the template schema is PodTemplateSpec of 1.27 (the oldest "
                       "Kubernetes the chart supports), which refuses it first",
}


def built_pods() -> dict[str, dict]:
    """The pod the operator builds for each role of the CartPole example (serving switched on)."""
    body = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
    body["spec"]["serving"] = {}
    body["spec"]["checkpointing"]["volume"] = {"claimName": "cartpole-checkpoints"}
    job = parse_job(body)
    options = BuildOptions(trainer_image="registry.local/kuberl-trainer:test")
    serving = builders.build_serving_deployment(job, options)["spec"]["template"]
    return {"head": builders.build_head_pod(job, options), "rolloutWorkers": builders.build_worker_pod(job, options, 0),
            "learner": builders.build_learner_pod(job, options),
            "serving": {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {**serving["metadata"], "name": "cartpole-ppo-serving"}, "spec": serving["spec"]}}


def ours(template: dict, role: str, level: str) -> list[str]:
    """The Pod Security refusals the operator makes for this template at this level."""
    found = tenancy.template_problems(template, role, tenancy.Allowance(pod_security=level))
    return [f"{'.'.join(map(str, path))}: {message}" for path, message in found if message.startswith("Pod Security")]


def server(admin, pod: dict, namespace: str, refusal: str = "violates PodSecurity") -> tuple[str, str]:
    """("admitted" | "refused" | "invalid", the server's message) for a dry-run create of `pod`; "refused"
    is a 403 whose message contains `refusal`."""
    body = {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}
    body["metadata"].pop("ownerReferences", None)
    try:
        admin.call("POST", admin.url("pods", namespace), body=body, params={"dryRun": "All"})
    except ApiError as err:
        message = err.body.get("message", "")
        if err.status == 403 and refusal in message:
            return "refused", message
        if err.status == 422:
            return "invalid", message
        raise
    return "admitted", ""


def make_namespace(cluster_session, name: str, enforce: str) -> str:
    admin = cluster_session.admin
    name = cluster_session.namespace_name(name)
    admin.call("POST", admin.url("namespaces", None), body={"metadata": {"name": name, "labels": {
        "pod-security.kubernetes.io/enforce": enforce, "pod-security.kubernetes.io/enforce-version": "latest"}}})
    # Pods name no ServiceAccount: admission needs the namespace's `default` one.
    wait_until(lambda: admin.call("GET", admin.url("serviceaccounts", name, "default")), 60, 0.1,
               f"the default ServiceAccount of {name}")
    return name


@pytest.fixture(scope="module")
def namespaces(cluster_session):
    """One namespace per level, enforcing it at the newest policy version the server has."""
    names = {level: make_namespace(cluster_session, f"psa-{level}", level) for level in LEVELS}
    yield names
    for name in names.values():
        cluster_session.admin.call("DELETE", cluster_session.admin.url("namespaces", None, name))


@dataclass
class Outcome:
    tally: Counter = field(default_factory=Counter)
    refused_alone: Counter = field(default_factory=Counter)  # control -> refusals where it was the only bad one
    disagreements: list = field(default_factory=list)
    stricter: list = field(default_factory=list)
    invalid: list = field(default_factory=list)


def differential(corpus: Corpus, submit) -> Outcome:
    """Every case of the corpus at every level: our verdict against `submit(pod, level)`'s."""
    pods = built_pods()
    out = Outcome()
    for case in corpus.cases():
        try:
            pod_template.check(case.template, case.role)
        except pod_template.TemplateProblems:
            out.tally["refused by the template schema"] += 1  # never reaches a pod: nothing to compare
            continue
        pod = pod_template.merge(pods[case.role], case.template, case.role)
        for level in LEVELS:
            verdict, message = submit(pod, level)
            if verdict == "invalid":
                out.tally["invalid pods (422)"] += 1
                out.invalid.append({"drawn": case.drawn, "server": message[:300]})
                continue
            mine = ours(case.template, case.role, level)
            out.tally[f"compared at {level}"] += 1
            bad = [name for name, v in case.drawn if v == "bad"]
            if verdict == "refused" and len(bad) == 1:
                out.refused_alone[bad[0]] += 1
            if bool(mine) == (verdict == "refused"):
                continue
            record = {"case": case.number, "role": case.role, "level": level, "drawn": case.drawn,
                      "template": case.template, "ours": mine, "server": message or "admitted"}
            if mine and any((name, level) in DELIBERATELY_STRICTER for name, _ in case.drawn):
                out.stricter.append(record)
            else:
                out.disagreements.append(record)
    return out


def record(corpus: Corpus, outcome: Outcome, what: str) -> None:
    results = os.environ.get("KUBERL_PSA_RESULTS")
    if not results:
        return
    path = Path(results)
    found = json.loads(path.read_text()) if path.exists() else {}
    found[what] = {
        "seed": SEED, "templates": SIZE, "tally": dict(outcome.tally), "disagreements": len(outcome.disagreements),
        "deliberately_stricter": len(outcome.stricter),
        "reached": {f"{c} {v}": n for (c, v), n in sorted(corpus.reached.items())},
        "refused_by_the_server_alone": dict(outcome.refused_alone),
        "first_disagreements": outcome.disagreements[:50], "first_invalid": outcome.invalid[:30]}
    path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def check_outcome(corpus: Corpus, outcome: Outcome) -> None:
    assert not outcome.disagreements, (json.dumps(outcome.disagreements[:5], indent=1)
                                       + f"\n({len(outcome.disagreements)} in all)")
    # The corpus reached every control, both ways, and the server itself refused every refusing one.
    drawn = {c for c, _ in corpus.reached}
    assert drawn == set(CONTROLS), set(CONTROLS) - drawn
    refusing = {c for c, v in corpus.reached if v == "bad"}
    assert refusing == set(CONTROLS) - {"hostUsers"}, set(CONTROLS) - refusing
    missing = refusing - set(UNREACHABLE) - set(outcome.refused_alone)
    assert not missing, missing
    tally = outcome.tally
    assert tally["compared at restricted"] >= SIZE // 2 and tally["compared at baseline"] >= SIZE // 2, tally


def test_our_pod_security_check_agrees_with_the_api_servers_admission(cluster_session, namespaces):
    corpus = Corpus(SEED, SIZE, ROLES, pod_template.MAIN_CONTAINERS)
    outcome = differential(corpus, lambda pod, level: server(cluster_session.admin, pod, namespaces[level]))
    record(corpus, outcome, "pod_security_admission")
    check_outcome(corpus, outcome)


# ---- the chart's ValidatingAdmissionPolicy --------------------------------------------------------------

POLICY_REFUSAL = "ValidatingAdmissionPolicy"


@pytest.fixture(scope="module")
def policy(cluster_session):
    """The chart's policy, binding and tenancy ConfigMap as `helm install` renders them, for three namespaces
    whose own Pod Security admission enforces nothing: one allowed baseline, one restricted with a
    ServiceAccount, one the values do not name (the default: restricted, no ServiceAccount)."""
    names = {"baseline": make_namespace(cluster_session, "vap-baseline", "privileged"),
             "restricted": make_namespace(cluster_session, "vap-restricted", "privileged"),
             "unnamed": make_namespace(cluster_session, "vap-unnamed", "privileged")}
    tenancy_values = {names["baseline"]: {"podSecurity": "baseline"},
                      names["restricted"]: {"podSecurity": "restricted", "serviceAccounts": ["trainer"]}}
    rendered = subprocess.run(
        [str(helm_binary()), "template", "kuberl", str(REPO / "charts" / "kuberl-operator"), "--namespace",
         OPERATOR_NAMESPACE, "--kube-version", "1.37.0", "--show-only", "templates/admission-policy.yaml",
         "--set-json", f"tenancy.namespaces={json.dumps(tenancy_values)}"],
        capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["kind"] for d in docs} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap"}
    cluster_session.plane.apply(rendered)
    admin = cluster_session.admin
    try:
        # The API server picks up a new policy from its informer: wait until it refuses a privileged pod.
        probe = privileged_pod()
        wait_until(lambda: server(admin, probe, names["unnamed"], POLICY_REFUSAL)[0] == "refused", 60, 0.2,
                   "the ValidatingAdmissionPolicy in force")
        yield names
    finally:
        cluster_session.plane.kubectl("delete", "-f", "-", stdin=rendered, check=False)
        for name in names.values():
            admin.call("DELETE", admin.url("namespaces", None, name))


def privileged_pod(labels: dict | None = None) -> dict:
    pod = copy.deepcopy(built_pods()["learner"])
    pod["metadata"]["labels"] = labels if labels is not None else pod["metadata"]["labels"]
    pod["spec"]["containers"][0]["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    return pod


def test_the_charts_admission_policy_refuses_what_our_check_refuses(cluster_session, policy):
    corpus = Corpus(SEED, SIZE, ROLES, pod_template.MAIN_CONTAINERS)
    outcome = differential(corpus, lambda pod, level: server(cluster_session.admin, pod, policy[level], POLICY_REFUSAL))
    record(corpus, outcome, "admission_policy")
    check_outcome(corpus, outcome)


def test_a_user_who_may_create_pods_cannot_create_a_kuberl_pod_its_namespace_does_not_allow(cluster_session, policy):
    """The operator is not in the way here: a tenant with `create pods` copies a job pod's labels onto a
    privileged pod, or names a ServiceAccount, and the API server refuses it; the same pod without the
    labels is the namespace's own business (its Pod Security admission, here enforcing nothing)."""
    namespace = policy["restricted"]
    plane = cluster_session.plane
    plane.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "create-pods", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "tenant-creates-pods", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "create-pods"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]}])
    tenant = Rest(plane, plane.service_account_token(namespace, "tenant"))

    def create(pod: dict) -> tuple[int, str]:
        body = {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}
        try:
            tenant.call("POST", tenant.url("pods", namespace), body=body, params={"dryRun": "All"})
        except ApiError as err:
            return err.status, err.body.get("message", "")
        return 201, ""

    status, message = create(privileged_pod())
    assert status == 403 and POLICY_REFUSAL in message and "privileged containers are not allowed" in message, message
    unlabelled = privileged_pod(labels={"app": "mine"})
    assert create(unlabelled) == (201, "")
    for account, allowed in (("tenant", False), ("trainer", True)):
        pod = copy.deepcopy(built_pods()["learner"])
        pod["spec"].update(serviceAccountName=account, automountServiceAccountToken=True)
        status, message = create(pod)
        if allowed:
            assert status == 201, message
        else:
            assert status == 403 and "ServiceAccount" in message, message
    # The operator's own pods pass, as they are.
    for role, pod in built_pods().items():
        assert create(pod) == (201, ""), role

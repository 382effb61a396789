"""A tenant who may create RLTrainingJobs, and not pods, gets no more pod than the namespace allows: every
hostile template is refused, for every role, with the field's path, by `kuberl validate` and by the
operator's validation, before anything is built; a platform team's allowance widens exactly what it names."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, job_pods
from kuberl.api import cloud_identity, pod_security, pod_template
from kuberl.api.load import parse_job
from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, InvalidJob
from kuberl.api.tenancy import Allowance, Tenancy, operator_pod
from kuberl.operator import builders, rbac
from kuberl.operator.builders import BuildOptions
from kuberl.operator.jobs import validate_spec
from kuberl.operator.main import _parser, config_from_args
from pod_security import assert_restricted

NS = "team-a"
ROLES = tuple(pod_template.MAIN_CONTAINERS)
SIDE = {"name": "side", "image": "busybox:1.36"}


def _sidecar(**security_context) -> dict:
    return {"spec": {"containers": [{**SIDE, "securityContext": security_context}]}}


def _main(role: str, **security_context) -> dict:
    return {"spec": {"containers": [{"name": pod_template.MAIN_CONTAINERS[role], "securityContext": security_context}]}}


#: What a tenant tried (name, template for a role, the field refused inside the template, the least level that
#: admits it: None when no Pod Security level does, because it is a ServiceAccount question).
HOSTILE = [
    ("privileged sidecar", lambda r: _sidecar(privileged=True),
     "spec.containers[0].securityContext.privileged", "privileged"),
    ("sidecar adds SYS_ADMIN", lambda r: _sidecar(capabilities={"add": ["SYS_ADMIN"]}),
     "spec.containers[0].securityContext.capabilities.add", "privileged"),
    ("sidecar as uid 0", lambda r: _sidecar(runAsUser=0),
     "spec.containers[0].securityContext.runAsUser", "baseline"),
    ("hostPath of /", lambda r: {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
     "spec.volumes[0].hostPath", "privileged"),
    ("hostNetwork", lambda r: {"spec": {"hostNetwork": True}}, "spec.hostNetwork", "privileged"),
    ("hostPID", lambda r: {"spec": {"hostPID": True}}, "spec.hostPID", "privileged"),
    ("hostIPC", lambda r: {"spec": {"hostIPC": True}}, "spec.hostIPC", "privileged"),
    ("hostPort", lambda r: {"spec": {"containers": [{**SIDE, "ports": [{"containerPort": 80, "hostPort": 80}]}]}},
     "spec.containers[0].ports[0].hostPort", "privileged"),
    ("role container escalates", lambda r: _main(r, allowPrivilegeEscalation=True),
     "spec.containers[0].securityContext.allowPrivilegeEscalation", "baseline"),
    ("role container keeps capabilities", lambda r: _main(r, capabilities={"drop": []}),
     "spec.containers[0].securityContext.capabilities.drop", "baseline"),
    ("pod as uid 0", lambda r: {"spec": {"securityContext": {"runAsUser": 0}}},
     "spec.securityContext.runAsUser", "baseline"),
    ("pod may run as root", lambda r: {"spec": {"securityContext": {"runAsNonRoot": False}}},
     "spec.securityContext.runAsNonRoot", "baseline"),
    ("unconfined seccomp", lambda r: {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}},
     "spec.securityContext.seccompProfile.type", "privileged"),
    ("unsafe sysctl", lambda r: {"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}},
     "spec.securityContext.sysctls[0].name", "privileged"),
    ("an init container that escalates", lambda r: {"spec": {"initContainers": [
        {**SIDE, "name": "setup", "securityContext": {"allowPrivilegeEscalation": True}}]}},
     "spec.initContainers[0].securityContext.allowPrivilegeEscalation", "baseline"),
    ("the operator's ServiceAccount", lambda r: {"spec": {"serviceAccountName": rbac.DEFAULT_NAME}},
     "spec.serviceAccountName", None),
    ("the deprecated serviceAccount field", lambda r: {"spec": {"serviceAccount": "default"}},
     "spec.serviceAccount", None),
    ("the default account's token", lambda r: {"spec": {"automountServiceAccountToken": True}},
     "spec.automountServiceAccountToken", None),
    ("a projected token", lambda r: {"spec": {"volumes": [{"name": "tok", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]}},
     "spec.volumes[0].projected.sources[0].serviceAccountToken", None),
    ("a legacy token Secret as a volume", lambda r: {"spec": {"volumes": [
        {"name": "tok", "secret": {"secretName": "default-token-x7k2p"}}]}}, "spec.volumes[0].secret.secretName", None),
    ("a legacy token Secret projected", lambda r: {"spec": {"volumes": [{"name": "tok", "projected": {"sources": [
        {"secret": {"name": "builder-token-4bq9z"}}]}}]}},
     "spec.volumes[0].projected.sources[0].secret.name", None),
    ("a legacy token Secret in env", lambda r: {"spec": {"containers": [{**SIDE, "env": [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "default-token-x7k2p", "key": "token"}}}]}]}},
     "spec.containers[0].env[0].valueFrom.secretKeyRef.name", None),
    ("a legacy token Secret as envFrom", lambda r: {"spec": {"initContainers": [
        {**SIDE, "name": "setup", "envFrom": [{"secretRef": {"name": "ci.bot-token-zz2m7"}}]}]}},
     "spec.initContainers[0].envFrom[0].secretRef.name", None),
    ("Azure Workload Identity", lambda r: {"metadata": {"labels": {"azure.workload.identity/use": "true"}}},
     "metadata.labels.azure.workload.identity/use", None),
    ("Azure Workload Identity's client id", lambda r: {"metadata": {"annotations": {
        "azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000000"}}},
     "metadata.annotations.azure.workload.identity/client-id", None),
    ("AAD Pod Identity", lambda r: {"metadata": {"labels": {"aadpodidbinding": "admin"}}},
     "metadata.labels.aadpodidbinding", None),
    ("kube2iam or kiam", lambda r: {"metadata": {"annotations": {"iam.amazonaws.com/role": "admin"}}},
     "metadata.annotations.iam.amazonaws.com/role", None),
    ("EKS IRSA", lambda r: {"metadata": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}}},
     "metadata.annotations.eks.amazonaws.com/role-arn", None),
    ("GKE Workload Identity", lambda r: {"metadata": {"annotations": {"iam.gke.io/gcp-service-account": "a@b.iam"}}},
     "metadata.annotations.iam.gke.io/gcp-service-account", None),
]
LEVELS_UP = {"baseline": ("baseline", "privileged"), "privileged": ("privileged",), None: ()}


def _with_template(job_dict: dict, role: str, template: dict) -> dict:
    job = copy.deepcopy(job_dict)
    job["metadata"]["namespace"] = NS
    if role == "serving":
        job["spec"]["checkpointing"] = {"volume": {"claimName": "ckpt"}}
        job["spec"]["serving"] = {}
    job["spec"].setdefault(role, {})["template"] = template
    return job


def _refusals(job: dict, tenancy: Tenancy) -> list[str]:
    with pytest.raises(InvalidJob) as err:
        parse_job(job, tenancy=tenancy)
    return [p.path for p in err.value.problems]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("what, make, field, least", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_template_is_refused_by_default_at_its_field_for_every_role(job_dict, role, what, make, field,
                                                                              least):
    job = _with_template(job_dict, role, make(role))
    parse_job(copy.deepcopy(job))  # the schema alone takes it: the namespace's allowance is what refuses it
    assert _refusals(job, Tenancy()) == [f"spec.{role}.template.{field}"]
    # The operator's validation: the same refusal, so the job is InvalidSpec before any object is built.
    body = {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": job["metadata"]}
    parsed, problems = validate_spec(body, json.dumps(job["spec"]), logger=None, tenancy=Tenancy())
    assert [p.path for p in problems] == [f"spec.{role}.template.{field}"]


@pytest.mark.parametrize("what, make, field, least", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_an_allowance_widens_exactly_the_level_it_names(job_dict, what, make, field, least):
    job = _with_template(job_dict, "learner", make("learner"))
    for level in ("baseline", "privileged"):
        tenancy = Tenancy({NS: Allowance(level)})
        if level in LEVELS_UP[least]:
            parse_job(copy.deepcopy(job), tenancy=tenancy)
        else:
            assert _refusals(job, tenancy) == [f"spec.learner.template.{field}"], level
    # Another namespace's allowance is not this one's.
    assert _refusals(job, Tenancy({"team-b": Allowance("privileged", frozenset({"default"}))})) != []


def test_a_service_account_and_its_token_only_where_the_platform_team_named_it(job_dict):
    template = {"spec": {"serviceAccountName": "trainer-s3", "automountServiceAccountToken": True}}
    job = _with_template(job_dict, "learner", template)
    assert _refusals(job, Tenancy()) == ["spec.learner.template.spec.serviceAccountName",
                                         "spec.learner.template.spec.automountServiceAccountToken"]
    assert _refusals(job, Tenancy({NS: Allowance(service_accounts=frozenset({"other"}))})) == [
        "spec.learner.template.spec.serviceAccountName", "spec.learner.template.spec.automountServiceAccountToken"]
    parse_job(job, tenancy=Tenancy({NS: Allowance(service_accounts=frozenset({"trainer-s3"}))}))
    # Named but no token asked for: the pod runs as that account with no token mounted.
    pod = builders.build_learner_pod(parse_job(_with_template(job_dict, "learner", {
        "spec": {"serviceAccountName": "trainer-s3"}}), tenancy=Tenancy({NS: Allowance(
            service_accounts=frozenset({"trainer-s3"}))})), BuildOptions())
    assert pod["spec"]["serviceAccountName"] == "trainer-s3" and pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", ["api-token", "tracking-token-key", "db-token-abcde", "token-x7k2p", "-token-x7k2p",
                                  "default-token-x7k2p-old", "registry"])
def test_a_secret_not_named_like_a_token_secret_is_the_namespaces_business(job_dict, name):
    template = {"spec": {"volumes": [{"name": "s", "secret": {"secretName": name}}]}}
    parse_job(_with_template(job_dict, "learner", template), tenancy=Tenancy())


def test_a_token_secret_only_of_an_account_the_platform_team_named(job_dict):
    template = {"spec": {"volumes": [{"name": "a", "secret": {"secretName": "trainer-s3-token-x7k2p"}},
                                     {"name": "b", "secret": {"secretName": "default-token-x7k2p"}}]}}
    job = _with_template(job_dict, "learner", template)
    with pytest.raises(InvalidJob) as err:
        parse_job(job, tenancy=Tenancy())
    first, second = err.value.problems
    assert first.path == "spec.learner.template.spec.volumes[0].secret.secretName"
    assert ("'trainer-s3-token-x7k2p' is named as Kubernetes names the token Secret of ServiceAccount 'trainer-s3'"
            in first.message and "none is allowed here" in first.message and "tenancy.namespaces" in first.message)
    assert second.path == "spec.learner.template.spec.volumes[1].secret.secretName"
    # The account's own token Secret is as much as running as the account, which it allows.
    assert _refusals(job, Tenancy({NS: Allowance(service_accounts=frozenset({"trainer-s3"}))})) == [
        "spec.learner.template.spec.volumes[1].secret.secretName"]


def test_an_identity_key_only_as_far_as_the_platform_team_allowed_it(job_dict):
    template = {"metadata": {"labels": {"azure.workload.identity/use": "true", "AADPodIdBinding": "x"},
                             "annotations": {"azure.workload.identity/client-id": "id", "team": "rl"}}}
    job = _with_template(job_dict, "learner", template)
    refused = ["spec.learner.template.metadata.labels.azure.workload.identity/use",
               "spec.learner.template.metadata.labels.AADPodIdBinding",
               "spec.learner.template.metadata.annotations.azure.workload.identity/client-id"]
    with pytest.raises(InvalidJob) as err:
        parse_job(job, tenancy=Tenancy())
    assert [p.path for p in err.value.problems] == refused
    assert "asks Azure Workload Identity for cloud credentials" in err.value.problems[0].message
    assert "identityKeys, none is allowed here" in err.value.problems[0].message
    assert _refusals(job, Tenancy({NS: Allowance(identity_keys=frozenset({"azure.workload.identity/use"}))})) == \
        refused[1:]
    assert _refusals(job, Tenancy({NS: Allowance(identity_keys=frozenset({"azure.workload.identity/"}))})) == \
        [refused[1]]
    parse_job(job, tenancy=Tenancy({NS: Allowance(identity_keys=frozenset({"azure.workload.identity/",
                                                                           "aadpodidbinding"}))}))


def test_the_platform_team_allows_identity_keys_in_the_chart_values():
    tenancy = Tenancy.from_json(json.dumps({NS: {"serviceAccounts": ["trainer"],
                                                 "identityKeys": ["azure.workload.identity/use", "iam.gke.io/"]}}))
    assert tenancy.allowance(NS) == Allowance(service_accounts=frozenset({"trainer"}), identity_keys=frozenset(
        {"azure.workload.identity/use", "iam.gke.io/"}))
    for bad in (["team.example/identity"], "aadpodidbinding", [3]):
        with pytest.raises(ValueError, match=f"tenancy.namespaces.{NS}.identityKeys: .* under one of azure"):
            Tenancy.from_json(json.dumps({NS: {"identityKeys": bad}}))
    with pytest.raises(ValueError, match="give any of podSecurity, serviceAccounts, identityKeys, nothing else"):
        Tenancy.from_json(json.dumps({NS: {"identityKey": ["aadpodidbinding"]}}))


def test_the_security_page_names_every_identity_key():
    page = (REPO / "docs" / "security.md").read_text()
    for key in cloud_identity.IDENTITY_KEYS:
        assert f"`{key}" in page, key


def test_no_job_runs_in_the_operators_own_namespace(job_dict):
    job = copy.deepcopy(job_dict)
    job["metadata"]["namespace"] = "kuberl-system"
    with pytest.raises(InvalidJob) as err:
        parse_job(job, tenancy=Tenancy(operator_namespace="kuberl-system"))
    assert [p.path for p in err.value.problems] == ["metadata.namespace"]
    assert "operator's own namespace" in err.value.problems[0].message
    parse_job(job, tenancy=Tenancy(operator_namespace="kuberl-ops"))


def test_a_realistic_template_passes_and_its_pods_stay_restricted(job_dict):
    """Tolerations, env from Secrets, volumes, a sidecar and an init container: what platform engineers
    write, and nothing a namespace at "restricted" refuses."""
    template = {
        "metadata": {"labels": {"team": "rl"}},
        "spec": {
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {"runAsUser": 2000, "supplementalGroups": [5]},
            "initContainers": [{**SIDE, "name": "fetch", "command": ["true"]}],
            "containers": [
                {"name": "learner", "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {**SIDE, "securityContext": {"runAsUser": 3000, "capabilities": {"add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                        {"name": "cfg", "projected": {"sources": [{"configMap": {"name": "c"}}]}}],
        },
    }
    job = parse_job(_with_template(job_dict, "learner", template), tenancy=Tenancy())
    for pod in job_pods(job, BuildOptions()):
        assert_restricted(pod)


@pytest.mark.parametrize("role", ROLES)
def test_the_check_sees_the_security_fields_the_builders_write(job_dict, role):
    """The check merges templates onto `operator_pod(role)`: it must hold what the built pod holds, or a
    template could pass the check and still widen the built pod."""
    job = parse_job(_with_template(job_dict, role, {"spec": {"nodeSelector": {"a": "b"}}}))
    serving = builders.build_serving(job, BuildOptions()) if role == "serving" else []
    built = [m for m in [*job_pods(job, BuildOptions()), *serving] if m["kind"] in ("Pod", "Deployment")
             and m["metadata"]["labels"].get("app.kubernetes.io/component") == names_component(role)]
    assert built, role
    skeleton = operator_pod(role)["spec"]
    for manifest in built:
        spec = manifest["spec"]["template"]["spec"] if manifest["kind"] == "Deployment" else manifest["spec"]
        for key in pod_template.POD_FIELDS:
            assert spec[key] == skeleton[key], (role, key)
        for field in ("containers", "initContainers"):
            ours = {c["name"]: c["securityContext"] for c in skeleton.get(field, [])}
            theirs = {c["name"]: c["securityContext"] for c in spec.get(field, [])}
            assert theirs == ours, (role, field)


def names_component(role: str) -> str:
    return {"head": "head", "rolloutWorkers": "rollout-worker", "learner": "learner", "serving": "serving"}[role]


def test_pod_security_levels_are_nested_and_the_built_pods_meet_the_strictest(job_dict):
    pod = builders.build_learner_pod(parse_job(job_dict), BuildOptions())
    assert pod_security.violations(pod, "restricted") == []
    loose = copy.deepcopy(pod)
    loose["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    assert pod_security.violations(loose, "baseline") == []
    assert {path[-1] for path, _ in pod_security.violations(loose, "restricted")} == {
        "allowPrivilegeEscalation", "runAsUser", "drop"}
    loose["spec"]["hostNetwork"] = True
    assert [path for path, _ in pod_security.violations(loose, "baseline")] == [("spec", "hostNetwork")]
    assert pod_security.violations(loose, "privileged") == []
    with pytest.raises(ValueError, match="one of restricted, baseline, privileged"):
        pod_security.violations(pod, "strict")


def test_kuberl_validate_refuses_by_default_and_takes_the_namespaces_allowance_as_flags(job_dict, tmp_path):
    job = _with_template(job_dict, "rolloutWorkers", {"spec": {"hostPID": True, "serviceAccountName": "ci"}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    cli = [sys.executable, "-m", "kuberl.trainer.cli", "validate", str(path)]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == INVALID_SPEC_EXIT_CODE, refused.stderr
    assert "spec.rolloutWorkers.template.spec.hostPID" in refused.stderr
    assert "spec.rolloutWorkers.template.spec.serviceAccountName" in refused.stderr
    assert "tenancy.namespaces" in refused.stderr  # says who can allow more
    allowed = subprocess.run([*cli, "--pod-security", "privileged", "--service-account", "ci"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert allowed.returncode == 0, allowed.stderr
    # A cloud-identity label: refused unless allowed, as the chart's identityKeys allow it.
    job["spec"]["rolloutWorkers"]["template"]["metadata"] = {"labels": {"azure.workload.identity/use": "true"}}
    path.write_text(yaml.safe_dump(job))
    flags = ["--pod-security", "privileged", "--service-account", "ci"]
    refused = subprocess.run([*cli, *flags], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == INVALID_SPEC_EXIT_CODE and "azure.workload.identity/use" in refused.stderr
    allowed = subprocess.run([*cli, *flags, "--identity-key", "azure.workload.identity/"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert allowed.returncode == 0, allowed.stderr
    unknown = subprocess.run([*cli, *flags, "--identity-key", "example.com/x"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert unknown.returncode != 0 and "--identity-key example.com/x" in unknown.stderr


def test_the_operator_reads_its_allowances_and_refuses_a_bad_one():
    args = _parser().parse_args(["run", "--operator-namespace", "ops", "--tenancy",
                                 json.dumps({NS: {"podSecurity": "baseline", "serviceAccounts": ["s3"]}})])
    tenancy = config_from_args(args).tenancy
    assert tenancy.operator_namespace == "ops"
    assert tenancy.allowance(NS) == Allowance("baseline", frozenset({"s3"}))
    assert tenancy.allowance("team-b") == Allowance()
    for bad, says in ((["--tenancy", json.dumps({NS: {"podSecurity": "root"}})], "not a Pod Security level"),
                      (["--tenancy", json.dumps({"ops": {"podSecurity": "baseline"}})], "operator's own namespace"),
                      (["--tenancy", json.dumps({NS: {"serviceAccounts": ["Bad_Name"]}})], "ServiceAccount names")):
        with pytest.raises(SystemExit, match=says):
            config_from_args(_parser().parse_args(["run", "--operator-namespace", "ops", *bad]))


def test_the_single_namespace_rbac_keeps_the_operators_account_out_of_the_watched_namespace():
    role, binding = rbac.single_namespace("rl-jobs")
    assert binding["subjects"][0]["namespace"] == rbac.DEFAULT_SERVICE_ACCOUNT_NAMESPACE != "rl-jobs"
    with pytest.raises(ValueError, match="outside the namespace it watches"):
        rbac.single_namespace("ops", service_account_namespace="ops")


# ---- bounds: what one job may cost the operator ---------------------------------------------------


def _padded(size: int) -> dict:
    """A schema-valid template of about `size` bytes as JSON (one long annotation)."""
    return {"metadata": {"annotations": {"note": "x" * max(0, size - 40)}}}


def test_a_template_over_its_bound_is_refused_with_the_bound(job_dict):
    job = _with_template(job_dict, "learner", _padded(pod_template.MAX_TEMPLATE_BYTES + 100))
    with pytest.raises(InvalidJob) as err:
        parse_job(job)
    (problem,) = err.value.problems
    assert problem.path == "spec.learner.template"
    assert f"a template is at most {pod_template.MAX_TEMPLATE_BYTES:,}" in problem.message
    parse_job(_with_template(job_dict, "learner", _padded(pod_template.MAX_TEMPLATE_BYTES - 100)))


def test_replicas_times_template_size_is_bounded_per_job(job_dict):
    template = _padded(pod_template.MAX_TEMPLATE_BYTES - 100)
    fits = pod_template.MAX_JOB_TEMPLATE_BYTES // pod_template.template_bytes(template)
    job = _with_template(job_dict, "rolloutWorkers", template)
    job["spec"]["rolloutWorkers"]["replicas"] = fits
    parse_job(copy.deepcopy(job))
    job["spec"]["rolloutWorkers"]["replicas"] = fits + 1
    with pytest.raises(InvalidJob) as err:
        parse_job(job)
    (problem,) = err.value.problems
    assert problem.path == "spec" and f"rolloutWorkers {pod_template.template_bytes(template):,} bytes x {fits + 1}" \
        in problem.message and "fewer replicas or smaller templates" in problem.message


def test_kubectl_explain_states_the_bounds():
    from kuberl.api.crd import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for role in ROLES:
        assert pod_template.BOUNDS_TEXT in spec[role]["properties"]["template"]["description"], role

"""The Helm chart, rendered by the real helm and checked against the official Kubernetes schemas.

Every `ci/*-values.yaml` file is linted and rendered; every manifest is validated strictly
(kubernetes-validate) for the chart's oldest supported Kubernetes and the newest the validator
knows; every pod passes Pod Security "restricted". The chart's RBAC, CRD, operator flags, scrape
selectors and dashboard are compared with the code they must agree with, not with copies.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kuberl.api import crd as crd_module
from kuberl.operator import names, rbac
from kubernetes_validate.utils import latest_version
from pod_security import assert_restricted, pod_specs
from tools import REPO, helm_binary, yaml_documents

CHART = REPO / "charts" / "kuberl-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "kuberl"
NAMESPACE = "kuberl-system"
#: Kinds the prometheus-operator CRDs define; the official schemas do not cover them.
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor"}


def _kube_versions() -> list[str]:
    """The chart's minimum Kubernetes (Chart.yaml kubeVersion) and the newest the validator knows."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    minimum = re.match(r">=\s*(\d+\.\d+)", chart["kubeVersion"]).group(1)
    return [f"{minimum}.0", latest_version()]


KUBE_VERSIONS = _kube_versions()


@functools.cache
def _helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=60, check=False)


def render(*args: str, values: Path | None = None, namespace: str = NAMESPACE) -> list[dict]:
    """`helm template` the chart (CRDs included) and parse every document."""
    cmd = ["template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds", *args]
    if values is not None:
        cmd += ["--values", str(values)]
    result = _helm(*cmd)
    assert result.returncode == 0, result.stderr
    return yaml_documents(result.stdout)


def by_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict], kind: str) -> dict:
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, got {[m['metadata']['name'] for m in found]}"
    return found[0]


def values_id(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def operator_container(manifests: list[dict]) -> dict:
    deployment = one(manifests, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def learner_pod(namespace: str = "ml-jobs") -> dict:
    """A learner pod exactly as the operator builds it, from the repo's example job."""
    from kuberl.api.load import load_job_file
    from kuberl.operator.builders import BuildOptions, build_learner_pod

    job = load_job_file(REPO / "examples" / "cartpole-ppo.yaml")
    job.metadata.namespace = namespace
    return build_learner_pod(job, BuildOptions())


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items()) and not selector.get(
        "matchExpressions"
    )


# --------------------------------------------------------------------------------------------
# helm lint, schema validation of every rendered manifest
# --------------------------------------------------------------------------------------------


def test_ci_values_files_cover_defaults_every_toggle_and_single_namespace():
    assert {values_id(p) for p in CI_VALUES} >= {"default", "all-on", "namespaced"}
    all_on = yaml.safe_load((CHART / "ci" / "all-on-values.yaml").read_text())
    assert all_on["metrics"]["serviceMonitor"]["enabled"]
    assert all_on["metrics"]["podMonitor"]["enabled"]
    assert all_on["dashboards"]["enabled"]


@pytest.mark.parametrize("values", CI_VALUES, ids=values_id)
def test_helm_lint_strict_passes(values):
    result = _helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", CI_VALUES, ids=values_id)
def test_every_rendered_manifest_is_valid_for_kubernetes(values, kube_version):
    manifests = render("--kube-version", kube_version, values=values)
    checked = set()
    for manifest in manifests:
        if manifest["kind"] in MONITORING_KINDS:
            continue  # prometheus-operator CRDs: checked field by field in the monitor tests below
        try:
            kubernetes_validate.validate(manifest, kube_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']} at {path}: {err.message}")
        checked.add(manifest["kind"])
    # A kind the validator has no schema for raises SchemaNotFoundError above: nothing is skipped.
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Service"} <= checked


def test_chart_refuses_a_kubernetes_older_than_it_supports():
    result = _helm("template", RELEASE, str(CHART), "--kube-version", "1.26.0")
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr


# --------------------------------------------------------------------------------------------
# values.schema.json
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, complaint",
    [
        (["--set", "imagee.tag=1.0"], "additional properties 'imagee'"),
        (["--set", "metrics.podMonitor.enable=true"], "additional properties 'enable'"),
        (["--set", "securityContext.runAsNonroot=true"], "additional properties 'runAsNonroot'"),
        (["--set", "tolerations[0].effectt=NoSchedule"], "additional properties 'effectt'"),
        (["--set-string", "metrics.service.port=http"], "/metrics/service/port"),
        (["--set", "dashboards.enabled=yes-please"], "/dashboards/enabled"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "operator.watchNamespace=Not_A_Namespace"], "/operator/watchNamespace"),
        (["--set", "operator.metricsPort=70000"], "/operator/metricsPort"),
        (["--set", "metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
        (["--set", "tenancy.namespaces.team-a.podSecurity=root"], "/tenancy/namespaces/team-a/podSecurity"),
        (["--set", "tenancy.namespaces.team-a.serviceAcounts={s3}"], "additional properties 'serviceAcounts'"),
        (["--set", "tenancy.namespaces.Team_A.podSecurity=baseline"], "invalid propertyName 'Team_A'"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_values_schema_rejects_typos_and_wrong_types(bad, complaint):
    result = _helm("template", RELEASE, str(CHART), *bad)
    assert result.returncode != 0, f"{bad} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr, result.stderr


def test_the_operator_never_watches_its_own_namespace_nor_allows_anything_there():
    for bad, says in ((["--set", f"operator.watchNamespace={NAMESPACE}"], "must not be the release namespace"),
                      (["--set", f"tenancy.namespaces.{NAMESPACE}.podSecurity=baseline"],
                       "no job runs in the operator's own namespace")):
        result = _helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *bad)
        assert result.returncode != 0 and says in result.stderr, result.stderr


def test_the_tenancy_values_reach_the_operator_and_it_knows_its_namespace():
    from kuberl.operator.main import _parser, config_from_args

    allowance = {"team-gpu": {"podSecurity": "baseline", "serviceAccounts": ["trainer-s3"]}}
    container = operator_container(render("--set-json", f"tenancy.namespaces={json.dumps(allowance)}"))
    (env,) = [e for e in container["env"] if e["name"] == "POD_NAMESPACE"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    tenancy = config_from_args(_parser().parse_args([*container["args"], "--operator-namespace", NAMESPACE])).tenancy
    assert tenancy.allowance("team-gpu").pod_security == "baseline"
    assert tenancy.allowance("team-gpu").service_accounts == {"trainer-s3"}
    assert tenancy.allowance("other").pod_security == "restricted" and not tenancy.allowance("other").service_accounts
    default = config_from_args(_parser().parse_args(operator_container(render())["args"])).tenancy
    assert default.namespaces == {}


def _yaml_keys(node: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        keys.add(path)
        if isinstance(value, dict) and value:
            keys |= _yaml_keys(value, path)
    return keys


def _schema_keys(schema: dict, defs: dict, prefix: str = "") -> set[str]:
    keys = set()
    if "$ref" in schema:
        return set()  # Kubernetes objects passed through: their fields are the official schema's
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        keys.add(path)
        keys |= _schema_keys(sub, defs, path)
    return keys


def test_values_schema_and_values_yaml_describe_the_same_values():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    in_values = _yaml_keys(values)
    in_schema = _schema_keys(schema, schema.get("definitions", {})) - {"global"}
    # Pass-through maps (resources.requests, ...) have free keys: compare the chart's own structure.
    free = {"resources", "podSecurityContext", "securityContext"}
    in_values = {k for k in in_values if k.split(".")[0] not in free or "." not in k}
    in_schema = {k for k in in_schema if k.split(".")[0] not in free or "." not in k}
    assert in_values == in_schema, f"only in values.yaml: {in_values - in_schema}; only in the schema: {in_schema - in_values}"


def _documented_above(lines: list[str], i: int) -> bool:
    j = i - 1
    while j >= 0 and lines[j].strip().startswith("#"):
        if lines[j].strip().startswith("# --"):
            return True
        j -= 1
    return False


def test_every_value_is_documented_where_it_stands():
    """Each value in values.yaml has a `# --` comment above it or above a block that holds it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    stack: list[tuple[int, str, bool]] = []  # enclosing blocks: (indent, path, documented)
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([s[1] for s in stack] + [key])
        documented = _documented_above(lines, i) or any(s[2] for s in stack)
        following = next((n for n in lines[i + 1:] if n.strip() and not n.strip().startswith("#")), "")
        is_block = rest == "" and len(following) - len(following.lstrip()) > indent
        if is_block:
            stack.append((indent, key, documented))
        elif not documented:
            undocumented.append(path)
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


# --------------------------------------------------------------------------------------------
# CRDs, RBAC
# --------------------------------------------------------------------------------------------


def test_chart_crd_is_the_committed_crd_and_what_the_model_generates():
    generated = crd_module.crd_yaml()
    assert (REPO / "crds" / "rltrainingjob.yaml").read_text() == generated, "crds/ is stale: run `kuberl crd`"
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    assert chart_crds == ["rlsweep.yaml", "rltrainingjob.yaml"]
    assert (CHART / "crds" / "rltrainingjob.yaml").read_text() == generated, (
        "the chart's crds/ differs: kuberl crd -o charts/kuberl-operator/crds/rltrainingjob.yaml"
    )
    sweep = crd_module.sweep_crd_yaml()
    assert (REPO / "crds" / "rlsweep.yaml").read_text() == sweep, "crds/ is stale: run `kuberl crd --kind RLSweep`"
    assert (CHART / "crds" / "rlsweep.yaml").read_text() == sweep, (
        "the chart's crds/ differs: kuberl crd --kind RLSweep -o charts/kuberl-operator/crds/rlsweep.yaml"
    )


def test_cluster_wide_rbac_grants_exactly_the_operators_rules():
    manifests = render()
    role = one(manifests, "ClusterRole")
    assert role["rules"] == rbac.RULES + rbac.SWEEP_RULES + rbac.CLUSTER_RULES
    assert role["rules"] == rbac.cluster_wide()[0]["rules"]
    binding = one(manifests, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    service_account = one(manifests, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    assert not by_kind(manifests, "Role") and not by_kind(manifests, "RoleBinding")


def test_single_namespace_rbac_is_a_role_in_the_watched_namespace_only():
    manifests = render(values=CHART / "ci" / "namespaced-values.yaml")
    role = one(manifests, "Role")
    assert role["metadata"]["namespace"] == "ml-jobs"
    assert role["rules"] == rbac.RULES + rbac.SWEEP_RULES
    assert role["rules"] == rbac.single_namespace("ml-jobs")[0]["rules"]
    binding = one(manifests, "RoleBinding")
    assert binding["metadata"]["namespace"] == "ml-jobs"
    assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE  # the operator itself runs in the release namespace
    assert not by_kind(manifests, "ClusterRole") and not by_kind(manifests, "ClusterRoleBinding")


def test_rbac_create_false_renders_no_rbac():
    kinds = {m["kind"] for m in render("--set", "rbac.create=false")}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


# --------------------------------------------------------------------------------------------
# The operator Deployment
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=values_id)
def test_every_rendered_pod_passes_pod_security_restricted(values):
    manifests = render(values=values)
    with_pods = [m for m in manifests if list(pod_specs(m))]
    assert with_pods, "the chart renders no pod"
    for manifest in with_pods:
        assert_restricted(manifest)


def test_operators_job_pods_pass_pod_security_restricted():
    from conftest import job_pods
    from kuberl.api.load import load_job_file
    from kuberl.operator.builders import BuildOptions

    job = load_job_file(REPO / "examples" / "cartpole-ppo.yaml")
    for pod in job_pods(job, BuildOptions()):
        assert_restricted(pod)


def test_deployment_is_one_replica_recreate_with_liveness_resources_and_a_read_only_root():
    manifests = render()
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(manifests)
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    probe = container["livenessProbe"]["httpGet"]
    port_numbers = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    liveness_arg = next(a for a in container["args"] if a.startswith("--liveness-endpoint="))
    assert liveness_arg == f"--liveness-endpoint=http://0.0.0.0:{port_numbers[probe['port']]}/healthz"
    assert pod["serviceAccountName"] == one(manifests, "ServiceAccount")["metadata"]["name"]


def parse_operator_args(args: list[str]):
    """The chart's arguments through kuberl-operator's own parser (a flag it lacks fails the test)."""
    from kuberl.operator import main

    try:
        return main._parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"kuberl-operator rejects the chart's arguments: {args}")


@pytest.mark.parametrize("values", CI_VALUES, ids=values_id)
def test_operator_command_line_is_accepted_by_the_operators_own_parser(values):
    container = operator_container(render(values=values))
    assert container["command"] == ["kuberl-operator"]
    assert container["args"][0] == "run"
    parse_operator_args(container["args"])


def test_operator_flags_carry_the_watch_scope_ports_and_job_defaults():
    from kuberl.operator.main import config_from_args

    default = parse_operator_args(operator_container(render())["args"])
    assert default.all_namespaces is True and default.namespace == []
    assert default.metrics_port == 8080
    build = config_from_args(default).build
    assert build.trainer_image == names.DEFAULT_TRAINER_IMAGE, "chart and operator disagree on the trainer image"
    assert build.rollout_image == names.DEFAULT_ROLLOUT_IMAGE, "chart and operator disagree on the rollout image"
    assert build.image_pull_policy == "IfNotPresent" and build.network_policies is True

    namespaced = parse_operator_args(
        operator_container(render(values=CHART / "ci" / "namespaced-values.yaml"))["args"])
    assert namespaced.namespace == ["ml-jobs"] and not namespaced.all_namespaces

    all_on = parse_operator_args(operator_container(render(values=CHART / "ci" / "all-on-values.yaml"))["args"])
    config = config_from_args(all_on)
    assert config.build.trainer_image == "registry.example.com/ml/kuberl-trainer:0.1.0-cuda"
    assert config.build.rollout_image == "registry.example.com/ml/kuberl-rollout:0.1.0"
    assert config.build.image_pull_policy == "Always"
    assert config.build.network_policies is False
    assert config.reconcile_interval == 5 and config.progress_interval == 15
    assert all_on.verbose is True


def test_image_defaults_to_the_chart_app_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    container = operator_container(render())
    assert container["image"] == f"ghcr.io/kuberl/kuberl-operator:{chart['appVersion']}"
    assert names.DEFAULT_TRAINER_IMAGE.endswith(f":{chart['appVersion']}")
    assert names.DEFAULT_ROLLOUT_IMAGE.endswith(f":{chart['appVersion']}")


# --------------------------------------------------------------------------------------------
# Scraping: metrics Service + ServiceMonitor (operator), PodMonitor (learners)
# --------------------------------------------------------------------------------------------


def test_metrics_service_selects_the_operator_pod_on_its_metrics_port():
    manifests = render()
    service = one(manifests, "Service")
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics"
    container_ports = {p["name"]: p["containerPort"] for p in operator_container(manifests)["ports"]}
    assert port["targetPort"] in container_ports
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(container_ports["metrics"])


def dashboards(manifests: list[dict]) -> list[dict]:
    """The ConfigMaps that carry a Grafana dashboard (the admission policy's tenancy ConfigMap does not)."""
    return [m for m in by_kind(manifests, "ConfigMap") if "kuberl.json" in (m.get("data") or {})]


def test_monitors_and_dashboard_are_off_by_default():
    manifests = render()
    assert not {m["kind"] for m in manifests} & MONITORING_KINDS
    assert dashboards(manifests) == []


def test_the_admission_policy_is_on_by_default_from_kubernetes_1_30_and_reads_the_tenancy_values():
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    manifests = render("--kube-version", "1.30.0", "--set-json",
                       'tenancy.namespaces={"team-a": {"podSecurity": "baseline", "serviceAccounts": ["s3", "ci"]}}')
    policy, binding = one(manifests, kinds[0]), one(manifests, kinds[1])
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    params = next(m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"] == binding["spec"]["paramRef"]["name"])
    assert params["metadata"]["namespace"] == binding["spec"]["paramRef"]["namespace"] == NAMESPACE
    assert params["data"] == {"team-a.podSecurity": "baseline", "team-a.serviceAccounts": "s3,ci"}
    assert policy["spec"]["matchConstraints"]["objectSelector"]["matchExpressions"] == [
        {"key": "kuberl.dev/job-name", "operator": "Exists"}]
    for args in (("--kube-version", "1.29.0"), ("--kube-version", "1.33.0", "--set", "admissionPolicy.enabled=false")):
        rendered = render(*args)
        assert not {m["kind"] for m in rendered} & set(kinds), args
        assert not [m for m in by_kind(rendered, "ConfigMap") if m["metadata"]["name"].endswith("-tenancy")], args


def test_service_monitor_selects_the_operator_metrics_service():
    manifests = render(values=CHART / "ci" / "all-on-values.yaml")
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = one(manifests, "Service")
    assert matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s" and endpoint["scrapeTimeout"] == "5s"


def test_pod_monitor_selects_the_learner_pods_the_operator_builds_and_nothing_else():
    manifests = render(values=CHART / "ci" / "all-on-values.yaml")
    monitor = one(manifests, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    selector = monitor["spec"]["selector"]
    learner = learner_pod()
    assert matches(selector, learner["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
    (container,) = learner["spec"]["containers"]
    metrics_ports = [p for p in container["ports"] if p["name"] == endpoint["port"]]
    assert metrics_ports, f"the learner container has no port named {endpoint['port']!r}"
    annotations = learner["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics_ports[0]["containerPort"])
    assert annotations["prometheus.io/path"] == endpoint["path"]

    from conftest import job_pods
    from kuberl.api.load import load_job_file
    from kuberl.operator.builders import BuildOptions

    job = load_job_file(REPO / "examples" / "cartpole-ppo.yaml")
    others = [p for p in job_pods(job, BuildOptions()) if p["metadata"]["name"] != learner["metadata"]["name"]]
    assert others and not any(matches(selector, p["metadata"]["labels"]) for p in others)
    operator_pod = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not matches(selector, operator_pod)


def test_pod_monitor_follows_the_watched_namespace_in_single_namespace_mode():
    monitor = one(render(values=CHART / "ci" / "namespaced-values.yaml"), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml-jobs"]}
    assert monitor["metadata"]["namespace"] == NAMESPACE


# --------------------------------------------------------------------------------------------
# Dashboard ConfigMap, NOTES.txt
# --------------------------------------------------------------------------------------------


def test_dashboard_configmap_ships_the_repo_dashboard_with_the_sidecar_label():
    source = (REPO / "dashboards" / "kuberl.json").read_text()
    assert (CHART / "dashboards" / "kuberl.json").read_text() == source, (
        "the chart's dashboard copy differs: cp dashboards/kuberl.json charts/kuberl-operator/dashboards/"
    )
    (default,) = dashboards(render("--set", "dashboards.enabled=true"))
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert default["metadata"]["namespace"] == NAMESPACE
    assert json.loads(default["data"]["kuberl.json"]) == json.loads(source)

    (custom,) = dashboards(render(values=CHART / "ci" / "all-on-values.yaml"))
    assert custom["metadata"]["labels"]["grafana_dashboard_custom"] == "kuberl"
    assert "grafana_dashboard" not in custom["metadata"]["labels"]
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["annotations"] == {"grafana_folder": "KubeRL"}
    assert json.loads(custom["data"]["kuberl.json"]) == json.loads(source)


def _notes(*args: str) -> str:
    result = _helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_print_commands_to_apply_an_example_job_and_watch_it():
    notes = _notes()
    applied = re.findall(r"kubectl apply (?:-n \S+ )?-f (\S+)", notes)
    assert applied, notes
    for path in applied:
        example = REPO / path
        assert example.exists(), f"NOTES.txt applies {path}, which does not exist"
        job_name = yaml.safe_load(example.read_text())["metadata"]["name"]
        assert f"rltj/{job_name}" in notes or f"rltj {job_name}" in notes
    assert "kubectl get rltj" in notes and " -w" in notes
    from kuberl.operator.status import CONDITION_TYPES

    conditions = re.findall(r"--for=condition=(\w+)", notes)
    assert conditions and set(conditions) <= set(CONDITION_TYPES), conditions
    assert f"rollout status deployment/{RELEASE}-kuberl-operator" in notes
    assert "-n default" in notes


def test_notes_use_the_watched_namespace_in_single_namespace_mode():
    notes = _notes("--set", "operator.watchNamespace=ml-jobs")
    assert "kubectl apply -n ml-jobs -f" in notes
    assert "kubectl get rltj -n ml-jobs -w" in notes

"""kuberl.api.pod_security, rule by rule, where the newest policy version differs from the older ones, and for
the controls a template cannot bring to the API server (test_pod_security_admission.py's UNREACHABLE)."""

from __future__ import annotations

import copy

import pytest

from kuberl.api import pod_template
from kuberl.api.pod_security import BASELINE, PRIVILEGED, RESTRICTED, violations

OK_CONTAINER = {"name": "c", "image": "i", "securityContext": copy.deepcopy(pod_template.CONTAINER_SECURITY_CONTEXT)}


def pod(**spec) -> dict:
    containers = spec.pop("containers", [copy.deepcopy(OK_CONTAINER)])
    return {"metadata": spec.pop("metadata", {}), "spec": {
        "securityContext": copy.deepcopy(pod_template.POD_SECURITY_CONTEXT), "containers": containers, **spec}}


def paths(found) -> list[str]:
    return [".".join(map(str, path)) for path, _ in found]


def test_the_operators_own_pod_meets_restricted():
    assert violations(pod(), RESTRICTED) == []


@pytest.mark.parametrize("where", [("livenessProbe",), ("readinessProbe",), ("startupProbe",),
                                   ("lifecycle", "postStart"), ("lifecycle", "preStop")])
@pytest.mark.parametrize("action", ["httpGet", "tcpSocket"])
def test_a_host_on_a_probe_or_hook_breaks_baseline(where, action):
    container = copy.deepcopy(OK_CONTAINER)
    handler = {action: {"port": 8080, "host": "169.254.169.254"}}
    if len(where) == 2:
        container["lifecycle"] = {where[1]: handler}
    else:
        container[where[0]] = handler
    found = violations(pod(containers=[container]), BASELINE)
    assert paths(found) == [f"spec.containers.0.{'.'.join(where)}.{action}.host"], found
    assert "'169.254.169.254' is set" in found[0][1]
    assert violations(pod(containers=[container]), PRIVILEGED) == []
    handler[action]["host"] = ""
    assert violations(pod(containers=[container]), RESTRICTED) == []


def test_unmasked_proc_is_allowed_at_baseline_only_in_a_user_namespace():
    container = copy.deepcopy(OK_CONTAINER)
    container["securityContext"]["procMount"] = "Unmasked"
    assert paths(violations(pod(containers=[container]), BASELINE)) == ["spec.containers.0.securityContext.procMount"]
    assert violations(pod(containers=[container], hostUsers=False), BASELINE) == []
    assert paths(violations(pod(containers=[container], hostUsers=False), RESTRICTED)) == [
        "spec.containers.0.securityContext.procMount"]


def test_root_in_a_user_namespace_meets_restricted():
    root = pod()
    root["spec"]["securityContext"].update(runAsNonRoot=False, runAsUser=0)
    root["spec"]["containers"][0]["securityContext"].update(runAsNonRoot=False, runAsUser=0)
    assert sorted(paths(violations(root, RESTRICTED))) == [
        "spec.containers.0.securityContext.runAsNonRoot", "spec.containers.0.securityContext.runAsUser",
        "spec.securityContext.runAsNonRoot", "spec.securityContext.runAsUser"]
    root["spec"]["hostUsers"] = False
    assert violations(root, RESTRICTED) == []


def test_newer_allowances_image_volumes_empty_apparmor_annotation_and_the_1_37_sysctls():
    assert violations(pod(volumes=[{"name": "data", "image": {"reference": "r/data:1"}}]), RESTRICTED) == []
    annotated = pod(metadata={"annotations": {"container.apparmor.security.beta.kubernetes.io/c": ""}})
    assert violations(annotated, BASELINE) == []
    annotated["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/c"] = "unconfined"
    assert paths(violations(annotated, BASELINE)) == [
        "metadata.annotations.container.apparmor.security.beta.kubernetes.io/c"]
    tuned = pod()
    tuned["spec"]["securityContext"]["sysctls"] = [{"name": "net.ipv4.tcp_slow_start_after_idle", "value": "0"},
                                                   {"name": "net.ipv4.tcp_notsent_lowat", "value": "16384"}]
    assert violations(tuned, BASELINE) == []
    tuned["spec"]["securityContext"]["sysctls"].append({"name": "net.core.somaxconn", "value": "1024"})
    assert paths(violations(tuned, BASELINE)) == ["spec.securityContext.sysctls.2.name"]


def test_controls_the_api_refuses_before_admission_are_still_refused():
    """hostProcess (the API accepts it only on an all-HostProcess Windows pod) and appArmorProfile (newer than
    the template schema): no template brings them to the server, so the check is held to them here."""
    host_process = pod()
    host_process["spec"]["containers"][0]["securityContext"]["windowsOptions"] = {"hostProcess": True}
    assert paths(violations(host_process, BASELINE)) == ["spec.containers.0.securityContext.windowsOptions.hostProcess"]
    unconfined = pod()
    unconfined["spec"]["securityContext"]["appArmorProfile"] = {"type": "Unconfined"}
    assert paths(violations(unconfined, BASELINE)) == ["spec.securityContext.appArmorProfile.type"]
    unconfined["spec"]["securityContext"]["appArmorProfile"] = {"type": "Localhost", "localhostProfile": "p"}
    assert violations(unconfined, RESTRICTED) == []


def test_the_charts_admission_policy_is_generated_from_these_rules():
    from kuberl.operator import admission_policy

    committed = admission_policy.CHART_TEMPLATE.read_text()
    assert committed == admission_policy.chart_template(), (
        "charts/kuberl-operator/templates/admission-policy.yaml is stale: run "
        "`python -m kuberl.operator.admission_policy`")
    # Each of the module's sets reaches the CEL, so a rule changed here changes the policy.
    from kuberl.api import pod_security as pss

    for values in (pss.SAFE_SYSCTLS, pss.BASELINE_ADDABLE_CAPABILITIES, pss.SELINUX_TYPES - {""}):
        assert all(f'"{v}"' in committed or f"'{v}'" in committed or f'\\"{v}\\"' in committed for v in values)

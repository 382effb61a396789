"""The chart's ValidatingAdmissionPolicy: the API server itself holds every pod labelled as a KubeRL job's to
the Pod Security level and the ServiceAccount rules its namespace's allowance gives, even if the operator
(or a user who may create pods and copies its labels) got it wrong.

The CEL is generated from the same rules the operator checks with (kuberl.api.pod_security's sets, the
tenancy's defaults), so there is one statement of each rule: `python -m kuberl.operator.admission_policy`
rewrites `charts/kuberl-operator/templates/admission-policy.yaml` (a test fails when it is stale), and
tests/integration/test_pod_security_admission.py holds the policy, on a real API server, to the same
verdicts as kuberl.api.pod_security over the generated corpus of templates.

The per-namespace allowance comes from a ConfigMap the chart renders from `tenancy.namespaces` (the
policy's parameter): `<namespace>.podSecurity` and `<namespace>.serviceAccounts` (comma-separated);
a namespace it does not name gets the default, restricted and no ServiceAccount.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kuberl.api import pod_security as pss
from kuberl.operator import names

CHART_TEMPLATE = (Path(__file__).resolve().parents[3] / "charts" / "kuberl-operator" / "templates"
                  / "admission-policy.yaml")
#: Every volume source of a Pod (Kubernetes 1.37's Volume, less `name`): restricted allows only its own list.
VOLUME_SOURCES = ("awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
                  "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk",
                  "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim",
                  "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret",
                  "storageos", "vsphereVolume")


def _list(items) -> str:
    return "[" + ", ".join(json.dumps(i) for i in sorted(items)) + "]"


def _unset_or(obj: str, field: str, ok: str) -> str:
    """CEL: `obj.field` is unset, or `ok` holds for it (written with `obj.field`)."""
    return f"(!has({obj}.{field}) || {ok})"


def _context_rule(ok: str) -> str:
    """`ok` (over `sc`, a securityContext) holds for the pod's and every container's securityContext."""
    return (f"(!has(object.spec.securityContext) || [object.spec.securityContext].all(sc, {ok})) && "
            f"variables.containers.all(c, !has(c.securityContext) || [c.securityContext].all(sc, {ok}))")


def _handlers_rule() -> str:
    probes = " && ".join(f"(!has(c.{p}) || ((!has(c.{p}.httpGet) || !has(c.{p}.httpGet.host) || "
                         f"c.{p}.httpGet.host == '') && (!has(c.{p}.tcpSocket) || !has(c.{p}.tcpSocket.host) || "
                         f"c.{p}.tcpSocket.host == '')))" for p in pss.PROBES)
    hooks = " && ".join(f"(!has(c.lifecycle) || !has(c.lifecycle.{h}) || ((!has(c.lifecycle.{h}.httpGet) || "
                        f"!has(c.lifecycle.{h}.httpGet.host) || c.lifecycle.{h}.httpGet.host == '') && "
                        f"(!has(c.lifecycle.{h}.tcpSocket) || !has(c.lifecycle.{h}.tcpSocket.host) || "
                        f"c.lifecycle.{h}.tcpSocket.host == '')))" for h in pss.HOOKS)
    return f"variables.containers.all(c, {probes} && {hooks})"


def baseline_rules() -> list[tuple[str, str]]:
    """(CEL that must hold, what it says when it does not): the baseline level."""
    seccomp_ok = f"(!has(sc.seccompProfile) || sc.seccompProfile.type in {_list(pss.SECCOMP_TYPES)})"
    apparmor_ok = f"(!has(sc.appArmorProfile) || sc.appArmorProfile.type in {_list(pss.APPARMOR_TYPES)})"
    selinux_ok = ("(!has(sc.seLinuxOptions) || ((!has(sc.seLinuxOptions.type) || sc.seLinuxOptions.type in "
                  f"{_list(pss.SELINUX_TYPES)}) && (!has(sc.seLinuxOptions.user) || sc.seLinuxOptions.user == '') "
                  "&& (!has(sc.seLinuxOptions.role) || sc.seLinuxOptions.role == '')))")
    host_process_ok = ("(!has(sc.windowsOptions) || !has(sc.windowsOptions.hostProcess) || "
                       "!sc.windowsOptions.hostProcess)")
    prefix = pss.APPARMOR_ANNOTATION_PREFIX
    return [
        ("!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && !(has(object.spec.hostPID) && "
         "object.spec.hostPID) && !(has(object.spec.hostIPC) && object.spec.hostIPC)",
         "host namespaces are not allowed (spec.hostNetwork, hostPID, hostIPC)"),
        ("variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || "
         "!c.securityContext.privileged)", "privileged containers are not allowed"),
        ("variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.capabilities) || "
         f"!has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(a, a in "
         f"{_list(pss.BASELINE_ADDABLE_CAPABILITIES)}))", "a container adds a capability baseline does not allow"),
        ("!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))",
         "hostPath volumes are not allowed"),
        ("variables.containers.all(c, !has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))",
         "host ports are not allowed"),
        (_context_rule(seccomp_ok), "seccompProfile.type must be RuntimeDefault or Localhost"),
        (_context_rule(selinux_ok), "seLinuxOptions: the type must be a container type, user and role unset"),
        (_context_rule(apparmor_ok), "appArmorProfile.type must be RuntimeDefault or Localhost"),
        (f"!has(object.metadata.annotations) || object.metadata.annotations.all(k, !k.startsWith('{prefix}') || "
         f"object.metadata.annotations[k] in ['', 'runtime/default'] || "
         "object.metadata.annotations[k].startsWith('localhost/'))",
         "AppArmor annotations must be runtime/default or localhost/<profile>"),
        ("!has(object.spec.securityContext) || !has(object.spec.securityContext.sysctls) || "
         f"object.spec.securityContext.sysctls.all(s, s.name in {_list(pss.SAFE_SYSCTLS)})",
         "only the safe sysctls are allowed"),
        ("(has(object.spec.hostUsers) && !object.spec.hostUsers && variables.level == 'baseline') || "
         "variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.procMount) || "
         "c.securityContext.procMount == 'Default')", "procMount must be Default"),
        (_context_rule(host_process_ok), "HostProcess pods and containers are not allowed"),
        (_handlers_rule(), "probes and lifecycle hooks may not name a host"),
    ]


def restricted_rules() -> list[tuple[str, str]]:
    """(CEL that must hold, what it says when it does not): what restricted adds to baseline."""
    refused = sorted(set(VOLUME_SOURCES) - pss.RESTRICTED_VOLUME_SOURCES)
    non_root = ("(has(object.spec.hostUsers) && !object.spec.hostUsers) || ("
                "!(has(object.spec.securityContext) && has(object.spec.securityContext.runAsNonRoot) && "
                "!object.spec.securityContext.runAsNonRoot) && variables.containers.all(c, "
                "(has(c.securityContext) && has(c.securityContext.runAsNonRoot)) ? c.securityContext.runAsNonRoot : "
                "(has(object.spec.securityContext) && has(object.spec.securityContext.runAsNonRoot) && "
                "object.spec.securityContext.runAsNonRoot)))")
    not_uid0 = "(!has(sc.runAsUser) || sc.runAsUser != 0)"
    pod_seccomp = "(has(object.spec.securityContext) && has(object.spec.securityContext.seccompProfile))"
    return [
        ("!has(object.spec.volumes) || object.spec.volumes.all(v, " +
         " && ".join(f"!has(v.{k})" for k in refused) + ")",
         f"volumes may only be {', '.join(sorted(pss.RESTRICTED_VOLUME_SOURCES))}"),
        ("variables.containers.all(c, has(c.securityContext) && has(c.securityContext.allowPrivilegeEscalation) && "
         "!c.securityContext.allowPrivilegeEscalation)", "allowPrivilegeEscalation must be false"),
        (non_root, "runAsNonRoot must be true"),
        ("(has(object.spec.hostUsers) && !object.spec.hostUsers) || (" + _context_rule(not_uid0) + ")",
         "runAsUser must not be 0"),
        (f"variables.containers.all(c, (has(c.securityContext) && has(c.securityContext.seccompProfile)) || "
         f"{pod_seccomp})", "seccompProfile.type must be set, on the pod or every container"),
        ("variables.containers.all(c, has(c.securityContext) && has(c.securityContext.capabilities) && "
         "has(c.securityContext.capabilities.drop) && 'ALL' in c.securityContext.capabilities.drop && "
         "(!has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(a, a in "
         f"{_list(pss.RESTRICTED_ADDABLE_CAPABILITIES)})))",
         "capabilities must drop ALL and may add only NET_BIND_SERVICE"),
    ]


def account_rules() -> list[tuple[str, str]]:
    """A ServiceAccount, its token mounted, or a projected token: only an account the namespace allows."""
    allowed = "object.spec.serviceAccountName in variables.accounts"
    return [
        (f"!has(object.spec.serviceAccountName) || object.spec.serviceAccountName == 'default' || {allowed}",
         "the pod runs as a ServiceAccount its namespace's allowance does not name"),
        ("(has(object.spec.automountServiceAccountToken) && !object.spec.automountServiceAccountToken) || "
         f"{allowed}",
         "a ServiceAccount token is mounted only for an account the namespace's allowance names "
         "(set automountServiceAccountToken: false)"),
        ("!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.projected) || !has(v.projected.sources) || "
         f"v.projected.sources.all(s, !has(s.serviceAccountToken))) || {allowed}",
         "a projected ServiceAccount token only for an account the namespace's allowance names"),
    ]


def policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy, named by the chart (`__NAME__` is replaced with the release's)."""
    level = "variables.level"
    validations = [{"expression": f"!({level} in ['baseline', 'restricted']) || ({rule})",
                    "messageExpression": f"'Pod Security ' + {level} + ' (the namespace\\'s allowance for KubeRL "
                                         f"pods): {message}'"} for rule, message in baseline_rules()]
    validations += [{"expression": f"{level} != 'restricted' || ({rule})",
                     "messageExpression": f"'Pod Security restricted (the namespace\\'s allowance for KubeRL pods): "
                                          f"{message}'"} for rule, message in restricted_rules()]
    validations += [{"expression": rule, "message": f"KubeRL pods: {message}"} for rule, message in account_rules()]
    for v in validations:
        v["reason"] = "Forbidden"
    key = "request.namespace + '.podSecurity'"
    accounts = "request.namespace + '.serviceAccounts'"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "__NAME__"},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            # CREATE only: what the rules read cannot change on a pod after it exists, and a later change
            # of the allowance must not stop Kueue or the garbage collector from updating a running pod.
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                   "resources": ["pods"]}],
                "objectSelector": {"matchExpressions": [{"key": names.JOB_NAME_LABEL, "operator": "Exists"}]}},
            "variables": [
                {"name": "level", "expression": f"has(params.data) && {key} in params.data ? params.data[{key}] : "
                                                f"'{pss.RESTRICTED}'"},
                {"name": "accounts", "expression": f"has(params.data) && {accounts} in params.data && "
                                                   f"params.data[{accounts}] != '' ? "
                                                   f"params.data[{accounts}].split(',') : []"},
                {"name": "containers", "expression": "object.spec.containers + (has(object.spec.initContainers) ? "
                                                     "object.spec.initContainers : [])"},
            ],
            "validations": validations,
        },
    }


HEADER = """\
{{- /* Generated by `python -m kuberl.operator.admission_policy` from the operator's own rules: edit that. */}}
{{- if and .Values.admissionPolicy.enabled (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) }}
"""
FOOTER = """\
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "kuberl-operator.fullname" . }}-pods
  labels:
    {{- include "kuberl-operator.labels" . | nindent 4 }}
spec:
  policyName: {{ include "kuberl-operator.fullname" . }}-pods
  validationActions: [Deny]
  paramRef:
    name: {{ include "kuberl-operator.fullname" . }}-tenancy
    namespace: {{ .Release.Namespace }}
    parameterNotFoundAction: Deny
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "kuberl-operator.fullname" . }}-tenancy
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "kuberl-operator.labels" . | nindent 4 }}
data:
  {{- range $namespace, $allowance := .Values.tenancy.namespaces }}
  {{ $namespace }}.podSecurity: {{ $allowance.podSecurity | default "restricted" | quote }}
  {{ $namespace }}.serviceAccounts: {{ join "," ($allowance.serviceAccounts | default list) | quote }}
  {{- end }}
{{- end }}
"""


def chart_template() -> str:
    body = yaml.safe_dump(policy(), sort_keys=False, width=100000)
    body = body.replace("name: __NAME__", 'name: {{ include "kuberl-operator.fullname" . }}-pods\n'
                        '  labels:\n    {{- include "kuberl-operator.labels" . | nindent 4 }}')
    return HEADER + body + FOOTER


def main() -> int:
    CHART_TEMPLATE.write_text(chart_template())
    print(f"wrote {CHART_TEMPLATE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

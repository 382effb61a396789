"""What a job's pod templates may do in a namespace, as the platform team allowed it.

Creating an RLTrainingJob lets a tenant run pods in that namespace: the operator creates them with its
own rights, so a template must not give a pod more than the namespace allows. By default every pod meets
Pod Security "restricted", runs with no ServiceAccount token (named, projected, automounted or a Secret
named as Kubernetes names an account's token Secret) and carries no label or annotation that asks for a
cloud identity (kuberl.api.cloud_identity); a platform team can allow more per namespace (a PSA level
name, ServiceAccounts a template may name, identity keys), in the chart's values. Jobs in the operator's
own namespace are refused: its ServiceAccount lives there. Other Secrets, ConfigMaps and claims a template
mounts stay the namespace's own business, as they are for any pod its tenants create.

Pure data: `kuberl validate` and the operator call `problems()` on the parsed job, so both refuse the
same templates with the same paths, before any object of the job exists.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kuberl.api import cloud_identity, pod_security, pod_template
from kuberl.api.job import RLTrainingJob
from kuberl.api.pod_schema import format_path
from kuberl.api.problems import Problem

#: The roles whose pods a template changes: spec field -> the spec's attribute path.
ROLES = {"head": ("head",), "rolloutWorkers": ("rollout_workers",), "learner": ("learner",),
         "serving": ("serving",)}
_SERVICE_ACCOUNT_FIELDS = ("serviceAccountName", "serviceAccount")
#: The name Kubernetes gives the token Secret it makes for a ServiceAccount (every account before 1.24;
#: some distributions still make them): the account's name, "-token-", and 5 characters of apimachinery's random-name
#: alphabet (pkg/controller/serviceaccount/tokens_controller.go, k8s.io/apimachinery/pkg/util/rand).
#: The operator never reads Secrets, so a name is all it can tell a token Secret by.
_TOKEN_SECRET = re.compile(r"^(?P<account>.+)-token-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_ALLOWANCE_FIELDS = ("podSecurity", "serviceAccounts", "identityKeys")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: How to ask for more, in every refusal: the tenant cannot change it, the platform team can.
HOW_TO_ALLOW = "the platform team can allow more here (the chart's tenancy.namespaces)"


@dataclass(frozen=True)
class Allowance:
    """What a namespace's job pods may be: at least its Pod Security level, these ServiceAccounts, and
    these labels and annotations of cloud_identity.IDENTITY_KEYS (a key, or a prefix ending in "/")."""

    pod_security: str = pod_security.RESTRICTED
    service_accounts: frozenset[str] = frozenset()
    identity_keys: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        pod_security.check_level(self.pod_security)


@dataclass(frozen=True)
class Tenancy:
    """The allowance of each namespace named, the default for all others, and where the operator runs."""

    namespaces: Mapping[str, Allowance] = field(default_factory=dict)
    operator_namespace: str | None = None
    default: Allowance = Allowance()

    def allowance(self, namespace: str | None) -> Allowance:
        return self.namespaces.get(namespace or "", self.default)

    @classmethod
    def from_json(cls, text: str, operator_namespace: str | None = None) -> Tenancy:
        """The chart's `tenancy.namespaces` as JSON: {namespace: {podSecurity, serviceAccounts,
        identityKeys}}. ValueError names what is wrong."""
        fields = ", ".join(_ALLOWANCE_FIELDS)
        data = json.loads(text or "{}")
        if not isinstance(data, dict):
            raise ValueError(f"tenancy must map namespace names to {{{fields}}}")
        out = {}
        for namespace, entry in data.items():
            where = f"tenancy.namespaces.{namespace}"
            if not isinstance(entry, dict) or set(entry) - set(_ALLOWANCE_FIELDS):
                raise ValueError(f"{where}: give any of {fields}, nothing else")
            level = entry.get("podSecurity", pod_security.RESTRICTED)
            if level not in pod_security.LEVELS:
                raise ValueError(f"{where}.podSecurity: {level!r} is not a Pod Security level; "
                                 f"one of {', '.join(pod_security.LEVELS)}")
            accounts = entry.get("serviceAccounts") or []
            if not isinstance(accounts, list) or not all(isinstance(a, str) and _NAME.match(a) for a in accounts):
                raise ValueError(f"{where}.serviceAccounts: a list of ServiceAccount names")
            keys = entry.get("identityKeys") or []
            if not isinstance(keys, list) or not all(isinstance(k, str) and cloud_identity.grants(k) for k in keys):
                raise ValueError(f"{where}.identityKeys: a list of labels or annotations the operator refuses as "
                                 f"cloud identity, each a key or a prefix ending in '/' under one of "
                                 f"{', '.join(cloud_identity.IDENTITY_KEYS)}")
            if namespace == operator_namespace:
                raise ValueError(f"{where}: jobs never run in the operator's own namespace; allow nothing there")
            out[namespace] = Allowance(level, frozenset(accounts), frozenset(keys))
        return cls(out, operator_namespace=operator_namespace)


def problems(job: RLTrainingJob, tenancy: Tenancy) -> list[Problem]:
    """Every way the job would make a pod more than its namespace allows; empty: the job may run."""
    namespace = job.metadata.namespace
    if tenancy.operator_namespace and namespace == tenancy.operator_namespace:
        return [Problem("metadata.namespace", "jobs may not run in the operator's own namespace (its "
                        "ServiceAccount and rights live there); create the job in a tenant namespace", namespace)]
    allowance = tenancy.allowance(namespace)
    out: list[Problem] = []
    for role, attrs in ROLES.items():
        part: Any = job.spec
        for attr in attrs:
            part = getattr(part, attr, None)
        template = getattr(part, "template", None) if part is not None else None
        if template:
            where = f"spec.{role}.template"
            out += [Problem(f"{where}.{format_path(path)}", message, has_value=False)
                    for path, message in template_problems(template, role, allowance)]
    return out + _credentials_secret_problems(job, allowance)


def template_problems(template: dict[str, Any], role: str, allowance: Allowance) -> list[tuple[tuple, str]]:
    """(path inside the template, why) for what the template would add beyond `allowance`: the pod the
    operator builds for `role`, with the template merged onto it, checked at the allowed level."""
    merged = pod_template.merge(operator_pod(role), template, role)
    level = allowance.pod_security
    out = [(_in_template(path, merged, template), f"Pod Security {level!r}, this namespace's level: {message}; "
            f"{HOW_TO_ALLOW}") for path, message in pod_security.violations(merged, level)]
    return [*out, *_service_account_problems(template, allowance), *_token_secret_problems(template, allowance),
            *_identity_problems(template, allowance)]


def operator_pod(role: str) -> dict[str, Any]:
    """What the operator sets, on a role's pod, that Pod Security reads: the security contexts and the
    token, on its own container."""
    def container(name: str) -> dict[str, Any]:
        return {"name": name, "securityContext": copy.deepcopy(pod_template.CONTAINER_SECURITY_CONTEXT)}

    spec: dict[str, Any] = {**copy.deepcopy(pod_template.POD_FIELDS),
                            "containers": [container(pod_template.MAIN_CONTAINERS[role])]}
    return {"metadata": {}, "spec": spec}


def _in_template(path: tuple, merged: dict[str, Any], template: dict[str, Any]) -> tuple:
    """A path in the merged pod as a path in the template: list items found by name (the merge keys)."""
    if len(path) >= 3 and path[0] == "spec" and isinstance(path[2], int):
        name = (merged["spec"][path[1]][path[2]] or {}).get("name")
        items = (template.get("spec") or {}).get(path[1]) or []
        index = next((i for i, item in enumerate(items) if item.get("name") == name), None)
        if index is None:  # only the operator's own entry: the pod-level field it inherits is the cause
            return ("spec",)
        return ("spec", path[1], index, *path[3:])
    return path


def _allowed_text(allowed: frozenset[str]) -> str:
    return f"allowed here: {', '.join(sorted(allowed))}" if allowed else "none is allowed here"


def _service_account_problems(template: dict[str, Any], allowance: Allowance) -> list[tuple[tuple, str]]:
    spec = template.get("spec") or {}
    allowed_text = _allowed_text(allowance.service_accounts)
    out: list[tuple[tuple, str]] = []
    named = None
    for key in _SERVICE_ACCOUNT_FIELDS:
        if key in spec:
            if spec[key] in allowance.service_accounts:
                named = spec[key]
            else:
                out.append((("spec", key), f"a job's pods run as a ServiceAccount only where the platform team "
                            f"allowed it ({allowed_text}); by default they run with no token; {HOW_TO_ALLOW}"))
    token = ("a ServiceAccount token is mounted only with a serviceAccountName the platform team allowed "
             f"({allowed_text}); {HOW_TO_ALLOW}")
    if spec.get("automountServiceAccountToken") and named is None:
        out.append((("spec", "automountServiceAccountToken"), token))
    for i, volume in enumerate(spec.get("volumes") or []):
        for j, source in enumerate((volume.get("projected") or {}).get("sources") or []):
            if "serviceAccountToken" in source and named is None:
                out.append((("spec", "volumes", i, "projected", "sources", j, "serviceAccountToken"), token))
    return out


def _secret_refs(spec: dict[str, Any]) -> list[tuple[tuple, str]]:
    """(path, Secret name) of every Secret the pod would read: volumes, projected sources, env and envFrom."""
    out: list[tuple[tuple, str]] = []
    for i, volume in enumerate(spec.get("volumes") or []):
        if "secretName" in (volume.get("secret") or {}):
            out.append((("spec", "volumes", i, "secret", "secretName"), volume["secret"]["secretName"]))
        for j, source in enumerate((volume.get("projected") or {}).get("sources") or []):
            if "name" in (source.get("secret") or {}):
                out.append((("spec", "volumes", i, "projected", "sources", j, "secret", "name"),
                            source["secret"]["name"]))
    for key in _CONTAINER_LISTS:
        for i, container in enumerate(spec.get(key) or []):
            for j, env in enumerate(container.get("env") or []):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
                if "name" in ref:
                    out.append((("spec", key, i, "env", j, "valueFrom", "secretKeyRef", "name"), ref["name"]))
            for j, source in enumerate(container.get("envFrom") or []):
                if "name" in (source.get("secretRef") or {}):
                    out.append((("spec", key, i, "envFrom", j, "secretRef", "name"), source["secretRef"]["name"]))
    return out


def _token_secret_problems(template: dict[str, Any], allowance: Allowance) -> list[tuple[tuple, str]]:
    out = []
    for path, name in _secret_refs(template.get("spec") or {}):
        why = _token_secret_refusal(name, allowance)
        if why:
            out.append((path, why))
    return out


def _token_secret_refusal(name: str, allowance: Allowance) -> str | None:
    """A Secret named as Kubernetes names an account's token Secret holds that account's token for all the
    operator can tell: it is the account's only where the platform team allowed the account."""
    match = _TOKEN_SECRET.match(name)
    if match is None or match["account"] in allowance.service_accounts:
        return None
    return (f"{name!r} is named as Kubernetes names the token Secret of ServiceAccount {match['account']!r} "
            "(<account>-token-<5 characters>); a job's pods carry a ServiceAccount's token only where the platform "
            f"team allowed that account ({_allowed_text(allowance.service_accounts)}); a Secret that holds no "
            f"token can be named differently; {HOW_TO_ALLOW}")


def _credentials_secret_problems(job: RLTrainingJob, allowance: Allowance) -> list[Problem]:
    """The Secrets the spec hands the learner for a tracker or an object store: their keys go to a server
    the job names, so an account's token Secret is refused here as in a template."""
    named = {"spec.tracking.mlflow.credentialsSecret": job.spec.tracking.mlflow,
             "spec.checkpointing.s3.credentialsSecret": job.spec.checkpointing.s3}
    out = []
    for path, part in named.items():
        name = getattr(part, "credentials_secret", None)
        why = _token_secret_refusal(name, allowance) if name else None
        if why:
            out.append(Problem(path, why, name))
    return out


def _identity_problems(template: dict[str, Any], allowance: Allowance) -> list[tuple[tuple, str]]:
    meta = template.get("metadata") or {}
    out = []
    for kind in ("labels", "annotations"):
        for key in meta.get(kind) or {}:
            system = cloud_identity.grants(key)
            if system and not cloud_identity.covering(key, allowance.identity_keys):
                out.append((("metadata", kind, key), (
                    f"asks {system} for cloud credentials; a job's pods get a cloud identity only through the "
                    "labels and annotations the platform team allowed for the namespace (identityKeys, "
                    f"{_allowed_text(allowance.identity_keys)}); {HOW_TO_ALLOW}")))
    return out

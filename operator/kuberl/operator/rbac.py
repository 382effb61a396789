"""The exact API permissions the operator needs, and the RBAC manifests that grant them.

The Helm chart renders these same rules; `kuberl-operator rbac [--namespace NS]` prints them.
Nothing here touches secrets: the operator never reads or writes one.
"""

from __future__ import annotations

from typing import Any

import yaml

from kuberl.api import sweep
from kuberl.api.job import GROUP, PLURAL

#: Rules on namespaced resources: granted cluster-wide (ClusterRole) or in one namespace (Role).
RULES: list[dict[str, list[str]]] = [
    # The jobs: listed and watched by kopf, patched by kopf (its finalizer and annotations), deleted by
    # ttlSecondsAfterFinished. Never read one by one: kopf works from its watch.
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["list", "watch", "patch", "delete"]},
    # Status goes out as a merge patch of the status subresource (kopf's and the reconcile loop's).
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]},
    # Children carry ownerReferences with blockOwnerDeletion, which needs update on the owner's
    # finalizers where the OwnerReferencesPermissionEnforcement admission plugin is on (the tests' API
    # server runs it): an authorization check on every child's create, not a request of its own.
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
    # Pods: listed per job and watched (kopf's pod events), created, and deleted when replaced,
    # suspended or finished. Everything else a job owns is created once and removed by the garbage
    # collector with the job, so the operator neither reads nor deletes it.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "create", "delete"]},
    # The head and metrics Services; spec.serving's Service too.
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]},
    # Each job's Ray token: created once, never read back (no get, list or watch, so the operator's
    # credentials cannot read any Secret, its own jobs' included).
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    # Each learner's job file (immutable, named by its content).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
    # The Ray and learner NetworkPolicies of each job.
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
    # Each job's PodDisruptionBudget: a drain evicts its pods one at a time; patched when the job scales.
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create", "patch"]},
    # spec.serving: the Deployment serving the trained policy.
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]},
    # Kubernetes Events on every phase transition (kopf posts core/v1 Events).
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]

#: Rules of RLSweeps, granted with RULES: what a sweep's loop does beyond a job's.
SWEEP_RULES: list[dict[str, list[str]]] = [
    # The sweeps: listed and watched by kopf, patched by kopf (its finalizer, which stops the sweep's loop
    # before the sweep goes). Never deleted by the operator: the trials go with it (garbage collector).
    {"apiGroups": [GROUP], "resources": [sweep.PLURAL], "verbs": ["list", "watch", "patch"]},
    # The sweep's status: a merge patch of the status subresource.
    {"apiGroups": [GROUP], "resources": [f"{sweep.PLURAL}/status"], "verbs": ["patch"]},
    # Trials carry an ownerReference to the sweep with blockOwnerDeletion: authorized against update of the
    # sweep's finalizers on every trial's create, not a request of its own.
    {"apiGroups": [GROUP], "resources": [f"{sweep.PLURAL}/finalizers"], "verbs": ["update"]},
    # The trials: RLTrainingJobs created by the sweep's loop (listed, and suspended by a patch, under RULES).
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create"]},
]

#: Cluster-scoped rules, granted only in the cluster-wide variant: kopf watches CRDs and namespaces
#: to notice new ones at run time. Without them (single-namespace) kopf warns once and carries on.
CLUSTER_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]

#: Extra rules for `--peering` (several operator replicas agreeing who is active). Off by default:
#: the deployment model is one replica, and peering also needs kopf's peering CRDs installed.
PEERING_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["get", "list", "watch", "patch"]},
]

DEFAULT_NAME = "kuberl-operator"
DEFAULT_SERVICE_ACCOUNT_NAMESPACE = "kuberl-system"


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/name": "kuberl-operator", "app.kubernetes.io/part-of": "kuberl",
                      "app.kubernetes.io/component": "operator"}
    return meta


def _subject(service_account: str, namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}


def cluster_wide(*, name: str = DEFAULT_NAME, service_account: str = DEFAULT_NAME,
                 service_account_namespace: str = DEFAULT_SERVICE_ACCOUNT_NAMESPACE,
                 peering: bool = False) -> list[dict[str, Any]]:
    """ClusterRole + ClusterRoleBinding for an operator that watches every namespace."""
    rules = RULES + SWEEP_RULES + CLUSTER_RULES + (PEERING_RULES if peering else [])
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(name),
         "rules": [dict(r) for r in rules]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(name),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [_subject(service_account, service_account_namespace)]},
    ]


#: The watched namespace of deploy/rbac/single-namespace.yaml (the operator stays in its own).
EXAMPLE_JOB_NAMESPACE = "rl-jobs"


def single_namespace(namespace: str, *, name: str = DEFAULT_NAME, service_account: str = DEFAULT_NAME,
                     service_account_namespace: str = DEFAULT_SERVICE_ACCOUNT_NAMESPACE,
                     peering: bool = False) -> list[dict[str, Any]]:
    """Role + RoleBinding in `namespace` for an operator started with `--namespace NAMESPACE`, bound to its
    ServiceAccount in another namespace: a job's templates could name any account of their own namespace,
    so the operator's never lives where jobs run."""
    if namespace == service_account_namespace:
        raise ValueError(f"the operator's ServiceAccount must live outside the namespace it watches "
                         f"({namespace}): its rights would be open to every job there")
    rules = RULES + SWEEP_RULES + ([PEERING_RULES[1]] if peering else [])
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, namespace),
         "rules": [dict(r) for r in rules]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, namespace),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [_subject(service_account, service_account_namespace)]},
    ]


def render(manifests: list[dict[str, Any]]) -> str:
    """Manifests as one multi-document YAML string, in order."""
    return yaml.safe_dump_all(manifests, sort_keys=False)


#: Files under deploy/rbac/, generated by `write_deploy_files` (a test fails when they drift).
DEPLOY_FILES = {
    "cluster-wide.yaml": ("kuberl-operator rbac", lambda: cluster_wide()),
    "single-namespace.yaml": (f"kuberl-operator rbac --namespace {EXAMPLE_JOB_NAMESPACE}",
                              lambda: single_namespace(EXAMPLE_JOB_NAMESPACE)),
}


def deploy_file_text(filename: str) -> str:
    command, build = DEPLOY_FILES[filename]
    return (f"# Generated by `{command}` (kuberl/operator/rbac.py); do not edit.\n"
            "# The Helm chart renders the same rules.\n" + render(build()))


def write_deploy_files(directory: str) -> None:
    from pathlib import Path

    for filename in DEPLOY_FILES:
        (Path(directory) / filename).write_text(deploy_file_text(filename))

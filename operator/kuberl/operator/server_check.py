"""A job checked by the API server it would run on, before anything of it exists.

The server knows what no copy of its rules here does: its validation of every pod field, admission (Pod
Security, ResourceQuota, PriorityClass, webhooks such as Kueue's), and what the caller may create. So the
job itself and every object the operator would create for it are sent as server-side dry runs
(`dryRun=All`): the server runs all of that and stores nothing. `kuberl validate --server` does this with
the current kube context; the operator dry-runs each batch of creates the same way.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import kubernetes

from kuberl.api.job import GROUP, PLURAL, VERSION
from kuberl.api.load import parse_job
from kuberl.api.problems import Problem
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions

_RESOURCES = {"Pod": ("", "v1", "pods"), "Service": ("", "v1", "services"), "Secret": ("", "v1", "secrets"),
              "ConfigMap": ("", "v1", "configmaps"), "Deployment": ("apps", "v1", "deployments"),
              "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
              "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
              "RLTrainingJob": (GROUP, VERSION, PLURAL)}
#: An answer's message is quoted at most this long: a webhook may say a lot.
MESSAGE_MAX = 1000


def _path(kind: str, namespace: str) -> str:
    group, version, plural = _RESOURCES[kind]
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def dry_run(api: kubernetes.client.ApiClient, manifest: dict[str, Any], namespace: str) -> str | None:
    """Send one create as a server-side dry run with strict field validation (as `kubectl apply` does);
    the server's refusal as one line, or None when it would take it."""
    try:
        api.call_api(_path(manifest["kind"], namespace), "POST", body=manifest, auth_settings=["BearerToken"],
                     query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
                     header_params={"Content-Type": "application/json", "Accept": "application/json"},
                     _preload_content=False, _request_timeout=30)
    except kubernetes.client.ApiException as err:
        try:
            message = json.loads(err.body or "{}").get("message") or err.reason
        except ValueError:
            message = str(err.reason)
        return f"HTTP {err.status}: {str(message)[:MESSAGE_MAX]}"
    return None


def check(api: kubernetes.client.ApiClient, body: dict[str, Any], namespace: str,
          options: BuildOptions | None = None) -> list[Problem]:
    """The server's verdict on a job (`body`, as the user wrote it, already valid here) placed in `namespace`
    and on every object the operator would create for it, one problem per refusal; nothing is created."""
    body = {**body, "metadata": {**body.get("metadata", {}), "namespace": namespace}}
    job = parse_job(body)
    refused = dry_run(api, body, namespace)
    if refused is not None:  # the job itself: its children would never be made
        return [Problem("<server>", f"the API server refuses the job: {refused}", has_value=False)]
    problems = []
    for manifest in builders.every_object(job, options or BuildOptions(), ray_token=secrets.token_hex(32)):
        refused = dry_run(api, manifest, namespace)
        if refused is not None:
            what = f"{manifest['kind']} {manifest['metadata']['name']}"
            problems.append(Problem("<server>", f"the API server refuses the {what} the operator would create: "
                                    f"{refused}", has_value=False))
    return problems

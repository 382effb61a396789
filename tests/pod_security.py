"""Pod Security "restricted" over whatever carries a pod spec, for tests: the product's own check
(kuberl.api.pod_security, the one the operator refuses templates with) applied to a Pod, a workload
(Deployment, StatefulSet, DaemonSet, ReplicaSet, Job) or a CronJob, so chart tests and the builders' tests
check their output with one function. Tools nobody here wrote check the same manifests: checkov
(test_policy_scan.py) and, on the real control plane, the API server's Pod Security admission.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kuberl.api.pod_schema import format_path
from kuberl.api.pod_security import RESTRICTED, violations


def pod_specs(manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (where, pod spec) for every pod template a manifest carries (nothing for other kinds)."""
    kind = manifest.get("kind")
    name = manifest.get("metadata", {}).get("name", "?")
    spec = manifest.get("spec") or {}
    if kind == "Pod":
        yield f"Pod/{name}", spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"):
        yield f"{kind}/{name}", spec.get("template", {}).get("spec", {})
    elif kind == "CronJob":
        yield f"CronJob/{name}", spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every way this pod spec breaks the "restricted" Pod Security Standard, one sentence each."""
    problems = [] if pod.get("containers") else ["pod has no containers"]
    return problems + [f"{format_path(path)}: {message}" for path, message in violations({"spec": pod}, RESTRICTED)]


def assert_restricted(manifest: dict[str, Any]) -> None:
    """Fail with every violation when any pod template in the manifest breaks the restricted profile."""
    found = False
    for where, pod in pod_specs(manifest):
        found = True
        problems = restricted_violations(pod)
        assert not problems, f"{where} breaks Pod Security 'restricted':\n  - " + "\n  - ".join(problems)
    assert found, f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')} carries no pod spec"

"""Kubernetes Pod Security Standards, "restricted" profile, as a reusable checker for tests.

`restricted_violations(pod_spec)` returns every violation (empty list: the pod would be admitted
by a namespace labelled `pod-security.kubernetes.io/enforce: restricted`). It follows the
published profile (baseline controls plus the restricted ones), with the same pod-level /
container-level precedence the admission plugin uses. `pod_specs(manifest)` finds the pod spec in
a Pod, a workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job) or a CronJob, so chart
tests and the operator's builder tests check their output with one function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Volume sources the restricted profile allows (every other source, hostPath first, is refused).
ALLOWED_VOLUME_SOURCES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
#: Baseline: capabilities a container may add; restricted narrows this to NET_BIND_SERVICE.
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
ALLOWED_SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
ALLOWED_APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


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


def _containers(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in _CONTAINER_LISTS:
        for container in pod.get(field) or []:
            yield f"{field}[{container.get('name', '?')}]", container


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every way this pod spec breaks the "restricted" Pod Security Standard, one sentence each."""
    problems: list[str] = []
    pod_sc = pod.get("securityContext") or {}
    containers = list(_containers(pod))
    if not containers:
        problems.append("pod has no containers")

    # Baseline: host namespaces, host ports, host paths, privileged, HostProcess, /proc, SELinux, sysctls.
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"spec.{field} must be unset or false, got {pod[field]!r}")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls: {sysctl.get('name')!r} is not a safe sysctl")
    problems += _selinux_problems("spec.securityContext", pod_sc)
    problems += _apparmor_problems("spec.securityContext", pod_sc)

    for volume in pod.get("volumes") or []:
        sources = set(volume) - {"name"}
        bad = sources - ALLOWED_VOLUME_SOURCES
        if bad:
            problems.append(
                f"volume {volume.get('name')!r} uses {sorted(bad)}; allowed: {sorted(ALLOWED_VOLUME_SOURCES)}"
            )

    # Restricted: pod-level settings that containers may inherit.
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser must not be 0")
    if pod_seccomp is not None and pod_seccomp not in ALLOWED_SECCOMP_TYPES:
        problems.append(f"spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost, got {pod_seccomp!r}")

    for where, container in containers:
        sc = container.get("securityContext") or {}
        prefix = f"{where}.securityContext"
        if sc.get("privileged"):
            problems.append(f"{prefix}.privileged must be unset or false")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{prefix}.windowsOptions.hostProcess must not be true")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{prefix}.procMount must be Default, got {sc.get('procMount')!r}")
        for port in container.get("ports") or []:
            if port.get("hostPort") not in (None, 0):
                problems.append(f"{where}: port {port.get('name', port.get('containerPort'))} sets hostPort")
        problems += _selinux_problems(prefix, sc)
        problems += _apparmor_problems(prefix, sc)

        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{prefix}.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            problems.append(f"{prefix}.runAsNonRoot must be true (here or in the pod's securityContext)")
        if sc.get("runAsUser") == 0:
            problems.append(f"{prefix}.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is None and pod_seccomp is None:
            problems.append(f"{prefix}.seccompProfile.type must be RuntimeDefault or Localhost (here or on the pod)")
        elif seccomp is not None and seccomp not in ALLOWED_SECCOMP_TYPES:
            problems.append(f"{prefix}.seccompProfile.type must be RuntimeDefault or Localhost, got {seccomp!r}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{prefix}.capabilities.drop must include ALL")
        added = set(capabilities.get("add") or []) - RESTRICTED_ADDABLE_CAPABILITIES
        if added:
            problems.append(f"{prefix}.capabilities.add may only hold NET_BIND_SERVICE, got {sorted(added)}")
    return problems


def _selinux_problems(prefix: str, sc: dict[str, Any]) -> list[str]:
    options = sc.get("seLinuxOptions") or {}
    problems = []
    if options.get("type", "") not in ALLOWED_SELINUX_TYPES:
        problems.append(f"{prefix}.seLinuxOptions.type {options['type']!r} is not allowed")
    for field in ("user", "role"):
        if options.get(field):
            problems.append(f"{prefix}.seLinuxOptions.{field} must be unset")
    return problems


def _apparmor_problems(prefix: str, sc: dict[str, Any]) -> list[str]:
    profile_type = (sc.get("appArmorProfile") or {}).get("type")
    if profile_type is not None and profile_type not in ALLOWED_APPARMOR_TYPES:
        return [f"{prefix}.appArmorProfile.type must be RuntimeDefault or Localhost, got {profile_type!r}"]
    return []


def assert_restricted(manifest: dict[str, Any]) -> None:
    """Fail with every violation when any pod template in the manifest breaks the restricted profile."""
    found = False
    for where, pod in pod_specs(manifest):
        found = True
        problems = restricted_violations(pod)
        assert not problems, f"{where} breaks Pod Security 'restricted':\n  - " + "\n  - ".join(problems)
    assert found, f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')} carries no pod spec"

"""Kubernetes' Pod Security Standards over one pod: every way it breaks a level, with the field's path.

The levels are the published ones (kubernetes.io/docs/concepts/security/pod-security-standards) at the
newest policy version, as the admission plugin's checks (k8s.io/pod-security-admission/policy, v1.37)
read them, with its pod-level / container-level precedence: "privileged" allows everything, "baseline"
refuses the known privilege escalations, "restricted" is baseline plus the hardening rules. Hand-written
rules drift, so tests/integration/test_pod_security_admission.py holds this module to the API server's
own admission over a generated corpus of templates. The operator refuses a job whose templates would make
a pod break its namespace's level (kuberl.api.tenancy), before any object of the job exists; its own pods
meet "restricted".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Strictest first; a namespace's level allows what every level after it refuses.
LEVELS = ("restricted", "baseline", "privileged")
RESTRICTED, BASELINE, PRIVILEGED = LEVELS

#: Baseline: what a container may add to the runtime's default capabilities.
BASELINE_ADDABLE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: Restricted narrows that to one.
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
#: Restricted: the volume sources a pod may use (hostPath is refused at baseline already).
RESTRICTED_VOLUME_SOURCES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim", "projected",
    "secret"})
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: Baseline: the namespaced sysctls a pod may set.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"})
#: The AppArmor annotation of the older API (one per container).
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
#: Probes and lifecycle hooks: a `host` in any of them makes the kubelet, not the pod, open the connection.
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")

Violation = tuple[tuple, str]


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}; one of {', '.join(LEVELS)}")
    return level


def violations(pod: dict[str, Any], level: str = RESTRICTED) -> list[Violation]:
    """Every way `pod` ({metadata, spec}: a Pod or a pod template) breaks `level`: (path from the pod's
    root, what the level allows). Empty: a namespace enforcing `level` admits it."""
    check_level(level)
    if level == PRIVILEGED:
        return []
    found = _baseline(pod, level)
    if level == RESTRICTED:
        found += _restricted(pod.get("spec") or {})
    return found


def containers(spec: dict[str, Any]) -> Iterator[tuple[tuple, dict[str, Any]]]:
    """(path, container) for every container of a pod spec, init and ephemeral ones included."""
    for field in CONTAINER_LISTS:
        for i, container in enumerate(spec.get(field) or []):
            yield ("spec", field, i), container


def _baseline(pod: dict[str, Any], level: str) -> list[Violation]:
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    out: list[Violation] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append((("spec", field), "host namespaces are not allowed (must be unset or false)"))
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append((("spec", "securityContext", "windowsOptions", "hostProcess"), "HostProcess pods are not allowed"))
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append((("spec", "securityContext", "sysctls", i, "name"),
                        f"{sysctl.get('name')!r} is not one of the safe sysctls ({', '.join(sorted(SAFE_SYSCTLS))})"))
    out += _seccomp_not_unconfined(("spec", "securityContext"), pod_sc)
    out += _selinux(("spec", "securityContext"), pod_sc)
    out += _apparmor(("spec", "securityContext"), pod_sc)
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        allowed = value in ("", "runtime/default") or str(value).startswith("localhost/")
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not allowed:
            out.append((("metadata", "annotations", key), "AppArmor must be runtime/default or localhost/<profile>"))
    for i, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            out.append((("spec", "volumes", i, "hostPath"), "hostPath volumes are not allowed"))
    for where, container in containers(spec):
        sc = container.get("securityContext") or {}
        at = (*where, "securityContext")
        if sc.get("privileged"):
            out.append(((*at, "privileged"), "privileged containers are not allowed (must be unset or false)"))
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(((*at, "windowsOptions", "hostProcess"), "HostProcess containers are not allowed"))
        # A pod in its own user namespace may unmask /proc at baseline; restricted refuses it all the same.
        if sc.get("procMount") not in (None, "Default") and (level == RESTRICTED or not user_namespaced(spec)):
            out.append(((*at, "procMount"), "must be Default (unmasked /proc is not allowed"
                        + (")" if level == RESTRICTED else " unless the pod sets hostUsers: false)")))
        out += _host_handlers(where, container)
        # One message per container, whichever level refuses the capability.
        addable = RESTRICTED_ADDABLE_CAPABILITIES if level == RESTRICTED else BASELINE_ADDABLE_CAPABILITIES
        added = set((sc.get("capabilities") or {}).get("add") or []) - addable
        if added:
            out.append(((*at, "capabilities", "add"), f"may not add {', '.join(sorted(added))} ({level} allows "
                        f"{', '.join(sorted(addable))})"))
        for j, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                out.append(((*where, "ports", j, "hostPort"), "host ports are not allowed (must be unset or 0)"))
        out += _seccomp_not_unconfined(at, sc)
        out += _selinux(at, sc)
        out += _apparmor(at, sc)
    return out


def _restricted(spec: dict[str, Any]) -> list[Violation]:
    pod_sc = spec.get("securityContext") or {}
    out: list[Violation] = []
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = sorted(set(volume) - {"name", "hostPath"} - RESTRICTED_VOLUME_SOURCES)
        if kinds:
            out.append((("spec", "volumes", i, kinds[0]), f"{kinds[0]} volumes are not allowed (restricted allows "
                        f"{', '.join(sorted(RESTRICTED_VOLUME_SOURCES))})"))
    # In its own user namespace (hostUsers: false) a pod's root is not the node's: restricted lets it be.
    as_root_ok = user_namespaced(spec)
    if pod_sc.get("runAsNonRoot") is False and not as_root_ok:
        out.append((("spec", "securityContext", "runAsNonRoot"), "must be true (or unset with every container's true)"))
    if pod_sc.get("runAsUser") == 0 and not as_root_ok:
        out.append((("spec", "securityContext", "runAsUser"), "must not be 0 (root)"))
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for where, container in containers(spec):
        sc = container.get("securityContext") or {}
        at = (*where, "securityContext")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(((*at, "allowPrivilegeEscalation"), "must be false"))
        inherits_root = sc.get("runAsNonRoot") is None and pod_sc.get("runAsNonRoot") is not True
        if (sc.get("runAsNonRoot") is False or inherits_root) and not as_root_ok:
            out.append(((*at, "runAsNonRoot"), "must be true (here or in the pod's securityContext)"))
        if sc.get("runAsUser") == 0 and not as_root_ok:
            out.append(((*at, "runAsUser"), "must not be 0 (root)"))
        if (sc.get("seccompProfile") or {}).get("type") is None and pod_seccomp is None:
            out.append(((*at, "seccompProfile", "type"), "must be RuntimeDefault or Localhost (here or on the pod)"))
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append(((*at, "capabilities", "drop"), "must include ALL"))
    return out


def user_namespaced(spec: dict[str, Any]) -> bool:
    """Whether the pod runs in a user namespace of its own (hostUsers: false): its root is not the node's."""
    return spec.get("hostUsers") is False


def _host_handlers(where: tuple, container: dict[str, Any]) -> list[Violation]:
    """A `host` on a probe or lifecycle hook: the kubelet would connect to any address the tenant names."""
    handlers: list[tuple[tuple, Any]] = [((name,), container.get(name)) for name in PROBES]
    handlers += [(("lifecycle", hook), (container.get("lifecycle") or {}).get(hook)) for hook in HOOKS]
    out: list[Violation] = []
    for at, handler in handlers:
        for action in ("httpGet", "tcpSocket"):
            host = ((handler or {}).get(action) or {}).get("host")
            if host:
                out.append(((*where, *at, action, "host"), f"must be unset or empty ({host!r} is set: probes and "
                            "hooks go to the pod's own address)"))
    return out


def _seccomp_not_unconfined(at: tuple, sc: dict[str, Any]) -> list[Violation]:
    kind = (sc.get("seccompProfile") or {}).get("type")
    if kind is not None and kind not in SECCOMP_TYPES:
        return [((*at, "seccompProfile", "type"), f"must be RuntimeDefault or Localhost, not {kind!r}")]
    return []


def _selinux(at: tuple, sc: dict[str, Any]) -> list[Violation]:
    options = sc.get("seLinuxOptions") or {}
    out = []
    if options.get("type", "") not in SELINUX_TYPES:
        out.append(((*at, "seLinuxOptions", "type"), f"must be one of {', '.join(sorted(SELINUX_TYPES - {''}))}"))
    for field in ("user", "role"):
        if options.get(field):
            out.append(((*at, "seLinuxOptions", field), "must be unset"))
    return out


def _apparmor(at: tuple, sc: dict[str, Any]) -> list[Violation]:
    kind = (sc.get("appArmorProfile") or {}).get("type")
    if kind is not None and kind not in APPARMOR_TYPES:
        return [((*at, "appArmorProfile", "type"), f"must be RuntimeDefault or Localhost, not {kind!r}")]
    return []

"""Generated pod templates for the differential test of our Pod Security check against the API server's own
admission (tests/integration/test_pod_security_admission.py, bench/bench_pod_security.py).

Each template is built from CONTROLS: for every field that a Pod Security control reads, a generator that
sets it to a value the levels allow or one they refuse, on the pod, the role's own container, a sidecar or an
init container. A template draws a few of them at random (a seeded `random.Random`, so a run is repeatable),
and `Corpus.reached` counts what each control was set to: the test asserts that every control was drawn
both ways, and that the server itself refused every refusing draw at least once, so the corpus is known to
reach every field the admission plugin reads (`CONTROLS` is kept to the fields of the upstream checks in
k8s.io/pod-security-admission/policy: one entry per check and field family).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: A generator sets one control on a template and says whether the value it chose is one that some level
#: refuses ("bad") or one every level allows ("ok").
Setter = Callable[[random.Random, "Draft"], str]

SIDECAR_IMAGE = "registry.local/sidecar:1"


@dataclass
class Draft:
    """A template being built for one role: the pod part, and containers found or added by name."""

    role_container: str
    template: dict[str, Any] = field(default_factory=lambda: {"metadata": {}, "spec": {}})

    @property
    def spec(self) -> dict[str, Any]:
        return self.template["spec"]

    def pod_context(self) -> dict[str, Any]:
        return self.spec.setdefault("securityContext", {})

    def container(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """The role's own container, a sidecar or an init container (which one, at random)."""
        kind = rng.choice(("main", "sidecar", "init"))
        if kind == "main":
            return kind, self._named("containers", self.role_container, image=False)
        if kind == "sidecar":
            return kind, self._named("containers", "side", image=True)
        return kind, self._named("initContainers", "prep", image=True)

    def sidecar(self) -> dict[str, Any]:
        return self._named("containers", "side", image=True)

    def _named(self, key: str, name: str, *, image: bool) -> dict[str, Any]:
        items = self.spec.setdefault(key, [])
        for item in items:
            if item["name"] == name:
                return item
        item = {"name": name, **({"image": SIDECAR_IMAGE} if image else {})}
        items.append(item)
        return item


def _context(rng: random.Random, draft: Draft) -> dict[str, Any]:
    """A securityContext to set a field on: the pod's, or one container's."""
    if rng.random() < 0.4:
        return draft.pod_context()
    return draft.container(rng)[1].setdefault("securityContext", {})


def _container_context(rng: random.Random, draft: Draft) -> dict[str, Any]:
    return draft.container(rng)[1].setdefault("securityContext", {})


def host_namespaces(rng, draft):
    name = rng.choice(("hostNetwork", "hostPID", "hostIPC"))
    value = rng.random() < 0.6
    draft.spec[name] = value
    return "bad" if value else "ok"


def privileged(rng, draft):
    value = rng.choice((True, False))
    context = _container_context(rng, draft)
    context["privileged"] = value
    if value:  # the API refuses a privileged container that may not escalate (the operator's default)
        context["allowPrivilegeEscalation"] = True
    return "bad" if value else "ok"


BASELINE_CAPS = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
OTHER_CAPS = ("SYS_ADMIN", "NET_ADMIN", "NET_RAW", "SYS_PTRACE", "BPF", "ALL")


def capabilities_add(rng, draft):
    pool = rng.choice((("NET_BIND_SERVICE",), BASELINE_CAPS, OTHER_CAPS))
    added = sorted(set(rng.sample(pool, rng.randint(1, min(2, len(pool))))))
    _container_context(rng, draft).setdefault("capabilities", {})["add"] = added
    return "ok" if added == ["NET_BIND_SERVICE"] else "bad"


def capabilities_drop(rng, draft):
    drop = rng.choice(([], ["NET_RAW"], ["ALL"], ["all"], ["ALL", "NET_RAW"], None))
    _container_context(rng, draft).setdefault("capabilities", {})["drop"] = drop
    return "ok" if drop and "ALL" in drop else "bad"


def host_path(rng, draft):
    draft.spec.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": "/var/run"}})
    return "bad"


#: Volume sources beyond hostPath: the restricted level allows a few, baseline all of them.
VOLUMES = {
    "emptyDir": ({}, "ok"), "configMap": ({"name": "c"}, "ok"), "secret": ({"secretName": "s"}, "ok"),
    "downwardAPI": ({"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}, "ok"),
    "persistentVolumeClaim": ({"claimName": "c"}, "ok"),
    "projected": ({"sources": [{"configMap": {"name": "c"}}]}, "ok"),
    "csi": ({"driver": "csi.example.com"}, "ok"),
    "ephemeral": ({"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"],
                                                    "resources": {"requests": {"storage": "1Gi"}}}}}, "ok"),
    "nfs": ({"server": "nfs.example.com", "path": "/x"}, "bad"),
    "iscsi": ({"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}, "bad"),
    "fc": ({"wwids": ["3600508b400105e210000900000490000"]}, "bad"),
    "cephfs": ({"monitors": ["10.0.0.1:6789"]}, "bad"),
    "rbd": ({"monitors": ["10.0.0.1:6789"], "image": "i"}, "bad"),
    "glusterfs": ({"endpoints": "e", "path": "p"}, "bad"),
    "flexVolume": ({"driver": "example/flex"}, "bad"),
    "azureFile": ({"secretName": "s", "shareName": "x"}, "bad"),
    "image": ({"reference": "registry.local/data:1", "pullPolicy": "IfNotPresent"}, "ok"),
    "gitRepo": ({"repository": "https://example.com/r.git"}, "bad"),
}


def volume(rng, draft):
    kind = rng.choice(sorted(VOLUMES))
    source, verdict = VOLUMES[kind]
    draft.spec.setdefault("volumes", []).append({"name": f"v-{kind.lower()}", kind: source})
    return verdict


def host_port(rng, draft):
    port = rng.choice((0, 8080))
    entry: dict[str, Any] = {"containerPort": 8080, "protocol": "TCP"}
    if port or rng.random() < 0.5:
        entry["hostPort"] = port
    draft.sidecar()["ports"] = [entry]
    return "bad" if port else "ok"


def _profile(rng, draft, field: str, localhost: str) -> str:
    """A seccomp or AppArmor profile (the same three types, the same rule) on the pod or a container."""
    kind = rng.choice(("RuntimeDefault", "Localhost", "Unconfined"))
    profile: dict[str, Any] = {"type": kind}
    if kind == "Localhost":
        profile["localhostProfile"] = localhost
    _context(rng, draft)[field] = profile
    return "bad" if kind == "Unconfined" else "ok"


def seccomp(rng, draft):
    return _profile(rng, draft, "seccompProfile", "profiles/p.json")


def selinux(rng, draft):
    options: dict[str, Any] = {}
    verdict = "ok"
    kind = rng.choice(("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t", "spc_t",
                       "unconfined_t"))
    if kind:
        options["type"] = kind
    if kind in ("spc_t", "unconfined_t"):
        verdict = "bad"
    if rng.random() < 0.3:
        options[rng.choice(("user", "role"))] = "system_r"
        verdict = "bad"
    if rng.random() < 0.3:
        options["level"] = "s0:c123,c456"
    _context(rng, draft)["seLinuxOptions"] = options
    return verdict


def apparmor_field(rng, draft):
    return _profile(rng, draft, "appArmorProfile", "k8s-profile")


def apparmor_annotation(rng, draft):
    _, container = draft.container(rng)
    value = rng.choice(("runtime/default", "localhost/k8s-profile", "", "unconfined"))
    draft.template["metadata"].setdefault("annotations", {})[
        f"container.apparmor.security.beta.kubernetes.io/{container['name']}"] = value
    return "bad" if value == "unconfined" else "ok"


SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")
SAFE_SYSCTLS += ("net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat")
UNSAFE_SYSCTLS = ("kernel.msgmax", "net.core.somaxconn", "kernel.sem", "net.ipv4.tcp_max_syn_backlog")
SYSCTL_VALUES = {"net.ipv4.ip_local_port_range": "32768 60999", "net.ipv4.ping_group_range": "0 0",
                 "net.ipv4.tcp_rmem": "4096 87380 6291456", "net.ipv4.tcp_wmem": "4096 16384 4194304",
                 "net.ipv4.ip_local_reserved_ports": "8080", "kernel.sem": "250 32000 32 128"}


def sysctls(rng, draft):
    names = rng.sample(SAFE_SYSCTLS + UNSAFE_SYSCTLS, rng.randint(1, 2))
    draft.pod_context()["sysctls"] = [{"name": n, "value": SYSCTL_VALUES.get(n, "1")} for n in names]
    return "ok" if all(n in SAFE_SYSCTLS for n in names) else "bad"


def proc_mount(rng, draft):
    value = rng.choice(("Default", "Unmasked"))
    _container_context(rng, draft)["procMount"] = value
    if value == "Unmasked":
        draft.spec["hostUsers"] = False  # the API refuses Unmasked without a user namespace
        return "bad"
    return "ok"


def host_users(rng, draft):
    draft.spec["hostUsers"] = rng.choice((True, False))
    return "ok"


def windows_host_process(rng, draft):
    value = rng.choice((True, False))
    _context(rng, draft).setdefault("windowsOptions", {})["hostProcess"] = value
    return "bad" if value else "ok"


def allow_privilege_escalation(rng, draft):
    value = rng.choice((True, False, None))
    _container_context(rng, draft)["allowPrivilegeEscalation"] = value
    return "ok" if value is False else "bad"


def run_as_non_root(rng, draft):
    value = rng.choice((True, False, None))
    _context(rng, draft)["runAsNonRoot"] = value
    return "ok" if value else "bad"


def run_as_user(rng, draft):
    value = rng.choice((0, 1000, 65534))
    _context(rng, draft)["runAsUser"] = value
    return "bad" if value == 0 else "ok"


def _handler(rng: random.Random) -> tuple[dict[str, Any], str]:
    host = rng.choice(("", "169.254.169.254", "localhost", None))
    kind = rng.choice(("httpGet", "tcpSocket"))
    action: dict[str, Any] = {"port": 8080} if kind == "tcpSocket" else {"path": "/", "port": 8080}
    if host is not None:
        action["host"] = host
    return {kind: action}, "bad" if host else "ok"


def probe_host(rng, draft):
    handler, verdict = _handler(rng)
    draft.sidecar()[rng.choice(("livenessProbe", "readinessProbe", "startupProbe"))] = handler
    return verdict


def lifecycle_host(rng, draft):
    handler, verdict = _handler(rng)
    if "tcpSocket" in handler:  # the API accepts tcpSocket in a lifecycle handler only for old objects
        handler = {"httpGet": {"path": "/", "port": 8080, **({"host": handler["tcpSocket"]["host"]}
                                                              if "host" in handler["tcpSocket"] else {})}}
    _, container = draft.container(rng)
    if container["name"] == "prep":
        container = draft.sidecar()  # lifecycle hooks are for containers that keep running
    container.setdefault("lifecycle", {})[rng.choice(("postStart", "preStop"))] = handler
    return verdict


#: One entry per upstream check (and field family where a check reads several): the generator that sets it.
CONTROLS: dict[str, Setter] = {
    "hostNamespaces": host_namespaces,
    "privileged": privileged,
    "capabilities.add": capabilities_add,
    "capabilities.drop": capabilities_drop,
    "hostPathVolumes": host_path,
    "restrictedVolumes": volume,
    "hostPorts": host_port,
    "seccompProfile": seccomp,
    "seLinuxOptions": selinux,
    "appArmorProfile": apparmor_field,
    "appArmor annotation": apparmor_annotation,
    "sysctls": sysctls,
    "procMount": proc_mount,
    "hostUsers": host_users,
    "windowsHostProcess": windows_host_process,
    "allowPrivilegeEscalation": allow_privilege_escalation,
    "runAsNonRoot": run_as_non_root,
    "runAsUser": run_as_user,
    "hostProbes": probe_host,
    "hostLifecycle": lifecycle_host,
}


@dataclass
class Case:
    number: int
    role: str
    template: dict[str, Any]
    drawn: list[tuple[str, str]]  # (control, "ok" | "bad")


@dataclass
class Corpus:
    """`size` templates from `seed`, one role each; `reached` counts (control, verdict) over them."""

    seed: int
    size: int
    roles: tuple[str, ...]
    role_containers: dict[str, str]
    reached: Counter = field(default_factory=Counter)

    def cases(self) -> list[Case]:
        rng = random.Random(self.seed)
        out = []
        names = sorted(CONTROLS)
        for number in range(self.size):
            role = rng.choice(self.roles)
            draft = Draft(self.role_containers[role])
            drawn = []
            for name in rng.sample(names, rng.choice((1, 1, 2, 3))):
                verdict = CONTROLS[name](rng, draft)
                drawn.append((name, verdict))
                self.reached[name, verdict] += 1
            if not draft.template["metadata"]:
                del draft.template["metadata"]
            out.append(Case(number, role, draft.template, drawn))
        return out


__all__ = ["CONTROLS", "Case", "Corpus"]

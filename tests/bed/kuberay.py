"""
KubeRay's own operator on a bed's control plane: the binary `scripts/build-kuberay` built from
`github.com/ray-project/kuberay/ray-operator`, with its CRDs and the ClusterRole its manager runs under
from the same module.

    with KubeRay(plane, admin, workdir):
        ...  # RayClusters and RayJobs anywhere are reconciled by KubeRay

KubeRay runs as a host process beside the API server (as the control plane's own components do here),
with a TokenRequest token of its own ServiceAccount bound to the release's ClusterRole, not the admin's.
From the host, in-cluster Service names do not resolve, so it reaches each Ray dashboard through the API
server's Service proxy (its own `--use-kubernetes-proxy` flag; the ClusterRole grants services/proxy).
No webhooks: the release serves them only with its webhook overlay, off by default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .common import REPO, free_port, pinned, start_process, wait_until
from .control_plane import ControlPlane
from .host_controller import HostController, built_binary
from .real_cluster import Objects

BUILD_SCRIPT = REPO / "scripts" / "build-kuberay"
VERSION = pinned("build-kuberay", "KUBERAY_VERSION")
NAMESPACE = "kuberay-system"
SERVICE_ACCOUNT = "kuberay-operator"
#: The name the release's Helm chart gives its ClusterRole.
MANAGER_ROLE = "kuberay-operator"

Body = dict[str, Any]


def kuberay_bin() -> Path | None:
    """The built binary (its manifests lie beside it), or None when scripts/build-kuberay has not run."""
    return built_binary(BUILD_SCRIPT)


def ray_object(admin: Objects, kind: str, namespace: str, name: str | None = None) -> Any:
    """A RayJob or RayCluster (`kind` plural: rayjobs, rayclusters) as the admin sees it, None when absent;
    without a name, the list's items."""
    url = admin.rest.server + f"/apis/ray.io/v1/namespaces/{namespace}/{kind}" + (f"/{name}" if name else "")
    found = admin.rest.call("GET", url)
    return found if name or found is None else found.get("items") or []


class KubeRay(HostController):
    """KubeRay's operator for a bed: see the module docstring. A context manager. `env`: the operator's
    own environment switches (e.g. ENABLE_PROBES_INJECTION), as its Helm chart's `env` value sets them."""

    name = "ray-operator"

    def __init__(self, plane: ControlPlane, admin: Objects, work: Path, env: dict[str, str] | None = None):
        found = kuberay_bin()
        if found is None:
            raise RuntimeError("KubeRay is not built: run ./scripts/build-kuberay")
        super().__init__(found, plane, admin, work, "kuberay-operator.log")
        self.env = dict(env or {})
        self.username = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

    def start(self, timeout: float = 120) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.health_port, self.metrics_port = free_port(), free_port()
        self.kubeconfig = self.bind_service_account(NAMESPACE, SERVICE_ACCOUNT, MANAGER_ROLE)
        self.apply_crds(self.release_crds())
        self.process = start_process(
            [self.bin, "--enable-leader-election=false", "--use-kubernetes-proxy",
             f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
             f"--metrics-addr=127.0.0.1:{self.metrics_port}", "--log-stdout-encoder=console"],
            self.log, cwd=self.work, env={**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)})
        wait_until(self.ready, timeout, 0.2, f"KubeRay ready (/readyz; its log: {self.log})")

    def usage(self) -> dict[str, float]:
        """The process's CPU seconds (user + system) so far and its peak resident memory (VmHWM), MiB."""
        if self.process is None:
            raise RuntimeError("KubeRay is not running")
        return process_usage(self.process.pid)


def process_usage(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) and peak resident memory (VmHWM, MiB) of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"cpu_seconds": (int(fields[11]) + int(fields[12])) / ticks,
            "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024}


__all__ = ["VERSION", "KubeRay", "kuberay_bin", "process_usage", "ray_object"]

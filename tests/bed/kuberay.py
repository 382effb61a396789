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
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from .control_plane import REPO, ControlPlane
from .node_agent import wait_until
from .real_cluster import Objects

BUILD_SCRIPT = REPO / "scripts" / "build-kuberay"
#: The version scripts/build-kuberay pins.
VERSION = "v1.5.0"
NAMESPACE = "kuberay-system"
SERVICE_ACCOUNT = "kuberay-operator"
#: The name the release's Helm chart gives its ClusterRole.
MANAGER_ROLE = "kuberay-operator"

Body = dict[str, Any]


def kuberay_bin() -> Path | None:
    """The built binary (its manifests lie beside it), or None when scripts/build-kuberay has not run."""
    found = subprocess.run([str(BUILD_SCRIPT), "--print-bin"], capture_output=True, text=True, check=False)
    return Path(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else None


def ray_object(admin: Objects, kind: str, namespace: str, name: str | None = None) -> Any:
    """A RayJob or RayCluster (`kind` plural: rayjobs, rayclusters) as the admin sees it, None when absent;
    without a name, the list's items."""
    url = admin.rest.server + f"/apis/ray.io/v1/namespaces/{namespace}/{kind}" + (f"/{name}" if name else "")
    found = admin.rest.call("GET", url)
    return found if name or found is None else found.get("items") or []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KubeRay:
    """KubeRay's operator for a bed: see the module docstring. A context manager. `env`: the operator's
    own environment switches (e.g. ENABLE_PROBES_INJECTION), as its Helm chart's `env` value sets them."""

    def __init__(self, plane: ControlPlane, admin: Objects, work: Path, env: dict[str, str] | None = None):
        found = kuberay_bin()
        if found is None:
            raise RuntimeError("KubeRay is not built: run ./scripts/build-kuberay")
        self.bin, self.manifests = found, found.parent
        self.plane, self.admin, self.work = plane, admin, Path(work)
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.work / "kuberay-operator.log"
        self.username = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

    def __enter__(self) -> KubeRay:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout: float = 120) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.health_port, self.metrics_port = _free_port(), _free_port()
        self._service_account()
        self._crds()
        log = open(self.log, "wb")  # noqa: SIM115 (the process keeps it)
        self.process = subprocess.Popen(
            [str(self.bin), "--enable-leader-election=false", "--use-kubernetes-proxy",
             f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
             f"--metrics-addr=127.0.0.1:{self.metrics_port}", "--log-stdout-encoder=console"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True,
            env={**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)})
        log.close()
        wait_until(self._ready, timeout, 0.2, f"KubeRay ready (/readyz; its log: {self.log})")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def _service_account(self) -> None:
        """KubeRay's ServiceAccount bound to the release's ClusterRole, and a kubeconfig with its token."""
        role = yaml.safe_load((self.manifests / "manager-role.yaml").read_text())
        role["metadata"]["name"] = MANAGER_ROLE
        self.plane.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
            role,
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": MANAGER_ROLE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MANAGER_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
        ])
        self.kubeconfig = self.plane.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)

    def _crds(self) -> None:
        """The release's CRDs, server-side (they are too big for a client-side apply's annotation)."""
        crds = [doc for doc in yaml.safe_load_all((self.manifests / "crds.yaml").read_text()) if doc]
        self.plane.apply(crds, timeout=120)
        for crd in crds:
            name = crd["metadata"]["name"]
            wait_until(lambda name=name: self._established(name), 60, 0.1, f"the CRD {name} Established")

    def _established(self, crd: str) -> bool:
        found = self.admin.rest.call(
            "GET", self.plane.server + f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") or {}
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (found.get("status") or {}).get("conditions") or [])

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"ray-operator exited with {self.process.returncode}:\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

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

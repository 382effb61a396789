"""
A third-party controller built from its Go module and run beside a bed's API server as a host process
(Kueue, KubeRay): what every such controller needs the same way. Its release's ClusterRole bound to a
ServiceAccount of its own (never the admin's token), its CRDs applied server-side and Established, a
readiness probe on a loopback port, and a stop that waits for the process.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from tools import yaml_documents

from .common import Body, stop_process
from .control_plane import ControlPlane
from .real_cluster import Objects


def built_binary(build_script: Path) -> Path | None:
    """The binary `build_script --print-bin` names (its manifests lie beside it), or None when not built."""
    found = subprocess.run([str(build_script), "--print-bin"], capture_output=True, text=True, check=False)
    return Path(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else None


class HostController:
    """Subclasses give `name` (for messages), set `self.health_port` and `self.process` in `start()`, and
    may add to `stop()`. A context manager: a failed start stops what it began."""

    name = "controller"

    def __init__(self, binary: Path, plane: ControlPlane, admin: Objects, work: Path, log_name: str):
        self.bin, self.manifests = binary, binary.parent
        self.plane, self.admin, self.work = plane, admin, Path(work)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.work / log_name
        self.health_port = 0

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.end_process()

    def __enter__(self) -> Any:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def end_process(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def bind_service_account(self, namespace: str, account: str, role_name: str, *extra: Body) -> Path:
        """The account bound to the release's ClusterRole (`manager-role.yaml` beside the binary, renamed
        `role_name`), with `extra` objects (a Role and its binding); a kubeconfig with the account's token."""
        role = yaml.safe_load((self.manifests / "manager-role.yaml").read_text())
        role["metadata"]["name"] = role_name
        self.plane.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
            role,
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role_name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
            *extra,
        ])
        return self.plane.service_account_kubeconfig(namespace, account)

    def release_crds(self) -> list[Body]:
        return yaml_documents((self.manifests / "crds.yaml").read_text())

    def apply_crds(self, crds: list[Body]) -> None:
        """Server-side (they are too big for a client-side apply's annotation), then each Established."""
        self.plane.apply(crds, timeout=120)
        self.admin.rest.wait_established(*(crd["metadata"]["name"] for crd in crds))

    def ready(self) -> bool:
        """Its /readyz answers 200; a process that exited raises with its log's tail."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


__all__ = ["Body", "HostController", "built_binary"]

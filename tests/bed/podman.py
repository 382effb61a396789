"""
podman as the bed's container runtime: its command line with what this sandbox needs (runc, no default
ulimits), and a network of the test's own for a bed's pods.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from tools import file_lock

#: Ulimits podman sets by default need CAP_SYS_RESOURCE, which this sandbox lacks.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"


class Podman:
    """The podman command line, with the runtime and configuration this sandbox needs."""

    def __init__(self, workdir: pathlib.Path):
        self.conf = pathlib.Path(os.environ.get("CONTAINERS_CONF") or workdir / "containers.conf")
        if "CONTAINERS_CONF" not in os.environ:
            self.conf.parent.mkdir(parents=True, exist_ok=True)
            self.conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        self.base = ["podman", "--runtime", "runc"]

    def argv(self, *args: str) -> list[str]:
        return [*self.base, *args]

    def __call__(self, *args: str, check: bool = True, timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    @staticmethod
    def available() -> bool:
        return shutil.which("podman") is not None and shutil.which("runc") is not None

    def image_exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0


@contextlib.contextmanager
def podman_network(podman: Podman, name: str, seed: int) -> Iterator[str]:
    """A podman bridge network of the test's own on a /16 no other network uses; yields its subnet, and
    removes it (with anything left on it) at the end. Picking the subnet and creating the network hold a
    machine-wide lock: beds started at once (test workers, a benchmark beside the tests) never pick the
    same free /16."""
    podman("network", "rm", "--force", name, check=False)
    with file_lock(pathlib.Path(tempfile.gettempdir()) / "kuberl-podman-networks.lock"):
        subnet = free_subnet(podman, seed)
        podman("network", "create", "--subnet", subnet, "--disable-dns", name)
    try:
        yield subnet
    finally:
        podman("network", "rm", "--force", name, check=False)


def free_subnet(podman: Podman, seed: int) -> str:
    """A /16 in 10.0.0.0/8 no podman network here uses yet."""
    used = set()
    listing = podman("network", "ls", "--format", "{{json .}}", check=False).stdout
    for line in listing.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            for sub in json.loads(line).get("subnets") or []:
                used.add(str(sub.get("subnet")))
    for offset in range(200):
        second = 100 + (seed + offset) % 150
        candidate = f"10.{second}.0.0/16"
        if candidate not in used:
            return candidate
    raise RuntimeError("no free 10.x.0.0/16 for a podman network")


__all__ = ["CONTAINERS_CONF", "Podman", "free_subnet", "podman_network"]

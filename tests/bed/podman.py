"""
podman on the bed's machine: its command line with what this sandbox needs (runc, no default ulimits), for
what a test asks of an image itself (the images are built with podman, and the node pulls them from the
bed's registry).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

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


__all__ = ["CONTAINERS_CONF", "Podman"]

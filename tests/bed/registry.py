"""
A container registry: CNCF Distribution (`registry`, what Docker Hub and most registries run), built by
scripts/build-registry, serving plain HTTP on loopback or on the host's end of a real node's link (where
only the host and that node reach it), storing on local disk. A real node's containerd mirrors ghcr.io to
it (`real_node_config.registry_hosts`), so pods pull KubeRL's images by their own names; the benchmarks
push to it and pull from it (bench/bench_image_pull.py).

Two registries may share a store (two real nodes' beds at once): pushes and the garbage collection after
a registry stops hold the store's lock, so a collection never takes a blob a push has uploaded and not yet
named in a manifest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tools import file_lock

from .common import SCRIPTS, free_port, http_ok, start_process, stop_process, wait_until


def registry_binary() -> Path:
    found = subprocess.run([str(SCRIPTS / "build-registry"), "--print-bin"], capture_output=True, text=True,
                           check=False)
    if found.returncode != 0:
        raise RuntimeError("the registry is not built: run ./scripts/build-registry (./scripts/test does)")
    return Path(found.stdout.strip().splitlines()[-1])


class Registry:
    """One registry process: `storage` holds its blobs (kept between runs when the caller keeps it)."""

    def __init__(self, storage: Path, work: Path, host: str = "127.0.0.1"):
        self.storage, self.work, self.host = Path(storage), Path(work), host
        self.address = ""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        self.work.mkdir(parents=True, exist_ok=True)
        port = free_port(self.host)
        config = self.work / "registry.yaml"
        config.write_text(json.dumps({
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": True}},
            "http": {"addr": f"{self.host}:{port}"}}))
        self.process = start_process([registry_binary(), "serve", config], self.work / "registry.log")
        self.address = f"{self.host}:{port}"
        wait_until(lambda: self.process is not None and self.process.poll() is None
                   and http_ok(f"http://{self.address}/v2/"), 30, 0.1, "the registry to answer")
        return self

    def stop(self) -> None:
        """Stopped, then its garbage collected: the layers of an image a newer push replaced under the same
        tag would otherwise stay on disk for good (gigabytes for each trainer image)."""
        if self.process is not None:
            stop_process(self.process, 15)
            with store_lock(self.storage):
                subprocess.run([str(registry_binary()), "garbage-collect", "--delete-untagged",
                                str(self.work / "registry.yaml")], capture_output=True, timeout=600, check=False)


def store_lock(storage: Path) -> Any:
    """Held while a push or a garbage collection changes the store `storage`."""
    return file_lock(storage.with_name(storage.name + ".lock"))


__all__ = ["Registry", "registry_binary", "store_lock"]

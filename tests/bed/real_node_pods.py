"""
What a test asks of the real node's containers, the way a node's admin finds out: containerd's own client
(`ctr`, in the CRI plugin's `k8s.io` namespace) for which containers exist and which run, and the log
files the kubelet writes.

- `NodeContainers.list()`: every container of a pod (the pause sandboxes left out) with its pod's
  namespace, name and uid (the labels the CRI plugin puts on it) and whether its task runs. A container
  that exited stays listed until the kubelet removes it (at once for a pod deleted, else its garbage
  collection), so "left over" means running.
- `NodeContainers.spec()`: the OCI runtime spec a container runs under (user, env, mounts, root).
- `NodeContainers.kill()`: a signal to a container's task, as a crash or an OOM kill would end it.
- `LogKeeper`: the kubelet deletes a pod's logs with the pod, and a fault test quotes the logs of a learner
  whose pod is gone; the keeper hard-links each log file as it appears (the link keeps every line the
  container writes after, and the file outlives its pod). Checked every 0.2 s: any container that lives
  longer than that is kept. A log the kubelet rotates (past 10 MiB) keeps its first file only.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The labels the CRI plugin gives a pod's containers (and the kubelet reads back).
POD_NAMESPACE, POD_NAME, POD_UID = "io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.pod.uid"
CONTAINER_NAME, KIND = "io.kubernetes.container.name", "io.cri-containerd.kind"

Ctr = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Container:
    id: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    running: bool

    @property
    def name(self) -> str:
        """The name dockershim gave a pod's container (the node agent's too): what a person greps for."""
        return f"k8s_{self.container}_{self.pod}_{self.namespace}_{self.pod_uid}"


class NodeContainers:
    """The node's pod containers through `ctr` (a RealNode's, in the CRI plugin's namespace)."""

    def __init__(self, ctr: Ctr):
        self._ctr = ctr
        self._labels: dict[str, dict[str, str]] = {}  # a container's labels never change

    def list(self) -> list[Container]:
        ids = self._ctr("containers", "list", "--quiet", timeout=30).stdout.split()
        running = {line.split()[0] for line in self._ctr("tasks", "list", timeout=30).stdout.splitlines()[1:]
                   if line.split()[-1:] == ["RUNNING"]}
        out = []
        for cid in ids:
            labels = self._labels_of(cid)
            if labels is None or labels.get(KIND) == "sandbox" or POD_UID not in labels:
                continue
            out.append(Container(cid, labels[POD_NAMESPACE], labels[POD_NAME], labels[POD_UID],
                                 labels.get(CONTAINER_NAME, ""), cid in running))
        return out

    def _labels_of(self, cid: str) -> dict[str, str] | None:
        if cid not in self._labels:
            try:
                info = json.loads(self._ctr("containers", "info", cid, timeout=30).stdout)
            except subprocess.CalledProcessError:
                return None  # removed since the listing
            self._labels[cid] = info.get("Labels") or {}
        return self._labels[cid]

    def spec(self, name: str) -> dict:
        """The OCI runtime spec containerd made for the container `name` (see `Container.name`): its process
        (user, env, capabilities), root file system and mounts, as runc ran it."""
        found = next(c for c in self.list() if c.name == name)
        return json.loads(self._ctr("containers", "info", found.id, timeout=30).stdout)["Spec"]

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        try:
            self._ctr("tasks", "kill", "--signal", signal, container_id, timeout=30)
        except subprocess.CalledProcessError as err:
            # ctr's own reason (a task already gone, one not yet started), which the bare exit status hides.
            raise AssertionError(f"ctr could not send {signal} to {container_id}: "
                                 f"{(err.stderr or err.stdout or '').strip()[-2000:]}") from None

    def pid(self, container_id: str) -> int:
        """The host pid of the container's first process."""
        for line in self._ctr("tasks", "list", timeout=30).stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == container_id:
                return int(fields[1])
        raise LookupError(f"container {container_id} has no running task")


class LogKeeper:
    """See the module docstring. `pod_logs`: the kubelet's podLogsDir; `keep`: where the kept logs go, each
    named k8s_<container>_<pod>_<namespace>_<pod uid>_<restart>.log."""

    def __init__(self, pod_logs: Path, keep: Path):
        self.pod_logs, self.keep = pod_logs, keep
        self.errors: list[str] = []
        self._copies: dict[Path, Path] = {}  # another file system than the kubelet's: copied while it lasts
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bed-log-keeper", daemon=True)

    def start(self) -> LogKeeper:
        self.keep.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sync()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.sync()
            except OSError as exc:
                self.errors.append(repr(exc))

    def sync(self) -> None:
        """Keep every log file there is now (a reader calls it first, for a container seconds old)."""
        with self._lock:
            for path in self._log_files():
                namespace, pod, uid = path.parent.parent.name.split("_", 2)
                target = self.keep / f"k8s_{path.parent.name}_{pod}_{namespace}_{uid}_{path.stem}.log"
                if target.exists() or path in self._copies:
                    continue
                try:
                    os.link(path, target)
                except FileNotFoundError:
                    continue  # its pod went between the listing and the link
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    self._copies[path] = target
            for path, target in list(self._copies.items()):
                try:
                    shutil.copyfile(path, target)
                except FileNotFoundError:
                    del self._copies[path]  # its pod is gone: the last copy stays

    def _log_files(self) -> list[Path]:
        """Each <namespace>_<pod>_<uid>/<container>/<restart>.log there is now. A pod's directory goes with
        its pod, so one listed may be gone when it is read (a glob raised then, in a CI run)."""
        return [path for pod in _entries(self.pod_logs) if pod.name.count("_") >= 2
                for container in _entries(pod) for path in _entries(container) if path.suffix == ".log"]


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


__all__ = ["Container", "LogKeeper", "NodeContainers"]

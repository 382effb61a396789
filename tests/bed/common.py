"""
What every part of the bed shares: where the repository and the chart are, the names the operator is
installed under, the Node the tests play the kubelet of, and the small things each part needs the same
way (waiting, free ports, self-signed certificates, starting and stopping a process, a build's pinned
version).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

Body = dict[str, Any]
T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
CHART = REPO / "charts" / "kuberl-operator"
#: The Helm release the beds install (or render) the chart as: the name docs/install.md gives it, so the
#: chart names its objects `kuberl-operator` (the release name alone, as it holds the chart's name).
RELEASE = "kuberl-operator"
OPERATOR_NAMESPACE = "kuberl-system"
#: The operator's CRDs (the chart's crds/, the same files as crds/): both are applied, both waited for.
OPERATOR_CRDS = ("rltrainingjobs.kuberl.dev", "rlsweeps.kuberl.dev")

#: The Node the tests play the kubelet of; the control plane's token file names it.
NODE = "kuberl-node"
#: A test Node's well-known labels, which the scheduler matches nodeSelectors against.
NODE_LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
#: What a test Node reports: the scheduler fits requests into it; nothing enforces it (pods share the machine).
NODE_CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "1Ti"}


def utc_now() -> str:
    """Now, as the API server writes a timestamp."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition") -> T:
    """Call `predicate` every `interval` s until it returns something true, and return that; an
    AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(interval)


def http_ok(url: str, timeout: float = 2) -> bool:
    """Whether `url` answers 200 now (a server's readiness probe, as the bed and the benchmarks poll it)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def node_manifest(name: str) -> Body:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **NODE_LABELS}}}


def ready_node_status(message: str, **fields: Any) -> Body:
    """A Node's status as its kubelet reports it Ready, with NODE_CAPACITY and any other `fields`
    (addresses, daemonEndpoints, nodeInfo)."""
    now = utc_now()
    return {"status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY, **fields, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": message,
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


def self_signed_certificate(directory: Path, name: str, common_name: str, alt_names: Sequence[str], *,
                            ca: bool = True, organization: str | None = None) -> tuple[Path, Path]:
    """`directory/<name>.crt` and `.key`: a self-signed certificate for `alt_names` (`IP:...`, `DNS:...`).
    `ca`: marked a CA, so that the certificate is also the CA bundle its clients verify it with.
    `organization`: the subject's O, which Kubernetes reads as a client certificate's group."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    extensions = ["-addext", f"subjectAltName={','.join(alt_names)}"]
    if ca:
        extensions += ["-addext", "basicConstraints=critical,CA:TRUE"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                    "-keyout", str(key), "-out", str(cert),
                    "-subj", (f"/O={organization}" if organization else "") + f"/CN={common_name}", *extensions],
                   check=True, capture_output=True)
    return cert, key


#: prctl(2)'s option: the signal a child gets when its parent thread exits.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child between fork and exec: the kernel kills it when the test process dies, however it dies (a
    SIGKILL, CI's timeout), so no etcd or API server outlives its session holding ports and data. Linux
    only; elsewhere the child lives on until it is stopped."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_process(argv: Sequence[str | Path], log: Path, *, cwd: Path | None = None,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A host process of the bed: its output (both streams) into `log`, in a session of its own (a
    terminal's Ctrl-C goes to the test, which stops it), dying with the test process."""
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([str(arg) for arg in argv], stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env=None if env is None else dict(env), start_new_session=True,
                                preexec_fn=die_with_parent)


def stop_process(process: subprocess.Popen[Any], timeout: float = 20, group: bool = False) -> None:
    """SIGTERM, SIGKILL when it has not exited after `timeout` s; returns once it has. `group`: both go to
    its process group (one started with `start_new_session`), so the children it forked stop with it."""
    if process.poll() is not None:
        return

    def send(sig: int) -> None:
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait(10)


def pinned(script: str, name: str) -> str:
    """The version `scripts/<script>` pins at its top (`NAME=value`): each pin is written there only."""
    match = re.search(rf"^{name}=(\S+)", (SCRIPTS / script).read_text(), re.MULTILINE)
    if match is None:
        raise LookupError(f"scripts/{script} pins no {name}= at the start of a line")
    return match[1]


__all__ = ["CHART", "NODE", "NODE_CAPACITY", "OPERATOR_CRDS", "OPERATOR_NAMESPACE", "RELEASE", "REPO", "Body",
           "die_with_parent", "free_port", "http_ok", "node_manifest", "pinned", "ready_node_status",
           "self_signed_certificate", "start_process", "stop_process", "utc_now", "wait_until"]

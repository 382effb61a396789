"""
What a real node (`real_node.RealNode`) changes on the machine it runs on, and how it is put back: its
network namespace (with the pods' bridge and every firewall rule kube-proxy, kube-router, the kubelet and
the CNI plugins install: they go with it) and the link and route to it, the kubelet's cgroup root, the
sysctls the kubelet sets, mounts under the node's directories, and its processes (containerd's shims
outlive containerd: they are found by the socket they were started for).

A record in the node slot's image store (`host-state.json`) names the processes, directories and sysctl
values of the node running now, so the slot's next node cleans up after one whose test process was killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import start_process
from .real_node_config import BRIDGE, SERVICE_SUBNET, NodeLayout, NodeNetwork

if TYPE_CHECKING:
    from .real_node import RealNode

#: What the kubelet sets machine-wide as it starts (pkg/kubelet/cm, setupKernelTunables).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CGROUP_V1 = Path("/sys/fs/cgroup")


class NodeProcesses:
    """A node's host processes: each started with its log in the node's directory and remembered in the
    host's record (so a later run can stop one a killed test left), and checked for an early exit."""

    def __init__(self, work: Path, host: HostState):
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._work, self._host = work, host

    def _spawn(self, name: str, argv: Sequence[str | Path], env: dict[str, str] | None = None) -> None:
        """`argv` run in the node's network namespace (nsenter execs it: the pid stays the process's)."""
        self.processes[name] = start_process([*self._host.layout.network.enter, *argv], self._work / f"{name}.log",
                                             cwd=self._work, env=env)
        self._host.remember_process(name, self.processes[name].pid, os.path.realpath(argv[0]))

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self._work / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")


def _run(*argv: str | Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    """A command of the node's admin; one that fails with `check` says what it printed."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class HostState:
    def __init__(self, record: Path, layout: NodeLayout):
        self.record = record
        self.layout = layout

    # ---- the record ----------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.record.read_text())
        except (OSError, ValueError):
            return {}

    def _write(self, **changes: Any) -> None:
        state = {**self._read(), **changes}
        self.record.write_text(json.dumps(state, indent=1))

    def remember_process(self, name: str, pid: int, exe: str) -> None:
        """A process of this node, by pid and executable (a later run kills a pid only while it still runs
        that executable: pids are reused)."""
        state = self._read()
        self._write(work=str(self.layout.work), node_bin=str(self.layout.node_bin),
                    processes={**state.get("processes", {}), name: [pid, exe]})

    def record_sysctls(self) -> None:
        self._write(sysctls={k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS})

    def restore_sysctls(self) -> None:
        for key, value in (self._read().get("sysctls") or {}).items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)

    # ---- making --------------------------------------------------------------------------------------

    def make_cgroup_root(self) -> None:
        """The kubelet's cgroupRoot in every v1 hierarchy; cpuset needs its cpus and mems before any child."""
        for hierarchy in CGROUP_V1.iterdir():
            if not hierarchy.is_dir() or hierarchy.name == "unified" or hierarchy.is_symlink():
                continue
            root = hierarchy / self.layout.network.cgroup_root.lstrip("/")
            root.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists():
                    (root / name).write_text((hierarchy / name).read_text())

    def firewall_installed(self) -> bool:
        return _run(*self.layout.network.enter, "iptables", "-w", "-S", "KUBE-ROUTER-FORWARD").returncode == 0

    # ---- putting back --------------------------------------------------------------------------------

    def stop_containers(self, node: RealNode) -> None:
        """Whatever the kubelet left running (a pod it had no time to stop): each task killed through
        containerd while it still runs."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            for task in node.ctr("tasks", "ls", "--quiet", timeout=30).stdout.split():
                with contextlib.suppress(subprocess.SubprocessError):
                    node.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=30)

    def clean_up(self) -> None:
        """Everything of a node that ran here before (this one, or one killed with its test), put back."""
        state = self._read()
        work = Path(state.get("work") or self.layout.work)
        for pid, exe in (state.get("processes") or {}).values():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/exe") == exe:
                    _kill(pid)
        self._kill_shims(work)
        self._unmount(work)
        # The namespace goes with its bridge, its end of the link and every firewall rule in it; the host's
        # end of the link (and its route) with the other end.
        _run("ip", "netns", "del", self.layout.network.netns)
        _run("ip", "link", "del", self.layout.network.host_link)
        self._remove_cgroup_root()
        self._remove_kubelet_paths(work)
        self.restore_sysctls()
        self._write(processes={}, sysctls={})

    def _kill_shims(self, work: Path) -> None:
        """containerd's runc shims: started for the node's socket, they outlive containerd."""
        socket = str(work)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"containerd-shim-runc-v2") and any(
                        a.decode(errors="replace").startswith(socket) for a in argv):
                    _kill(int(proc.name))

    def _unmount(self, work: Path) -> None:
        """The containers' root file systems, shm, volumes and network namespaces mounted under the node's
        directories, deepest first."""
        roots = (str(self.layout.images) + "/", str(work) + "/")
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(roots)), key=len, reverse=True):
            _run("umount", "-l", mount)

    def _remove_cgroup_root(self) -> None:
        for hierarchy in CGROUP_V1.iterdir():
            root = hierarchy / self.layout.network.cgroup_root.lstrip("/")
            if root.is_dir():
                for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                                        reverse=True):
                    with contextlib.suppress(OSError):
                        directory.rmdir()
                with contextlib.suppress(OSError):
                    root.rmdir()

    def _remove_kubelet_paths(self, work: Path) -> None:
        """The paths a kubelet uses whatever its root directory: its device plugins' socket directory, and
        /var/log/containers' links to its pods' logs."""
        with contextlib.suppress(OSError):
            for link in Path("/var/log/containers").iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(work)):
                    link.unlink()
        for path in (Path("/var/lib/kubelet/device-plugins/kubelet.sock"),):
            with contextlib.suppress(OSError):
                path.unlink()
        for directory in (Path("/var/lib/kubelet/device-plugins"), Path("/var/lib/kubelet"),
                          Path("/var/log/containers")):
            with contextlib.suppress(OSError):
                directory.rmdir()


def make_node_network(net: NodeNetwork) -> None:
    """The node's network namespace, its link to the host (the host's end the address the API server
    listens on, the host's route to the pods through it), and the pods' bridge with the node's address,
    before anything listens there (the CNI bridge plugin then attaches pods to it as it finds it)."""
    node = net.enter
    _run("ip", "netns", "add", net.netns, check=True)
    _run("ip", "link", "add", net.host_link, "type", "veth", "peer", "name", net.node_link, "netns", net.netns,
         check=True)
    _run("ip", "addr", "add", f"{net.host_address}/30", "dev", net.host_link, check=True)
    _run("ip", "link", "set", net.host_link, "up", check=True)
    _run(*node, "ip", "link", "set", "lo", "up", check=True)
    _run(*node, "ip", "addr", "add", f"{net.link_address}/30", "dev", net.node_link, check=True)
    _run(*node, "ip", "link", "set", net.node_link, "up", check=True)
    # No default route: this machine reaches nothing beyond itself, and a packet routed through the
    # host would wait for an answer that never comes (containerd resolving ghcr.io, the server of record
    # behind the mirror, took 50 s to give up so). Only the Service range goes through the host, so
    # that a connection of the node's own to a ClusterIP has a route before kube-proxy rewrites it.
    _run(*node, "ip", "route", "add", SERVICE_SUBNET, "via", net.host_address, check=True)
    _run(*node, "ip", "link", "add", BRIDGE, "type", "bridge", check=True)
    _run(*node, "ip", "addr", "add", f"{net.gateway}/{net.pod_subnet.split('/')[1]}", "dev", BRIDGE, check=True)
    _run(*node, "ip", "link", "set", BRIDGE, "up", check=True)
    # A node forwards its pods' traffic (a new namespace's default is the kernel's, not the host's).
    _run(*node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", check=True)
    _run("ip", "route", "add", net.pod_subnet, "via", net.link_address, check=True)


def _kill(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s; nothing when it is gone (or a pid reused by then)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


__all__ = ["HostState", "NodeProcesses", "make_node_network"]

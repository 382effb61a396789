"""
What a real node (`real_node.RealNode`) changes on the machine it runs on, and how it is put back: the
pods' bridge, the kubelet's cgroup root, the sysctls the kubelet sets, the firewall chains kube-proxy,
kube-router, the kubelet and the CNI plugins install, mounts under the node's directories, and its
processes (containerd's shims outlive containerd: they are found by the socket they were started for).

A record in the image store (`host-state.json`) names the processes, directories and sysctl values of
the node running now, so the next node cleans up after one whose test process was killed.
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
from .real_node_config import BRIDGE, CGROUP_ROOT, CNI_NETWORK, GATEWAY, POD_SUBNET, NodeLayout

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
        self.processes[name] = start_process(argv, self._work / f"{name}.log", cwd=self._work, env=env)
        self._host.remember_process(name, self.processes[name].pid)

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self._work / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")


def _run(*argv: str | Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, check=check)


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

    def remember_process(self, name: str, pid: int) -> None:
        """A process of this node, by pid and executable (a later run kills a pid only while it still runs
        that executable: pids are reused)."""
        state = self._read()
        self._write(work=str(self.layout.work), node_bin=str(self.layout.node_bin),
                    processes={**state.get("processes", {}), name: [pid, os.readlink(f"/proc/{pid}/exe")]})

    def record_sysctls(self) -> None:
        self._write(sysctls={k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS})

    def restore_sysctls(self) -> None:
        for key, value in (self._read().get("sysctls") or {}).items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)

    # ---- making --------------------------------------------------------------------------------------

    def make_bridge(self) -> None:
        """The pods' bridge with the node's address, before anything listens there (the CNI bridge plugin
        then attaches pods to it as it finds it)."""
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
        _run("ip", "addr", "add", f"{GATEWAY}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE, check=True)
        _run("ip", "link", "set", BRIDGE, "up", check=True)

    def make_cgroup_root(self) -> None:
        """The kubelet's cgroupRoot in every v1 hierarchy; cpuset needs its cpus and mems before any child."""
        for hierarchy in CGROUP_V1.iterdir():
            if not hierarchy.is_dir() or hierarchy.name == "unified" or hierarchy.is_symlink():
                continue
            root = hierarchy / CGROUP_ROOT.lstrip("/")
            root.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists():
                    (root / name).write_text((hierarchy / name).read_text())

    def firewall_installed(self) -> bool:
        return _run("iptables", "-w", "-S", "KUBE-ROUTER-FORWARD").returncode == 0

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
        self._clean_firewall()
        _run("ip", "link", "del", BRIDGE)
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

    def _clean_firewall(self) -> None:
        """Every chain named KUBE-* (kube-proxy's, kube-router's, the kubelet's: nothing else on the machine
        uses the prefix) with the rules that jump to it, in both families; kube-router's ipsets; and the CNI
        bridge plugin's masquerade rules of any sandbox not torn down through CNI. By hand, not by each
        tool's own clean-up: kube-router v2.1.0's `--cleanup-config` leaves its chains in place here and
        then crashes on the missing IPVS."""
        for tool in ("iptables", "ip6tables"):
            for table in ("filter", "nat", "mangle"):
                _remove_chains(tool, table, "KUBE-")
        for ipset in _run("ipset", "list", "-n").stdout.split():
            if ipset.startswith(("KUBE-", "kube-router")):
                _run("ipset", "destroy", ipset)
        chain_comment = f'name: \\"{CNI_NETWORK}\\"'
        nat = _run("iptables-save", "-t", "nat").stdout.splitlines()
        sandboxes = {line.split()[1] for line in nat if line.startswith("-A CNI-") and chain_comment in line}
        for line in nat:
            if line.startswith("-A POSTROUTING") and chain_comment in line:
                _run("sh", "-c", f"iptables -w -t nat {line.replace('-A ', '-D ', 1)}")
        for verb in ("-F", "-X"):
            for chain in sandboxes:
                _run("iptables", "-w", "-t", "nat", verb, chain)

    def _remove_cgroup_root(self) -> None:
        for hierarchy in CGROUP_V1.iterdir():
            root = hierarchy / CGROUP_ROOT.lstrip("/")
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


def _remove_chains(tool: str, table: str, prefix: str) -> None:
    """The chains of `table` named `prefix`*, after every rule of another chain that jumps to one."""
    rules = _run(tool, "-w", "-t", table, "-S").stdout.splitlines()
    chains = [line.split()[1] for line in rules if line.startswith("-N ") and line.split()[1].startswith(prefix)]
    for line in rules:
        parts = line.split()
        if parts[:1] == ["-A"] and not parts[1].startswith(prefix) and "-j" in parts \
                and parts[parts.index("-j") + 1].startswith(prefix):
            _run("sh", "-c", f"{tool} -w -t {table} {line.replace('-A ', '-D ', 1)}")
    for verb in ("-F", "-X"):
        for chain in chains:
            _run(tool, "-w", "-t", table, verb, chain)


def _kill(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s; nothing when it is gone (or a pid reused by then)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


__all__ = ["HostState", "NodeProcesses"]

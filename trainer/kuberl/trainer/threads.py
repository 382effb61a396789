"""How many CPU threads this process should compute with: its container's CPUs, never the node's.

torch, OpenMP, MKL and OpenBLAS size their pools to every core the kernel reports. In a pod that is the
node's count: on a 64-core node each learner would start 64 threads on its one CPU, and on a busy 2-core
node two threads under one CPU's share made the learner's update 25x slower (1.6 ms to 40 ms). The
container's CPUs are, in order, the fewest of: the cgroup's CPU quota (a CPU limit), the CPUs the operator
gives the pod (`KUBERL_CPUS`: its limit, else its request, rounded up, as Ray's --num-cpus), and the CPUs
this process may run on.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from kuberl.api.threads import CPUS_ENV, THREAD_ENV

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpus(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None without a quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for v1 in (root / "cpu", root / "cpu,cpuacct", root):
        try:
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def container_cpus(root: Path = CGROUP) -> int:
    """Whole CPUs this process's container may use (module doc), at least 1."""
    candidates: list[float] = []
    quota = cgroup_cpus(root)
    if quota is not None:
        candidates.append(quota)
    given = os.environ.get(CPUS_ENV, "")
    if given.isdigit() and int(given) > 0:
        candidates.append(int(given))
    try:
        candidates.append(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        candidates.append(os.cpu_count() or 1)
    return max(1, math.ceil(min(candidates)))


def size_threads(threads: int | None = None, root: Path = CGROUP) -> int:
    """Sets this process's thread pools to `threads`, else to its container's CPUs; returns the number.
    A pool size already in the environment (a template's env) is kept for that library."""
    count = threads or container_cpus(root)
    for var in THREAD_ENV:
        os.environ.setdefault(var, str(count))
    import torch

    torch.set_num_threads(count)
    return count


__all__ = ["CPUS_ENV", "THREAD_ENV", "cgroup_cpus", "container_cpus", "size_threads"]

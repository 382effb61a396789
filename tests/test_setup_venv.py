"""scripts/setup-venv installs the torch build the machine can use: the CPU build from PyTorch's CPU index
on a machine without an NVIDIA GPU (pip's configured index where that one cannot be reached), the CUDA
build with one, or what KUBERL_TORCH asks for. Its decisions are read from --dry-run, with a fake
`nvidia-smi` and local indexes (one served here, one refused); and the venv these tests run in, made by
setup-venv in CI, holds the CPU build on a machine without a GPU."""

from __future__ import annotations

import functools
import http.server
import importlib.metadata
import os
import socket
import subprocess
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
                "KUBERL_VENV": str(tmp_path / "venv"), **env}
    return subprocess.run([str(SCRIPT), "--dry-run", "dev"], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=60, check=False)


def _torch_install(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("+") and "torch==2.13.0" in x]
    return line


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
    assert f"--index-url {served_index} torch==2.13.0" in _torch_install(proc.stdout)
    assert "--force-reinstall" not in proc.stdout  # a new venv: nothing to replace


def test_no_gpu_and_an_unreachable_cpu_index_falls_back_to_pips_configured_index(tmp_path):
    url = _refused_url()
    proc = _dry_run(tmp_path, KUBERL_TORCH_INDEX=url)
    assert proc.returncode == 0, proc.stderr
    assert f"{url} cannot be reached; torch from pip's configured index" in proc.stdout
    assert "--index-url" not in _torch_install(proc.stdout)


@pytest.mark.parametrize("gpu", ["smi", "proc"])
def test_a_gpu_takes_the_cuda_build_from_pips_index(tmp_path, gpu):
    proc = _dry_run(tmp_path, gpu=gpu)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA GPU: yes; torch build: cuda" in proc.stdout
    assert "--index-url" not in _torch_install(proc.stdout)


def test_kuberl_torch_overrides_the_detection(tmp_path, served_index):
    proc = _dry_run(tmp_path, gpu="smi", KUBERL_TORCH="cpu", KUBERL_TORCH_INDEX=served_index)
    assert "NVIDIA GPU: yes; torch build: cpu (KUBERL_TORCH=cpu)" in proc.stdout
    assert f"--index-url {served_index}" in _torch_install(proc.stdout)
    proc = _dry_run(tmp_path, KUBERL_TORCH="cuda", KUBERL_TORCH_INDEX="https://download.pytorch.org/whl/cu128")
    assert "NVIDIA GPU: no; torch build: cuda (KUBERL_TORCH=cuda)" in proc.stdout
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.13.0" in _torch_install(proc.stdout)
    proc = _dry_run(tmp_path, KUBERL_TORCH="gpu")
    assert proc.returncode == 2 and "KUBERL_TORCH takes auto, cpu or cuda, not 'gpu'" in proc.stderr
    assert proc.stdout == ""  # nothing done


def test_this_venv_holds_the_build_setup_venv_picks_for_this_machine(tmp_path):
    proc = subprocess.run([str(SCRIPT), "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, "KUBERL_VENV": str(tmp_path / "venv")})
    assert proc.returncode == 0, proc.stderr
    if "NVIDIA GPU: yes" in proc.stdout:
        pytest.skip("this machine has an NVIDIA GPU: setup-venv installs the CUDA build here")
    import torch

    assert torch.__version__.startswith("2.13.0") and torch.version.cuda is None, torch.__version__
    cuda_wheels = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                         if d.metadata["Name"].lower().startswith("nvidia-"))
    assert cuda_wheels == [], cuda_wheels

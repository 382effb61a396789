"""scripts/build-images without building anything: --help, and --dry-run's engine commands.

The images themselves are built by the end-to-end tests (tests/bed/cluster_bed.py) through the script."""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-images"


def build_images(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("CONTAINERS_CONF", "KUBERL_BUILD_CACHE", "KUBERL_TORCH_INDEX")}
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**environ, **env}, check=False)


@pytest.fixture
def host(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """A scratch directory and a wheel cache of the test's own, and a PyTorch index that refuses."""
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu"
    return {"cache": tmp_path / "cache", "kuberl_cache": tmp_path / "kuberl", "refused": refused}


def dry_run(host: dict, *args: str) -> subprocess.CompletedProcess:
    return build_images("--dry-run", "--force", "--engine", "podman", "--cache-dir", str(host["cache"]), *args,
                        KUBERL_CACHE=str(host["kuberl_cache"]), KUBERL_TORCH_INDEX=str(host["refused"]))


def builds(stdout: str) -> dict[str, str]:
    """The dry run's build command lines, by image."""
    lines = [line for line in stdout.splitlines() if line.startswith("+ ") and " build " in line]
    return {re.search(r"-t ghcr\.io/kuberl/kuberl-(\w+):", line)[1]: line for line in lines}


def test_help() -> None:
    result = build_images("--help")
    assert result.returncode == 0, result.stderr
    for word in ("--engine", "--only", "--tag", "--force", "--dry-run", "--torch", "--from-index",
                 "--base-from-debian", "make-base-image", "3.11.2", "--runtime runc", "default_ulimits",
                 "--build-context wheels=DIR", "--network none"):
        assert word in result.stdout, word
    assert "set -euo" not in result.stdout


def test_bad_options_are_refused() -> None:
    assert build_images("--only", "serving").returncode == 2
    assert build_images("--torch", "rocm").returncode == 2
    assert build_images("--no-such-flag").returncode == 2


def test_dry_run_builds_every_image_from_the_wheel_cache_without_network(host: dict) -> None:
    result = dry_run(host, "--tag", "9.9.9")
    assert result.returncode == 0, result.stdout + result.stderr
    # PyTorch's CPU index refused: torch from pip's configured index, the rule setup-venv follows
    assert f"{host['refused']} cannot be reached; torch from pip's configured index" in result.stdout
    wheels = host["kuberl_cache"] / "wheels" / "torch-2.13.0-pip-index"
    downloads = [x for x in result.stdout.splitlines() if x.startswith("+ ") and " -m pip download " in x]
    assert downloads, result.stdout
    for line in downloads:  # into the cache, pinned, once (no pip cache beside it)
        assert f"-d {wheels} " in line and f"-c {REPO / 'constraints.txt'}" in line and "--no-cache-dir" in line
    assert "hatchling" in downloads[-1] and ".\\[trainer\\,operator\\]" in downloads[-1]
    lines = builds(result.stdout)
    assert set(lines) == {"operator", "trainer", "rollout"}
    for which, line in lines.items():
        assert line.startswith("+ podman --runtime runc build "), line
        assert f"-t ghcr.io/kuberl/kuberl-{which}:9.9.9 ." in line
        assert f"-f Dockerfile.{which} " in line
        assert re.search(r"--label kuberl\.dev/inputs-hash=[0-9a-f]{16} ", line)
        assert f"--build-context wheels={wheels} " in line
        assert "--network none" in line and "--pull=never" in line
        assert " -v " not in line  # nothing of the host's is mounted
    # podman's settings for sandboxes without CAP_SYS_RESOURCE
    assert (host["cache"] / "containers.conf").read_text() == "[containers]\ndefault_ulimits = []\n"


def test_dry_run_defaults_to_the_chart_tags(host: dict) -> None:
    result = dry_run(host)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = builds(result.stdout)
    chart = (REPO / "charts" / "kuberl-operator" / "Chart.yaml").read_text()
    app_version = re.search(r'^appVersion: "?([^"\n]+)"?', chart, re.MULTILINE)[1]
    names = (REPO / "operator" / "kuberl" / "operator" / "names.py").read_text()
    default_trainer = re.search(r'DEFAULT_TRAINER_IMAGE = "([^"]+)"', names)[1]
    default_rollout = re.search(r'DEFAULT_ROLLOUT_IMAGE = "([^"]+)"', names)[1]
    assert f"-t ghcr.io/kuberl/kuberl-operator:{app_version} " in lines["operator"]
    assert f"-t {default_trainer} " in lines["trainer"]
    assert f"-t {default_rollout} " in lines["rollout"] and "-f Dockerfile.rollout " in lines["rollout"]


def test_from_index_uses_the_dockerfiles_own_defaults(host: dict) -> None:
    result = dry_run(host, "--from-index")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " -m pip download " not in result.stdout
    for line in builds(result.stdout).values():
        assert "--build-context" not in line and "--network" not in line and "--build-arg" not in line


def test_dry_run_only_one_image(host: dict) -> None:
    result = dry_run(host, "--only", "operator")
    assert result.returncode == 0, result.stderr
    assert set(builds(result.stdout)) == {"operator"}

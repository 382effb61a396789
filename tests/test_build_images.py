"""scripts/build-images without building anything: --help, and --dry-run's engine commands.

The images themselves are built by the end-to-end tests (tests/bed/cluster_bed.py) through the script."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "build-images"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def build_images(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("CONTAINERS_CONF", "KUBERL_BUILD_CACHE")}
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**environ, **env}, check=False)


@pytest.fixture
def offline_host(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """A pip configuration like this project's CI host's, in a temporary directory."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / WHEEL).write_bytes(b"not a real wheel")
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "constraints.txt").write_text("torch<=2.14.1\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nextra-index-url = file://{tmp_path}/pypi/simple\nfind-links = {tmp_path}/wheels\n"
                    f"constraint = {tmp_path}/constraints.txt\ncert = {tmp_path}/ca.crt\n")
    return {"root": tmp_path, "conf": conf, "cache": tmp_path / "cache"}


def builds(stdout: str) -> dict[str, str]:
    """The dry run's build command lines, by image."""
    lines = [line for line in stdout.splitlines() if line.startswith("+ ") and " build " in line]
    return {re.search(r"-t ghcr\.io/kuberl/kuberl-(\w+):", line)[1]: line for line in lines}


def test_help() -> None:
    result = build_images("--help")
    assert result.returncode == 0, result.stderr
    for word in ("--engine", "--only", "--tag", "--force", "--dry-run", "--air-gapped", "--pip-config", "--mount",
                 "--base-from-debian", "make-base-image", "3.11.2", "--runtime runc", "default_ulimits"):
        assert word in result.stdout, word
    assert "set -euo" not in result.stdout


def test_bad_options_are_refused() -> None:
    assert build_images("--only", "serving").returncode == 2
    assert build_images("--air-gapped", "maybe").returncode == 2
    assert build_images("--no-such-flag").returncode == 2


def test_dry_run_air_gapped_podman(offline_host: dict[str, pathlib.Path]) -> None:
    root, conf, cache = offline_host["root"], offline_host["conf"], offline_host["cache"]
    result = build_images("--dry-run", "--force", "--engine", "podman", "--air-gapped", "on", "--tag", "9.9.9",
                          "--pip-config", str(conf), "--cache-dir", str(cache), "--mount", "/srv/extra:/srv/extra")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = builds(result.stdout)
    assert set(lines) == {"operator", "trainer"}
    index = cache / f"torch-index-{WHEEL[:-4]}"
    for which, line in lines.items():
        assert line.startswith("+ podman --runtime runc build "), line
        assert f"-t ghcr.io/kuberl/kuberl-{which}:9.9.9 ." in line
        assert f"-f Dockerfile.{which} " in line
        assert re.search(r"--label kuberl\.dev/inputs-hash=[0-9a-f]{16} ", line)
        assert "--network host" in line and "--pull=never" in line
        # this host's pip configuration and everything it names, read-only at the same paths
        assert f"-v {conf}:/etc/pip.conf:ro" in line
        for path in ("ca.crt", "constraints.txt", "wheels", "pypi"):
            assert f"-v {root / path}:{root / path}:ro" in line, path
        assert "-v /srv/extra:/srv/extra:ro" in line
    # torch, for the trainer only: exactly the CPU wheel, from a one-wheel index
    trainer, operator = lines["trainer"], lines["operator"]
    assert "--build-arg TORCH_INDEX_URL=file:///kuberl-torch-index" in trainer
    assert "--build-arg TORCH_VERSION=2.13.0+cpu" in trainer
    assert f"-v {index}:/kuberl-torch-index:ro" in trainer
    assert "TORCH" not in operator and "kuberl-torch-index" not in operator
    assert WHEEL in (index / "torch" / "index.html").read_text()
    assert (index / "torch" / WHEEL).read_bytes() == b"not a real wheel"
    assert 'href="torch/"' in (index / "index.html").read_text()
    # podman's settings for sandboxes without CAP_SYS_RESOURCE
    assert (cache / "containers.conf").read_text() == "[containers]\ndefault_ulimits = []\n"


def test_dry_run_defaults_to_the_chart_tags(offline_host: dict[str, pathlib.Path]) -> None:
    result = build_images("--dry-run", "--force", "--engine", "podman", "--air-gapped", "off",
                          "--cache-dir", str(offline_host["cache"]))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = builds(result.stdout)
    chart = (REPO / "charts" / "kuberl-operator" / "Chart.yaml").read_text()
    app_version = re.search(r'^appVersion: "?([^"\n]+)"?', chart, re.MULTILINE)[1]
    names = (REPO / "operator" / "kuberl" / "operator" / "names.py").read_text()
    default_trainer = re.search(r'DEFAULT_TRAINER_IMAGE = "([^"]+)"', names)[1]
    assert f"-t ghcr.io/kuberl/kuberl-operator:{app_version} " in lines["operator"]
    assert f"-t {default_trainer} " in lines["trainer"]
    # online: the Dockerfiles' own defaults, nothing mounted
    for line in lines.values():
        assert " -v " not in line and "TORCH_INDEX_URL" not in line


def test_dry_run_only_one_image(offline_host: dict[str, pathlib.Path]) -> None:
    result = build_images("--dry-run", "--force", "--engine", "podman", "--air-gapped", "off", "--only", "operator",
                          "--cache-dir", str(offline_host["cache"]))
    assert result.returncode == 0, result.stderr
    assert set(builds(result.stdout)) == {"operator"}


def test_air_gapped_docker_is_refused_with_advice(offline_host: dict[str, pathlib.Path]) -> None:
    result = build_images("--dry-run", "--force", "--engine", "docker", "--air-gapped", "on",
                          "--pip-config", str(offline_host["conf"]), "--cache-dir", str(offline_host["cache"]))
    assert result.returncode == 1
    assert "need podman" in result.stderr and "--help" in result.stderr

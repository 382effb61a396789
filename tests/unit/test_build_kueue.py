"""scripts/build-kueue without building anything: `--print-bin` on an empty cache, and a finished build
reused as it is (when this machine has one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-kueue"


def run(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"KUBERL_CACHE": str(cache)} if cache else {})}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_print_bin_fails_with_a_message_on_an_empty_cache_and_creates_nothing(tmp_path):
    done = run("--print-bin", cache=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert "not built" in done.stderr and "./scripts/build-kueue" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_finished_build_is_reused_with_its_manifests_beside_it():
    done = run("--print-bin")
    if done.returncode != 0:
        from tools import in_ci

        # ./scripts/test builds it before the tests; a bare pytest on a machine without Go may not have.
        reason = "Kueue is not built on this machine (./scripts/build-kueue)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    binary = Path(done.stdout.strip().splitlines()[-1])
    again = run()
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == str(binary)
    assert "built kueue" not in again.stderr  # nothing was built
    for name in ("crds.yaml", "crd-conversion.yaml", "webhooks.yaml", "manager-role.yaml",
                 "manager-secrets-role.yaml"):
        assert (binary.parent / name).stat().st_size > 0, name
    assert "kind: CustomResourceDefinition" in (binary.parent / "crds.yaml").read_text()

"""The habits CI keeps: ruff (imports, bugbear, pyflakes, pycodestyle) on the code, mypy on the job model and
the operator, both as configured in pyproject.toml, and the pre-commit hooks run the same commands."""

from __future__ import annotations

import subprocess
import sys

import yaml
from conftest import REPO
from tools import CACHE_DIR

CODE = ["operator", "trainer"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-cache", *CODE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing_in_the_job_model_and_the_operator():
    from importlib.metadata import version

    # Incremental, with its cache outside the clone under mypy's version: a fresh clone (CI's) re-checks only
    # what changed since the last run instead of every module of pydantic and the Kubernetes client again.
    cache = CACHE_DIR / f"mypy-{version('mypy')}-cache"
    result = _run("mypy", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "operator/kuberl/api" in (REPO / "pyproject.toml").read_text()


def test_the_pre_commit_hooks_run_what_ci_runs():
    hooks = {hook["id"]: hook for repo in yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
             for hook in repo["hooks"]}
    assert hooks["ruff"]["entry"].split()[:2] == [".venv/bin/ruff", "check"]
    assert hooks["ruff"]["files"] == "^(operator|trainer)/"
    assert hooks["mypy"]["entry"] == ".venv/bin/mypy" and hooks["mypy"]["pass_filenames"] is False

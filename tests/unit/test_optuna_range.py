"""The sweep engine on the lowest Optuna that pyproject allows, beside the pinned one (constraints.txt) that every
other test runs on: the engine keeps to Optuna's public calls, and this holds the range pyproject states to
what is tested. The lowest release is installed once, next to the other build caches, keyed by its version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib

from conftest import REPO
from packaging.requirements import Requirement
from tools import CACHE_DIR

#: The engine's own tests, and the cluster pass's, which rebuilds a study from a record every pass.
SWEEP_TESTS = ("tests/unit/test_sweep_engine.py", "tests/unit/test_sweep_cluster_pass.py",
               "tests/unit/test_sweep_property.py")


def _range() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sweep"]
    return next(r for r in map(Requirement, deps) if r.name == "optuna")


def _pinned() -> str:
    line = next(x for x in (REPO / "constraints.txt").read_text().splitlines() if x.startswith("optuna=="))
    return line.split("==", 1)[1].strip()


def _install(version: str) -> str:
    """Optuna `version` alone (its own dependencies are the venv's), in a cache folder; returns the folder."""
    target = CACHE_DIR / f"optuna-{version}"
    if not (target / "optuna").is_dir():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=f".optuna-{version}-", dir=CACHE_DIR)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", scratch,
                        f"optuna=={version}"], check=True, timeout=600)
        try:
            os.replace(scratch, target)  # whole or not at all: a cut-off install is never taken for one
        except OSError:  # another worker put it there first
            shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


def test_the_pinned_optuna_is_inside_the_range_pyproject_states():
    assert _range().specifier.contains(_pinned()), (_range(), _pinned())


def test_the_sweep_engine_passes_its_tests_on_the_lowest_optuna_pyproject_allows():
    lowest = min((spec.version for spec in _range().specifier if spec.operator == ">="), key=lambda v: tuple(
        int(x) for x in v.split(".")))
    version = lowest if lowest.count(".") == 2 else f"{lowest}.0"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_install(version), os.environ.get("PYTHONPATH", "")]))
    found = subprocess.run([sys.executable, "-c", "import optuna; print(optuna.__version__)"], env=env,
                           capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert found == version, f"the tests below would run on optuna {found}, not {version}"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             *SWEEP_TESTS], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

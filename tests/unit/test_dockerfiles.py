"""Dockerfile.operator, Dockerfile.trainer and Dockerfile.rollout: hadolint-clean, and built the way the cluster
runs them.

Images cannot be built here (no Docker engine), so these tests read the Dockerfiles: hadolint
lints them for real; the rest checks what a build would get wrong at run time (a root user, a uid
the pods do not expect, torch in the operator image, a COPY source the .dockerignore leaves out).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest
import tomllib
import yaml
from tools import REPO, hadolint_binary

DOCKERFILES = ["Dockerfile.operator", "Dockerfile.trainer", "Dockerfile.rollout"]
#: What CI pins and the trainer image must install first (torch's CPU wheel).
TORCH_PIN = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass
class Instruction:
    keyword: str
    args: str
    stage: int


def parse(name: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped; stage = index of its FROM."""
    text = (REPO / name).read_text()
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    out, stage = [], -1
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage))
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def pip_installs(instructions: list[Instruction]) -> list[list[str]]:
    """Every `pip [--python PY] install` command, as argument lists (after `install`)."""
    commands = []
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for part in re.split(r"&&|;", ins.args):
            words = shlex.split(part)
            if "install" in words and any(w.endswith("pip") for w in words[: words.index("install")]):
                commands.append(words[words.index("install") + 1:])
    return commands


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    out = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            key, _, value = ins.args.partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name):
    result = subprocess.run([str(hadolint_binary()), "--no-color", "--format", "json", str(REPO / name)],
                            capture_output=True, text=True, timeout=60, check=False)
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_one_stage_on_a_pinned_base_with_a_wheels_context_and_a_venv_without_pip(name):
    instructions = parse(name)
    froms = [i.args.split() for i in instructions if i.keyword == "FROM"]
    # `FROM scratch AS wheels`: empty unless the build names a wheel directory (--build-context)
    assert froms[0] == ["scratch", "AS", "wheels"], froms
    bases = [f[0] for f in froms[1:]]
    # One runtime stage: the base already carries pip, a build stage would keep nothing out. The trainer's
    # only other stage cuts torch's pins from constraints.txt, on the same base.
    helpers = [f for f in froms[1:-1]]
    assert helpers == ([[bases[-1], "AS", "torch-pins"]] if name == "Dockerfile.trainer" else []), froms
    _image, _, tag = bases[-1].partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), f"{bases[-1]}: pin a patch release"
    runtime = final_stage(instructions)
    assert any(i.keyword == "RUN" and "python -m venv --without-pip /opt/kuberl" in i.args for i in runtime), \
        "the runtime venv gets no pip of its own: nothing installs at run time"
    for args in pip_installs(instructions):
        # every install pinned (torch's by its own pins); from the wheels alone when they are given
        pins = "/opt/kuberl-src/torch-constraints.txt" if any(a.startswith("torch==") for a in args) \
            else "/opt/kuberl-src/constraints.txt"
        assert "-c" in args and args[args.index("-c") + 1] == pins, args
    for ins in runtime:
        if ins.keyword == "RUN" and "pip install" in ins.args:
            assert "--mount=type=bind,from=wheels,target=/wheels" in ins.args
            assert "--no-index --find-links /wheels" in ins.args


def test_torch_has_a_layer_of_its_own_before_the_sources_are_copied():
    runtime = final_stage(parse("Dockerfile.trainer"))
    torch_at = next(k for k, i in enumerate(runtime) if i.keyword == "RUN" and "torch==" in i.args)
    copies = [k for k, i in enumerate(runtime) if i.keyword == "COPY"]
    # Only torch's own pins come before it: a code change, or a pin changed elsewhere, leaves its gigabytes cached.
    assert [i.args for i in runtime if i.keyword == "COPY"][0] == "--from=torch-pins /torch-constraints.txt " \
                                                                   "/opt/kuberl-src/"
    assert sum(k < torch_at for k in copies) == 1, "a code change must leave torch's layer (gigabytes) cached"


def _requirement_closure(root: str) -> set[str]:
    """The names of `root` and every package it requires in this venv, extras followed (torch asks for
    cuda-toolkit's extras, which bring the nvidia-* packages), markers evaluated for this platform."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, str]] = set()
    todo = [(root, "")]
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return {name for name, _ in seen}


def test_the_torch_pins_stage_keeps_the_pin_of_everything_torch_installs():
    stage = [i for i in parse("Dockerfile.trainer") if i.stage == 1]
    grep = next(shlex.split(i.args) for i in stage if i.keyword == "RUN")
    pattern = re.compile(grep[grep.index("-E") + 1], re.IGNORECASE)
    from packaging.utils import canonicalize_name

    pinned = {canonicalize_name(line.split("==")[0]): line
              for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
    closure = _requirement_closure("torch")
    kept = {name for name, line in pinned.items() if pattern.search(line)}
    # torch's whole closure (as installed here, the CUDA build) is pinned in its layer, and nothing else is.
    assert closure & set(pinned) <= kept, sorted((closure & set(pinned)) - kept)
    assert kept <= closure, sorted(kept - closure)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_a_numeric_non_root_user_and_leaves_no_cache(name):
    instructions = parse(name)
    users = [i.args for i in final_stage(instructions) if i.keyword == "USER"]
    assert users, "the image must not run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric, non-zero (runAsNonRoot checks it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    for args in pip_installs(instructions):
        assert "--no-cache-dir" in args, f"pip install {' '.join(args)} keeps pip's cache in the image"
    for ins in instructions:
        if ins.keyword == "RUN" and "apt-get install" in ins.args:
            assert "rm -rf /var/lib/apt/lists" in ins.args


def _uid(name: str) -> int:
    users = [i.args for i in final_stage(parse(name)) if i.keyword == "USER"]
    return int(users[-1].split(":")[0])


def test_image_users_match_the_pods_that_run_them():
    from kuberl.api.pod_template import POD_SECURITY_CONTEXT

    assert _uid("Dockerfile.trainer") == POD_SECURITY_CONTEXT["runAsUser"]
    assert _uid("Dockerfile.rollout") == POD_SECURITY_CONTEXT["runAsUser"]
    chart_values = yaml.safe_load((REPO / "charts" / "kuberl-operator" / "values.yaml").read_text())
    assert _uid("Dockerfile.operator") == chart_values["podSecurityContext"]["runAsUser"]


def test_operator_image_installs_the_operator_extra_and_neither_torch_nor_ray():
    instructions = parse("Dockerfile.operator")
    installs = pip_installs(instructions)
    assert [a for a in installs if "/opt/kuberl-src/[operator]" in a], installs
    text = " ".join(" ".join(a) for a in installs)
    assert "torch" not in text and "ray" not in text and "trainer" not in text
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    operator_deps = " ".join(pyproject["project"]["dependencies"] + pyproject["project"]["optional-dependencies"]["operator"])
    assert "torch" not in operator_deps and "ray" not in operator_deps
    entrypoint = next(i.args for i in final_stage(instructions) if i.keyword == "ENTRYPOINT")
    assert json.loads(entrypoint)[0] in pyproject["project"]["scripts"]


def test_rollout_image_installs_the_rollout_extra_and_checks_its_imports_without_torch():
    """The head's and the workers' image: the rollout extra (no torch), checked at build time by importing
    the modules its pods run; the same base as the trainer image, so both hold the same Python and Ray."""
    instructions = parse("Dockerfile.rollout")
    installs = pip_installs(instructions)
    assert [a for a in installs if "/opt/kuberl-src/[rollout]" in a], installs
    assert "torch" not in " ".join(" ".join(a) for a in installs)
    build_check = next(i.args for i in final_stage(instructions) if i.keyword == "RUN" and "pip install" in i.args)
    assert "kuberl.trainer.rollout" in build_check and '! /opt/kuberl/bin/python -c "import torch"' in build_check
    bases = [i.args for i in parse("Dockerfile.rollout") if i.keyword == "FROM"]
    trainer_bases = [i.args.split()[0] for i in parse("Dockerfile.trainer") if i.keyword == "FROM"]
    assert bases[-1] == trainer_bases[-1]


_WITHOUT_TORCH_AND_RAY = """
import importlib.abc, sys
class NotInTheOperatorImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "ray"):
            raise ImportError(f"{name} is not installed in the operator image")
sys.meta_path.insert(0, NotInTheOperatorImage())
from kuberl.operator import main
from kuberl.operator.controllers import build_registry
from kuberl.operator import builders
from kuberl.api.load import load_job_file
from kuberl.api.semantics import check_registered
main._preload_validation()
for example in sys.argv[1:]:
    job = load_job_file(example, check=check_registered)  # the operator's check: the table of registered envs
    options = builders.BuildOptions()
    builders.build_head_pod(job, options), builders.build_learner_pod(job, options)
    builders.build_worker_pod(job, options, 0)
build_registry()
print("ok")
"""


def test_operator_runs_without_torch_or_ray():
    """What the operator image can do with neither installed: start, validate every example, build its pods."""
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH_AND_RAY, *examples], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_trainer_image_installs_pinned_torch_from_the_cpu_index_first_then_the_trainer_extra():
    instructions = parse("Dockerfile.trainer")
    defaults = arg_defaults(instructions)
    assert defaults["TORCH_VERSION"] == TORCH_PIN
    assert defaults["TORCH_INDEX_URL"] == CPU_INDEX, "CPU torch by default; CUDA is a build argument"
    installs = pip_installs(instructions)
    torch_at = [k for k, a in enumerate(installs) if any(w.startswith("torch==") for w in a)]
    project_at = next(k for k, a in enumerate(installs) if "/opt/kuberl-src/[trainer]" in a)
    assert len(torch_at) == 2 and max(torch_at) < project_at, "torch first: the project's install keeps its build"
    from_wheels, from_index = (installs[k] for k in torch_at)
    assert "--no-index" in from_wheels and "torch==${TORCH_VERSION}" in from_wheels
    assert "torch==${TORCH_VERSION}" in from_index and "--no-deps" in from_index
    assert from_index[from_index.index("--index-url") + 1] == "${TORCH_INDEX_URL}"
    # The trainer extra admits that torch (otherwise pip would replace it with a PyPI build).
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    torch_req = next(r for r in pyproject["project"]["optional-dependencies"]["trainer"] if r.startswith("torch"))
    from packaging.requirements import Requirement

    assert Requirement(torch_req).specifier.contains(TORCH_PIN)


def test_ci_installs_the_same_torch_the_trainer_image_does():
    # .ci/run -> scripts/test -> scripts/setup-venv, which pins torch for every local install.
    assert "./scripts/test" in (REPO / ".ci" / "run").read_text()
    assert "scripts/setup-venv" in (REPO / "scripts" / "test").read_text()
    pins = set(re.findall(r"^TORCH_VERSION=([\w.+]+)", (REPO / "scripts" / "lib" / "wheels.sh").read_text(), re.M))
    assert pins == {TORCH_PIN}, f"CI installs torch {pins}, the trainer image {TORCH_PIN}"
    assert f"torch=={TORCH_PIN}" in (REPO / "constraints.txt").read_text().splitlines()


# --------------------------------------------------------------------------------------------
# .dockerignore: Docker's own matching rules (patterns match a path or any of its parents; the
# last matching pattern wins; `!` re-includes)
# --------------------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + "$")


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    excluded = False
    parts = path.split("/")
    candidates = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip().strip("/")
        if _pattern_regex(pattern).match(path) or any(_pattern_regex(pattern).match(c) for c in candidates):
            excluded = not negate
    return excluded


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _repo_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (REPO / f).exists()]


def test_dockerignore_matcher_follows_docker_rules():
    patterns = ["*", "!src/", "**/__pycache__"]
    assert dockerignore_excludes("secret.txt", patterns)
    assert not dockerignore_excludes("src/a/b.py", patterns)
    assert dockerignore_excludes("src/a/__pycache__/b.pyc", patterns)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_copied_source_is_in_the_build_context(name):
    patterns = _dockerignore()
    files = _repo_files()
    for ins in parse(name):
        if ins.keyword != "COPY" or "--from=" in ins.args:
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        for source in words[:-1]:
            source = source.rstrip("/")
            under = [f for f in files if f == source or f.startswith(source + "/")]
            assert under, f"{name}: COPY {source}: nothing there"
            sent = [f for f in under if not dockerignore_excludes(f, patterns)]
            missing = [f for f in under if f not in sent and "__pycache__" not in f]
            assert sent and not missing, f"{name}: .dockerignore drops {missing or source}"


def test_dockerignore_keeps_local_state_out_of_the_context():
    patterns = _dockerignore()
    for path in [".venv/bin/python", ".git/HEAD", "runs/job/ckpt.pt", ".tools/helm/helm",
                 "bench/.venvs/trainer/bin/python", "tests/integration/test_chart.py", "charts/kuberl-operator/Chart.yaml",
                 "operator/kuberl/operator/__pycache__/main.cpython-311.pyc"]:
        assert dockerignore_excludes(path, patterns), f"{path} would be sent to the Docker daemon"

"""A user's own environment in a package (tests/data/gridgoal, what docs/custom-environments.md walks
through): it passes gymnasium's own env checker, a job names it either way gymnasium allows, and a
process that lacks its module says which module, which image and what to do, before any training."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import REPO
from gymnasium.utils.env_checker import check_env

from kuberl.api.load import parse_job
from kuberl.operator.names import DEFAULT_TRAINER_IMAGE
from kuberl.trainer.envs.resolve import EnvNotFound, check_environment, resolve_env_factory
from kuberl.trainer.rollout import RolloutWorker

PACKAGE = REPO / "tests" / "data" / "gridgoal"


@pytest.fixture
def gridgoal_installed(monkeypatch):
    """The package importable, as `pip install` in the image makes it; gone again afterwards."""
    monkeypatch.syspath_prepend(str(PACKAGE))
    yield
    for name in [m for m in sys.modules if m == "gridgoal" or m.startswith("gridgoal.")]:
        del sys.modules[name]
    gym.registry.pop("GridGoal-v0", None)


def test_the_example_env_passes_gymnasiums_env_checker(gridgoal_installed):
    from gridgoal.envs import GridGoal

    env = GridGoal(size=4)
    check_env(env, skip_render_check=True)
    # The shortest path: 3 right, 3 up; the return 1 - 0.01 * 5, as its docstring says.
    env.reset(seed=0)
    rewards = [env.step(a)[1] for a in (0, 0, 0, 1, 1, 1)]
    assert sum(rewards) == pytest.approx(0.95) and env.step(0)[2] is True
    with pytest.raises(ValueError, match="size must be 2 to 64"):
        GridGoal(size=1)


@pytest.mark.parametrize("env_id", ["gridgoal:GridGoal-v0", "gridgoal.envs:GridGoal"])
def test_a_job_names_the_package_s_env_by_registered_id_or_by_class(gridgoal_installed, job_dict, env_id):
    job_dict["spec"]["environment"] = {"id": env_id, "kwargs": {"size": 5}}
    job = parse_job(job_dict)
    assert check_environment(job.spec) == []
    env = resolve_env_factory(env_id)(size=5)
    assert env.unwrapped.size == 5


def test_a_missing_module_in_a_pod_names_the_field_the_module_and_the_image(job_dict, monkeypatch):
    monkeypatch.setenv("KUBERL_IMAGE", "registry.example.com/me/trainer:1")
    job_dict["spec"]["environment"] = {"id": "gridgoal:GridGoal-v0"}
    (problem,) = check_environment(parse_job(job_dict).spec)
    assert problem.path == "spec.environment.id"
    assert "cannot import the environment's module 'gridgoal' (No module named 'gridgoal')" in problem.message
    assert "in the image 'registry.example.com/me/trainer:1'" in problem.message
    assert "built FROM the trainer image" in problem.message and "spec.image" in problem.message


def test_a_missing_module_here_names_this_python(monkeypatch):
    monkeypatch.delenv("KUBERL_IMAGE", raising=False)
    with pytest.raises(EnvNotFound, match=re.escape(f"in this Python ({sys.executable})")):
        resolve_env_factory("gridgoal:GridGoal-v0")


def test_a_rollout_worker_without_the_module_says_so_when_pinged_instead_of_dying():
    """A worker that died in its constructor would be replaced by one that dies the same way; this one
    reports, and the learner fails the job with it (workers.WorkerSet.reconcile)."""
    worker = RolloutWorker("gridgoal:GridGoal-v0", {}, num_envs=2, seed=0, policy={"kind": "categorical"})
    assert "cannot import the environment's module 'gridgoal'" in worker.ping()["env_problem"]


def test_the_documented_dockerfile_builds_on_the_trainer_image_the_operator_runs():
    dockerfile = (PACKAGE / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert base == DEFAULT_TRAINER_IMAGE
    # The trainer's own pins keep torch, gymnasium and numpy where the image has them.
    assert "-c /opt/kuberl-src/constraints.txt" in dockerfile
    assert re.search(r"^USER 1000:1000\s*$", dockerfile.rstrip().splitlines()[-1])
    assert Path(REPO / "docs" / "custom-environments.md").read_text().count("tests/data/gridgoal") >= 1

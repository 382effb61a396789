"""What a job names is code only the job's own processes may run: locally `module:Name` must be a
gymnasium.Env subclass (or an id the module registers) before anything is called, a learner pod reports a
spec it refuses through its termination message, and the operator's table of registered environments is
the one the trainer generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, is_report

KUBERL = [sys.executable, "-m", "kuberl.trainer.cli"]


def _job(job_dict: dict, env_id: str, kwargs: dict | None = None) -> dict:
    job_dict["spec"]["environment"] = {"id": env_id, "kwargs": kwargs or {}}
    return job_dict


def _env(tmp_path) -> dict[str, str]:
    paths = [str(tmp_path), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


@pytest.mark.parametrize("env_id, kwargs, why", [
    ("subprocess:run", {"args": ["touch", "{touched}"]}, "has function 'run', not"),
    ("os:system", {"command": "touch {touched}"}, "has builtin_function_or_method 'system', not"),
    ("json:JSONDecoder", {}, "has type 'JSONDecoder', not"),
    ("os:no_such_name", {}, "has no attribute 'no_such_name'"),
    ("no_such_module_kuberl:Env", {}, "cannot import the environment's module 'no_such_module_kuberl'"),
])
def test_validate_refuses_a_name_that_is_not_an_env_class_before_calling_it(job_dict, tmp_path, env_id, kwargs,
                                                                            why):
    touched = tmp_path / "touched"
    kwargs = json.loads(json.dumps(kwargs).replace("{touched}", str(touched)))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job(job_dict, env_id, kwargs)))
    proc = subprocess.run([*KUBERL, "validate", str(path)], check=False, capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120)
    assert proc.returncode == INVALID_SPEC_EXIT_CODE, proc.stderr
    assert "spec.environment.id" in proc.stderr and why in proc.stderr, proc.stderr
    assert "gymnasium.Env subclass" in proc.stderr or "cannot import" in proc.stderr
    assert not touched.exists()
    assert "Traceback" not in proc.stderr


def test_validate_accepts_an_env_class_and_an_id_its_module_registers(job_dict, tmp_path):
    (tmp_path / "tenant_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('TenantPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    for env_id, kwargs in (("user_envs:Corridor", {"length": 4}), ("tenant_envs:TenantPole-v0", {})):
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(_job(job_dict, env_id, kwargs)))
        proc = subprocess.run([*KUBERL, "validate", str(path)], check=False, capture_output=True, text=True,
                              env=_env(tmp_path), timeout=120)
        assert proc.returncode == 0, proc.stderr


def test_a_learner_pod_leaves_the_refusal_as_its_termination_message(job_dict, tmp_path):
    """`kuberl learner` with the operator's env: exit 2, and `kuberl validate`'s text where the kubelet
    reads the termination message; the operator recognises it as a report."""
    job_dict["metadata"]["name"] = "tenant-job"
    message = tmp_path / "termination-log"
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(_job(job_dict, "subprocess:run", {"args": ["true"]})))
    env = {**_env(tmp_path), "KUBERL_JOB_SPEC_FILE": str(spec), "KUBERL_TERMINATION_MESSAGE_PATH": str(message)}
    proc = subprocess.run([*KUBERL, "learner"], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == INVALID_SPEC_EXIT_CODE, proc.stderr
    text = message.read_text()
    assert text.startswith("error: tenant-job is not a valid RLTrainingJob (1 problem(s)):")
    assert "spec.environment.id" in text and "gymnasium.Env subclass" in text
    assert is_report(text) and text.strip() == proc.stderr.strip()


def test_the_operators_table_of_registered_envs_is_the_generated_one():
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.envs.table", "--check"], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_operators_check_matches_the_full_check_on_every_buildable_registered_id():
    """One rule, two sources of spaces: the table and a built env give the same verdict."""
    from kuberl.api.load import parse_job
    from kuberl.api.semantics import check_registered, registered_envs
    from kuberl.trainer.envs.resolve import check_environment

    buildable = [env_id for env_id, row in registered_envs().items() if row.action is not None]
    assert {"CartPole-v1", "Pendulum-v1", "kuberl/TicTacToe-v0", "kuberl/AutoscalingMulti-v0"} <= set(buildable)
    for env_id in buildable:
        for algorithm in ("PPO", "DQN", "BDQ", "QLearning"):
            data = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
            data["spec"]["algorithm"] = {"name": algorithm}
            data["spec"]["environment"] = {"id": env_id}
            spec = parse_job(data).spec
            assert ([str(p) for p in check_registered(spec)] == [str(p) for p in check_environment(spec)]), \
                (env_id, algorithm)


def test_unknown_kwargs_of_a_registered_env_are_refused_by_the_operator(job_dict):
    from kuberl.api.load import InvalidJob, parse_job
    from kuberl.api.semantics import check_registered

    with pytest.raises(InvalidJob) as err:
        parse_job(_job(job_dict, "CartPole-v1", {"sutton_barto_reward": True, "gravity": 3}), check=check_registered)
    (problem,) = err.value.problems
    assert problem.path == "spec.environment.kwargs"
    assert "takes no argument 'gravity'" in problem.message and "sutton_barto_reward" in problem.message

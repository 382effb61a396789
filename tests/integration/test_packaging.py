"""Layout guarantees: `operator/` never shadows the standard library; the operator side stays torch-free."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import REPO


def _run(code: str, cwd=REPO) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_import_operator_from_repo_root_is_the_standard_library():
    import sysconfig

    out = _run("import operator, numpy, torch; print(operator.__file__); print(operator.itemgetter(1)([5, 6]))")
    path, value = out.splitlines()
    assert path.startswith(sysconfig.get_paths()["stdlib"]), path
    assert not path.startswith(str(REPO))
    assert value == "6"


def test_python_m_from_repo_root_works():
    out = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "crd"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert "kind: CustomResourceDefinition" in out


def test_job_model_and_operator_import_neither_torch_nor_ray():
    out = _run("import sys, kuberl.api.job, kuberl.api.load, kuberl.api.crd, kuberl.api.semantics, kuberl.operator;"
               "from kuberl.api.load import load_job_file;"
               "load_job_file('examples/cartpole-ppo.yaml');"
               "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    assert out.strip() == "[]"


def test_rollout_worker_side_does_not_import_torch():
    out = _run("import sys, kuberl.trainer.rollout, kuberl.trainer.policies, kuberl.trainer.metrics;"
               "print('torch' in sys.modules)")
    assert out.strip() == "False"


def test_wheel_contains_both_namespace_roots(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("kuberl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "kuberl/api/job.py" in names
    assert "kuberl/api/pod_template_schema.json" in names  # the pod template schema the operator checks with
    assert "kuberl/trainer/run.py" in names
    assert "kuberl/operator/__init__.py" in names
    assert "kuberl/__init__.py" not in names  # a namespace package spanning both roots

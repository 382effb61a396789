"""The house rules (scripts/house-check): no import cycle, kuberl.api apart from the trainer and the operator,
no class over 150 lines or function over 80. And the checker itself finds what it is for."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
import textwrap

from conftest import REPO


def _checker():
    loader = importlib.machinery.SourceFileLoader("house_check", str(REPO / "scripts" / "house-check"))
    spec = importlib.util.spec_from_loader("house_check", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_house_has_no_cycle_no_api_leak_and_nothing_too_long():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "house-check")], check=False, capture_output=True,
                            text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout


def test_the_checker_finds_a_lazy_import_cycle_and_a_long_function(tmp_path, monkeypatch):
    house = _checker()
    pkg = tmp_path / "trainer" / "kuberl" / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from kuberl.trainer import b\n")
    (pkg / "b.py").write_text("def f():\n    from kuberl.trainer.a import x\n" + "    y = 1\n" * 80)
    api = tmp_path / "operator" / "kuberl" / "api"
    api.mkdir(parents=True)
    (api / "__init__.py").write_text("")
    (api / "m.py").write_text(textwrap.dedent("import kuberl.trainer.b\n"))
    monkeypatch.setattr(house, "REPO", tmp_path)
    monkeypatch.setattr(house, "ROOTS", (tmp_path / "operator", tmp_path / "trainer"))
    found = house.problems()
    assert "import cycle: kuberl.trainer.a <-> kuberl.trainer.b" in found
    assert "kuberl.api.m imports kuberl.trainer.b: kuberl.api must import neither the trainer nor the operator" in found
    assert any("function f is 82 lines (at most 80)" in line for line in found)

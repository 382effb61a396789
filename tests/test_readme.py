"""The README stays true: its metrics table is the code's registry, its quick start is the two scripts,
and CI runs the README's test command."""

from __future__ import annotations

import re

from conftest import REPO
from kuberl.trainer.metrics import METRICS

README = (REPO / "README.md").read_text()


def test_metrics_table_matches_the_registry():
    rows = re.findall(r"^\| `(kuberl_[a-z_]+)` \| (counter|gauge|histogram) \| (.+?) \|$", README, re.M)
    learner_rows = {name: (kind, text) for name, kind, text in rows if not name.startswith("kuberl_operator_")}
    assert learner_rows == {name: (kind, text) for name, (kind, text) in METRICS.items()}


def test_quick_start_is_exactly_two_commands_and_ci_runs_the_second():
    block = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./scripts/train-example", "./scripts/test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "./scripts/test" in ci
    for script in ("scripts/train-example", "scripts/test", "scripts/setup-venv"):
        assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    assert 'torch==2.13.0' in (REPO / "scripts" / "setup-venv").read_text()


def test_every_example_is_documented():
    for path in sorted((REPO / "examples").glob("*.yaml")):
        assert f"examples/{path.name}" in README, f"README does not mention examples/{path.name}"

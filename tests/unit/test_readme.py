"""The README and the docs stay true: the metrics table is the code's registry, the quick start is the two
scripts (and CI runs the second), written once, every example is documented, every job shown in a code block
is valid, and every test, benchmark and result file the pages name exists."""

from __future__ import annotations

import copy
import re

import yaml

from conftest import REPO
from kuberl.api.job import RLTrainingJobSpec
from kuberl.api.load import parse_job
from kuberl.api.tenancy import Tenancy
from kuberl.trainer.metrics import METRICS

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


def _text(path) -> str:
    return path.read_text()


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_metrics_table_matches_the_registry():
    text = _text(DOCS / "observability.md")
    rows = re.findall(r"^\| `(kuberl_[a-z_]+)` \| (counter|gauge|histogram) \| (.+?) \|$", text, re.MULTILINE)
    learner_rows = {name: (kind, meaning) for name, kind, meaning in rows
                    if not name.startswith("kuberl_operator_")}
    assert learner_rows == {name: (kind, text) for name, (kind, text) in METRICS.items()}


def test_quick_start_is_exactly_two_commands_and_ci_runs_the_second():
    block = _text(README).split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./scripts/train-example", "./scripts/test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "./scripts/test" in ci
    for script in ("scripts/train-example", "scripts/test", "scripts/setup-venv"):
        assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    assert 'torch==2.13.0' in (REPO / "scripts" / "setup-venv").read_text()


def test_the_quick_start_is_written_once():
    """The README holds it; Getting started shows that section of the README (pymdownx.snippets), and no page
    writes the commands out again."""
    readme = _text(README)
    assert readme.count("--8<-- [start:quick-start]") == 1 and readme.count("--8<-- [end:quick-start]") == 1
    assert '--8<-- "README.md:quick-start"' in _text(DOCS / "getting-started.md")
    for page in sorted(DOCS.rglob("*.md")):
        for block in _code_blocks(_text(page), "bash"):
            assert not re.search(r"^\./scripts/train-example\b", block, re.MULTILINE), f"{page.name} repeats it"


def test_every_example_is_documented():
    docs = "\n".join(_text(page) for page in DOCS.rglob("*.md"))
    for path in sorted((REPO / "examples").glob("*.yaml")):
        assert f"examples/{path.name}" in docs, f"no page under docs/ mentions examples/{path.name}"


def _merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both_maps else value
    return out


def _as_job(block: str, example: dict) -> dict | None:
    """A YAML block as a whole job: a job itself, `spec:` to merge onto the example, or spec fields (an
    indented fragment included). None: not a job's (a Pod, an InferenceService, Helm values)."""
    import textwrap

    data = yaml.safe_load(textwrap.dedent(block))
    if not isinstance(data, dict):
        return None
    if data.get("kind") == "RLTrainingJob":
        return data
    if set(data) == {"spec"}:
        return _merged(example, data)
    spec_fields = {info.alias or name for name, info in RLTrainingJobSpec.model_fields.items()}
    if set(data) <= spec_fields:
        return _merged(example, {"spec": data})
    return None


def test_every_job_in_a_code_block_is_valid():
    """What a page shows as a job, or as part of one (merged onto the CartPole example), is a valid job, its
    pods within Pod Security "restricted" as `kuberl validate` checks by default."""
    example = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
    checked = []
    for page in PAGES:
        for block in _code_blocks(_text(page), "yaml"):
            job = _as_job(block, example)
            if job is not None:
                # raises, naming every problem, if invalid
                parse_job(job, source=f"{page.name} block", tenancy=Tenancy())
                checked.append(page.name)
    pages_with_jobs = {"job-file.md", "how-a-run-works.md", "algorithms.md", "pod-templates.md", "serving.md",
                       "custom-environments.md"}
    assert pages_with_jobs <= set(checked)


def test_every_test_benchmark_and_result_file_named_exists():
    """`tests/test_x.py::test_name` (and a following bare `::test_name`), bench scripts, result files and
    example jobs named on any page are there."""
    missing = []
    for page in PAGES:
        text = _text(page)
        module = None
        for match in re.finditer(r"(tests/[\w/]+\.py)?::(\w+)|tests/[\w/]+\.py", text):
            path = match.group(1) or (match.group(0) if match.group(0).startswith("tests/") else None)
            module = path or module
            if module is None or not (REPO / module).exists():
                missing.append(f"{page.name}: {match.group(0)}")
                continue
            if match.group(2) and f"def {match.group(2)}(" not in (REPO / module).read_text():
                missing.append(f"{page.name}: {module}::{match.group(2)}")
        for path in re.findall(r"\b(bench/\w+\.py|bench/results/[\w.-]+\.\w+|examples/[\w-]+\.yaml)\b", text):
            if not (REPO / path).exists():
                missing.append(f"{page.name}: {path}")
        for name in re.findall(r"`results/([\w.-]+\.(?:json|txt|md))`", text):
            if not (REPO / "bench" / "results" / name).exists():
                missing.append(f"{page.name}: bench/results/{name}")
    assert not missing, missing

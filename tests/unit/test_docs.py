"""The docs site: it builds with every warning an error (broken links and anchors included), every page is
in its nav, the README stays short, the job reference is the one the model generates, and the table of
where each spec field takes effect names every spec field."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

from conftest import REPO
from kuberl.api import reference
from kuberl.api.job import RLTrainingJobSpec

DOCS = REPO / "docs"


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (`!!python/name:`, the mermaid fence): read as their names."""


_MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def _nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(value) for value in nav.values()))
    return set()


def test_the_site_builds_strictly(tmp_path):
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "job" / "index.html").exists()


def test_every_page_is_in_the_nav():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_MkdocsLoader)
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert _nav_pages(config["nav"]) == pages


def test_the_readme_is_short_and_points_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 200
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", text))
    assert {"getting-started.md", "install.md", "reference/job.md", "testing.md"} <= linked
    assert all((DOCS / page).exists() for page in linked)


def test_the_committed_job_reference_is_generated_from_the_model():
    committed = (DOCS / "reference" / "job.md").read_text()
    assert committed == reference.render(), f"docs/reference/job.md is stale: run `{reference.COMMAND}`"


def _field_paths(schema: dict, path: str) -> list[str]:
    """Every field path of a CRD schema, down to (not into) the pod templates."""
    out = []
    for name, child in schema.get("properties", {}).items():
        here = f"{path}.{name}"
        out.append(here)
        if name != "template":
            out += _field_paths(child, here)
            out += _field_paths(child.get("items", {}), here + "[]")
    return out


def test_the_job_reference_lists_every_field_and_rule():
    from kuberl.api.crd import open_api_schema

    text = (DOCS / "reference" / "job.md").read_text()
    schema = open_api_schema()["properties"]
    paths = _field_paths(schema["spec"], "spec") + _field_paths(schema["status"], "status")
    assert len(paths) > 150
    assert [p for p in paths if f"| `{p}` |" not in text and f"[`{p}`](#" not in text] == []
    assert "spec.learner.template.spec" not in text  # the pod templates are summarised, not expanded
    messages = _rule_messages(open_api_schema())
    assert len(messages) > 10
    assert [m for m in messages if m not in text] == []


def _rule_messages(schema) -> list[str]:
    """The message of every CEL rule in the schema, pod templates included (they carry none)."""
    if isinstance(schema, list):
        return [m for item in schema for m in _rule_messages(item)]
    if not isinstance(schema, dict):
        return []
    own = [rule["message"] for rule in schema.get("x-kubernetes-validations", [])]
    below = [value for key, value in schema.items() if key != "x-kubernetes-validations"]
    return own + [m for value in below for m in _rule_messages(value)]


def test_the_spec_field_table_names_every_spec_field():
    """docs/where-things-are.md says where each spec field takes effect: every one, and learner.replicas."""
    text = (DOCS / "where-things-are.md").read_text().split("## Where each spec field takes effect", 1)[1]
    named = set()
    for row in re.findall(r"^\| (.+?) \| .+ \| .+ \|$", text, re.MULTILINE):
        named |= set(re.findall(r"`([\w.]+)`", row))
    fields = {info.alias or name for name, info in RLTrainingJobSpec.model_fields.items()}
    assert fields - named == set()
    assert "learner.replicas" in named


def test_the_code_the_spec_field_table_names_exists():
    """`builders.build_worker_pod`, `lifecycle._queued`, ...: the table follows the operator's code."""
    text = (DOCS / "where-things-are.md").read_text()
    missing = []
    named = set(re.findall(r"`(builders|lifecycle|kueue|startup)\.(\w+)(?![\w*-])", text))
    for module, name in sorted((module, name) for module, name in named if name != "py"):
        source = (REPO / "operator" / "kuberl" / "operator" / f"{module}.py").read_text()
        if not re.search(rf"^(def {name}\(|{name}\b.*=)", source, re.MULTILINE):
            missing.append(f"{module}.{name}")
    assert missing == []

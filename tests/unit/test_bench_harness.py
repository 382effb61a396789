"""The benchmarks' one harness (bench/common.py): every script takes `--output`, and every result file
under bench/results has the one shape and machine record a fresh run writes."""

from __future__ import annotations

import datetime
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

BENCH = REPO / "bench"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))  # peer_*.py run in the peers' virtualenvs and write no file
RESULT_FILES = sorted((BENCH / "results").glob("*.json"))
MACHINE_KEYS = {"cpus", "memory_gb", "platform", "python", "torch", "loadavg", "date", "git_commit"}


def shape_errors(record: dict) -> list[str]:
    """What keeps `record` from being a result file of the harness; [] when it is one."""
    errors = []
    keys = set(record)
    required = {"benchmark", "command", "machine", "results"}
    if not required <= keys <= required | {"summary"}:
        errors.append(f"top-level keys {sorted(keys)}")
    for key in ("benchmark", "command"):
        if not isinstance(record.get(key), str) or not record.get(key):
            errors.append(f"{key} is {record.get(key)!r}, not a non-empty string")
    if not isinstance(record.get("results"), dict):
        errors.append("results is not an object")
    if "summary" in record and not isinstance(record["summary"], dict):
        errors.append("summary is not an object")
    machine = record.get("machine")
    if not isinstance(machine, dict) or set(machine) != MACHINE_KEYS:
        found = sorted(machine) if isinstance(machine, dict) else machine
        return [*errors, f"machine keys {found!r}, not {sorted(MACHINE_KEYS)}"]
    expected = {"cpus": int, "memory_gb": (int, float), "platform": str, "python": str, "torch": str,
                "date": str, "git_commit": str}
    for key, kind in expected.items():
        if machine[key] is not None and not isinstance(machine[key], kind):
            errors.append(f"machine.{key} is {machine[key]!r}")
    loadavg = machine["loadavg"]
    if not isinstance(loadavg, dict) or set(loadavg) != {"before", "after"}:
        errors.append(f"machine.loadavg is {loadavg!r}, not {{'before': [1, 5, 15], 'after': [...]}}")
    else:
        for when, value in loadavg.items():
            if value is not None and not (isinstance(value, list) and len(value) == 3
                                          and all(isinstance(x, (int, float)) for x in value)):
                errors.append(f"machine.loadavg.{when} is {value!r}, not the 1, 5 and 15 minute averages")
    if machine["date"] is not None:
        try:
            datetime.datetime.strptime(machine["date"], "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            errors.append(f"machine.date {machine['date']!r} is not UTC ISO (2026-11-25T14:48:13Z)")
    return errors


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_takes_output(script: Path):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                            check=False, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--output" in result.stdout
    assert "--out " not in result.stdout


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_result_file_has_the_one_shape(path: Path):
    assert shape_errors(json.loads(path.read_text())) == []


def test_a_fresh_result_file_has_the_one_shape_with_everything_measured(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)

    def arguments(parser):
        parser.add_argument("--repeats", type=int, default=3)

    bench = common.Bench("Something measured.\n\nMore about it.", tmp_path / "default.json", arguments,
                         argv=["--repeats", "2", "--output", str(tmp_path / "x.json")])
    assert bench.args.repeats == 2
    path = bench.write({"rate": 1.5}, {"best": 1.5})
    record = json.loads(path.read_text())
    assert path == tmp_path / "x.json"
    assert shape_errors(record) == []
    assert record["benchmark"] == "Something measured"
    assert record["command"].endswith("--repeats 2 --output " + str(tmp_path / "x.json"))
    assert record["results"] == {"rate": 1.5} and record["summary"] == {"best": 1.5}
    machine = record["machine"]
    assert all(machine[key] is not None for key in ("cpus", "memory_gb", "platform", "python", "date"))
    assert len(machine["loadavg"]["before"]) == len(machine["loadavg"]["after"]) == 3
    assert bench.previous() == {"rate": 1.5}


def test_the_harness_imports_only_the_standard_library_at_the_top():
    """The peers' virtualenvs (no kuberl, no PyYAML) import bench/common.py too."""
    import ast

    tree = ast.parse((BENCH / "common.py").read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = {alias.name.split(".")[0] for node in top if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in top if isinstance(node, ast.ImportFrom) and node.module}
    assert names - {"__future__"} <= set(sys.stdlib_module_names)


def test_the_ci_benchmark_reads_the_phases_the_slowest_tests_and_the_workers_from_a_run():
    spec = importlib.util.spec_from_file_location("bench_ci", BENCH / "bench_ci.py")
    sys.path.insert(0, str(BENCH))  # bench_ci imports the harness as `common`, as when it runs
    try:
        bench_ci = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_ci)
    finally:
        sys.path.remove(str(BENCH))
    log = "\n".join([
        "created: 3/3 workers",
        "FAILED tests/integration/test_sweep_train.py::test_resume - assert 0 == 130",
        "============================= slowest 15 durations =============================",
        "410.50s call     tests/e2e/test_e2e_faults.py::test_ray_head_killed",
        "30.10s setup    tests/e2e/test_e2e_cluster.py::test_cartpole",
        "1 failed, 1257 passed, 2 skipped in 3723.09s (1:02:03)",
        "scripts/test: phase times: system packages: 20 s, venv: 44 s, images: 1126 s, tests: 3729 s; "
        "whole run: 5291 s (exit 1)",
    ])
    parsed = bench_ci.parse(log)
    assert parsed["phase_seconds"] == {"system packages": 20, "venv": 44, "images": 1126, "tests": 3729}
    assert (parsed["scripts_test_seconds"], parsed["exit_code"], parsed["test_workers"]) == (5291, 1, 3)
    assert parsed["pytest_summary"] == "1 failed, 1257 passed, 2 skipped"
    assert parsed["failed"] == ["tests/integration/test_sweep_train.py::test_resume"]
    # pytest -q prints no worker count: scripts/test's line says it; a log with neither has no figure.
    assert bench_ci.parse(log.replace("created: 3/3 workers", "scripts/test: test workers: 3"))["test_workers"] == 3
    assert bench_ci.parse(log.replace("created: 3/3 workers", ""))["test_workers"] is None
    assert parsed["slowest"] == [
        {"seconds": 410.5, "when": "call", "test": "tests/e2e/test_e2e_faults.py::test_ray_head_killed"},
        {"seconds": 30.1, "when": "setup", "test": "tests/e2e/test_e2e_cluster.py::test_cartpole"}]
    # The budget docs/testing.md states: a warm run's tests phase, a cold run's whole command.
    assert bench_ci.BUDGET_SECONDS == {"warm": {"tests": 35 * 60}, "cold": {"whole run": 60 * 60}}
    assert "35 minutes" in (REPO / "docs" / "testing.md").read_text()

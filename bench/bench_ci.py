"""CI's clock: `.ci/run` on a fresh clone of this repository, as CI runs it, with the time of each
phase that scripts/test prints (system packages, venv, images, tests) and of the whole command.

    .venv/bin/python bench/bench_ci.py                  # warm: this machine's caches as they are
    .venv/bin/python bench/bench_ci.py --cold           # first takes away what a new machine lacks and this
                                                        # repository made: its whole cache (the control
                                                        # plane, Kueue and Go builds, the wheels), pip's
                                                        # cache, the images (base included)
    .venv/bin/python bench/bench_ci.py --log ci.log --label warm   # record a run already made
                                                        # (`bash .ci/run > ci.log 2>&1` in a fresh clone)

Each result holds the phase times, the 15 slowest tests (pytest's --durations), each test module's summed time
(from a JUnit XML file the run writes beside the clone: what a layer's one-bed-at-a-time chain costs), the number
of test workers,
and whether the run kept the budget docs/testing.md states: the tests phase of a warm run at most 35
minutes, a whole cold run at most 60. A label containing "cold" is held to the cold budget.

Where the CPU went: each result has the machine's busy CPU seconds over the run (/proc/stat) against
what two cores could give in that time; and, where the kernel's process accounting can be turned on
(root, Debian's `acct` package: `accton`, `sa`), the CPU seconds of every process that ended during the
run, summed by command name, containers' processes included (`--cpu-by-command`).

Debian's packages are not removed by --cold (apt-get remove would touch the machine beyond this
project): time `apt-get install` of scripts/test's list on a new machine for that phase.
Results are merged into bench/results/ci.json by label (warm, cold).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench, load_average

PHASES = re.compile(r"scripts/test: phase times: (.*); whole run: (\d+) s \(exit (\d+)\)")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", re.MULTILINE)
#: pytest's --durations lines: "123.45s call     tests/e2e/test_x.py::test_y"
SLOWEST = re.compile(r"^([\d.]+)s (call|setup|teardown) +(\S+)$", re.MULTILINE)
#: xdist's own line (without -q), or scripts/test's (pytest -q prints no worker count).
WORKERS = re.compile(r"^(?:created: (\d+)/\d+ workers|scripts/test: test workers: (\d+))", re.MULTILINE)
#: The budget docs/testing.md states: the tests phase of a warm run, and a whole cold run (a new machine).
BUDGET_SECONDS = {"warm": {"tests": 35 * 60}, "cold": {"whole run": 60 * 60}}


def parse(text: str) -> dict:
    m = PHASES.search(text)
    if not m:
        raise SystemExit("no `scripts/test: phase times:` line in the log: did scripts/test run to its end?")
    phases = {name.strip(): int(sec) for name, sec in re.findall(r"([^,:]+): (\d+) s", m[1])}
    summary = SUMMARY.findall(text)
    workers = WORKERS.findall(text)
    return {"phase_seconds": phases, "scripts_test_seconds": int(m[2]), "exit_code": int(m[3]),
            "pytest_summary": summary[-1] if summary else None,
            "test_workers": int(next(n for n in workers[-1] if n)) if workers else None,
            "slowest": [{"seconds": float(sec), "when": when, "test": test}
                        for sec, when, test in SLOWEST.findall(text)][:15],
            "failed": re.findall(r"^FAILED (\S+)", text, re.MULTILINE),
            "disk_line": next((x for x in text.splitlines() if x.startswith("scripts/test: disk:")), None)}


def module_seconds(junit: Path) -> dict[str, float]:
    """Each test module's summed time (setup, call and teardown), the longest first."""
    import xml.etree.ElementTree as ElementTree

    sums: dict[str, float] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        # classname is the module's dotted path, and a test class's name after it where there is one.
        parts = case.get("classname", "?").split(".")
        last = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        module = "/".join(parts[:last + 1]) + ".py"
        sums[module] = sums.get(module, 0.0) + float(case.get("time") or 0.0)
    return {module: round(sec, 1) for module, sec in sorted(sums.items(), key=lambda kv: -kv[1])}


def cache_dir() -> Path:
    return Path(os.environ.get("KUBERL_CACHE",
                               Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kuberl"))


def make_cold() -> list[str]:
    """Take away what a new machine would not have and this project's scripts make or fetch: the whole
    KubeRL cache (the control plane and Kueue builds, Go's module and build caches, the wheels, helm,
    checkov, mypy's cache) is moved aside, to be put back if the run fails; pip's cache and every image go."""
    removed = []
    cache = cache_dir()
    if cache.exists():
        aside = cache.with_name(cache.name + ".before-cold")
        if aside.exists():
            raise SystemExit(f"{aside} is there from a cold run before: put it back or remove it first")
        cache.rename(aside)
        removed.append(f"{cache} (moved aside, to {aside})")
    pip_cache = Path.home() / ".cache" / "pip"
    if pip_cache.exists():
        shutil.rmtree(pip_cache)
        removed.append(str(pip_cache))
    if shutil.which("podman"):  # a new machine has none yet: scripts/test installs it
        subprocess.run(["podman", "rmi", "--all", "--force"], capture_output=True, check=False)
        subprocess.run(["podman", "image", "prune", "--all", "--force"], capture_output=True, check=False)
        removed.append("podman images (all)")
    return removed


def after_cold(passed: bool) -> None:
    """A cold run that passed leaves the caches it built; one that failed gets the ones from before back
    (its own kept beside them, for a look)."""
    cache = cache_dir()
    aside = cache.with_name(cache.name + ".before-cold")
    if not aside.exists():
        return
    if passed:
        shutil.rmtree(aside)
        return
    if cache.exists():
        cache.rename(cache.with_name(cache.name + ".cold-failed"))
    aside.rename(cache)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--log", type=Path, help="parse this .ci/run output instead of running it")
    parser.add_argument("--label", help="the result's label (default: cold or warm)")
    parser.add_argument("--cpu-by-command", action="store_true",
                        help="record CPU seconds by command name with the kernel's process accounting (root, acct)")


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (every state of /proc/stat's cpu line but idle
    and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_by_command(pacct: Path, top: int = 25) -> list[dict]:
    """The `top` commands by CPU, from a process accounting file. `sa -a --separate-times` lines: processes,
    real minutes ("re"), user and system CPU minutes ("u", "s"), ..., the command (-a: none lumped)."""
    out = subprocess.run(["sa", "-a", "--separate-times", str(pacct)], capture_output=True, text=True,
                         check=False).stdout
    rows = []
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        numbers = [p for p in parts if p.endswith(("re", "u", "s", "cp"))]
        cpu = sum(float(p[:-1]) for p in numbers if p[-1:] in ("u", "s") and p[:-1].replace(".", "").isdigit())
        rows.append({"command": parts[-1], "processes": int(parts[0]), "cpu_minutes": round(cpu, 2)})
    return sorted(rows, key=lambda r: -r["cpu_minutes"])[:top]


def main() -> None:
    bench = Bench(__doc__, RESULTS / "ci.json", arguments)
    args = bench.args
    label = args.label or ("cold" if args.cold else "warm")
    entry: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                   "load_average_before": load_average()}
    if args.log:
        text = args.log.read_text()
        entry["source"] = f"log {args.log.name}"
        real = re.search(r"real\s+(\d+)m([\d.]+)s", text)
        entry["whole_command_seconds"] = round(int(real[1]) * 60 + float(real[2]), 1) if real else None
    else:
        if args.cold:
            entry["removed_first"] = make_cold()
        used_before = shutil.disk_usage("/").used
        with tempfile.TemporaryDirectory(prefix="kuberl-ci-") as tmp:
            clone = Path(tmp) / "main"
            subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
            shared = Path(tmp) / "shared"
            shared.symlink_to(REPO.parent / "shared")
            junit = Path(tmp) / "junit.xml"
            pacct = Path(tmp) / "pacct"
            if args.cpu_by_command:
                pacct.touch()
                subprocess.run(["accton", str(pacct)], check=True)
            busy_before = busy_cpu_seconds()
            started = time.monotonic()
            # PYTEST_ADDOPTS: the run's own command line (and its printed output) stay as CI's.
            proc = subprocess.run(["bash", ".ci/run"], cwd=clone, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, env={**os.environ, "CI": "true", "PYTEST_ADDOPTS": f"--junitxml={junit}"},
                                  check=False)
            entry["whole_command_seconds"] = round(time.monotonic() - started, 1)
            entry["busy_cpu_seconds"] = round(busy_cpu_seconds() - busy_before, 1)
            entry["cpu_seconds_two_cores_give"] = round(2 * entry["whole_command_seconds"], 1)
            if args.cpu_by_command:
                subprocess.run(["accton", "off"], check=True)
                entry["cpu_by_command"] = cpu_by_command(pacct)
            text = proc.stdout + proc.stderr
            # The clone's commit: the repository's own may have moved on while the run went.
            commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True).strip()
            entry["source"] = f"bash .ci/run in a fresh clone of {commit}"
            # The whole output, for the failures' tracebacks (the result keeps only their names).
            log = Path(tempfile.gettempdir()) / f"kuberl-ci-{label}.log"
            log.write_text(text)
            print(f"the run's output: {log}", file=sys.stderr)
            if junit.exists():
                entry["module_seconds"] = module_seconds(junit)
            # what the run left on the disk (its clone's venv included, removed just after)
            entry["disk_gb_added"] = round((shutil.disk_usage("/").used - used_before) / 1e9, 1)
        if args.cold:
            after_cold(proc.returncode == 0)
    entry.update(parse(text))
    entry["load_average_after"] = load_average()
    kind = "cold" if "cold" in label else "warm"
    seconds = {**entry["phase_seconds"], "whole run": entry["scripts_test_seconds"]}
    entry["budget"] = {what: {"limit_seconds": limit, "seconds": seconds.get(what),
                              "within": seconds.get(what) is not None and seconds[what] <= limit}
                       for what, limit in BUDGET_SECONDS[kind].items()}
    results = bench.previous()
    results.setdefault("runs", {})[label] = entry
    bench.write(results)
    print(entry)


if __name__ == "__main__":
    main()

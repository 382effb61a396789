"""Time scripts/build-control-plane cold, warm and re-link only, and record what it built.

    .venv/bin/python bench/bench_control_plane_build.py                 # in the default cache, which
                                                                        # must not hold a build yet
    .venv/bin/python bench/bench_control_plane_build.py --cache /tmp/k  # in another KUBERL_CACHE

Three runs of the script, one after another, in one KUBERL_CACHE:
  cold    nothing there: no Go module cache, no Go build cache, no build. Every module comes from the
          proxy, every package is compiled, the kubectl/helm wheel comes from PyPI. The cache must have
          neither go/ nor control-plane/ (the script refuses to time a "cold" run that is not).
  warm    the same command again: it finds the finished build and does nothing.
  relink  bin/ deleted, the Go caches kept (what a new release of the script's own steps costs, or a
          tree whose bin/ was lost): the wrapper is regenerated and tidied, compiles hit the cache, the
          binaries are linked, the wheel is fetched again.

Each run records wall seconds, user and system CPU seconds, the peak RSS of its largest process (GNU
time's %M), the load average before and after, and the seconds between the script's own progress
lines (its phases). Then the size of each binary, of the Go caches and of the build directory, and
`--check`'s report of the versions. The build is left in the cache for the tests and later use.
Each run adds one build to bench/results/control_plane_build.json (--output); the runs kept there are
what docs/control-plane.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench, load_average, utc_now

SCRIPT = REPO / "scripts" / "build-control-plane"
GNU_TIME = "/usr/bin/time"


def pins() -> dict[str, str]:
    text = SCRIPT.read_text()
    names = ("K8S_VERSION", "ETCD_VERSION", "KUBECTL_WHEEL", "KUBECTL_VERSION", "HELM_VERSION")
    return {n.lower(): re.search(rf"^{n}=(\S+)$", text, re.MULTILINE)[1] for n in names}


def du_bytes(path: Path) -> int | None:
    if not path.exists():
        return None
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def run_script(label: str, env: dict[str, str], log_dir: Path) -> dict:
    """One run of the script, timed; its progress lines stamped with the seconds since it started."""
    stats = Path(tempfile.mkstemp(prefix="cp-time-")[1])
    command = [str(SCRIPT)]
    if Path(GNU_TIME).exists():
        command = [GNU_TIME, "-f", "%e %U %S %M", "-o", str(stats), *command]
    load_before = load_average()
    started = time.monotonic()
    stamped, lines = [], []
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("build-control-plane:"):
                stamped.append([round(time.monotonic() - started, 1), line.rstrip()])
    wall = round(time.monotonic() - started, 1)
    log = log_dir / f"control_plane_build.{label}.log"
    log.write_text("".join(lines))
    result = {"exit_code": proc.returncode, "wall_seconds": wall, "load_average_before": load_before,
              "load_average_after": load_average(), "progress": stamped, "log": str(log),
              "last_line": lines[-1].rstrip() if lines else ""}
    fields = stats.read_text().split() if stats.stat().st_size else []
    stats.unlink()
    if len(fields) >= 4:
        result.update({"user_cpu_seconds": float(fields[-3]), "system_cpu_seconds": float(fields[-2]),
                       "peak_rss_mb_largest_process": round(int(fields[-1]) / 1024, 1)})
    if proc.returncode:
        raise SystemExit(f"{label}: {SCRIPT} failed (exit {proc.returncode}), log {log}:\n{''.join(lines[-40:])}")
    return result


def phases(progress: list) -> dict[str, float]:
    """Seconds from each progress line to the next (the last one to the end of the run)."""
    keys = [("etcd", "go.etcd.io/etcd/server/v3@"), ("kube_download", "k8s.io/kubernetes@"),
            ("kube_tidy", "wrapper module"), ("kube_compile_and_link", "go build kube-"),
            ("kubectl_helm_wheel", "kubectl and helm:"), ("version_check", "versions:")]
    marks = []
    for key, needle in keys:
        hit = next((t for t, line in progress if needle in line), None)
        if hit is not None:
            marks.append((key, hit))
    ends = [t for _, t in marks[1:]] + [progress[-1][0] if progress else 0.0]
    return {key: round(end - start, 1) for (key, start), end in zip(marks, ends, strict=True)}


def arguments(parser: argparse.ArgumentParser) -> None:
    default_cache = Path(os.environ.get("KUBERL_CACHE") or
                         Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kuberl")
    parser.add_argument("--cache", type=Path, default=default_cache,
                        help="the KUBERL_CACHE to build in (default %(default)s); must hold no go/ nor control-plane/")
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where each run's whole output is kept (default %(default)s)")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "control_plane_build.json", arguments)
    args = bench.args
    cache = args.cache.resolve()
    stale = [p for p in (cache / "go", cache / "control-plane") if p.exists()]
    if stale:
        raise SystemExit(f"not a cold cache: {', '.join(map(str, stale))} exist(s); remove them or pass another "
                         "--cache")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KUBERL_CACHE": str(cache)}
    v = pins()
    build = cache / "control-plane" / f"k8s-{v['k8s_version']}-etcd-{v['etcd_version']}"
    bin_dir = build / "bin"
    started = utc_now()

    runs = {}
    runs["cold"] = run_script("cold", env, args.log_dir)
    sizes = {p.name: p.stat().st_size for p in sorted(bin_dir.iterdir()) if p.is_file()}
    disk = {"gomodcache": du_bytes(cache / "go" / "mod"), "gocache": du_bytes(cache / "go" / "build"),
            "build_dir": du_bytes(build), "bin": du_bytes(bin_dir)}
    kk_zip = cache / "go" / "mod" / "cache" / "download" / "k8s.io" / "kubernetes" / "@v" / f"{v['k8s_version']}.zip"
    disk["k8s_module_zip"] = kk_zip.stat().st_size if kk_zip.exists() else None
    runs["warm"] = run_script("warm", env, args.log_dir)
    shutil.rmtree(bin_dir)
    runs["relink"] = run_script("relink", env, args.log_dir)
    for run in runs.values():
        run["phase_seconds"] = phases(run["progress"])
    check = subprocess.run([str(SCRIPT), "--check"], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    go_version = subprocess.run(["go", "version"], capture_output=True, text=True, check=False).stdout.strip()

    build_record = {
        "date": started,
        "build_command": f"KUBERL_CACHE={cache} ./scripts/build-control-plane",
        "go": go_version,
        "pins": v,
        "seconds": {label: run["wall_seconds"] for label, run in runs.items()},
        "runs": runs,
        "binary_bytes": sizes,
        "binary_mb": {name: round(size / 1e6, 1) for name, size in sizes.items()},
        "disk_bytes": disk,
        "disk_mb": {k: round(b / 1e6, 1) for k, b in disk.items() if b is not None},
        "check": {"exit_code": check.returncode, "report": check.stdout.splitlines()},
    }
    # Each run of this script adds one build: on a shared machine one cold figure says little alone.
    results = bench.previous()
    results["builds"] = [*results.get("builds", []), build_record]
    results["notes"] = NOTES
    colds = [b["seconds"]["cold"] for b in results["builds"]]
    bench.write(results, {"cold_seconds": colds, "latest": build_record["seconds"],
                          "binary_mb": build_record["binary_mb"]})
    print(json.dumps({k: build_record[k] for k in ("seconds", "binary_mb", "disk_mb")}, indent=1))


NOTES = [
    "MB = 10^6 bytes; binaries are stripped (-s -w), CGO_ENABLED=0, -trimpath",
    "peak RSS: GNU time's %M, the largest single process of a run (the compiler or linker), not a sum",
    "2 cores shared with other agents' jobs: read each run's times with its load averages",
    "relink: bin/ removed, GOMODCACHE and GOCACHE kept; it still fetches the kubectl/helm wheel from PyPI",
    "phase_seconds: from one of the script's progress lines to the next",
]


if __name__ == "__main__":
    main()

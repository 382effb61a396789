"""Every run splits its wall clock into phases (start-up, collection, learning, evaluation, report,
shutdown) that sum to the whole; summary.json and the summary table carry the split."""

from __future__ import annotations

import time

from kuberl.trainer.report import PHASES, Timeline, _time_rows


def test_phases_sum_to_the_total():
    origin = time.perf_counter() - 0.05  # as if the process had started 50 ms ago
    timeline = Timeline(origin)
    time.sleep(0.01)
    timeline.mark("startup", ray=0.004)
    time.sleep(0.02)
    timeline.mark_split("collection", 0.005, "learning")
    timeline.mark("evaluation")
    timeline.mark("report")
    timeline.mark("shutdown")
    split = timeline.as_dict()
    assert set(PHASES) <= set(split)
    assert split["startup"] >= 0.05
    assert abs(split["collection"] - 0.005) < 1e-3 and split["learning"] > 0.01
    assert abs(sum(split[p] for p in PHASES) - split["total"]) < 0.01
    assert split["startup_detail"]["ray"] == 0.004 and split["startup_detail"]["before_train"] >= 0.05


def test_split_cannot_give_more_than_the_span():
    timeline = Timeline()
    timeline.mark_split("collection", 99.0, "learning")
    split = timeline.as_dict()
    assert split["learning"] == 0.0 and split["collection"] <= split["total"] + 1e-3


def test_summary_table_rows():
    timeline = Timeline()
    timeline.mark("startup", ray=0.0, learner_build=0.0)
    rows = dict(_time_rows(timeline.as_dict()))
    assert "whole run" in rows and "  shutdown" in rows
    assert _time_rows(None) == []


def test_kuberl_train_writes_the_split_from_process_start(tmp_path, job_dict):
    """A whole `kuberl train` process: summary.json's phases cover it from process start to the end;
    it exits 0, and no process of its embedded Ray outlives it (it leaves by os._exit, and Ray's
    processes go after it: stopping them first raced its exit and sometimes turned 0 into 1)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    import yaml

    job_dict["spec"]["stopping"] = {"maxEnvSteps": 3_000}
    job_dict["spec"]["evaluation"] = {"episodes": 4}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict))
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    # Its own Ray directory (short: Ray's socket paths must fit 107 bytes): every process of that Ray
    # holds a log file open in it, which is how the ones left behind are found.
    ray_dir = tempfile.mkdtemp(prefix="krl-", dir="/tmp")
    try:
        proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(path), "--workers", "1",
                               "--run-dir", str(run_dir), "--no-progress", "--metrics-port", "0"],
                              capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ, RAY_TMPDIR=ray_dir))
        wall = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr[-3000:]
        deadline = time.monotonic() + 30  # a generous bound on the clean-up, not a timing assumption
        while _processes_using(ray_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_using(ray_dir) == []
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    split = json.loads((run_dir / "summary.json").read_text())["time_split"]
    assert abs(sum(split[p] for p in PHASES) - split["total"]) < 0.05
    assert 0 < split["total"] <= wall + 0.5  # counted from process start, never beyond its end
    assert split["startup_detail"]["before_train"] > 0 and split["collection"] > 0 and split["learning"] > 0
    assert "whole run" in proc.stdout and "start-up" in proc.stdout
    for name in ("evaluation.json", "learning_curve.svg", "metrics.csv"):
        assert (run_dir / name).stat().st_size > 0
    assert list((run_dir / "checkpoints").iterdir())


def _processes_using(directory: str) -> list[str]:
    """Command lines of live processes holding a file open under `directory` (Linux /proc)."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(directory + "/") for fd in fds):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")[:120])
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_learning_curve_svg_is_well_formed_and_draws_every_point():
    import xml.etree.ElementTree as ET

    from kuberl.trainer.report import learning_curve_svg

    points = [(1024.0 * i, 20.0 + 5.0 * i) for i in range(1, 101)]  # crosses 475 at i = 91
    svg = learning_curve_svg(points, 475.0, title="cartpole <ppo> & co", xlabel="environment steps",
                             ylabel="mean return")
    root = ET.fromstring(svg)  # parses: the title's < and & are escaped
    ns = {"s": "http://www.w3.org/2000/svg"}
    line = root.find("s:polyline", ns)
    coords = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert len(coords) == len(points)
    xs, ys = [c[0] for c in coords], [c[1] for c in coords]
    assert xs == sorted(xs) and ys == sorted(ys, reverse=True)  # steps rightwards, rising return upwards
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "cartpole <ppo> & co" in texts and "target 475" in texts and "100k" in texts
    target_y = [float(e.get("y1")) for e in root.findall("s:line", ns) if e.get("stroke") == "#d62728"]
    assert len(target_y) == 1 and min(ys) < target_y[0] < max(ys)  # the curve crosses the target line
    assert ET.fromstring(learning_curve_svg([], None, "t", "x", "y")).find("s:polyline", ns) is None

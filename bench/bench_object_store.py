"""What keeping checkpoints in object storage costs a run: `kuberl train examples/cartpole-ppo.yaml` with
checkpoints on disk only, and with spec.checkpointing.s3 as well (a real S3-compatible store, SeaweedFS
built by scripts/build-seaweedfs, on loopback), runs alternating; the training clock (summary.json's
wall_clock), the whole command, each checkpoint's upload (the learner's log line: object and manifest,
prune included) and its size; a second `kuberl train` on the same path with an empty run directory (a new
pod's disk), which resumes from the store: its whole command and the learner's build, the download in it
(the example stops at its target return, so the resumed run, its target met already, ends at once). Then
the DQN example (its checkpoint carries the replay buffer) the same way, for a checkpoint of megabytes.

    .venv/bin/python bench/bench_object_store.py [--runs 5] [--dqn-runs 3]   # bench/results/object_store.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import EXAMPLES, REPO, RESULTS, Bench, stats

sys.path.insert(0, str(REPO / "tests"))

UPLOADED = re.compile(r"checkpoint s3://\S+ in ([0-9.]+) s \(([0-9.]+) kB\)")


def train_once(job: Path, run_dir: Path, env: dict[str, str], *extra: str) -> dict[str, float]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(job), "--run-dir", str(run_dir),
                           "--no-progress", "--metrics-port", "0", *extra], env=env, check=True, capture_output=True,
                          text=True, timeout=900)
    wall = time.perf_counter() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    uploads = [(float(s), float(kb)) for s, kb in UPLOADED.findall(done.stderr)]
    startup = summary.get("time_split", {}).get("startup_detail", {})
    return {"command": wall, "training_clock": summary["wall_clock"], "env_steps": summary["env_steps"],
            "checkpoints_uploaded": len(uploads), "upload_seconds": [s for s, _ in uploads],
            "checkpoint_kb": [kb for _, kb in uploads], "learner_build": startup.get("learner_build"),
            "resumed": "resumed from s3://" in done.stderr}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dqn-runs", type=int, default=3)


def compare(store, tmp: Path, stem: str, runs: int, continued: bool) -> dict:
    """`runs` alternating runs of examples/<stem>.yaml on disk only and with the store as well."""
    import yaml

    env = {**os.environ, **store.credentials_env(), "RAY_USAGE_STATS_ENABLED": "0"}
    base = yaml.safe_load((EXAMPLES / f"{stem}.yaml").read_text())
    seen: dict[str, list[dict]] = {"disk": [], "disk_and_s3": [], **({"continued_from_s3": []} if continued else {})}
    for i in range(runs):
        stored = json.loads(json.dumps(base))
        stored.setdefault("spec", {}).setdefault("checkpointing", {})["s3"] = {
            "uri": store.uri(f"bench-{stem}-{i}"), "endpoint": store.endpoint}
        job = tmp / f"{stem}-stored-{i}.yaml"
        job.write_text(yaml.safe_dump(stored))
        seen["disk"].append(train_once(EXAMPLES / f"{stem}.yaml", tmp / f"{stem}-disk-{i}", env))
        seen["disk_and_s3"].append(train_once(job, tmp / f"{stem}-s3-{i}", env))
        if continued:
            more = seen["disk_and_s3"][-1]["env_steps"] + 4096
            seen["continued_from_s3"].append(train_once(job, tmp / f"{stem}-again-{i}", env,
                                                        "--max-env-steps", str(more)))
        for name in seen:
            print(stem, name, seen[name][-1], flush=True)
    uploads = [s for r in seen["disk_and_s3"] for s in r["upload_seconds"]]
    out: dict = {
        "runs": {name: {key: stats([r[key] for r in rs if r[key] is not None])
                        for key in ("command", "training_clock", "env_steps", "checkpoints_uploaded", "learner_build")}
                 for name, rs in seen.items()},
        "upload_seconds_per_checkpoint": stats(uploads),
        "checkpoint_kb": stats([kb for r in seen["disk_and_s3"] for kb in r["checkpoint_kb"]]),
        "upload_share_of_training_clock": round(
            sum(uploads) / sum(r["training_clock"] for r in seen["disk_and_s3"]), 4),
    }
    if continued:
        out["every_continued_run_resumed_from_the_store"] = all(r["resumed"] for r in seen["continued_from_s3"])
    disk, s3 = out["runs"]["disk"], out["runs"]["disk_and_s3"]
    out["median_ratio_s3_over_disk"] = {key: round(s3[key]["median"] / disk[key]["median"], 3)
                                        for key in ("command", "training_clock")}
    return out


def main() -> None:
    from s3_store import SeaweedFS

    bench = Bench(__doc__, RESULTS / "object_store.json", arguments)
    args = bench.args
    with tempfile.TemporaryDirectory() as tmp, SeaweedFS(Path(tmp) / "store") as store:
        result = {"kuberl_train_cartpole_ppo": compare(store, Path(tmp), "cartpole-ppo", args.runs, True),
                  "kuberl_train_cartpole_dqn": compare(store, Path(tmp), "cartpole-dqn", args.dqn_runs, False)}
    print(json.dumps(result, indent=1))
    bench.write(result)


if __name__ == "__main__":
    main()

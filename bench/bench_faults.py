"""The fault matrix on real containers, as a table: fault, recovered, seconds to recover, env steps lost,
orphans (bench/results/faults.json).

It runs tests/test_e2e_faults.py (the same code as CI: every fault on a job mid-training on the
one-node bed of tests/cluster_bed.py), which writes one row per fault when KUBERL_FAULTS_RESULTS
names a file. A fault whose test fails has no row; the test's output says why.

    .venv/bin/python bench/bench_faults.py          # -> bench/results/faults.json, and the table
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "faults.json"


def main() -> int:
    started = time.monotonic()
    env = {**os.environ, "KUBERL_FAULTS_RESULTS": str(OUT)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(REPO / "tests" / "test_e2e_faults.py")], cwd=REPO, env=env, check=False)
    data = json.loads(OUT.read_text())
    data["module_seconds"] = round(time.monotonic() - started, 1)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"\n{'fault':<78} {'recovered':>9} {'s to recover':>12} {'steps lost':>10} {'orphans':>7}")
    for row in data["faults"]:
        print(f"{row['fault']:<78} {'yes' if row['recovered'] else 'NO':>9} {row['seconds_to_recover']:>12} "
              f"{row['env_steps_lost']:>10} {row['orphans']:>7}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())

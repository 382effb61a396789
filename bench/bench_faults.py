"""The fault matrix on the real node, as a table: fault, recovered, seconds to recover, env steps lost,
orphans (bench/results/faults.json).

It runs tests/e2e/test_e2e_faults.py (the same code as CI: every fault on a job mid-training on the
one-node bed of tests/bed/cluster_bed.py, its node a real kubelet with containerd), which writes one row per fault when KUBERL_FAULTS_RESULTS
names a file. A fault whose test fails has no row; the test's output says why.

    .venv/bin/python bench/bench_faults.py          # -> bench/results/faults.json, and the table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, RESULTS, Bench, Stopwatch


def main() -> int:
    bench = Bench(__doc__, RESULTS / "faults.json")
    clock = Stopwatch()
    with tempfile.TemporaryDirectory(prefix="kuberl-faults-") as tmp:
        rows = Path(tmp) / "faults.json"
        env = {**os.environ, "KUBERL_FAULTS_RESULTS": str(rows)}
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 str(REPO / "tests" / "e2e" / "test_e2e_faults.py")], cwd=REPO, env=env, check=False)
        if not rows.exists():
            raise SystemExit(f"tests/e2e/test_e2e_faults.py wrote no rows (pytest exit {result.returncode})")
        data = json.loads(rows.read_text())
    bench.write({"job": data["job"], "faults": data["faults"], "module_seconds": clock.seconds(1)})
    print(f"\n{'fault':<78} {'recovered':>9} {'s to recover':>12} {'steps lost':>10} {'orphans':>7}")
    for row in data["faults"]:
        print(f"{row['fault']:<78} {'yes' if row['recovered'] else 'NO':>9} {row['seconds_to_recover']:>12} "
              f"{row['env_steps_lost']:>10} {row['orphans']:>7}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())

"""The fault matrix on real containers, as a table: fault, recovered, seconds to recover, env steps lost,
orphans (bench/results/faults.json).

It runs tests/test_e2e_faults.py (the same code as CI: every fault on a job mid-training on the
one-node bed of tests/bed/cluster_bed.py), which writes one row per fault when KUBERL_FAULTS_RESULTS
names a file. A fault whose test fails has no row; the test's output says why.

    .venv/bin/python bench/bench_faults.py          # -> bench/results/faults.json, and the table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, RESULTS, write_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=RESULTS / "faults.json")
    out = parser.parse_args().output.resolve()
    started = time.monotonic()
    env = {**os.environ, "KUBERL_FAULTS_RESULTS": str(out)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(REPO / "tests" / "test_e2e_faults.py")], cwd=REPO, env=env, check=False)
    data = json.loads(out.read_text())
    data["module_seconds"] = round(time.monotonic() - started, 1)
    write_json(out, data)
    print(f"\n{'fault':<78} {'recovered':>9} {'s to recover':>12} {'steps lost':>10} {'orphans':>7}")
    for row in data["faults"]:
        print(f"{row['fault']:<78} {'yes' if row['recovered'] else 'NO':>9} {row['seconds_to_recover']:>12} "
              f"{row['env_steps_lost']:>10} {row['orphans']:>7}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())

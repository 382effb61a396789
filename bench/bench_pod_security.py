"""Our Pod Security check and the chart's ValidatingAdmissionPolicy against the API server's own admission,
over a larger generated corpus than CI's (bench/results/pod_security.json).

It runs tests/integration/test_pod_security_admission.py (the same code as CI, on the real control plane)
with KUBERL_PSA_CORPUS templates (default 2,000; CI runs 240) and records, for each comparison, the corpus
size, what was compared, the disagreements (0 is the bar), and how often each control was drawn and refused
by the server alone.

    .venv/bin/python bench/bench_pod_security.py [--templates N]
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
    bench = Bench(__doc__, RESULTS / "pod_security.json",
                  lambda parser: parser.add_argument("--templates", type=int, default=2000))
    args = bench.args
    clock = Stopwatch()
    with tempfile.TemporaryDirectory(prefix="kuberl-psa-") as tmp:
        out = Path(tmp) / "psa.json"
        env = {**os.environ, "KUBERL_PSA_RESULTS": str(out), "KUBERL_PSA_CORPUS": str(args.templates)}
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                 str(REPO / "tests" / "integration" / "test_pod_security_admission.py")],
                                cwd=REPO, env=env, check=False)
        if not out.exists():
            raise SystemExit(f"the differential test wrote no results (pytest exit {result.returncode})")
        data = json.loads(out.read_text())
    summary = {what: {k: found[k] for k in ("templates", "seed", "tally", "disagreements", "deliberately_stricter",
                                             "refused_by_the_server_alone", "reached")}
               for what, found in data.items()}
    bench.write({"comparisons": summary, "pytest_exit": result.returncode, "module_seconds": clock.seconds(1)})
    for what, found in summary.items():
        print(f"{what}: {found['templates']} templates, {found['tally']}, disagreements {found['disagreements']}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())

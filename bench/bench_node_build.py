"""Time scripts/build-node cold and warm (bench/results/node_build.json).

    .venv/bin/python bench/bench_node_build.py

cold: an empty KUBERL_CACHE (a temporary one): every module from the proxy, every package compiled,
containerd, CoreDNS, kube-router and the pause image built; warm: the same command again, which finds the
build and does nothing. Records wall seconds, the script's own per-part seconds (its `build-node: PART: N s`
lines), the binaries' sizes and the load average around each run. The temporary cache is removed after.
The node's kubelet and kube-proxy are the control plane's (bench/bench_control_plane_build.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, Bench, load_average

SCRIPT = REPO / "scripts" / "build-node"


def run(cache: Path) -> dict:
    before = load_average()
    t0 = time.monotonic()
    done = subprocess.run([str(SCRIPT)], cwd=REPO, env={**os.environ, "KUBERL_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=3600, check=True)
    seconds = time.monotonic() - t0
    parts = {m[1]: int(m[2]) for m in re.finditer(r"^build-node: ([\w-]+): (\d+) s$", done.stderr, re.MULTILINE)}
    return {"wall_seconds": round(seconds, 1), "part_seconds": parts, "load_before": before,
            "load_after": load_average(), "bin": done.stdout.strip().splitlines()[-1]}


def main() -> None:
    bench = Bench(__doc__, RESULTS / "node_build.json")
    cache = Path(tempfile.mkdtemp(prefix="kuberl-node-build-", dir="/var/tmp"))
    try:
        cold = run(cache)
        warm = run(cache)
        sizes = {p.name: round(p.stat().st_size / 1e6, 1) for p in sorted(Path(cold["bin"]).iterdir())
                 if p.is_file() and not p.name.startswith(".")}
        go_mb = round(sum(f.stat().st_size for f in (cache / "go").rglob("*") if f.is_file()) / 1e6, 1)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result = {"command": ".venv/bin/python bench/bench_node_build.py", "cold": cold, "warm": warm,
              "binary_mb": sizes, "go_caches_mb": go_mb,
              "notes": ["cold: an empty KUBERL_CACHE, so also an empty Go module and build cache (its own: "
                        "go_caches_mb); ./scripts/test builds in the machine's shared cache, beside the control "
                        "plane's modules"]}
    bench.write(result)
    print(result)


if __name__ == "__main__":
    main()

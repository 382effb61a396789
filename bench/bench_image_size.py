"""Installed size of each image's Python environment (no Docker engine here to measure the images).

For each Dockerfile, a fresh venv under bench/.venvs/<image> gets exactly the `pip install`
commands of the Dockerfile's build stage, in order, with the Dockerfile's ARG defaults
substituted (the project path stands for the build context). The venv's size is the part of the
image this project controls; the python:*-slim base adds the same amount to both images.

    python bench/bench_image_size.py                      # both images; writes bench/results/image_size.json
    python bench/bench_image_size.py --torch-index-url ''  # torch from pip's configured index instead of
                                                           # the Dockerfile's default (the CPU wheel either way)
    python bench/bench_image_size.py operator --also 'kubernetes<36'   # a what-if, recorded apart
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

from common import BENCH, REPO, RESULTS, Bench

VENVS = BENCH / ".venvs"
IMAGES = {"operator": "Dockerfile.operator", "trainer": "Dockerfile.trainer"}
OPERATOR_TARGET_MB = 150
MB = 1_000_000

# Reports each distribution's installed bytes (from its RECORD) as JSON; runs inside the venv.
_SIZES = r"""
import json, os, importlib.metadata as md
out = []
for d in md.distributions():
    total = 0
    for f in d.files or []:
        p = d.locate_file(f)
        if os.path.isfile(p) and not os.path.islink(p):
            total += os.path.getsize(p)
    out.append({"name": d.metadata["Name"], "version": d.version, "bytes": total})
print(json.dumps(out))
"""


def dockerfile_installs(dockerfile: Path, overrides: dict[str, str]) -> list[list[str]]:
    """The build stage's `pip install` argument lists, ARGs substituted, `.` as the repo path."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    args: dict[str, str] = {}
    installs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ARG ") and "=" in line:
            key, _, value = line[4:].partition("=")
            args[key.strip()] = value.strip()
        if not line.startswith("RUN "):
            continue
        for part in re.split(r"&&|;", line[4:]):
            words = shlex.split(part)
            if "install" in words and any(w.endswith("pip") for w in words[: words.index("install")]):
                installs.append(words[words.index("install") + 1:])
    values = {**args, **overrides}
    resolved = []
    for command in installs:
        out = []
        skip = False
        for k, word in enumerate(command):
            if skip:
                skip = False
                continue
            word = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], word)
            if word == "--index-url" and command[k + 1] and not re.sub(
                    r"\$\{(\w+)\}", lambda m: values[m.group(1)], command[k + 1]):
                skip = True  # an empty index URL: use pip's configured index
                continue
            # The build context's path (".", "./[extra]") stands for the repository here.
            if re.fullmatch(r"\.?/?(\[[\w,]+\])?", word) and word.startswith("."):
                word = str(REPO) + word.lstrip("./")
            out.append(word)
        resolved.append(out)
    return resolved


def tree_bytes(root: Path) -> tuple[int, int]:
    total, count = 0, 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            count += 1
    return total, count


def build(image: str, overrides: dict[str, str], also: list[str]) -> dict:
    target = VENVS / (image if not also else f"{image}-variant")
    if target.exists():
        shutil.rmtree(target)
    # As in the Dockerfiles: a venv without pip, filled by an outer pip (`pip --python`).
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    commands = dockerfile_installs(REPO / IMAGES[image], overrides)
    commands[-1] = commands[-1] + also  # a what-if: extra pins resolved with the project
    started = time.monotonic()
    for command in commands:
        print(f"[{image}] pip install {' '.join(command)}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *command],
                       check=True)
    install_seconds = time.monotonic() - started
    total, files = tree_bytes(target)
    packages = json.loads(subprocess.run([str(python), "-c", _SIZES], capture_output=True, text=True,
                                         check=True).stdout)
    packages.sort(key=lambda p: -p["bytes"])
    return {
        "dockerfile": IMAGES[image],
        "pip_installs": [" ".join(c).replace(str(REPO), ".") for c in commands],
        "venv_mb": round(total / MB, 1),
        "files": files,
        "install_seconds": round(install_seconds, 1),
        "distributions": len(packages),
        "has_torch_or_ray": any(p["name"].lower() in ("torch", "ray") for p in packages),
        "largest": [{"name": p["name"], "version": p["version"], "mb": round(p["bytes"] / MB, 1),
                     "share": round(p["bytes"] / total, 3)} for p in packages[:10]],
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="*", default=list(IMAGES), choices=list(IMAGES))
    parser.add_argument("--also", action="append", default=[], metavar="REQ",
                        help="what-if: add this requirement to the project install (e.g. 'kubernetes<36'); "
                             "recorded as '<image> with REQ'")
    parser.add_argument("--torch-index-url", default=None,
                        help="override the trainer Dockerfile's TORCH_INDEX_URL ('' = pip's configured index)")


def main() -> int:
    bench = Bench(__doc__, RESULTS / "image_size.json", arguments)
    args = bench.args
    overrides = {} if args.torch_index_url is None else {"TORCH_INDEX_URL": args.torch_index_url}

    results = bench.previous()  # images measured by earlier runs stay
    results["note"] = ("Installed size of a venv with exactly each image's pip installs (apparent bytes, "
                       "MB = 10^6). The python slim base image is not included.")
    results.setdefault("images", {})
    for image in args.images:
        report = build(image, overrides, args.also)
        report["command"] = " ".join(["python", "bench/bench_image_size.py", image]
                                     + [f"--also '{r}'" for r in args.also]
                                     + ([f"--torch-index-url '{args.torch_index_url}'"]
                                        if args.torch_index_url is not None else []))
        if image == "operator":
            report["target_mb"] = OPERATOR_TARGET_MB
            report["within_target"] = report["venv_mb"] <= OPERATOR_TARGET_MB
        label = " with ".join([image, *args.also])
        results["images"][label] = report
        top = ", ".join(f"{p['name']} {p['mb']} MB" for p in report["largest"][:4])
        print(f"{label}: {report['venv_mb']} MB in {report['files']} files; largest: {top}")
    bench.write(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

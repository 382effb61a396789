"""What a cold node pulls for each role of a job: the images pushed to a real registry on loopback and pulled
into an empty image store, one pull at a time, alternating (bench/results/image_pull.json).

    ./scripts/build-registry && .venv/bin/python bench/bench_image_pull.py [--repeats 3]

The registry is CNCF Distribution (`scripts/build-registry`), storing on local disk; podman pushes each image
from this host's store with its default compression (gzip, as most registries hold images) and pulls it into
a fresh `--root` (a node that has never run the image). A node that runs only rollout workers (or a head)
pulls the rollout image; one that runs a learner the trainer image; before images per role, every node pulled
the trainer image. Loopback has no bandwidth limit: the pull is decompression and writes, so a node behind a
real network waits longer for the larger image still; the compressed bytes say how much longer.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from common import REPO, RESULTS, Bench, from_tests

bed_registry = from_tests("bed.registry")

IMAGES = {"rollout": "ghcr.io/kuberl/kuberl-rollout:0.1.0", "trainer": "ghcr.io/kuberl/kuberl-trainer:0.1.0"}


def arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="pulls of each image (alternating)")


def podman(*args: str, root: Path | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    store = ["--root", str(root / "root"), "--runroot", str(root / "run")] if root else []
    return subprocess.run(["podman", *store, *args], capture_output=True, text=True, timeout=timeout, check=True)


def compressed_bytes(address: str, repository: str, tag: str) -> int:
    """The layers' and config's bytes as the registry holds them: what a pull transfers."""
    request = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/{tag}", headers={"Accept": ", ".join([
        "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.loads(response.read())
    return manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])


def push(address: str) -> dict[str, dict]:
    """Each image pushed from this host's store: the seconds it took and its size in the registry."""
    pushed = {}
    for role, image in IMAGES.items():
        repository, _, tag = image.split("/", 1)[1].partition(":")
        target = f"{address}/{repository}:{tag}"
        started = time.monotonic()
        podman("push", "--tls-verify=false", image, f"docker://{target}")
        seconds = round(time.monotonic() - started, 1)
        size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
        pushed[role] = {"image": image, "reference": target, "push_seconds": seconds,
                        "compressed_mb": round(compressed_bytes(address, repository, tag) / 1e6, 1),
                        "uncompressed_mb": round(size / 1e6, 1)}
    return pushed


def pull(pushed: dict[str, dict], workdir: Path, repeats: int) -> dict[str, list[float]]:
    """Each image pulled `repeats` times, alternating which goes first, each into an empty store."""
    pulls: dict[str, list[float]] = {role: [] for role in IMAGES}
    for attempt in range(repeats):
        for role in (list(IMAGES) if attempt % 2 == 0 else list(reversed(IMAGES))):
            node = workdir / f"node-{role}-{attempt}"
            os.sync()  # the previous pull's gigabytes written out first, not while this one is timed
            started = time.monotonic()
            podman("pull", "--tls-verify=false", pushed[role]["reference"], root=node)
            pulls[role].append(round(time.monotonic() - started, 1))
            podman("rmi", "--all", "--force", root=node)
            shutil.rmtree(node, ignore_errors=True)
    return pulls


def main() -> None:
    bench = Bench(__doc__, RESULTS / "image_pull.json", arguments)
    repeats = bench.args.repeats
    with tempfile.TemporaryDirectory(prefix="kuberl-pull-", dir="/var/tmp") as tmp:
        registry = bed_registry.Registry(Path(tmp) / "blobs", Path(tmp)).start()
        try:
            pushed = push(registry.address)
            pulls = pull(pushed, Path(tmp), repeats)
        finally:
            registry.stop()
    version = (REPO / "scripts" / "build-registry").read_text().split("REGISTRY_VERSION=")[1].split()[0]
    medians = {role: statistics.median(pulls[role]) for role in IMAGES}
    result = {
        "command": f".venv/bin/python bench/bench_image_pull.py --repeats {repeats}",
        "registry": f"CNCF Distribution {version} on loopback, local-disk storage",
        "engine": podman("--version").stdout.strip(),
        "images": {role: {**pushed[role], "pull_seconds": pulls[role], "pull_seconds_median": medians[role]}
                   for role in IMAGES},
        "ratios": {
            "trainer_over_rollout_compressed": round(pushed["trainer"]["compressed_mb"]
                                                     / pushed["rollout"]["compressed_mb"], 2),
            "trainer_over_rollout_pull": round(medians["trainer"] / medians["rollout"], 2)},
        "notes": [
            "each pull into an empty --root and --runroot: a node that never ran the image; one pull at a time, "
            "after a sync (an earlier run without it had the pulls after the trainer's 2-3x slower: its "
            "gigabytes still being written out)",
            "loopback: no bandwidth limit, so the pull is decompression and writes; over a real network the "
            "compressed bytes decide more of it",
        ],
    }
    bench.write(result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

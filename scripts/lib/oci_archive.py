"""Write an OCI image layout as a tar archive (what `ctr images import` reads) holding one image: a single
layer made of a directory's files, owned by root, with a fixed mtime so the same files give the same
digests.

    python3 scripts/lib/oci_archive.py ROOTFS NAME ENTRYPOINT_JSON OUT.tar

Only the standard library: scripts/build-node runs it before any virtual environment exists.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _layer(rootfs: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        layer.add(rootfs, arcname=".", filter=_root_owned)
    return buffer.getvalue()


def image_archive(rootfs: str, name: str, entrypoint: list[str], out: str) -> str:
    """Write the archive; returns the manifest's digest."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    layer = _layer(rootfs)
    compressed = gzip.compress(layer, mtime=0)
    # The pause container runs as the nobody user upstream's image names (65535), never as root.
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
                         }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(compressed),
                    "size": len(compressed)}]}).encode()
    manifest_digest = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest), "annotations": {"io.containerd.image.name": name,
                                               "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]})

    with tarfile.open(out, "w") as archive:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index.encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    return manifest_digest


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    print(image_archive(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))

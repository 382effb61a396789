"""scripts/lib/oci_archive.py writes the pause image as an OCI image layout in a tar, for `ctr images import`
(tests/e2e/test_real_node.py imports it into a real containerd). Here: the layout a strict reader expects,
every digest and size true, the layer's files owned by root, and the same files giving the same digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile

from conftest import REPO

SCRIPT = REPO / "scripts" / "lib" / "oci_archive.py"


def _strict(data: bytes) -> dict:
    def no_duplicates(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    return json.loads(data, object_pairs_hook=no_duplicates)


def _write(tmp_path, name: str) -> tuple[str, dict[str, bytes]]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "pause").write_bytes(b"\x7fELF-not-really")
    (root / "pause").chmod(0o755)
    out = tmp_path / name
    done = subprocess.run([sys.executable, str(SCRIPT), str(root), "localhost/kuberl/pause:3.10", '["/pause"]',
                           str(out)], capture_output=True, text=True, check=True)
    with tarfile.open(out) as archive:
        files = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    return done.stdout.strip(), files


def test_the_archive_is_an_oci_layout_whose_digests_hold(tmp_path):
    digest, files = _write(tmp_path, "a.tar")
    assert _strict(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for path, data in files.items():
        if path.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == path.rsplit("/", 1)[1], path
    (entry,) = _strict(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/kuberl/pause:3.10"
    manifest = _strict(files[f"blobs/sha256/{digest.split(':')[1]}"])
    assert entry["size"] == len(files[f"blobs/sha256/{digest.split(':')[1]}"])
    config_blob = files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"]
    config = _strict(config_blob)
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    (layer,) = manifest["layers"]
    compressed = files[f"blobs/sha256/{layer['digest'].split(':')[1]}"]
    assert layer["size"] == len(compressed)
    plain = gzip.decompress(compressed)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(plain).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(plain)) as rootfs:
        members = {m.name: m for m in rootfs.getmembers()}
    assert members["./pause"].mode & 0o111 and members["./pause"].uid == 0 and members["./pause"].mtime == 0


def test_the_same_files_give_the_same_image(tmp_path):
    assert _write(tmp_path, "a.tar")[0] == _write(tmp_path, "b.tar")[0]

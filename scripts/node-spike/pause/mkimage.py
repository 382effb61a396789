"""Write an OCI image archive (oci-layout tar) with one layer from a directory: for `ctr images import`."""
import hashlib, io, json, sys, tarfile, gzip

rootfs, name, out = sys.argv[1:4]
entrypoint = json.loads(sys.argv[4])
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
    t.add(rootfs, arcname=".", filter=lambda ti: (setattr(ti, "uid", 0), setattr(ti, "gid", 0), setattr(ti, "uname", ""), setattr(ti, "gname", ""), setattr(ti, "mtime", 0), ti)[-1])
layer_tar = buf.getvalue()
layer_gz = gzip.compress(layer_tar, mtime=0)
diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
blobs = {}
def blob(data):
    d = "sha256:" + hashlib.sha256(data).hexdigest(); blobs[d] = data; return d
layer_d = blob(layer_gz)
config = json.dumps({"architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
config_d = blob(config)
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d, "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_d, "size": len(layer_gz)}]}).encode()
manifest_d = blob(manifest)
index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": manifest_d, "size": len(manifest), "annotations": {"io.containerd.image.name": name,
    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}).encode()
with tarfile.open(out, "w") as t:
    def add(path, data):
        ti = tarfile.TarInfo(path); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", index)
    for d, data in blobs.items():
        add("blobs/sha256/" + d.split(":")[1], data)
print(out, manifest_d)

"""A real S3-compatible store for the tests and benchmarks that keep checkpoints in one: SeaweedFS's `weed
server` (master, volume server, filer and S3 gateway in one process), built from its Go module by
scripts/build-seaweedfs, on loopback or on the host's end of a real node's link, every port its own.

    with SeaweedFS(tmp_path) as store:
        store.uri("my-test")                 # s3://kuberl/my-test: a prefix of the one bucket
        env = store.credentials_env()       # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
        store.endpoint                       # http://127.0.0.1:<port>

A bucket is a collection of volumes of its own in SeaweedFS (the master grows several for each, seconds
apiece), so tests share one bucket, `BUCKET`, each under its own prefix.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

from bed.common import free_port, stop_process
from tools import REPO, tool_missing

from kuberl.trainer.object_store import Credentials, ObjectStoreError, S3Client

BUILD = REPO / "scripts" / "build-seaweedfs"
START_SECONDS = 120.0
BUCKET = "kuberl"


def weed_binary() -> Path:
    found = subprocess.run([str(BUILD), "--print-bin"], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        tool_missing("seaweedfs", "run ./scripts/build-seaweedfs (./scripts/test builds it)")
    return Path(found.stdout.strip().splitlines()[-1])


class SeaweedFS:
    """One `weed server` with S3 on, one identity allowed everything (`credentials`), data under `directory`."""

    def __init__(self, directory: Path, host: str = "127.0.0.1"):
        self.directory, self.host = directory, host
        self.credentials = Credentials(f"AK{secrets.token_hex(8).upper()}", secrets.token_urlsafe(24))
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""
        self._bucket_made = False

    def __enter__(self) -> SeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        weed = weed_binary()
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "kuberl-tests", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": self.credentials.access_key,
                             "secretKey": self.credentials.secret_key}]}]}))
        for _ in range(3):  # a port taken between the pick and the bind: others
            ports = {name: free_port(self.host) for name in
                     ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")}
            args = [f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
                    for name, port in ports.items()]
            log = (self.directory / "weed.log").open("w")
            self.proc = subprocess.Popen(
                [str(weed), "server", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}", *args,
                 "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                 # Small volumes, few of them: a test's checkpoints are megabytes.
                 "-master.volumeSizeLimitMB=64", "-volume.max=32", "-volume.preStopSeconds=0"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.endpoint = f"http://{self.host}:{ports['s3']}"
            self._bucket_made = False
            deadline = time.monotonic() + START_SECONDS
            while self.proc.poll() is None and time.monotonic() < deadline:
                if self._answers():
                    return
                time.sleep(0.2)
            self.stop()
        raise AssertionError(f"weed server did not start: {(self.directory / 'weed.log').read_text()[-3000:]}")

    def _answers(self) -> bool:
        """The gateway takes an object into BUCKET: its filer is up and the master has grown volumes for it
        on the volume server (the gateway answers before all that is done)."""
        client = self.client()
        try:
            if not self._bucket_made:
                client.create_bucket()
                self._bucket_made = True
            client.put_bytes("ready", b"ready")
        except ObjectStoreError:
            return False
        return True

    def stop(self) -> None:
        # Its filer flushes metadata logs to volumes that stop first, and retries for half a minute: a test's
        # store has nothing to keep past the test, so SIGKILL follows SIGTERM after 5 s.
        if self.proc is not None:
            stop_process(self.proc, 5, group=True)

    def client(self, bucket: str = BUCKET, credentials: Credentials | None = None) -> S3Client:
        return S3Client(bucket, credentials or self.credentials, self.endpoint)

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def credentials_env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.credentials.access_key,
                "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key}

"""Checkpoints in an S3-compatible object store (`spec.checkpointing.s3`), beside the local ones.

A checkpoint is committed in two steps: its object (`<prefix>ckpt-<iteration>.pt`, the same bytes as the
local file) first, then a small manifest (`<prefix>ckpt-<iteration>.json`: its size and SHA-256). A
reader takes only checkpoints with a manifest whose object has that size and hash, newest first, so a
write cut off anywhere (before the object is whole, or between the two) leaves the previous checkpoint
the newest one. After a commit the oldest are deleted past keepLast (manifest first: a checkpoint is
never half-listed), with any object a cut-off write left behind.

The path is the run's identity: a learner, restarted or in a new job naming the same path, resumes from
its newest checkpoint; a path with none starts from `resumeFrom`'s newest (another run's), or fresh.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.trainer.object_store import Credentials, ObjectStoreError, S3Client, file_sha256, parse_s3_uri

log = logging.getLogger(__name__)

_MANIFEST = re.compile(r"^ckpt-(\d{9})\.json$")
_OBJECT = re.compile(r"^ckpt-(\d{9})\.pt$")
MANIFEST_BYTES_MAX = 64 << 10
#: The largest checkpoint object read back (a replay buffer of millions of transitions fits).
OBJECT_BYTES_MAX = 64 << 30
#: Waits between tries of a checkpoint's upload when the store cannot be reached or fails (5xx).
RETRY_SECONDS = (1.0, 3.0)
MANIFEST_FORMAT = 1
#: Seconds each socket operation of the run's record may take: a learner leaving within SIGTERM's grace
#: period does not wait on a store that is down.
RECORD_TIMEOUT_SECONDS = 5.0


class CheckpointStoreRefused(RuntimeError):
    """The store refuses this job's credentials or bucket: no retry helps until the spec or the Secret
    changes. `field` is the spec field to fix."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class StoredCheckpoint:
    iteration: int
    where: str  # s3://bucket/key of its object, for people to read


class ObjectCheckpoints:
    """One s3://bucket/prefix of checkpoints."""

    def __init__(self, uri: str, client: S3Client, prefix: str, field: str = "spec.checkpointing.s3.uri"):
        self.uri, self.client, self.prefix, self.field = uri, client, prefix, field

    @classmethod
    def open(cls, uri: str, endpoint: str | None, region: str, field: str) -> ObjectCheckpoints:
        """The store at `uri` with the environment's credentials (`field`: the spec field that named it)."""
        credentials = Credentials.from_environment()
        if credentials is None:
            raise CheckpointStoreRefused(
                f"no credentials for {uri}: give spec.checkpointing.s3.credentialsSecret (a Secret with keys "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or set those variables where kuberl train runs",
                "spec.checkpointing.s3.credentialsSecret")
        bucket, prefix = parse_s3_uri(uri)
        return cls(uri, S3Client(bucket, credentials, endpoint, region), prefix, field)

    # ---- reading ----------------------------------------------------------------------------------

    def committed(self) -> list[int]:
        """Iterations with a manifest, oldest first. Raises CheckpointStoreRefused when the store refuses."""
        return sorted(i for i, kind in self._listing() if kind == "manifest")

    def load_latest(self, map_location: Any = "cpu") -> tuple[StoredCheckpoint, dict[str, Any]] | None:
        """The newest committed checkpoint that loads, its object checked against its manifest; warns
        about and skips any that do not. None when there is none."""
        import torch

        for iteration in reversed(self.committed()):
            where = f"{self.uri.rstrip('/')}/ckpt-{iteration:09d}.pt"
            try:
                with tempfile.TemporaryDirectory(prefix="kuberl-ckpt-") as tmp:
                    path = self._fetch(iteration, Path(tmp) / "state.pt")
                    state = torch.load(path, map_location=map_location, weights_only=True)
                return StoredCheckpoint(iteration, where), state
            except ObjectStoreError as err:
                if err.refused:
                    raise self._refusal(err) from None
                if err.status != 404:
                    # The store failed to answer (5xx, cut off, down): the checkpoint may be whole, and a
                    # learner that took an older one instead would redo what it holds. The caller stops.
                    raise
                log.warning("checkpoint %s cannot be read (%s); trying the previous one", where, err)
            except Exception as err:  # noqa: BLE001 - a corrupt state raises many types; all mean "unusable"
                log.warning("checkpoint %s does not load (%s: %s); trying the previous one",
                            where, type(err).__name__, err)
        return None

    def _fetch(self, iteration: int, dest: Path) -> Path:
        raw = self.client.get_bytes(f"{self.prefix}ckpt-{iteration:09d}.json", MANIFEST_BYTES_MAX)
        manifest = _manifest(raw, iteration)
        digest = self.client.get_file(f"{self.prefix}{manifest['object']}", dest, manifest["bytes"])
        if digest != manifest["sha256"] or dest.stat().st_size != manifest["bytes"]:
            raise ValueError("its object is not the one its manifest commits (size or SHA-256 differ)")
        return dest

    # ---- writing ----------------------------------------------------------------------------------

    def save(self, local: Path, iteration: int, keep_last: int, job_name: str) -> StoredCheckpoint:
        """Upload the local checkpoint `local` as `iteration`, commit it, prune past `keep_last`. Retries
        what may pass on a second try; raises ObjectStoreError when it does not."""
        key, digest = f"ckpt-{iteration:09d}", file_sha256(local)
        manifest = json.dumps({"format": MANIFEST_FORMAT, "iteration": iteration, "object": f"{key}.pt",
                               "bytes": local.stat().st_size, "sha256": digest, "job": job_name,
                               "written": round(time.time(), 3)}, sort_keys=True).encode()
        self._retrying(lambda: self.client.put_file(f"{self.prefix}{key}.pt", local, sha256=digest))
        self._retrying(lambda: self.client.put_bytes(f"{self.prefix}{key}.json", manifest, "application/json"))
        try:
            self._prune(keep_last)
        except ObjectStoreError as err:  # the checkpoint is committed; old ones wait for the next prune
            log.warning("old checkpoints in %s not deleted: %s", self.uri, err)
        return StoredCheckpoint(iteration, f"{self.uri.rstrip('/')}/{key}.pt")

    def keep_record(self, files: dict[str, bytes]) -> list[str]:
        """The run's record under the prefix (its summary, the learner's last log lines): what happened,
        once the pods and their logs are gone. One try each; returns the names kept."""
        client = self.client.with_timeout(RECORD_TIMEOUT_SECONDS)
        kept = []
        for name, data in files.items():
            try:
                client.put_bytes(f"{self.prefix}{name}", data,
                                 "application/json" if name.endswith(".json") else "text/plain; charset=utf-8")
                kept.append(name)
            except ObjectStoreError as err:
                log.warning("%s not kept in %s: %s", name, self.uri, err)
        return kept

    def _retrying(self, call) -> None:
        for wait in (*RETRY_SECONDS, None):
            try:
                call()
                return
            except ObjectStoreError as err:
                if err.refused:
                    raise self._refusal(err) from None
                if wait is None or (err.status is not None and err.status < 500):
                    raise
                log.warning("%s; trying again in %.0f s", err, wait)
                time.sleep(wait)

    def _prune(self, keep_last: int) -> None:
        listing = self._listing()
        manifests = sorted(i for i, kind in listing if kind == "manifest")
        keep = set(manifests[-keep_last:])
        newest = manifests[-1] if manifests else -1
        for iteration in manifests[:-keep_last]:
            self.client.delete(f"{self.prefix}ckpt-{iteration:09d}.json")
        for iteration, kind in listing:
            # An object without a manifest older than the newest commit was cut off; newer ones may be
            # a write in progress (none here: one learner writes), so only the older go.
            if kind == "object" and iteration not in keep and iteration < newest:
                self.client.delete(f"{self.prefix}ckpt-{iteration:09d}.pt")

    def _listing(self) -> list[tuple[int, str]]:
        try:
            keys = self.client.list_keys(self.prefix)
        except ObjectStoreError as err:
            if err.refused:
                raise self._refusal(err) from None
            raise
        found = []
        for key in keys:
            name = key[len(self.prefix):]
            if m := _MANIFEST.match(name):
                found.append((int(m.group(1)), "manifest"))
            elif m := _OBJECT.match(name):
                found.append((int(m.group(1)), "object"))
        return found

    def _refusal(self, err: ObjectStoreError) -> CheckpointStoreRefused:
        if err.code == "NoSuchBucket":
            return CheckpointStoreRefused(f"{self.uri}: no such bucket at {self.client.where} ({err}): create "
                                          "it, or name one that exists", self.field)
        return CheckpointStoreRefused(
            f"{self.uri}: the store refused this job's credentials ({err}): check the keys AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY of spec.checkpointing.s3.credentialsSecret, and that they may read and write "
            "the bucket", "spec.checkpointing.s3.credentialsSecret")


def _manifest(raw: bytes, iteration: int) -> dict[str, Any]:
    """A manifest's fields, checked: the store's bytes are read as hostile (strict JSON, no NaN, types
    and bounds checked) before anything is fetched on their word."""

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} in a manifest")

    data = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    expected = f"ckpt-{iteration:09d}.pt"
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or data.get("object") != expected:
        raise ValueError(f"not a format-{MANIFEST_FORMAT} manifest of {expected}")
    size, digest = data.get("bytes"), data.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= OBJECT_BYTES_MAX:
        raise ValueError(f"its size is not 1..{OBJECT_BYTES_MAX} bytes")
    if not isinstance(digest, str) or re.fullmatch(r"[0-9a-f]{64}", digest) is None:
        raise ValueError("its sha256 is not 64 hex digits")
    return data

"""Checkpoints: written atomically (temp file, fsync, rename, fsync dir), the last K kept, loaded with
`torch.load(..., weights_only=True)`; a newest file that does not load falls back to the previous one."""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


def checkpoint_path(directory: Path, iteration: int) -> Path:
    return directory / f"ckpt-{iteration:09d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first (temp files and strangers ignored)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(directory: Path, iteration: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write `state` for `iteration`; a crash mid-write leaves earlier checkpoints untouched."""
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, iteration)
    fd, tmp_name = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(directory)[:-keep_last]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: Path, map_location: str | torch.device = "cpu") -> tuple[Path, dict[str, Any]] | None:
    """Newest checkpoint that loads; warns about and skips any that do not."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # noqa: BLE001 - a truncated or corrupt file raises many types; all mean "unusable"
            log.warning("checkpoint %s does not load (%s: %s); trying the previous one",
                        path.name, type(err).__name__, err)
    return None

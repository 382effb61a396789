"""Files people rank segments with, under RUN_DIR/preferences/ (numpy and json only: the CLI uses it).

candidates.jsonl: the learner appends candidate pairs, one JSON object a line:
    {"pair": ID, "segments": {"a": SEGMENT, "b": SEGMENT}}
    SEGMENT = {"id": ID + "a" or "b", "obs": [[...] per step], "actions": [[...] per step],
               "rewards": [...], "measures": {name: [...] per step}}   (MEASURES; null where absent)
pairs.jsonl: ranked pairs, one JSON object a line, appended by `kuberl preferences` (or anything):
    {"a": SEGMENT_ID, "b": SEGMENT_ID, "prefer": "a" | "b" | "equal"}     ("pair": ID optional)
The learner re-reads pairs.jsonl when its size or mtime changes and ingests its new complete lines.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PREFERENCES_DIR = "preferences"
CANDIDATES_FILE = "candidates.jsonl"
PAIRS_FILE = "pairs.jsonl"
PREFER_VALUES = {"a": 1.0, "b": 0.0, "equal": 0.5}


def parse_ranking(line: str) -> tuple[str, str, float]:
    """(segment a, segment b, P(a preferred)) from one pairs.jsonl line; ValueError says what is wrong."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 -- a bad line, skipped and counted as such
    for key in ("a", "b"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise ValueError(f"{key!r} must be a segment id (a string from candidates.jsonl)")
    prefer = record.get("prefer")
    if prefer not in PREFER_VALUES:
        raise ValueError(f"prefer={prefer!r}; allowed values: a, b, equal")
    if record["a"] == record["b"]:
        raise ValueError("a and b are the same segment")
    return record["a"], record["b"], PREFER_VALUES[prefer]


class PairsReader:
    """Polls a pairs file (size and mtime: one stat per call) and returns its new complete lines.
    A file that shrank or was replaced (a ConfigMap update) is read again from its start; lines
    already seen are skipped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.stamp: tuple[int, int, int] | None = None
        self.seen: set[str] = set()

    def poll(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp == self.stamp:
            return []
        if st.st_size < self.offset or (self.stamp is not None and st.st_ino != self.stamp[2]):
            self.offset = 0
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for its newline
        self.offset += len(complete)
        self.stamp = stamp if len(complete) == len(data) else None
        lines = []
        for raw in complete.decode(errors="replace").splitlines():
            line = raw.strip()
            if line and line not in self.seen:
                self.seen.add(line)
                lines.append(line)
        return lines

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "seen": sorted(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset, self.seen, self.stamp = int(state["offset"]), set(state["seen"]), None


def read_candidates(path: Path) -> list[dict[str, Any]]:
    """The candidate pairs in a candidates.jsonl, oldest first (a torn last line is skipped)."""
    out = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "pair" in record and "segments" in record:
            out.append(record)
    return out


def append_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Appends whole lines in one write (a reader never sees half a line it would keep)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    with open(path, "a") as handle:
        handle.write(data)


def ranking_record(pair: str, prefer: str) -> dict[str, Any]:
    if prefer not in PREFER_VALUES:
        raise ValueError(f"prefer={prefer!r}; allowed values: a, b, equal")
    return {"pair": pair, "a": pair + "a", "b": pair + "b", "prefer": prefer, "time": round(time.time(), 3)}

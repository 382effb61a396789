"""The learner's side of the pairs people rank: candidate pairs written to
RUN_DIR/preferences/candidates.jsonl, and the pairs file (pairs_file.py) polled for new rankings,
whose segment ids are looked up among the candidates (this process's, else the file's)."""

from __future__ import annotations

import collections
import logging
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from kuberl.api.job import PREFERENCE_CONFIGMAP_MOUNT, PreferenceSpec
from kuberl.trainer.preferences.pairs_file import (
    CANDIDATES_FILE,
    PAIRS_FILE,
    PREFERENCES_DIR,
    PairsReader,
    append_jsonl,
    parse_ranking,
    read_candidates,
)
from kuberl.trainer.preferences.steps import MEASURES

log = logging.getLogger("kuberl.trainer")

MAX_CANDIDATES = 2000  # candidate pairs written per learner process (candidates.jsonl stays ~10-40 MB)


class HumanRankedPairs:
    """Segment pairs for people to rank, and the rankings they gave: candidates go out to
    candidates.jsonl, rankings come in from the pairs file as (segment a, segment b, P(a preferred))."""

    def __init__(self, cfg: PreferenceSpec):
        self.cfg = cfg
        self.counts = collections.Counter()  # human / rejected pairs, candidates written
        self.run_dir: Path | None = None
        self.reader: PairsReader | None = None
        self.candidates: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._candidates_stamp: float | None = None
        self._reader_state: dict[str, Any] | None = None

    def attach_run_dir(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        if self.cfg.config_map:
            path = Path(PREFERENCE_CONFIGMAP_MOUNT) / PAIRS_FILE
        elif self.cfg.pairs_file:
            path = self.run_dir / self.cfg.pairs_file
        else:
            path = self.run_dir / PREFERENCES_DIR / PAIRS_FILE
        self.reader = PairsReader(path)
        if self._reader_state is not None:  # a resumed run reads on from where its checkpoint was
            self.reader.load_state_dict(self._reader_state)
        log.info("preference pairs: reading %s while training", path)

    @property
    def candidates_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / PREFERENCES_DIR / CANDIDATES_FILE

    def write_candidates(self, pool, n: int, rng: np.random.Generator) -> None:
        """`n` random pairs of `pool` (a SegmentPool) appended to candidates.jsonl."""
        n = min(n, MAX_CANDIDATES - self.counts["candidates"])
        path = self.candidates_path
        drawn = pool.pairs(n, rng) if path is not None and n > 0 else None
        if drawn is None:
            return
        records = []
        for i in range(len(drawn[0]["obs"])):
            pair = secrets.token_hex(4)
            segments = {}
            for side, seg in zip("ab", drawn, strict=False):
                self.candidates[pair + side] = (seg["obs"][i], seg["actions"][i])
                segments[side] = _segment_record(pair + side, {k: v[i] for k, v in seg.items()})
            records.append({"pair": pair, "segments": segments})
        while len(self.candidates) > 2 * MAX_CANDIDATES:
            self.candidates.popitem(last=False)
        append_jsonl(path, records)
        self.counts["candidates"] += len(records)

    def _segment(self, seg_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A candidate segment by id: from memory, else from candidates.jsonl (an earlier process's)."""
        path = self.candidates_path
        if seg_id not in self.candidates and path is not None and path.exists():
            stamp = path.stat().st_mtime
            if stamp != self._candidates_stamp:
                self._candidates_stamp = stamp
                for record in read_candidates(path):
                    for side, seg in record["segments"].items():
                        self.candidates.setdefault(record["pair"] + side, (
                            np.asarray(seg["obs"], np.float32), np.asarray(seg["actions"], np.int64)))
        return self.candidates.get(seg_id)

    def read_rankings(self, obs_shape: tuple[int, ...]) -> list[tuple[dict, dict, float]]:
        """The pairs file's new rankings as (segment a, segment b, P(a preferred)); a malformed line is
        logged and counted, never raised."""
        out: list[tuple[dict, dict, float]] = []
        if self.reader is None:
            return out
        for line in self.reader.poll():
            try:
                id_a, id_b, label = parse_ranking(line)
                segs = [self._segment(i) for i in (id_a, id_b)]
                missing = [i for i, s in zip((id_a, id_b), segs, strict=False) if s is None]
                if missing:
                    raise ValueError(f"unknown segment id {missing[0]!r} (not in {CANDIDATES_FILE})")
                if any(s[0].shape != tuple(obs_shape) for s in segs):
                    raise ValueError("segment shape differs from this run's segmentLength and observation")
            except ValueError as err:
                self.counts["rejected"] += 1
                log.warning("preference pairs file %s: line skipped: %s: %.120s", self.reader.path, err, line)
                continue
            a = {"obs": segs[0][0][None], "actions": segs[0][1][None]}
            b = {"obs": segs[1][0][None], "actions": segs[1][1][None]}
            out.append((a, b, label))
            self.counts["human"] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "reader": None if self.reader is None else self.reader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = collections.Counter(state["counts"])
        self._reader_state = state.get("reader")
        if self.reader is not None and self._reader_state is not None:
            self.reader.load_state_dict(self._reader_state)


def _segment_record(seg_id: str, seg: dict[str, np.ndarray]) -> dict[str, Any]:
    def rounded(values: np.ndarray) -> list:
        return [None if np.isnan(x) else round(float(x), 4) for x in values]

    return {"id": seg_id, "obs": np.round(seg["obs"], 4).tolist(), "actions": seg["actions"].tolist(),
            "rewards": rounded(seg["rewards"]),
            "measures": {key: rounded(seg["measures"][:, k]) for k, key in enumerate(MEASURES)}}

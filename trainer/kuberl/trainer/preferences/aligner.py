"""What BDQ calls for its preference head: segments in, ranked pairs in (teacher and people), the
Bradley-Terry loss for the update, held-out accuracy and counts for the metrics, and its state.

Per learner iteration (`ingest`): the workers' per-step records are cut into segments kept in a
recent pool; the teacher labels `pairsPerIteration` random pool pairs; `candidatesPerIteration`
pool pairs go to RUN_DIR/preferences/candidates.jsonl for people; the pairs file's new lines are
read (one stat when nothing changed). Each new pair is held out with probability
`heldOutFraction`. Per gradient update (`loss`): the BT loss on `batchSize` training pairs.
"""

from __future__ import annotations

import collections
import logging
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kuberl.api.job import PREFERENCE_CONFIGMAP_MOUNT, PreferenceSpec
from kuberl.trainer.preferences.head import PairStore, PreferenceHead, accuracy, bt_loss, segment_scores
from kuberl.trainer.preferences.pairs_file import (
    CANDIDATES_FILE, PAIRS_FILE, PREFERENCES_DIR, PairsReader, append_jsonl, parse_ranking, read_candidates,
)
from kuberl.trainer.preferences.steps import MEASURES, SegmentCutter
from kuberl.trainer.preferences.teacher import teacher_labels

log = logging.getLogger("kuberl.trainer")

POOL_SEGMENTS = 1024  # recent segments the teacher and the candidates are drawn from
HELD_OUT_EVAL = 512  # newest held-out pairs the accuracy is measured on
MAX_CANDIDATES = 2000  # candidate pairs written per learner process (candidates.jsonl stays ~10-40 MB)


class SegmentPool:
    """The newest `capacity` segments (numpy), a ring."""

    def __init__(self, capacity: int):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.data: dict[str, np.ndarray] = {}

    def add(self, segments: dict[str, np.ndarray]) -> None:
        for i in range(len(segments["obs"])):
            if not self.data:
                self.data = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in segments.items()}
            for key, v in segments.items():
                self.data[key][self.pos] = v[i]
            self.pos = (self.pos + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def pairs(self, n: int, rng: np.random.Generator) -> tuple[dict, dict] | None:
        if self.size < 2 or n == 0:
            return None
        idx = np.array([rng.choice(self.size, 2, replace=False) for _ in range(n)])
        return ({k: v[idx[:, 0]] for k, v in self.data.items()}, {k: v[idx[:, 1]] for k, v in self.data.items()})


class PreferenceAligner:
    def __init__(self, cfg: PreferenceSpec, obs_dim: int, width: int, branches: tuple[int, ...],
                 device: torch.device, seed: int):
        self.cfg, self.device = cfg, device
        with torch.random.fork_rng(devices=[]):  # the Q-network's initialisation stays the one without a head
            torch.manual_seed(seed + 7919)
            self.head = PreferenceHead(width, branches).to(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + 7919)
        self.rng = np.random.default_rng([seed, 7919])
        self.cutter = SegmentCutter(cfg.segment_length)
        self.pool = SegmentPool(POOL_SEGMENTS)
        store = lambda n: PairStore(n, cfg.segment_length, obs_dim, len(branches), device)  # noqa: E731
        self.train = store(cfg.max_pairs)
        self.held_out = store(max(16, int(cfg.max_pairs * cfg.held_out_fraction) + 1))
        self.counts = collections.Counter()  # teacher / human / rejected pairs, candidates written
        self.losses: list[float] = []
        self.run_dir: Path | None = None
        self.reader: PairsReader | None = None
        self.candidates: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._candidates_stamp: float | None = None
        self._reader_state: dict[str, Any] | None = None

    # ---- files ------------------------------------------------------------------------------

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

    # ---- per iteration -----------------------------------------------------------------------

    def ingest(self, batches: list[dict[str, Any]]) -> None:
        for b in batches:
            steps = b.pop("steps", None)
            if steps is not None:
                segments = self.cutter.cut(b.get("worker_index", 0), steps)
                if segments is not None:
                    self.pool.add(segments)
        teacher = self.cfg.teacher
        if teacher is not None:
            drawn = self.pool.pairs(teacher.pairs_per_iteration, self.rng)
            if drawn is not None:
                a, b = drawn
                self._add_pairs(a, b, teacher_labels(teacher, a["measures"], b["measures"], self.rng))
                self.counts["teacher"] += len(a["obs"])
        self._write_candidates()
        self._read_rankings()

    def _add_pairs(self, a: dict, b: dict, labels: np.ndarray) -> None:
        obs = torch.as_tensor(np.stack([a["obs"], b["obs"]], axis=1), device=self.device)
        actions = torch.as_tensor(np.stack([a["actions"], b["actions"]], axis=1), device=self.device)
        held = self.rng.random(len(labels)) < self.cfg.held_out_fraction
        target = torch.as_tensor(labels, device=self.device)
        for store, rows in ((self.held_out, held), (self.train, ~held)):
            if rows.any():
                idx = torch.as_tensor(np.nonzero(rows)[0], device=self.device)
                store.add(obs[idx], actions[idx], target[idx])

    def _write_candidates(self) -> None:
        n = min(self.cfg.candidates_per_iteration, MAX_CANDIDATES - self.counts["candidates"])
        path = self.candidates_path
        drawn = self.pool.pairs(n, self.rng) if path is not None and n > 0 else None
        if drawn is None:
            return
        records = []
        for i in range(len(drawn[0]["obs"])):
            pair = secrets.token_hex(4)
            segments = {}
            for side, seg in zip("ab", drawn):
                self.candidates[pair + side] = (seg["obs"][i], seg["actions"][i])
                segments[side] = _segment_record(pair + side, {k: v[i] for k, v in seg.items()})
            records.append({"pair": pair, "segments": segments})
        while len(self.candidates) > 2 * MAX_CANDIDATES:
            self.candidates.popitem(last=False)
        append_jsonl(path, records)
        self.counts["candidates"] += len(records)

    def _segment(self, seg_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A candidate segment by id: from memory, else from candidates.jsonl (an earlier process's)."""
        if seg_id not in self.candidates and self.candidates_path is not None and self.candidates_path.exists():
            stamp = self.candidates_path.stat().st_mtime
            if stamp != self._candidates_stamp:
                self._candidates_stamp = stamp
                for record in read_candidates(self.candidates_path):
                    for side, seg in record["segments"].items():
                        self.candidates.setdefault(record["pair"] + side, (
                            np.asarray(seg["obs"], np.float32), np.asarray(seg["actions"], np.int64)))
        return self.candidates.get(seg_id)

    def _read_rankings(self) -> None:
        if self.reader is None:
            return
        for line in self.reader.poll():
            try:
                id_a, id_b, label = parse_ranking(line)
                segs = [self._segment(i) for i in (id_a, id_b)]
                missing = [i for i, s in zip((id_a, id_b), segs) if s is None]
                if missing:
                    raise ValueError(f"unknown segment id {missing[0]!r} (not in {CANDIDATES_FILE})")
                if any(s[0].shape != self.train.obs.shape[2:] for s in segs):
                    raise ValueError("segment shape differs from this run's segmentLength and observation")
            except ValueError as err:
                self.counts["rejected"] += 1
                log.warning("preference pairs file %s: line skipped: %s: %.120s", self.reader.path, err, line)
                continue
            a = {"obs": segs[0][0][None], "actions": segs[0][1][None]}
            b = {"obs": segs[1][0][None], "actions": segs[1][1][None]}
            self._add_pairs(a, b, np.array([label], np.float32))
            self.counts["human"] += 1

    # ---- per gradient update -----------------------------------------------------------------

    def loss(self, features_fn) -> torch.Tensor | None:
        """The weighted BT loss on a batch of training pairs (None before there are any)."""
        if self.train.size == 0 or self.cfg.weight == 0:
            return None
        idx = torch.randint(0, self.train.size, (self.cfg.batch_size,), device=self.device, generator=self.generator)
        obs, actions, labels = self.train.get(idx)
        scores = segment_scores(features_fn, self.head, obs.flatten(0, 1), actions.flatten(0, 1)).view(-1, 2)
        loss = bt_loss(scores[:, 0], scores[:, 1], labels)
        self.losses.append(loss.item())
        return self.cfg.weight * loss

    def shaped_rewards(self, features_fn, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        """r + beta * standardised r(s, a) over the batch (rewardShaping; exact for nStep 1, the first
        step's score otherwise)."""
        if self.cfg.reward_shaping == 0 or self.train.size < self.cfg.batch_size:
            return rewards
        with torch.no_grad():
            score = self.head.step_scores(features_fn(obs), actions.reshape(len(obs), -1))
            score = (score - score.mean()) / (score.std() + 1e-6)
        return rewards + self.cfg.reward_shaping * score

    def stats(self, features_fn) -> dict[str, float]:
        """The iteration's figures for metrics.jsonl and Prometheus (kuberl_preference_*)."""
        out = {"preference_pairs_used": float(self.counts["teacher"] + self.counts["human"]),
               "preference_pairs_human": float(self.counts["human"]),
               "preference_pairs_rejected": float(self.counts["rejected"])}
        if self.losses:
            out["preference_loss"] = float(np.mean(self.losses))
            self.losses = []
        if self.held_out.size:
            n = min(self.held_out.size, HELD_OUT_EVAL)
            idx = (torch.arange(n, device=self.device) + self.held_out.pos - n) % self.held_out.size
            obs, actions, labels = self.held_out.get(idx)
            with torch.no_grad():
                scores = segment_scores(features_fn, self.head, obs.flatten(0, 1), actions.flatten(0, 1)).view(-1, 2)
            acc, strict = accuracy(scores[:, 0], scores[:, 1], labels)
            out["preference_held_out_pairs"] = float(strict)  # strict ("equal" excluded) among the newest
            if strict:
                out["preference_accuracy"] = acc
        return out

    # ---- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"head": self.head.state_dict(), "train": self.train.state_dict(),
                "held_out": self.held_out.state_dict(), "counts": dict(self.counts),
                "reader": None if self.reader is None else self.reader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.train.load_state_dict(state["train"])
        self.held_out.load_state_dict(state["held_out"])
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

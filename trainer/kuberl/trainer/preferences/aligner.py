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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kuberl.api.job import PreferenceSpec
from kuberl.trainer.preferences.head import PairStore, PreferenceHead, accuracy, bt_loss, segment_scores
from kuberl.trainer.preferences.people import HumanRankedPairs
from kuberl.trainer.preferences.steps import SegmentCutter
from kuberl.trainer.preferences.teacher import teacher_labels

POOL_SEGMENTS = 1024  # recent segments the teacher and the candidates are drawn from
HELD_OUT_EVAL = 512  # newest held-out pairs the accuracy is measured on


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
        def store(n):
            return PairStore(n, cfg.segment_length, obs_dim, len(branches), device)
        self.train = store(cfg.max_pairs)
        self.held_out = store(max(16, int(cfg.max_pairs * cfg.held_out_fraction) + 1))
        self.counts = collections.Counter()  # pairs the teacher labelled
        self.losses: list[float] = []
        self.human_pairs = HumanRankedPairs(cfg)

    def attach_run_dir(self, run_dir: Path) -> None:
        self.human_pairs.attach_run_dir(run_dir)

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
        self.human_pairs.write_candidates(self.pool, self.cfg.candidates_per_iteration, self.rng)
        for a, b, label in self.human_pairs.read_rankings(self.train.obs.shape[2:]):
            self._add_pairs(a, b, np.array([label], np.float32))

    def _add_pairs(self, a: dict, b: dict, labels: np.ndarray) -> None:
        obs = torch.as_tensor(np.stack([a["obs"], b["obs"]], axis=1), device=self.device)
        actions = torch.as_tensor(np.stack([a["actions"], b["actions"]], axis=1), device=self.device)
        held = self.rng.random(len(labels)) < self.cfg.held_out_fraction
        target = torch.as_tensor(labels, device=self.device)
        for store, rows in ((self.held_out, held), (self.train, ~held)):
            if rows.any():
                idx = torch.as_tensor(np.nonzero(rows)[0], device=self.device)
                store.add(obs[idx], actions[idx], target[idx])

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

    def shaped_rewards(self, features_fn, obs: torch.Tensor, actions: torch.Tensor,
                       rewards: torch.Tensor) -> torch.Tensor:
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
        human_counts = self.human_pairs.counts
        out = {"preference_pairs_used": float(self.counts["teacher"] + human_counts["human"]),
               "preference_pairs_human": float(human_counts["human"]),
               "preference_pairs_rejected": float(human_counts["rejected"])}
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
                "people": self.human_pairs.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.train.load_state_dict(state["train"])
        self.held_out.load_state_dict(state["held_out"])
        self.counts = collections.Counter(state["counts"])
        self.human_pairs.load_state_dict(state["people"])


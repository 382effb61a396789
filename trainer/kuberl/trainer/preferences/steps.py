"""Per-step records the rollout workers keep for the preference head, and segments cut from them.

A worker asked to record (`RolloutWorker(record_steps=True)`) adds `batch["steps"]` to each
off-policy batch: for each of its `num_steps` vector steps and each env copy, the observation the
action was chosen on, the action, the reward and `MEASURES` from the env's `info` (NaN where the env
does not report one). The learner cuts each env copy's consecutive steps into segments of
`segmentLength` steps (`SegmentCutter`), carrying a worker's remainder to its next batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Per-step info values recorded: what the teacher reads and what `kuberl preferences` shows.
MEASURES = ("arrivals", "instances", "latency_ms", "slo_violation", "utilisation", "dropped", "dropped_low_priority")


class StepRecorder:
    """One batch's per-step records, [num_steps, num_envs, ...] once `drain`ed."""

    def __init__(self) -> None:
        self.obs: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []
        self.measures: list[np.ndarray] = []

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, info: dict,
            ended: np.ndarray | None) -> None:
        """One vector step. For copies whose episode `ended` with it, the values are the final info's
        (a same-step autoreset put the reset's info in `info`)."""
        n = len(rewards)
        final = info.get("final_info") if ended is not None else None
        row = np.full((n, len(MEASURES)), np.nan, np.float32)
        for k, key in enumerate(MEASURES):
            if key in info:
                row[:, k] = np.asarray(info[key], np.float32).reshape(n)
            if isinstance(final, dict) and key in final:
                row[ended, k] = np.asarray(final[key], np.float32).reshape(n)[ended]
        self.obs.append(np.array(obs, np.float32))
        self.actions.append(np.asarray(actions).reshape(n, -1).astype(np.int64))
        self.rewards.append(np.asarray(rewards, np.float32))
        self.measures.append(row)

    def drain(self) -> dict[str, np.ndarray]:
        out = {"obs": np.stack(self.obs), "actions": np.stack(self.actions), "rewards": np.stack(self.rewards),
               "measures": np.stack(self.measures)}
        self.__init__()
        return out


class SegmentCutter:
    """Cuts each worker's recorded steps into segments of `length` consecutive steps per env copy."""

    def __init__(self, length: int):
        self.length = length
        self.pending: dict[Any, dict[str, np.ndarray]] = {}  # worker index -> steps not yet in a segment

    def cut(self, worker: Any, steps: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Segments [S, length, ...] (S = whole segments x env copies) from this worker's steps so far."""
        held = self.pending.get(worker)
        if held is not None and held["obs"].shape[1:] == steps["obs"].shape[1:]:
            steps = {k: np.concatenate([held[k], v]) for k, v in steps.items()}
        whole = len(steps["obs"]) // self.length
        self.pending[worker] = {k: v[whole * self.length:] for k, v in steps.items()}
        if whole == 0:
            return None
        out = {}
        for key, v in steps.items():
            v = v[: whole * self.length]
            # [whole*L, N, ...] -> [whole, L, N, ...] -> [whole, N, L, ...] -> [whole*N, L, ...]
            v = v.reshape(whole, self.length, *v.shape[1:]).swapaxes(1, 2)
            out[key] = v.reshape(-1, self.length, *v.shape[3:])
        return out

"""Greedy evaluation episodes spread over the rollout workers, and the summary every suite reports."""

from __future__ import annotations

from typing import Any

import numpy as np


def summarize(returns: list[float], lengths: list[int]) -> dict[str, Any]:
    arr = np.asarray(returns, dtype=np.float64)
    return {
        "episodes": int(len(arr)),
        "mean_return": float(arr.mean()) if len(arr) else None,
        "std_return": float(arr.std()) if len(arr) else None,
        "min_return": float(arr.min()) if len(arr) else None,
        "max_return": float(arr.max()) if len(arr) else None,
        "mean_length": float(np.mean(lengths)) if lengths else None,
    }


def greedy_episodes(workers, weights_ref, version: int, seeds: list[int],
                    env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one greedy episode per seed, the seeds dealt round-robin over the ready workers."""
    ready = workers.ready()
    if not ready:
        raise RuntimeError("no rollout worker is ready to evaluate")
    shares = {h.index: (weights_ref, version, seeds[i::len(ready)], env_kwargs or {}) for i, h in enumerate(ready)}
    results = workers.call("evaluate", {k: v for k, v in shares.items() if v[2]})
    returns = [r for res in results.values() for r in res["returns"]]
    lengths = [n for res in results.values() for n in res["lengths"]]
    summary = summarize(returns, lengths)
    policies = [name for res in results.values() for name in res.get("policies", [])]
    if policies:  # policy groups (environment.multiAgent.groups): each group's agents' mean return
        by_policy: dict[str, list[float]] = {}
        for name, value in zip(policies, returns, strict=True):
            by_policy.setdefault(name, []).append(value)
        summary["by_policy"] = {name: float(np.mean(values)) for name, values in sorted(by_policy.items())}
    return summary


def episodes_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    """Suite kind `episodes`: greedy episodes on `episodes` seeds from spec.evaluation.seed, with the
    suite's env kwargs over the spec's."""
    seeds = list(range(spec.evaluation.seed, spec.evaluation.seed + suite.episodes))
    return greedy_episodes(workers, weights_ref, version, seeds, suite.env_kwargs)

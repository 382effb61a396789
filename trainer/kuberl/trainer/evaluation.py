"""Final evaluation: deterministic episodes spread over the rollout workers, plus the spec's suites.

A suite kind maps to a runner; scenario-specific runners (opponents, baselines) register here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

SuiteRunner = Callable[..., dict[str, Any]]
SUITE_RUNNERS: dict[str, SuiteRunner] = {}


def register_suite(kind: str) -> Callable[[SuiteRunner], SuiteRunner]:
    def deco(fn: SuiteRunner) -> SuiteRunner:
        SUITE_RUNNERS[kind] = fn
        return fn

    return deco


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
    return summarize(returns, lengths)


@register_suite("episodes")
def _episodes_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    seeds = list(range(spec.evaluation.seed, spec.evaluation.seed + suite.episodes))
    return greedy_episodes(workers, weights_ref, version, seeds, suite.env_kwargs)


def evaluate(spec, workers, weights_ref, version: int) -> dict[str, Any]:
    ev = spec.evaluation
    seeds = list(range(ev.seed, ev.seed + ev.episodes))
    results: dict[str, Any] = {"deterministic": greedy_episodes(workers, weights_ref, version, seeds)}
    for suite in ev.suites:
        runner = SUITE_RUNNERS.get(suite.kind)
        if runner is None:
            _load_scenario_runners()
            runner = SUITE_RUNNERS.get(suite.kind)
        if runner is None:
            raise ValueError(f"spec.evaluation.suites[{suite.name}].kind: no runner for {suite.kind!r}; "
                             f"known: {', '.join(sorted(SUITE_RUNNERS))}")
        results[suite.name] = runner(spec, suite, workers, weights_ref, version)
    return results


def _load_scenario_runners() -> None:
    """Scenario modules register their runners on import."""
    try:
        import kuberl.trainer.scenario_eval  # noqa: F401
    except ModuleNotFoundError as err:
        if err.name != "kuberl.trainer.scenario_eval":
            raise

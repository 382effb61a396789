"""Final evaluation: greedy episodes spread over the rollout workers, then the spec's suites.

`SUITES` maps a suite's `kind` to the runner that plays it; each runner lives in this package
(plain episodes, Tic-Tac-Toe opponents, autoscaling baselines) and returns its suite's results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kuberl.trainer.evaluation.baselines import baseline_suite
from kuberl.trainer.evaluation.episodes import episodes_suite, greedy_episodes, summarize
from kuberl.trainer.evaluation.opponent import opponent_suite

SuiteRunner = Callable[..., dict[str, Any]]
SUITES: dict[str, SuiteRunner] = {
    "episodes": episodes_suite,
    "opponent": opponent_suite,
    "baseline": baseline_suite,
}


def evaluate(spec, workers, weights_ref, version: int) -> dict[str, Any]:
    """`deterministic` (spec.evaluation.episodes greedy episodes), then one entry per suite, by name."""
    settings = spec.evaluation
    seeds = list(range(settings.seed, settings.seed + settings.episodes))
    results: dict[str, Any] = {"deterministic": greedy_episodes(workers, weights_ref, version, seeds)}
    for suite in settings.suites:
        runner = SUITES.get(suite.kind)
        if runner is None:
            raise ValueError(f"spec.evaluation.suites[{suite.name}].kind: no runner for {suite.kind!r}; "
                             f"known: {', '.join(sorted(SUITES))}")
        results[suite.name] = runner(spec, suite, workers, weights_ref, version)
    return results


__all__ = ["SUITES", "evaluate", "greedy_episodes", "summarize"]

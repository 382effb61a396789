"""Autoscaling evaluation (suite kind `baseline`): non-learning policies (random, threshold) on the
seeds the learned policy is evaluated on, a threshold baseline grid-searched first on seeds of its own."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from kuberl.trainer.evaluation.episodes import summarize

#: The threshold grid searched when a suite does not fix upper/lower (pairs with lower >= upper skipped).
THRESHOLD_UPPERS = (0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1, 1.2)
THRESHOLD_LOWERS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_THRESHOLD_KEYS = ("upper", "lower", "tuning_episodes")
_MULTI_THRESHOLD_KEYS = (*_THRESHOLD_KEYS, "tier", "priority")
_RANDOM_KEYS = ("seed",)


def baseline_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    """A non-learning policy on the seeds the learned policy is evaluated on, so their means compare
    episode for episode. A threshold baseline not fully fixed by `baselineParams` is grid-searched first
    on separate tuning seeds (never the evaluation seeds)."""
    from kuberl.trainer.rollout import make_env

    field = f"spec.evaluation.suites[{suite.name}]"
    env_spec = spec.environment
    kwargs = {**env_spec.kwargs, **suite.env_kwargs}
    settings = spec.evaluation
    seeds = list(range(settings.seed, settings.seed + suite.episodes))

    def make():
        return make_env(env_spec.id, kwargs, env_spec.max_episode_steps)

    params = dict(suite.baseline_params)
    if suite.baseline == "random":
        _check_keys(f"{field}.baselineParams", params, _RANDOM_KEYS)
        seed = int(params.get("seed", settings.seed))
        env = make()
        try:
            returns, lengths = run_baseline(env, _RandomActions(env.action_space, seed), seeds)
        finally:
            env.close()
        return {"baseline": "random", "params": {"seed": seed}, **summarize(returns, lengths)}
    if suite.baseline == "threshold":
        multi = _is_multi(env_spec.id, field)
        _check_keys(f"{field}.baselineParams", params, _MULTI_THRESHOLD_KEYS if multi else _THRESHOLD_KEYS)
        tuning_episodes = int(params.pop("tuning_episodes", 5))
        # After every seed any suite evaluates on, so the tuning never sees an evaluation episode.
        first_tuning_seed = settings.seed + max([settings.episodes] + [s.episodes for s in settings.suites])
        tuning_seeds = list(range(first_tuning_seed, first_tuning_seed + tuning_episodes))
        chosen, tuned_return = tune_threshold(make, params, tuning_seeds, multi)
        env = make()
        try:
            returns, lengths = run_baseline(env, threshold_policy(chosen, multi), seeds)
        finally:
            env.close()
        result = {"baseline": "threshold", "params": chosen, **summarize(returns, lengths)}
        if tuned_return is not None:
            result.update(tuning_seeds=[tuning_seeds[0], tuning_seeds[-1]], tuning_mean_return=tuned_return)
        return result
    raise ValueError(f"{field}.baseline: required for kind baseline, got {suite.baseline!r}; "
                     "allowed values: random, threshold")


def run_baseline(env, policy, seeds: list[int]) -> tuple[list[float], list[int]]:
    """One episode per seed; `policy(obs, info)` sees the last info (action masks live there)."""
    returns, lengths = [], []
    for seed in seeds:
        obs, info = env.reset(seed=int(seed))
        total, steps, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy(obs, info))
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(steps)
    return returns, lengths


class _RandomActions:
    """Uniform over the action space (over the legal actions when the env gives a mask)."""

    def __init__(self, action_space, seed: int):
        self.space = action_space
        self.space.seed(seed)

    def __call__(self, obs, info: dict) -> Any:
        mask = info.get("action_mask")
        if mask is not None:
            return self.space.sample(mask=np.asarray(mask, np.int8))
        return self.space.sample()


def threshold_policy(params: dict[str, Any], multi: bool):
    from kuberl.trainer.envs.baselines import MultiThresholdPolicy, ThresholdPolicy

    if multi:
        policy = MultiThresholdPolicy(params["upper"], params["lower"], params["tier"], params["priority"])
    else:
        policy = ThresholdPolicy(params["upper"], params["lower"])
    return lambda obs, info: policy(obs)


def threshold_grid(env, fixed: dict[str, Any], multi: bool) -> list[dict[str, Any]]:
    """Every threshold setting to try: upper x lower (lower < upper), and tier x priority on
    AutoscalingMulti-v0, with the values in `fixed` held."""
    axes: dict[str, tuple] = {"upper": THRESHOLD_UPPERS, "lower": THRESHOLD_LOWERS}
    if multi:
        nvec = np.asarray(env.action_space.nvec)
        axes.update(tier=tuple(range(int(nvec[1]))), priority=tuple(range(int(nvec[2]))))
    for key, value in fixed.items():
        if key in axes:
            axes[key] = (value,)
    grid = [dict(zip(axes, values, strict=False)) for values in itertools.product(*axes.values())]
    grid = [params for params in grid if params["lower"] < params["upper"]]
    if not grid:
        raise ValueError(f"baselineParams: no threshold pair has lower < upper (upper={axes['upper']}, "
                         f"lower={axes['lower']})")
    return grid


def rank_thresholds(env, grid: list[dict[str, Any]], seeds: list[int], multi: bool) -> list[tuple[float, dict]]:
    """(mean return on `seeds`, settings) for every setting in `grid`, best first."""
    ranked = [(float(np.mean(run_baseline(env, threshold_policy(params, multi), seeds)[0])), params)
              for params in grid]
    return sorted(ranked, key=lambda item: -item[0])


def tune_threshold(make, fixed: dict[str, Any], seeds: list[int], multi: bool) -> tuple[dict[str, Any], float | None]:
    """The best settings on `seeds` over the grid of the values not in `fixed`: (settings, mean return),
    or (fixed settings, None) when there is nothing to search."""
    env = make()
    try:
        grid = threshold_grid(env, fixed, multi)
        if len(grid) == 1:
            return grid[0], None
        if not seeds:
            raise ValueError("baselineParams.tuning_episodes: must be >= 1 to grid-search thresholds")
        score, params = rank_thresholds(env, grid, seeds, multi)[0]
        return params, score
    finally:
        env.close()


def _is_multi(env_id: str, field: str) -> bool:
    from kuberl.trainer.envs import AUTOSCALING_ID, AUTOSCALING_MULTI_ID

    if env_id not in (AUTOSCALING_ID, AUTOSCALING_MULTI_ID):
        raise ValueError(f"{field}.baseline: threshold needs {AUTOSCALING_ID} or {AUTOSCALING_MULTI_ID}, "
                         f"got spec.environment.id {env_id!r}; the random baseline works on any env")
    return env_id == AUTOSCALING_MULTI_ID


def _check_keys(field: str, params: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in params:
        if key not in allowed:
            raise ValueError(f"{field}: key {key!r} is not allowed; allowed keys: {', '.join(allowed)}")

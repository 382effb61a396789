"""Scenario evaluation suites: runners for `spec.evaluation.suites` kinds beyond plain episodes.

Importing this module registers them with `evaluation.register_suite`. One section per scenario:
Tic-Tac-Toe opponent games, and autoscaling baselines.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from kuberl.trainer.evaluation import register_suite, summarize

# ============================================================================================
# Tic-Tac-Toe: games against an opponent (kind: opponent)
# ============================================================================================


@register_suite("opponent")
def opponent_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    """`episodes` games of the greedy policy on one rollout worker: against a uniform-random
    opponent, moving first or second as `agentFirst` says (default first), or against itself."""
    from kuberl.trainer.envs import TICTACTOE_ID

    field = f"spec.evaluation.suites[{suite.name}]"
    if spec.environment.id != TICTACTOE_ID:
        raise ValueError(f"{field}.kind: opponent needs a two-player env ({TICTACTOE_ID}), "
                         f"got spec.environment.id {spec.environment.id!r}")
    if suite.opponent is None:
        raise ValueError(f"{field}.opponent: required for kind opponent; allowed values: random, self")
    ready = workers.ready()
    if not ready:
        raise RuntimeError("no rollout worker is ready to evaluate")
    agent_first = True if suite.agent_first is None else suite.agent_first
    args = (_worker_games, weights_ref, version, suite.opponent.value, agent_first, suite.episodes,
            spec.evaluation.seed)
    results = workers.call("run", {ready[0].index: args})
    if not results:
        raise RuntimeError(f"{field}: the rollout worker playing the games died")
    return next(iter(results.values()))


def _worker_games(worker, params, version: int, opponent: str, agent_first: bool, games: int,
                  seed: int) -> dict[str, Any]:
    """On a rollout worker: load the final weights, then play with a cached greedy copy of its policy."""
    from kuberl.trainer.selfplay import FrozenOpponent

    worker.set_weights(params, version)
    policy = FrozenOpponent()
    policy.refresh(worker.policy, version)
    return opponent_games(policy, opponent, agent_first, games, seed)


def opponent_games(policy, opponent: str, agent_first: bool, games: int, seed: int) -> dict[str, Any]:
    """Win/draw/loss counts and rates of `policy(obs, mask) -> cell` from the agent's side.

    opponent "random": uniform over free cells (seeded), the agent moving first or second.
    opponent "self": the policy plays both sides; the agent is X when `agent_first`, else O
    (a deterministic policy plays the same game every time: all draws means it holds itself).
    """
    from kuberl.trainer.envs.tictactoe import evaluate_self_play, evaluate_vs_random

    if opponent == "random":
        counts = evaluate_vs_random(policy, games=games, agent_first=agent_first, seed=seed)
        extra: dict[str, Any] = {}
    elif opponent == "self":
        sides = evaluate_self_play(policy, games=games)
        mine, theirs = ("x_win", "o_win") if agent_first else ("o_win", "x_win")
        counts = {"win": sides[mine], "draw": sides["draw"], "loss": sides[theirs]}
        extra = {"x_wins": sides["x_win"], "o_wins": sides["o_win"]}
    else:
        raise ValueError(f"opponent={opponent!r} is not allowed; allowed values: random, self")
    return {
        "opponent": opponent, "agent_first": agent_first, "games": games,
        "wins": counts["win"], "draws": counts["draw"], "losses": counts["loss"],
        "win_rate": counts["win"] / games, "draw_rate": counts["draw"] / games,
        "loss_rate": counts["loss"] / games, **extra,
    }


# ============================================================================================
# Autoscaling: baseline policies on the policy's evaluation seeds (kind: baseline)
# ============================================================================================

#: The threshold grid searched when a suite does not fix upper/lower (pairs with lower >= upper skipped).
THRESHOLD_UPPERS = (0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1, 1.2)
THRESHOLD_LOWERS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_THRESHOLD_KEYS = ("upper", "lower", "tuning_episodes")
_MULTI_THRESHOLD_KEYS = (*_THRESHOLD_KEYS, "tier", "priority")
_RANDOM_KEYS = ("seed",)


@register_suite("baseline")
def baseline_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    """A non-learning policy on the seeds the learned policy is evaluated on, so their means compare
    episode for episode. A threshold baseline not fully fixed by `baselineParams` is grid-searched first
    on separate tuning seeds (never the evaluation seeds)."""
    from kuberl.trainer.rollout import make_env

    field = f"spec.evaluation.suites[{suite.name}]"
    env_spec = spec.environment
    kwargs = {**env_spec.kwargs, **suite.env_kwargs}
    ev = spec.evaluation
    seeds = list(range(ev.seed, ev.seed + suite.episodes))

    def make():
        return make_env(env_spec.id, kwargs, env_spec.max_episode_steps)

    params = dict(suite.baseline_params)
    if suite.baseline == "random":
        _check_keys(f"{field}.baselineParams", params, _RANDOM_KEYS)
        seed = int(params.get("seed", ev.seed))
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
        first_tuning_seed = ev.seed + max([ev.episodes] + [s.episodes for s in ev.suites])
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
    grid = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
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

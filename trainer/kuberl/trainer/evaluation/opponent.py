"""Tic-Tac-Toe evaluation (suite kind `opponent`): games of the greedy policy against a
uniform-random opponent or against itself."""

from __future__ import annotations

from typing import Any


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

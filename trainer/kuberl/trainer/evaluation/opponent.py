"""Tic-Tac-Toe evaluation (suite kind `opponent`): games of the greedy policy against a
uniform-random opponent or against itself."""

from __future__ import annotations

from typing import Any


def opponent_suite(spec, suite, workers, weights_ref, version) -> dict[str, Any]:
    """`episodes` games of the greedy policy on one rollout worker: against a uniform-random
    opponent, moving first or second as `agentFirst` says (default first), or against itself."""
    from kuberl.trainer.envs import TICTACTOE_ID

    field = f"spec.evaluation.suites[{suite.name}]"
    from kuberl.api.job import AgentPolicies

    multi_agent = spec.environment.multi_agent
    self_play = multi_agent is not None and multi_agent.policies == AgentPolicies.SELF_PLAY
    if spec.environment.id != TICTACTOE_ID and not self_play:
        raise ValueError(f"{field}.kind: opponent needs a two-player env ({TICTACTOE_ID}, or a PettingZoo game "
                         f"under environment.multiAgent.policies: selfPlay), got spec.environment.id "
                         f"{spec.environment.id!r}")
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
    if worker.evaluator.multi_agent is not None:
        return _tally(opponent, agent_first, games, seat_games(worker.evaluator, policy, opponent, agent_first,
                                                               games, seed), {})
    return opponent_games(policy, opponent, agent_first, games, seed)


def seat_games(evaluator, policy, opponent: str, agent_first: bool, games: int, seed: int) -> dict[str, int]:
    """A PettingZoo game under self-play: the greedy policy in the first seat (`agent_first`) or the second,
    against uniformly random moves or against itself, on env copies of the evaluation's own."""
    from kuberl.trainer.envs.resolve import agents_vector
    from kuberl.trainer.envs.selfplay_agents import play_games

    if opponent not in ("random", "self"):
        raise ValueError(f"opponent={opponent!r} is not allowed; allowed values: random, self")
    env = agents_vector(evaluator.env_id, evaluator.env_kwargs, evaluator.multi_agent, min(games, 64),
                        evaluator.max_episode_steps, seat=0 if agent_first else 1)
    env.opponents.epsilon = 0.0
    if opponent == "self":
        env.set_opponent_policy(policy)
    try:
        return play_games(env, policy, games, seed)
    finally:
        env.close()


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
    return _tally(opponent, agent_first, games, counts, extra)


def _tally(opponent: str, agent_first: bool, games: int, counts: dict[str, int], extra: dict[str, Any]
           ) -> dict[str, Any]:
    return {
        "opponent": opponent, "agent_first": agent_first, "games": games,
        "wins": counts["win"], "draws": counts["draw"], "losses": counts["loss"],
        "win_rate": counts["win"] / games, "draw_rate": counts["draw"] / games,
        "loss_rate": counts["loss"] / games, **extra,
    }

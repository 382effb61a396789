"""Self-play in any PettingZoo env (`environment.multiAgent.policies: selfPlay`): the learner plays one agent of
each game and frozen past versions of its policy play the others.

Each copy of the env is one entry of the rollout worker's vector env, so the samplers, PPO, DQN and the
evaluation see a one-agent env: its observation is the learner's agent's, its reward what that agent earned
since its last move (the others' moves in between are part of the step), its episode the learner's game.
The learner's seat goes round the env's `possible_agents` game by game (copy c starts at seat c), so it
learns every side. Env steps count the learner's own moves.

The opponents: the rollout worker installs a greedy copy of its acting policy (`set_opponent_policy`, by
kuberl.trainer.selfplay, which replaces it `refresh_updates` gradient updates later), and
`opponent_epsilon` of their moves are uniformly random among the legal ones. Until a copy is installed (and
always in evaluation, whose envs get none) every opponent move is random: the evaluation's return is the
greedy policy's against uniformly random opponents, in every seat.

The env is driven through PettingZoo's AEC API, which turn-based games (classic/tictactoe-v3, chess)
have; a parallel env goes through PettingZoo's own `parallel_to_aec`. Opponent moves are asked for all
copies at once: one forward pass per round of moves. Numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from kuberl.trainer.envs.multiagent import AgentEncoding, MultiAgentEnvError, same_spaces

POLICIES_FIELD = "spec.environment.multiAgent.policies"
#: Opponent moves one learner move may wait for: a game whose turn never comes back to the learner's agent
#: is refused, not played forever.
MAX_OPPONENT_ROUNDS = 10_000


def as_aec(env: Any) -> Any:
    """A PettingZoo AEC env from what a factory returned: AEC as is, parallel through PettingZoo's conversion."""
    from pettingzoo import AECEnv, ParallelEnv
    from pettingzoo.utils.conversions import parallel_to_aec

    if isinstance(env, AECEnv):
        return env
    if isinstance(env, ParallelEnv):
        return parallel_to_aec(env)
    raise MultiAgentEnvError(f"environment.multiAgent needs a PettingZoo env, and the factory returned a "
                             f"{type(env).__name__}: name the env module's env (or parallel_env) as module:factory")


class SelfPlayAgents:
    """`copies` games of a PettingZoo env, the learner's agent of each one entry (see the module's text).

    Takes the vector env's calls the samplers make: reset(seed=[one per copy]), step(actions), close();
    `single_observation_space`, `single_action_space`, `num_envs`; and the self-play protocol's
    `set_opponent_policy` and `self_play_refresh_updates`."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, make: Callable[[], Any], copies: int, agent_id_in_observation: bool = False,
                 max_episode_steps: int | None = None, refresh_updates: int = 100, opponent_epsilon: float = 0.5,
                 seat: int | None = None):
        """`seat`: the learner's agent (its index in possible_agents) in every game, where an evaluation
        asks for one; None: the seats taken in turn."""
        self.games = [as_aec(make()) for _ in range(copies)]
        # The state read from the env itself: through PettingZoo's wrappers every attribute costs three
        # __getattr__ hops, most of a step's time. Moves and observations still go through the wrappers.
        self.raw = [game.unwrapped for game in self.games]
        first = self.games[0]
        self.agents = list(first.possible_agents)
        self.single_action_space = _action_space(first, self.agents)
        self.encoding = AgentEncoding(first.observation_space(self.agents[0]), len(self.agents),
                                      agent_id_in_observation)
        self.single_observation_space = self.encoding.space
        self.n_actions = int(self.single_action_space.n)
        self.num_envs = self.copies = copies
        self.max_episode_steps = max_episode_steps
        self.self_play_refresh_updates = refresh_updates
        self.opponents = Opponents(self.encoding, self.n_actions, copies, opponent_epsilon)
        if seat is not None and not 0 <= seat < len(self.agents):
            raise MultiAgentEnvError(f"seat {seat}: the env has {len(self.agents)} agents", POLICIES_FIELD)
        self.fixed_seat = seat
        self.seats = np.arange(copies) % len(self.agents)  # the learner's agent index in each copy
        if seat is not None:
            self.seats[:] = seat
        self.steps = np.zeros(copies, np.int64)
        self.obs = np.zeros((copies, self.encoding.width), np.float32)
        self.masks = np.ones((copies, self.n_actions), bool)

    def set_opponent_policy(self, policy: Any) -> None:
        """Install the frozen policy the opponents play greedily (kuberl.trainer.selfplay.FrozenOpponent)."""
        self.opponents.policy = policy

    def reset(self, *, seed: list[int] | int | None = None, options: dict | None = None):
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + c for c in range(self.copies)]
        for copy, game in enumerate(self.games):
            if seeds[copy] is not None:
                self.opponents.rngs[copy] = np.random.default_rng(seeds[copy])
                if self.fixed_seat is None:
                    self.seats[copy] = copy % len(self.agents)
            game.reset(seed=seeds[copy], options=options)
            self.steps[copy] = 0
        self._to_the_learner(range(self.copies))
        for copy in range(self.copies):
            self._take(copy, self._learner_last(copy)[0])
        return self.obs.copy(), self._info()

    def step(self, actions: np.ndarray):
        rewards = np.zeros(self.copies, np.float64)
        terminated = np.zeros(self.copies, bool)
        truncated = np.zeros(self.copies, bool)
        for copy, game in enumerate(self.games):
            game.step(int(actions[copy]))
            self.steps[copy] += 1
        self._to_the_learner(range(self.copies))
        final_obs = np.empty(self.copies, dtype=object)
        ended = np.zeros(self.copies, bool)
        final_masks = self.masks.copy()
        for copy in range(self.copies):
            obs, reward, term, trunc = self._learner_last(copy)
            rewards[copy] = reward
            out_of_time = self.max_episode_steps is not None and self.steps[copy] >= self.max_episode_steps
            terminated[copy] = term
            truncated[copy] = not term and (trunc or out_of_time)
            self._take(copy, obs)
            if term or truncated[copy]:
                ended[copy], final_obs[copy], final_masks[copy] = True, self.obs[copy].copy(), self.masks[copy]
        if ended.any():
            restarted = np.flatnonzero(ended)
            for copy in restarted:
                if self.fixed_seat is None:
                    self.seats[copy] = (self.seats[copy] + 1) % len(self.agents)
                self.games[copy].reset()
                self.steps[copy] = 0
            self._to_the_learner(restarted)
            for copy in restarted:
                self._take(copy, self._learner_last(copy)[0])
            extra = {"final_obs": final_obs, "_final_obs": ended, "final_info": {"action_mask": final_masks}}
        else:
            extra = {}
        return self.obs.copy(), rewards, terminated, truncated, self._info(extra)

    # ---- the opponents' moves ------------------------------------------------------------------------

    def _to_the_learner(self, copies: Any) -> None:
        """Play the other agents of each copy in `copies` until it is the learner's agent's turn (or its game
        is over for it): an agent done steps out (PettingZoo's `step(None)`), one still in moves; the moves of
        one round asked of the frozen policy in one batch."""
        waiting = list(copies)
        for _ in range(MAX_OPPONENT_ROUNDS):
            movers: list[tuple[int, int, Any]] = []
            for copy in waiting:
                game, raw, seat = self.games[copy], self.raw[copy], self.agents[self.seats[copy]]
                while seat in raw.agents and raw.agent_selection != seat:
                    agent = raw.agent_selection
                    if raw.terminations[agent] or raw.truncations[agent]:
                        game.step(None)
                        continue
                    movers.append((copy, self.agents.index(agent), game.observe(agent)))
                    break
            if not movers:
                return
            for (copy, _, _), move in zip(movers, self.opponents(movers), strict=True):
                self.games[copy].step(int(move))
            waiting = [copy for copy, _, _ in movers]
        raise MultiAgentEnvError(f"the learner's agent got no turn in {MAX_OPPONENT_ROUNDS} of the others' moves: "
                                 "self-play needs a game that comes back to every agent", POLICIES_FIELD)

    # ---- the learner's side --------------------------------------------------------------------------

    def _learner_last(self, copy: int) -> tuple[Any, float, bool, bool]:
        """The learner's agent's observation, the reward it earned since its last move, and whether its game
        ended (terminated, truncated). An agent the env dropped without a word ended truncated."""
        raw, seat = self.raw[copy], self.agents[self.seats[copy]]
        if seat not in raw.agents:
            return None, 0.0, False, True
        # What PettingZoo's last() says of the agent selected, which _to_the_learner made the learner's.
        return (self.games[copy].observe(seat), float(raw._cumulative_rewards[seat]),  # noqa: SLF001
                bool(raw.terminations[seat]), bool(raw.truncations[seat]))

    def _take(self, copy: int, obs: Any) -> None:
        if obs is None:  # a dropped agent: its last observation stands
            return
        row, mask = self.encoding.row(obs, int(self.seats[copy]))
        self.obs[copy] = row
        self.masks[copy] = mask if mask is not None and mask.any() else True

    def _info(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"seat": self.seats.copy()}
        if self.encoding.masked:
            info["action_mask"] = self.masks.copy()
        return {**info, **(extra or {})}

    def close(self) -> None:
        for game in self.games:
            game.close()


def _action_space(game: Any, agents: list[str]) -> gym.spaces.Discrete:
    """The one action space of the game's agents; a game self-play cannot use is refused, saying why."""
    if len(agents) < 2:
        raise MultiAgentEnvError(f"self-play needs a game of two or more agents, and this env has {agents}: use "
                                 "policies: shared", POLICIES_FIELD)
    same_spaces(game, agents, "a frozen copy of the learner's policy plays every other agent", POLICIES_FIELD)
    space = game.action_space(agents[0])
    if not isinstance(space, gym.spaces.Discrete):
        raise MultiAgentEnvError(f"self-play needs a Discrete action space, and the agents act in {space}: use "
                                 "policies: shared", POLICIES_FIELD)
    return space


class Opponents:
    """The moves of the agents the learner does not play, for a round of games at once: the frozen policy's
    greedy moves (one forward pass), `epsilon` of them uniformly random among the legal ones instead (each game
    its own random stream, seeded by its reset), all random while no policy is installed."""

    def __init__(self, encoding: AgentEncoding, n_actions: int, copies: int, epsilon: float):
        self.encoding, self.n_actions, self.epsilon = encoding, n_actions, float(epsilon)
        self.policy: Any = None  # the frozen policy: .batch(obs rows, masks) -> actions
        self.rngs = [np.random.default_rng(c) for c in range(copies)]
        self.moves = 0  # the opponents' moves so far, random or not

    def __call__(self, movers: list[tuple[int, int, Any]]) -> np.ndarray:
        """One move for each (copy, agent index, observation) of `movers`."""
        rows = np.zeros((len(movers), self.encoding.width), np.float32)
        masks = np.ones((len(movers), self.n_actions), bool)
        moves = np.zeros(len(movers), np.int64)
        frozen = np.zeros(len(movers), bool)
        for k, (copy, index, obs) in enumerate(movers):
            row, mask = self.encoding.row(obs, index)
            rows[k] = row
            if mask is not None and mask.any():
                masks[k] = mask
            rng = self.rngs[copy]
            if self.policy is None or rng.random() < self.epsilon:
                moves[k] = rng.choice(np.flatnonzero(masks[k]))
            else:
                frozen[k] = True
        if frozen.any():
            moves[frozen] = self.policy.batch(rows[frozen], masks[frozen])
        self.moves += len(movers)
        return moves


def play_games(env: SelfPlayAgents, policy: Any, games: int, seed: int) -> dict[str, int]:
    """`games` games of `policy` (`.batch(obs, masks) -> actions`, greedy) on `env` as it is set up (its seat,
    its opponents), counted from the policy's side: a positive return is a win, a negative one a loss."""
    counts = {"win": 0, "draw": 0, "loss": 0}
    obs, info = env.reset(seed=[seed + c for c in range(env.num_envs)])
    total = np.zeros(env.num_envs)
    played = 0
    while played < games:
        obs, reward, terminated, truncated, info = env.step(policy.batch(obs, info.get("action_mask", env.masks)))
        total += reward
        for copy in np.flatnonzero(terminated | truncated):
            if played < games:
                counts["win" if total[copy] > 0 else "loss" if total[copy] < 0 else "draw"] += 1
                played += 1
            total[copy] = 0.0
    return counts

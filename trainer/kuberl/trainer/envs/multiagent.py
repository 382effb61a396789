"""PettingZoo environments as the rollout workers' vector env: each agent of each copy is one entry.

A shared policy (parameter sharing) acts for every agent, so `copies` copies of an env with `n`
agents step as one gymnasium-style vector env of `copies * n` entries, ordered copy by copy and,
within a copy, in the env's `possible_agents` order. The samplers, PPO's advantages and DQN's
replay then treat an agent's steps as they treat an env's: an agent's episode is its steps from the
copy's reset to its own end.

With policy groups (environment.multiAgent.groups) the entries are the same, and each belongs to its
agent's group: agents of one group share their spaces, groups need not. An entry's observation row is
its group's encoding, zero-padded to the widest group's; the action space is the largest group's
Discrete, and a group with fewer actions has the others masked. The acting policy and the learner split
the entries by group (`AgentGroup`), so each group's policy sees only its own rows, widths and actions.

PettingZoo lets agents leave before the others (an agent killed in a battle). An entry whose agent
has gone is not alive until its copy resets: `info["alive"]` says which entries' agents act this
step; the sampler neither counts nor trains on the others. A copy resets when its last agent ends,
or at `max_episode_steps` (every agent still in it truncated), in the same step, as gymnasium's
`AutoresetMode.SAME_STEP` does: an ended agent's last observation is in `info["final_obs"]`.

An AEC env is taken through PettingZoo's own `aec_to_parallel`, which refuses one whose agents do not
all act before the env updates (a turn-based game); its message is passed on. An env whose agents
differ in their spaces cannot share one policy, and is refused naming the agents and their spaces.

Imports numpy and gymnasium here, PettingZoo when an env is built: rollout workers never load torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

#: A classic PettingZoo env's observation: a dict of these two keys (the legal moves as a 0/1 vector).
OBSERVATION, ACTION_MASK = "observation", "action_mask"


class MultiAgentEnvError(ValueError):
    """The PettingZoo env cannot be trained with one shared policy, and why; `field`: the job's field to change."""

    def __init__(self, message: str, field: str = "spec.environment.id"):
        super().__init__(message)
        self.field = field


def as_parallel(env: Any) -> Any:
    """A PettingZoo parallel env from what a factory returned: parallel as is, AEC through PettingZoo's
    conversion; anything else refused."""
    from pettingzoo import AECEnv, ParallelEnv
    from pettingzoo.utils.conversions import aec_to_parallel

    if isinstance(env, ParallelEnv):
        return env
    if isinstance(env, AECEnv):
        try:
            return aec_to_parallel(env)
        except AssertionError as err:  # PettingZoo's own refusal of a turn-based env
            raise MultiAgentEnvError(f"PettingZoo cannot run this AEC env in parallel: {err}") from None
    raise MultiAgentEnvError(f"environment.multiAgent needs a PettingZoo env, and the factory returned a "
                             f"{type(env).__name__}: name the env module's parallel_env (or env) as module:factory")


class AgentEncoding:
    """How one agent's observation becomes a float row: a Box flattened, a Discrete one-hot, the legal-move
    mask of a classic env's dict taken out, and the agent's one-hot index appended when asked."""

    def __init__(self, obs_space: gym.Space, n_agents: int, agent_id: bool):
        self.masked = isinstance(obs_space, gym.spaces.Dict) and set(obs_space.spaces) == {OBSERVATION, ACTION_MASK}
        inner = obs_space[OBSERVATION] if self.masked else obs_space
        self.one_hot = int(inner.n) if isinstance(inner, gym.spaces.Discrete) else 0
        if isinstance(inner, gym.spaces.Discrete):
            low, high = np.zeros(self.one_hot, np.float32), np.ones(self.one_hot, np.float32)
        elif isinstance(inner, gym.spaces.Box):
            low, high = np.asarray(inner.low, np.float32).ravel(), np.asarray(inner.high, np.float32).ravel()
        else:
            raise MultiAgentEnvError(f"an agent's observation space is {inner}; KubeRL takes a Box or a Discrete (or "
                                     f"a dict of '{OBSERVATION}' as one of those and '{ACTION_MASK}')")
        self.n_agents, self.agent_id = n_agents, agent_id
        if agent_id:
            low, high = np.concatenate([low, np.zeros(n_agents, np.float32)]), \
                np.concatenate([high, np.ones(n_agents, np.float32)])
        self.space = gym.spaces.Box(low, high, dtype=np.float32)
        self.width = int(low.size)

    def row(self, obs: Any, index: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(the agent's observation row, its legal-move mask or None)."""
        mask = None
        if self.masked:
            obs, mask = obs[OBSERVATION], np.asarray(obs[ACTION_MASK], bool)
        flat = np.eye(self.one_hot, dtype=np.float32)[int(obs)] if self.one_hot else np.asarray(obs, np.float32).ravel()
        if self.agent_id:
            flat = np.concatenate([flat, np.eye(self.n_agents, dtype=np.float32)[index]])
        return flat, mask


@dataclass(frozen=True)
class AgentGroup:
    """One policy's agents: its name, the agents' indices in possible_agents, and the spaces its policy acts in
    (the agents' encoded observation, their action space)."""

    name: str
    agents: tuple[int, ...]
    observation_space: gym.Space
    action_space: gym.Space


def agent_groups(env: Any, agents: list[str], groups: dict[str, list[str]] | None,
                 agent_id: bool) -> tuple[list[AgentGroup], list[AgentEncoding]]:
    """The policy groups (one, "shared", without `groups`) and each agent's encoding. Every agent in exactly one
    group, and the agents of a group in the same spaces; refused naming the field otherwise."""
    field = "spec.environment.multiAgent.groups"
    if groups is None:
        same_spaces(env, agents, "one shared policy (environment.multiAgent.policies: shared) acts for every agent",
                    "spec.environment.multiAgent.policies")
        named = {"shared": list(agents)}
    else:
        named = groups
        listed = [a for members in named.values() for a in members]
        unknown = sorted(set(listed) - set(agents))
        twice = sorted({a for a in listed if listed.count(a) > 1})
        missing = [a for a in agents if a not in listed]
        for what, names in (("are not agents of the env", unknown), ("are in more than one group", twice),
                            ("are in no group", missing)):
            if names:
                raise MultiAgentEnvError(f"agents {names} {what}: list each of the env's possible_agents {agents} "
                                         "in exactly one group", field)
    out: list[AgentGroup] = []
    encodings: dict[int, AgentEncoding] = {}
    for name, members in named.items():
        if groups is not None:
            same_spaces(env, members, f"the agents of group {name!r} share its policy", field)
        encoding = AgentEncoding(env.observation_space(members[0]), len(members), agent_id)
        action = env.action_space(members[0])
        if groups is not None and not isinstance(action, gym.spaces.Discrete):
            raise MultiAgentEnvError(f"group {name!r} acts in {action}: policies: groups takes Discrete action "
                                     "spaces", field)
        indices = tuple(agents.index(a) for a in members)
        encodings.update({i: encoding for i in indices})
        out.append(AgentGroup(name, indices, encoding.space, action))
    return out, [encodings[i] for i in range(len(agents))]


class AgentEntries:
    """`copies` copies of a PettingZoo parallel env as one vector env of agents (see the module's text).

    Takes the vector env's calls the samplers make: reset(seed=[one per copy]), step(actions) with one
    action per entry, close(); `single_observation_space`, `single_action_space`, `num_envs`; `groups`, the
    policy groups its entries belong to (one without `groups`: the shared policy's).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, make: Callable[[], Any], copies: int, agent_id_in_observation: bool = False,
                 max_episode_steps: int | None = None, groups: dict[str, list[str]] | None = None):
        self.parallel_envs = [as_parallel(make()) for _ in range(copies)]  # not `envs`: that is a SyncVectorEnv's
        first = self.parallel_envs[0]
        self.agents = list(first.possible_agents)
        if not self.agents:
            raise MultiAgentEnvError("the env has no possible_agents")
        self.groups, self.encodings = agent_groups(first, self.agents, groups, agent_id_in_observation)
        #: Each agent's index within its group (its one-hot index with agentIdInObservation).
        self.index_in_group = [g.agents.index(i) for i in range(len(self.agents))
                               for g in self.groups if i in g.agents]
        #: Each agent's action count (its group's Discrete n; 0 for other action spaces).
        self.actions_of = [int(getattr(g.action_space, "n", 0)) for i in range(len(self.agents))
                           for g in self.groups if i in g.agents]
        self.single_observation_space, self.single_action_space = self._entry_spaces()
        self.n_agents, self.copies = len(self.agents), copies
        self.num_envs = copies * self.n_agents
        self.max_episode_steps = max_episode_steps
        self.steps = np.zeros(copies, np.int64)
        width = int(self.single_observation_space.shape[0])
        self.obs = np.zeros((self.num_envs, width), np.float32)
        self.alive = np.zeros(self.num_envs, bool)
        self.masks = self._entry_masks()

    def _entry_spaces(self) -> tuple[gym.Space, gym.Space]:
        """One group: its own spaces. Several: the widest observation row, and the largest Discrete."""
        if len(self.groups) == 1:
            return self.groups[0].observation_space, self.groups[0].action_space
        width = max(int(g.observation_space.shape[0]) for g in self.groups)
        n = max(int(g.action_space.n) for g in self.groups)
        return gym.spaces.Box(-np.inf, np.inf, (width,), np.float32), gym.spaces.Discrete(n)

    def _entry_masks(self) -> np.ndarray | None:
        """Every entry's legal moves, where any group has a mask (a classic env) or fewer actions than the others."""
        space = self.single_action_space
        n = int(space.n) if isinstance(space, gym.spaces.Discrete) else 0
        sizes = {int(g.action_space.n) for g in self.groups} if n else set()
        if not (any(e.masked for e in self.encodings) or len(sizes) > 1):
            return None
        masks = np.zeros((self.num_envs, n), bool)
        for slot in range(self.num_envs):
            masks[slot, :self.actions_of[slot % self.n_agents]] = True
        return masks

    def _entries(self, copy: int) -> range:
        return range(copy * self.n_agents, (copy + 1) * self.n_agents)

    def _take(self, copy: int, observations: dict[str, Any]) -> None:
        """A copy's observations after its reset: every agent in them alive, the others not."""
        for i, slot in enumerate(self._entries(copy)):
            agent = self.agents[i]
            self.alive[slot] = agent in observations
            if agent in observations:
                self._set_obs(slot, observations[agent], i)
            else:
                self.obs[slot] = 0.0
        self.steps[copy] = 0

    def _set_obs(self, slot: int, obs: Any, index: int) -> None:
        row, mask = self.encodings[index].row(obs, self.index_in_group[index])
        self.obs[slot, :row.size] = row
        if self.masks is not None:
            self.masks[slot, :self.actions_of[index]] = mask if mask is not None and mask.any() else True

    def _info(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"alive": self.alive.copy()}
        if self.masks is not None:
            info["action_mask"] = self.masks.copy()
        return {**info, **(extra or {})}

    def reset(self, *, seed: list[int] | int | None = None, options: dict | None = None):
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + c for c in range(self.copies)]
        for copy, env in enumerate(self.parallel_envs):
            observations, _ = env.reset(seed=seeds[copy], options=options)
            self._unknown_agents(observations)
            self._take(copy, observations)
        return self.obs.copy(), self._info()

    def step(self, actions: np.ndarray):
        rewards = np.zeros(self.num_envs, np.float64)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        ended = np.zeros(self.num_envs, bool)
        final_obs = np.empty(self.num_envs, dtype=object)
        final_masks = None if self.masks is None else self.masks.copy()
        acting = self.alive.copy()  # the entries whose agents act in this step: info["alive"] of the last call
        for copy, env in enumerate(self.parallel_envs):
            slots = self._entries(copy)
            moves = {self.agents[i]: actions[slot] for i, slot in enumerate(slots) if acting[slot]}
            observations, reward, term, trunc, _ = env.step(moves)
            self._unknown_agents(observations)
            self.steps[copy] += 1
            out_of_time = self.max_episode_steps is not None and self.steps[copy] >= self.max_episode_steps
            still_in = set(env.agents)
            for i, slot in enumerate(slots):
                agent = self.agents[i]
                if not acting[slot]:
                    continue
                rewards[slot] = float(reward.get(agent, 0.0))
                if agent in observations:
                    self._set_obs(slot, observations[agent], i)
                terminated[slot] = bool(term.get(agent, False))
                # An agent the env dropped without a word ends as truncated, as one out of time does.
                truncated[slot] = not terminated[slot] and (bool(trunc.get(agent, False)) or out_of_time
                                                             or agent not in still_in)
                if terminated[slot] or truncated[slot]:
                    ended[slot], final_obs[slot], self.alive[slot] = True, self.obs[slot].copy(), False
                    if final_masks is not None:
                        final_masks[slot] = self.masks[slot]
            if not self.alive[slots.start:slots.stop].any():
                observations, _ = env.reset()
                self._unknown_agents(observations)
                self._take(copy, observations)
        extra: dict[str, Any] = {}
        if ended.any():
            extra.update({"final_obs": final_obs, "_final_obs": ended})
            if final_masks is not None:
                extra["final_info"] = {ACTION_MASK: final_masks}
        return self.obs.copy(), rewards, terminated, truncated, self._info(extra)

    def _unknown_agents(self, observations: dict[str, Any]) -> None:
        unknown = set(observations) - set(self.agents)
        if unknown:
            raise MultiAgentEnvError(f"agents {sorted(unknown)} are not in the env's possible_agents "
                                     f"{self.agents}: KubeRL needs every agent listed there from the start")

    def close(self) -> None:
        for env in self.parallel_envs:
            env.close()


def same_spaces(env: Any, agents: list[str], why: str, field: str) -> None:
    """One policy acts for every agent (`why` says how): every agent must see and act in the same spaces."""
    first = agents[0]
    for agent in agents[1:]:
        for what, space in (("observation", env.observation_space), ("action", env.action_space)):
            if space(agent) != space(first):
                raise MultiAgentEnvError(
                    f"agents {first!r} and {agent!r} have different {what} spaces ({space(first)} and "
                    f"{space(agent)}): {why}, which needs one observation and one action space for every "
                    "agent", field)

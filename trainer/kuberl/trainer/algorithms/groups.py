"""Policy groups (environment.multiAgent.policies: groups): one learner state per group of agents.

Each group has an algorithm of its own (the job's algorithm, PPO or DQN, and hyperparameters, built for the
group's own observation and action spaces): its networks, its optimizer, its random streams, its replay (DQN)
and its gradient updates. An iteration's batches hold every agent's steps (kuberl.trainer.envs.multiagent:
entry c of a worker's vector env is agent `c % n_agents`); each group learns from its agents' share alone (PPO's
[steps, entries] columns, DQN's transitions by the entry that made them), cut to its own observation width and
actions, so a group's update is the one its algorithm would make if its agents' steps were all it had seen.
What the workers act with is each group's policy on its agents' rows (kuberl.trainer.policies.groups). Returns
are reported per group as well as over all agents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kuberl.trainer.algorithms.base import Algorithm, LearnStats
from kuberl.trainer.metrics import POLICY_RETURN_PREFIX
from kuberl.trainer.policies.groups import PREFIX, group_config
from kuberl.trainer.spaces import SpaceInfo

#: A group's mean return in a metrics row: `mean_return/<group>` (TensorBoard: rollout/mean_return/<group>).
RETURN_KEY = POLICY_RETURN_PREFIX + "{}"


class PolicyGroups(Algorithm):
    """The job's algorithm once per group; `groups`: (name, agent indices, the group's spaces) each."""

    def __init__(self, algorithm: type[Algorithm], cfg: Any, groups: list[tuple[str, tuple[int, ...], SpaceInfo]],
                 n_agents: int, device: torch.device, seed: int, total_env_steps: int | None):
        super().__init__(cfg, groups[0][2], device, seed, total_env_steps)
        self.name, self.on_policy, self.n_agents = algorithm.name, algorithm.on_policy, n_agents
        # Each group its own seed, so two groups of the same shape do not start from the same weights.
        self.groups = [(name, np.asarray(agents, np.int64), info,
                        algorithm(cfg, info, device, seed + 1_000 * i, total_env_steps))
                       for i, (name, agents, info) in enumerate(groups)]

    # The loop asks these of the algorithm: every group's is the same (the job's hyperparameters), the first's.
    def exploration(self, env_steps: int) -> float:
        return self.groups[0][3].exploration(env_steps)

    @property
    def n_step(self) -> int:
        return self.groups[0][3].n_step

    def policy_config(self) -> dict[str, Any]:
        return group_config([(name, tuple(int(a) for a in agents), info, algo.policy_config())
                             for name, agents, info, algo in self.groups], self.n_agents)

    def weights(self) -> dict[str, np.ndarray]:
        return {PREFIX.format(i) + key: value for i, (_, _, _, algo) in enumerate(self.groups)
                for key, value in algo.weights().items()}

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        losses, updates, extra = [], 0, {}
        for name, agents, info, algo in self.groups:
            mine = [group_batch(b, agents, self.n_agents, info) for b in batches]
            stats = algo.learn(mine, env_steps, max_updates)
            updates += stats.gradient_updates
            if np.isfinite(stats.loss):
                losses.append(stats.loss)
            extra.update({f"{key}/{name}": value for key, value in stats.extra.items()})
            returns = np.concatenate([b["episode_returns"] for b in mine]) if mine else np.zeros(0)
            if len(returns):
                extra[RETURN_KEY.format(name)] = float(np.mean(returns))
        self.gradient_updates += updates
        return LearnStats(loss=float(np.mean(losses)) if losses else float("nan"), gradient_updates=updates,
                          extra=extra)

    def state_dict(self) -> dict[str, Any]:
        return {"groups": {name: algo.state_dict() for name, _, _, algo in self.groups},
                "gradient_updates": self.gradient_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["groups"]
        names = [name for name, _, _, _ in self.groups]
        if sorted(saved) != sorted(names):
            raise ValueError(f"the checkpoint holds policy groups {sorted(saved)} and the job has {sorted(names)}: "
                             "spec.environment.multiAgent.groups changed; start the job afresh (a new name)")
        for name, _, _, algo in self.groups:
            algo.load_state_dict(saved[name])
        self.gradient_updates = int(state["gradient_updates"])


def group_batch(batch: dict[str, Any], agents: np.ndarray, n_agents: int, info: SpaceInfo) -> dict[str, Any]:
    """One worker's batch cut to one group's entries, observations cut to the group's width and action masks to
    its actions, with its agents' episodes: an on-policy batch's columns of every [steps, entries] array, an
    off-policy batch's transitions of its agents (their env steps its own)."""
    if "entries" in batch:
        return _group_transitions(batch, agents, n_agents, info)
    entries = batch["obs"].shape[1]
    columns = np.nonzero(np.isin(np.arange(entries) % n_agents, agents))[0]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key in ("episode_returns", "episode_lengths", "episode_entries"):
            continue
        if isinstance(value, np.ndarray) and value.ndim >= 2 and value.shape[1] == entries:
            value = value[:, columns]
            if key == "obs":
                value = value[..., :info.obs_dim]
            elif key == "masks":
                value = value[..., :info.action_dims[0]]
        elif key == "last_values":
            value = value[columns]
        out[key] = value
    return {**out, **_group_episodes(batch, agents, n_agents)}


def _group_transitions(batch: dict[str, Any], agents: np.ndarray, n_agents: int, info: SpaceInfo) -> dict[str, Any]:
    mine = np.isin(np.asarray(batch["entries"]) % n_agents, agents)
    out = dict(batch)
    for key in ("obs", "next_obs", "actions", "rewards", "dones", "discounts", "next_masks", "entries"):
        if key in batch:
            out[key] = np.asarray(batch[key])[mine]
    if len(out["obs"]):
        out["obs"], out["next_obs"] = out["obs"][:, :info.obs_dim], out["next_obs"][:, :info.obs_dim]
    if "next_masks" in out:
        out["next_masks"] = out["next_masks"][:, :info.action_dims[0]]
    # One transition per step an agent acted in (n-step ones come out as their steps end): its steps, which
    # its replay ratio (trainFrequency) counts.
    out["env_steps"] = int(mine.sum())
    return {**out, **_group_episodes(batch, agents, n_agents)}


def _group_episodes(batch: dict[str, Any], agents: np.ndarray, n_agents: int) -> dict[str, np.ndarray]:
    ended = np.isin(np.asarray(batch["episode_entries"]) % n_agents, agents)
    return {"episode_returns": np.asarray(batch["episode_returns"])[ended],
            "episode_lengths": np.asarray(batch["episode_lengths"])[ended]}

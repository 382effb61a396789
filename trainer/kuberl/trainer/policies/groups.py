"""Policy groups' acting policy (environment.multiAgent.groups): one policy per group of agents, each acting
for its own entries with its own weights.

A rollout worker's vector env has an entry per agent of each env copy, copy by copy, in possible_agents order
(kuberl.trainer.envs.multiagent), so row r of a batch is agent `r % n_agents`. Each group's policy gets its
rows, cut to its own observation width and its own actions, and its outputs go back to those rows: what it
computes is what it would compute alone on its agents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from kuberl.trainer.policies.numpy_ops import Params
from kuberl.trainer.spaces import SpaceInfo

#: The weights of group i are `g{i}/<name>` in the weights the learner ships.
PREFIX = "g{}/"


def group_config(groups: list[tuple[str, tuple[int, ...], SpaceInfo, dict[str, Any]]], n_agents: int) -> dict:
    """The `policy_config` of policy groups: per group its name, agents, spaces and own policy's config."""
    return {"kind": "groups", "n_agents": n_agents,
            "groups": [{"name": name, "agents": list(agents), "info": asdict(info), "policy": cfg}
                       for name, agents, info, cfg in groups]}


def info_from_dict(data: dict[str, Any]) -> SpaceInfo:
    return SpaceInfo(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                        for k, v in data.items()})


class GroupPolicies:
    """The policy of each group, over the rows of its agents."""

    kind = "groups"

    def __init__(self, info: SpaceInfo, n_agents: int, groups: list[tuple[str, np.ndarray, SpaceInfo, Any]]):
        self.info, self.n_agents, self.groups = info, n_agents, groups
        self._rows_by_size: dict[int, list[np.ndarray]] = {}  # batch size -> each group's rows (every step asks)

    @classmethod
    def from_config(cls, info: SpaceInfo, cfg: dict[str, Any],
                    make_policy: Callable[[SpaceInfo, dict[str, Any]], Any] | None = None) -> GroupPolicies:
        """`make_policy`: builds each group's own policy from its config (policies.make_policy)."""
        if make_policy is None:
            raise ValueError("policy groups need the policy table to build each group's policy")
        groups = []
        for g in cfg["groups"]:
            group_info = info_from_dict(g["info"])
            groups.append((g["name"], np.asarray(g["agents"], np.int64), group_info,
                           make_policy(group_info, g["policy"])))
        return cls(info, int(cfg["n_agents"]), groups)

    def load(self, params: Params) -> None:
        for i, (_, _, _, policy) in enumerate(self.groups):
            prefix = PREFIX.format(i)
            policy.load({k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)})

    def _rows(self, n: int) -> list[np.ndarray]:
        """Each group's rows in a batch of `n` rows."""
        if n not in self._rows_by_size:
            agent = np.arange(n) % self.n_agents
            self._rows_by_size[n] = [np.nonzero(np.isin(agent, agents))[0] for _, agents, _, _ in self.groups]
        return self._rows_by_size[n]

    def _each(self, method: str, obs: np.ndarray, mask: np.ndarray | None, lead: tuple = (), **kwargs: Any) -> Any:
        """`method` of every group's policy on its rows; its outputs (an array, or a tuple of them) put back."""
        out: list[np.ndarray] = []
        for (_, _, info, policy), rows in zip(self.groups, self._rows(len(obs)), strict=True):
            if not len(rows):
                continue
            mine = obs[rows, :info.obs_dim]
            if method == "value":
                got = policy.value(mine)
            else:
                got = getattr(policy, method)(*lead, mine, None if mask is None else mask[rows, :info.action_dims[0]],
                                              **kwargs)
            parts = got if isinstance(got, tuple) else (got,)
            if not out:
                out = [np.zeros((len(obs), *np.shape(p)[1:]), np.asarray(p).dtype) for p in parts]
            for whole, part in zip(out, parts, strict=True):
                whole[rows] = part
        return tuple(out) if len(out) > 1 else out[0]

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, **kwargs: Any):
        return self._each("act", obs, mask, (rng,), **kwargs)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._each("value", obs, None)

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return self._each("greedy", obs, mask)

"""Checks a schema cannot express: the environment exists and the algorithm can act in its spaces.

Pure data: nothing here imports, calls or builds an environment. The rules take the spaces as
`SpaceInfo`; the trainer describes a real environment's spaces with them (`kuberl.trainer.envs.resolve`),
the operator takes them from `registered_envs.json`, a table the trainer generates of every registered
id it can build (`kuberl-envs-table`). So the operator checks a registered id without running anything
a tenant named, in microseconds, and the learner pod checks the rest with the same rules.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from importlib import resources
from typing import Any

from kuberl.api.job import (
    ACTION_SPACES_SUPPORTED,
    MODULE_SEPARATOR,
    AgentPolicies,
    AlgorithmName,
    CollectionMode,
    RLTrainingJobSpec,
    algorithms_acting_in,
)
from kuberl.api.problems import Problem

#: The image a job's pod runs, set by the operator in every pod it creates: a module the image lacks is
#: reported with the image to rebuild.
IMAGE_ENV = "KUBERL_IMAGE"
TABLE_RESOURCE = "registered_envs.json"
#: Keyword arguments gymnasium.make passes on to every environment.
MAKE_KWARGS = ("render_mode",)


@dataclasses.dataclass(frozen=True)
class SpaceInfo:
    """A gymnasium space as the rules need it: its class name and shape (JSON in the table)."""

    kind: str
    shape: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpaceInfo:
        return cls(str(data["kind"]), tuple(int(n) for n in data.get("shape") or ()))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class RegisteredEnv:
    """One row of the table: the spaces at default kwargs (None: not buildable where the table was
    made) and the keyword arguments the constructor takes (None: any)."""

    action: SpaceInfo | None
    observation: SpaceInfo | None
    params: tuple[str, ...] | None


def names_code(env_id: str) -> bool:
    """Whether an id names a module to import (`module:Class`, `module:Env-vN`), not a registered id."""
    return MODULE_SEPARATOR in env_id


@functools.cache
def registered_envs() -> dict[str, RegisteredEnv]:
    raw = json.loads(resources.files("kuberl.api").joinpath(TABLE_RESOURCE).read_text())
    table = {}
    for env_id, row in raw["envs"].items():
        table[env_id] = RegisteredEnv(
            action=SpaceInfo.from_json(row["action"]) if row.get("action") else None,
            observation=SpaceInfo.from_json(row["observation"]) if row.get("observation") else None,
            params=tuple(row["params"]) if row.get("params") is not None else None,
        )
    return table


def unknown_env_problem(env_id: str, known: list[str]) -> Problem:
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return Problem(
        "spec.environment.id",
        "unknown environment: not a registered gymnasium id (e.g. CartPole-v1, kuberl/TicTacToe-v0) "
        f"and not module:Class{hint}",
        env_id,
    )


def unknown_kwargs_problem(spec: RLTrainingJobSpec, params: tuple[str, ...]) -> Problem | None:
    allowed = sorted(set(params) | set(MAKE_KWARGS))
    unknown = sorted(k for k in spec.environment.kwargs if k not in allowed)
    if not unknown:
        return None
    return Problem("spec.environment.kwargs",
                   f"the environment rejected its kwargs: {spec.environment.id} takes no argument "
                   f"{', '.join(map(repr, unknown))}; it takes: {', '.join(allowed) or 'none'}",
                   spec.environment.kwargs)


def check_registered(spec: RLTrainingJobSpec) -> list[Problem]:
    """The operator's check: the id against the table, never importing or building anything.

    A `module:...` id, and a PettingZoo env's (multiAgent), is left to the learner pod, which runs the
    full check before it trains. The spaces are those at default kwargs, so with kwargs given only their
    names are checked here."""
    env_id = spec.environment.id
    if spec.environment.multi_agent is not None:
        return policy_groups_problems(spec)
    if names_code(env_id):
        return []
    table = registered_envs()
    row = table.get(env_id)
    if row is None:
        return [unknown_env_problem(env_id, sorted(table))]
    if row.params is not None:
        problem = unknown_kwargs_problem(spec, row.params)
        if problem is not None:
            return [problem]
    if spec.environment.kwargs or row.action is None or row.observation is None:
        return []
    return check_spaces(spec, row.action, row.observation)


#: What policy groups train with: each group's update is its own algorithm's over its agents' share of the
#: iteration's batches (kuberl.trainer.algorithms.groups), PPO's columns or DQN's transitions.
GROUP_ALGORITHMS = (AlgorithmName.PPO, AlgorithmName.DQN)


def policy_groups_problems(spec: RLTrainingJobSpec) -> list[Problem]:
    """Policy groups (environment.multiAgent.policies: groups) train with PPO or DQN, on one learner, collecting
    in sync mode."""
    multi = spec.environment.multi_agent
    if multi is None or multi.policies != AgentPolicies.GROUPS:
        return []
    problems = []
    name = spec.algorithm.name.value
    if spec.algorithm.name not in GROUP_ALGORITHMS:
        problems.append(Problem("spec.algorithm.name", f"policies: groups trains with PPO or DQN; {name} trains one "
                                "shared policy (policies: shared)", name))
    if spec.learner.replicas > 1:
        problems.append(Problem("spec.learner.replicas", "policies: groups trains on one learner (1)",
                                spec.learner.replicas))
    if spec.collection.mode != CollectionMode.SYNC:
        problems.append(Problem("spec.collection.mode", "policies: groups collects in sync mode",
                                spec.collection.mode.value))
    return problems


def check_spaces(spec: RLTrainingJobSpec, action: SpaceInfo, observation: SpaceInfo) -> list[Problem]:
    """Can the algorithm act in these spaces (and, for QLearning, tabulate the observation)?"""
    problems: list[Problem] = []
    env_id, algorithm = spec.environment.id, spec.algorithm.name
    allowed = ACTION_SPACES_SUPPORTED[algorithm]
    if action.kind not in allowed:
        problems.append(Problem(
            "spec.algorithm.name",
            f"{algorithm.value} cannot act in {env_id}'s {action.kind} action space "
            f"({algorithm.value} acts in {', '.join(allowed)}); "
            f"choose one that can: {', '.join(algorithms_acting_in(action.kind)) or 'none does'}",
            algorithm.value,
        ))
    if algorithm == AlgorithmName.QLEARNING:
        problems += _tabular_problems(spec, observation)
    return problems


def _tabular_problems(spec: RLTrainingJobSpec, obs: SpaceInfo) -> list[Problem]:
    env_id = spec.environment.id
    if obs.kind == "Discrete":
        return []
    if obs.kind != "Box":
        return [Problem("spec.environment.id", f"QLearning needs a Discrete or Box observation, got {obs.kind}",
                        env_id)]
    bins = spec.algorithm.q_learning.bins
    dims = obs.shape[0] if obs.shape else 1
    if len(obs.shape) != 1:
        return [Problem("spec.environment.id", "QLearning needs a 1-D Box or Discrete "
                        f"observation, got shape {obs.shape}", env_id)]
    if not bins:
        return [Problem("spec.algorithm.qLearning.bins", f"a Box observation needs bins (1 or {dims} entries)", bins)]
    if len(bins) not in (1, dims):
        return [Problem("spec.algorithm.qLearning.bins",
                        f"needs 1 or {dims} entries for a {dims}-dimensional observation", bins)]
    return []

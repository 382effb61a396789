"""Environment resolution and the full environment check, run where a job's own code may run.

`kuberl validate`, `kuberl train`, the learner pod (before it trains) and the rollout workers resolve
an id here. The operator never does: it checks registered ids against a table
(`kuberl.api.semantics.check_registered`) and leaves `module:...` ids to the job's learner pod.

A `module:Name` id imports `module` (the user's own code, in the user's own process or pod), then
`Name` must be a `gymnasium.Env` subclass, or an id that importing `module` registered (gymnasium's
`module:Env-vN` syntax). Anything else is refused before it is called.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import kuberl.trainer.envs  # noqa: F401  (registers the kuberl/* ids)
from kuberl.api.job import AgentPolicies, MultiAgentSpec, RLTrainingJobSpec, SelfPlaySpec
from kuberl.api.problems import Problem
from kuberl.api.semantics import (
    IMAGE_ENV,
    MODULE_SEPARATOR,
    SpaceInfo,
    check_spaces,
    policy_groups_problems,
    unknown_env_problem,
)

EnvFactory = Callable[..., gym.Env]


class EnvNotFound(LookupError):
    """The id names no registered environment and no importable gymnasium.Env subclass."""


def resolve_env_factory(env_id: str) -> EnvFactory:
    """Return a callable(**kwargs) -> env for a registered id, `module:Env-vN` or `module:Class`."""
    if MODULE_SEPARATOR in env_id:
        module_name, _, name = env_id.partition(MODULE_SEPARATOR)
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise EnvNotFound(f"cannot import the environment's module {module_name!r} ({err}) "
                              f"{_where_to_install()}") from None
        if name in gym.registry:  # gymnasium's module:Env-vN: importing the module registered the id
            return _maker(name)
        target = getattr(module, name, None)
        if not (inspect.isclass(target) and issubclass(target, gym.Env)):
            what = "has no attribute" if target is None else f"has {type(target).__name__} {name!r}, not"
            raise EnvNotFound(f"module {module_name!r} {what} {name!r}: module:Name must name a "
                              "gymnasium.Env subclass or an id the module registers with gymnasium")
        return target
    if env_id not in gym.registry:
        raise EnvNotFound(f"{env_id!r} is not a registered gymnasium id")
    return _maker(env_id)


def agents_vector(env_id: str, kwargs: dict[str, Any], multi_agent: dict[str, Any] | MultiAgentSpec, copies: int,
                  max_episode_steps: int | None = None, seat: int | None = None) -> Any:
    """`copies` copies of a PettingZoo env as the rollout workers' vector env, as `multi_agent`
    (environment.multiAgent) maps its agents to policies: every agent an entry of one shared policy or of its
    group's (kuberl.trainer.envs.multiagent), or the learner's agent of each game an entry and frozen copies of its
    policy the others (kuberl.trainer.envs.selfplay_agents; `seat` fixes the learner's agent)."""
    spec = MultiAgentSpec.model_validate(multi_agent) if isinstance(multi_agent, dict) else multi_agent
    if spec.policies == AgentPolicies.SELF_PLAY:
        from kuberl.trainer.envs.selfplay_agents import SelfPlayAgents

        factory = resolve_agents_factory(env_id, turn_based=True)
        settings = spec.self_play or SelfPlaySpec()
        return SelfPlayAgents(lambda: factory(**kwargs), copies, spec.agent_id_in_observation, max_episode_steps,
                              settings.refresh_updates, settings.opponent_epsilon, seat)
    from kuberl.trainer.envs.multiagent import AgentEntries

    factory = resolve_agents_factory(env_id)
    return AgentEntries(lambda: factory(**kwargs), copies, spec.agent_id_in_observation, max_episode_steps,
                        spec.groups)


def resolve_agents_factory(env_id: str, turn_based: bool = False) -> Callable[..., Any]:
    """A PettingZoo env (environment.multiAgent): an id of PettingZoo's registry (its parallel version where
    it has one, its AEC one first when `turn_based`), or `module:factory`, the module imported and `factory`
    one of its callables (PettingZoo's `parallel_env` or `env`, or a class). What either returns is checked
    when called (kuberl.trainer.envs.multiagent.as_parallel, selfplay_agents.as_aec)."""
    module_name, separator, name = env_id.partition(MODULE_SEPARATOR)
    if not separator:
        import pettingzoo

        kinds = [("parallel", pettingzoo.parallel_registry), ("aec", pettingzoo.aec_registry)]
        for kind, registry in (kinds[::-1] if turn_based else kinds):
            if env_id in registry:
                return functools.partial(pettingzoo.make, kind, env_id)
        known = sorted(set(pettingzoo.parallel_registry) | set(pettingzoo.aec_registry))
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise EnvNotFound(f"{env_id!r} is not in PettingZoo's registry{hint}: name one of its ids, or a PettingZoo "
                          "env's module and factory (e.g. mpe2.simple_spread_v3:parallel_env)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvNotFound(f"cannot import the environment's module {module_name!r} ({err}) "
                          f"{_where_to_install()}") from None
    target = getattr(module, name, None)
    if not callable(target):
        raise EnvNotFound(f"module {module_name!r} has no callable {name!r}: module:factory names the PettingZoo "
                          "env's parallel_env (or env)")
    return target


def _where_to_install() -> str:
    """Where the missing module must be installed: the pod's image (named), or this Python."""
    image = os.environ.get(IMAGE_ENV)
    if image:
        return (f"in the image {image!r}: install its package in an image built FROM the trainer image and "
                "name that image in spec.image (docs/custom-environments.md)")
    return (f"in this Python ({sys.executable}): install its package here, and for a cluster in an image "
            "built FROM the trainer image named in spec.image (docs/custom-environments.md)")


def _maker(env_id: str) -> EnvFactory:
    def make(**kwargs: Any) -> gym.Env:
        return gym.make(env_id, **kwargs)

    return make


def describe_space(space: gym.Space) -> SpaceInfo:
    shape = getattr(space, "shape", None) or ()
    return SpaceInfo(type(space).__name__, tuple(int(n) for n in shape))


def check_environment(spec: RLTrainingJobSpec) -> list[Problem]:
    """The full check: resolve the id, build the env with its kwargs, and apply the space rules."""
    if spec.environment.multi_agent is not None:
        return _check_agents(spec)
    env_id = spec.environment.id
    try:
        factory = resolve_env_factory(env_id)
    except EnvNotFound as err:
        if MODULE_SEPARATOR in env_id:
            return [Problem("spec.environment.id", f"cannot use the environment: {err}", env_id)]
        return [unknown_env_problem(env_id, sorted(gym.registry.keys()))]
    try:
        env = factory(**spec.environment.kwargs)
    except Exception as err:  # noqa: BLE001 - any refusal by the constructor is about the kwargs
        return [_kwargs_problem(spec, err)]
    try:
        return check_spaces(spec, describe_space(env.action_space), describe_space(env.observation_space))
    finally:
        env.close()


def _kwargs_problem(spec: RLTrainingJobSpec, err: Exception) -> Problem:
    why = str(err) if isinstance(err, (TypeError, ValueError)) else f"{type(err).__name__}: {err}"
    why = why if len(why) <= 500 else why[:500] + "..."  # a message may quote all of a huge kwargs
    return Problem("spec.environment.kwargs", f"the environment rejected its kwargs: {why}", spec.environment.kwargs)


def _check_agents(spec: RLTrainingJobSpec) -> list[Problem]:
    """A PettingZoo env: importable, a PettingZoo env its agents can share a policy in, then the space rules
    on one agent's spaces."""
    from kuberl.trainer.envs.multiagent import MultiAgentEnvError

    env_spec = spec.environment
    try:
        env = agents_vector(env_spec.id, env_spec.kwargs, env_spec.multi_agent, 1, env_spec.max_episode_steps)
    except EnvNotFound as err:
        return [Problem("spec.environment.id", f"cannot use the environment: {err}", env_spec.id)]
    except MultiAgentEnvError as err:
        return [Problem(err.field, str(err), env_spec.id)]
    except Exception as err:  # noqa: BLE001 - any refusal by the constructor is about the kwargs
        return [_kwargs_problem(spec, err)]
    try:
        return policy_groups_problems(spec) or check_spaces(spec, describe_space(env.single_action_space),
                                                            describe_space(env.single_observation_space))
    finally:
        env.close()

"""Environment resolution and the full environment check, run where a job's own code may run.

`kuberl validate`, `kuberl train`, the learner pod (before it trains) and the rollout workers resolve
an id here. The operator never does: it checks registered ids against a table
(`kuberl.api.semantics.check_registered`) and leaves `module:...` ids to the job's learner pod.

A `module:Name` id imports `module` (the user's own code, in the user's own process or pod), then
`Name` must be a `gymnasium.Env` subclass, or an id that importing `module` registered (gymnasium's
`module:Env-vN` syntax). Anything else is refused before it is called.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import kuberl.trainer.envs  # noqa: F401  (registers the kuberl/* ids)
from kuberl.api.job import RLTrainingJobSpec
from kuberl.api.problems import Problem
from kuberl.api.semantics import IMAGE_ENV, MODULE_SEPARATOR, SpaceInfo, check_spaces, unknown_env_problem

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
        why = str(err) if isinstance(err, (TypeError, ValueError)) else f"{type(err).__name__}: {err}"
        why = why if len(why) <= 500 else why[:500] + "..."  # a message may quote all of a huge kwargs
        return [Problem("spec.environment.kwargs", f"the environment rejected its kwargs: {why}",
                        spec.environment.kwargs)]
    try:
        return check_spaces(spec, describe_space(env.action_space), describe_space(env.observation_space))
    finally:
        env.close()

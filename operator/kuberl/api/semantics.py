"""Checks a schema cannot express: the environment exists and the algorithm can act in its spaces.

Imports gymnasium (numpy only), never torch or ray, so the operator can run it before it creates
anything.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from kuberl.api.job import ACTION_SPACES_SUPPORTED, AlgorithmName, RLTrainingJobSpec
from kuberl.api.load import Problem


def resolve_env_factory(env_id: str):
    """Return a callable(**kwargs) -> env for a gymnasium id or `module:Class`."""
    import gymnasium as gym

    import kuberl.trainer.envs  # noqa: F401  (registers kuberl/* ids)

    if ":" in env_id and not env_id.startswith("kuberl/"):
        module_name, _, attr = env_id.partition(":")
        module = importlib.import_module(module_name)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    gym.spec(env_id)  # raises a gymnasium error for an unknown id

    def make(**kwargs: Any):
        return gym.make(env_id, **kwargs)

    return make


def space_name(space: Any) -> str:
    return type(space).__name__


def check(spec: RLTrainingJobSpec, *, strict_imports: bool = True) -> list[Problem]:
    """Return every semantic problem. strict_imports=False skips `module:Class` envs that do not import
    here (the operator's image lacks the user's code; the learner checks them)."""
    import gymnasium as gym

    problems: list[Problem] = []
    env_id = spec.environment.id
    try:
        factory = resolve_env_factory(env_id)
    except ImportError as err:
        if not strict_imports:
            return problems
        problems.append(Problem("spec.environment.id", f"cannot import the environment class: {err}", env_id))
        return problems
    except gym.error.Error:
        import kuberl.trainer.envs  # noqa: F401

        known = sorted(gym.registry.keys())
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        problems.append(Problem(
            "spec.environment.id",
            "unknown environment: not a registered gymnasium id (e.g. CartPole-v1, kuberl/TicTacToe-v0) "
            f"and not module:Class{hint}",
            env_id,
        ))
        return problems
    try:
        env = factory(**spec.environment.kwargs)
    except (TypeError, ValueError) as err:
        problems.append(Problem("spec.environment.kwargs", f"the environment rejected its kwargs: {err}",
                                spec.environment.kwargs))
        return problems
    try:
        action = space_name(env.action_space)
        allowed = ACTION_SPACES_SUPPORTED[spec.algorithm.name]
        if action not in allowed:
            problems.append(Problem(
                "spec.algorithm.name",
                f"{spec.algorithm.name.value} cannot act in {env_id}'s {action} action space; "
                f"{spec.algorithm.name.value} supports {', '.join(allowed)}"
                + ("; PPO supports Box (continuous) actions" if action == "Box" else ""),
                spec.algorithm.name.value,
            ))
        obs = env.observation_space
        if spec.algorithm.name == AlgorithmName.QLEARNING:
            if isinstance(obs, gym.spaces.Box):
                bins = spec.algorithm.q_learning.bins
                dims = int(obs.shape[0]) if obs.shape else 1
                if len(obs.shape) != 1:
                    problems.append(Problem("spec.environment.id", "QLearning needs a 1-D Box or Discrete "
                                            f"observation, got shape {obs.shape}", env_id))
                elif not bins:
                    problems.append(Problem("spec.algorithm.qLearning.bins",
                                            f"a Box observation needs bins (1 or {dims} entries)", bins))
                elif len(bins) not in (1, dims):
                    problems.append(Problem("spec.algorithm.qLearning.bins",
                                            f"needs 1 or {dims} entries for a {dims}-dimensional observation",
                                            bins))
            elif not isinstance(obs, gym.spaces.Discrete):
                problems.append(Problem("spec.environment.id",
                                        f"QLearning needs a Discrete or Box observation, got {space_name(obs)}",
                                        env_id))
    finally:
        env.close()
    return problems

"""KubeRL's gymnasium environments, registered on import under the `kuberl/` namespace.

Only numpy and gymnasium are imported here, so the operator can validate env kwargs in a spec
without the trainer's heavy dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

TICTACTOE_ID = "kuberl/TicTacToe-v0"
AUTOSCALING_ID = "kuberl/Autoscaling-v0"
AUTOSCALING_MULTI_ID = "kuberl/AutoscalingMulti-v0"
ENV_IDS = (TICTACTOE_ID, AUTOSCALING_ID, AUTOSCALING_MULTI_ID)

_ENTRY_POINTS = {
    TICTACTOE_ID: "kuberl.trainer.envs.tictactoe:TicTacToeEnv",
    AUTOSCALING_ID: "kuberl.trainer.envs.autoscaling:AutoscalingEnv",
    AUTOSCALING_MULTI_ID: "kuberl.trainer.envs.autoscaling:AutoscalingMultiEnv",
}


def register_envs() -> None:
    """Register every id once; calling again (or re-importing) is a no-op."""
    for env_id, entry_point in _ENTRY_POINTS.items():
        if env_id not in gym.registry:
            # Episode lengths are env kwargs, so no TimeLimit wrapper: the envs truncate themselves.
            gym.register(id=env_id, entry_point=entry_point)


def env_config_class(env_id: str) -> type:
    """The frozen dataclass whose fields are the env's kwargs (defaults and a docstring per field)."""
    from kuberl.trainer.envs.autoscaling import AutoscalingConfig, AutoscalingMultiConfig
    from kuberl.trainer.envs.tictactoe import TicTacToeConfig

    classes = {
        TICTACTOE_ID: TicTacToeConfig,
        AUTOSCALING_ID: AutoscalingConfig,
        AUTOSCALING_MULTI_ID: AutoscalingMultiConfig,
    }
    if env_id not in classes:
        raise ValueError(f"env_id={env_id!r} is not a KubeRL env; allowed values: {', '.join(ENV_IDS)}")
    return classes[env_id]


def validate_env_kwargs(env_id: str, kwargs: Mapping[str, Any] | None) -> Any:
    """Check a spec's env kwargs without building the env; returns the parsed config.

    Raises ValueError naming the kwarg, its value and what is allowed.
    """
    return env_config_class(env_id).from_kwargs(dict(kwargs or {}))


register_envs()

__all__ = [
    "AUTOSCALING_ID",
    "AUTOSCALING_MULTI_ID",
    "ENV_IDS",
    "TICTACTOE_ID",
    "env_config_class",
    "register_envs",
    "validate_env_kwargs",
]

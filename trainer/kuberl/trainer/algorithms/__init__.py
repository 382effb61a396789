"""Learning algorithms, and the table that picks one by the job spec's `algorithm.name`.

Each algorithm module reads top to bottom (config -> networks -> update) and imports `base`; the
table lives here so that `base` imports none of them.
"""

from __future__ import annotations

import torch

from kuberl.api.job import AlgorithmName
from kuberl.trainer.algorithms.base import Algorithm, LearnStats
from kuberl.trainer.algorithms.bdq import BDQ
from kuberl.trainer.algorithms.dqn import DQN
from kuberl.trainer.algorithms.ppo import PPO
from kuberl.trainer.algorithms.qlearning import QLearning
from kuberl.trainer.algorithms.sac import SAC
from kuberl.trainer.algorithms.td3 import TD3
from kuberl.trainer.spaces import SpaceInfo

ALGORITHMS: dict[AlgorithmName, type[Algorithm]] = {
    AlgorithmName.PPO: PPO,
    AlgorithmName.DQN: DQN,
    AlgorithmName.BDQ: BDQ,
    AlgorithmName.QLEARNING: QLearning,
    AlgorithmName.SAC: SAC,
    AlgorithmName.TD3: TD3,
}


def algorithm_for(spec, info: SpaceInfo, device: torch.device, seed: int, total_env_steps: int | None) -> Algorithm:
    """The algorithm `spec.algorithm.name` names, built from its hyperparameters (`spec.algorithm.<name>`)."""
    name = spec.algorithm.name
    if name not in ALGORITHMS:
        raise ValueError(f"spec.algorithm.name: {name!r} has no learner; allowed values: "
                         f"{', '.join(n.value for n in ALGORITHMS)}")
    return ALGORITHMS[name](spec.algorithm.hyperparameters(), info, device, seed, total_env_steps)


__all__ = ["ALGORITHMS", "Algorithm", "LearnStats", "algorithm_for"]

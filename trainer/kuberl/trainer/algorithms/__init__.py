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
from kuberl.trainer.algorithms.groups import PolicyGroups
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


def algorithm_for_env(spec, device: torch.device, seed: int, total_env_steps: int | None) -> Algorithm:
    """The job's algorithm for its environment's spaces, probed from one copy of it: one algorithm, or one per
    policy group (environment.multiAgent.policies: groups) in the groups' own spaces."""
    from kuberl.api.job import AgentPolicies
    from kuberl.api.semantics import policy_groups_problems
    from kuberl.trainer.rollout import policy_spaces, probe_env
    from kuberl.trainer.spaces import space_info

    multi = spec.environment.multi_agent
    env = probe_env(spec.environment)
    try:
        if multi is None or multi.policies != AgentPolicies.GROUPS:
            return algorithm_for(spec, space_info(*policy_spaces(env)), device, seed, total_env_steps)
        refused = policy_groups_problems(spec)
        if refused:
            raise ValueError("; ".join(f"{p.path}: {p.message}" for p in refused))
        groups = [(g.name, g.agents, space_info(g.observation_space, g.action_space)) for g in env.groups]
        return PolicyGroups(ALGORITHMS[spec.algorithm.name], spec.algorithm.hyperparameters(), groups,
                            env.n_agents, device, seed, total_env_steps)
    finally:
        env.close()


__all__ = ["ALGORITHMS", "Algorithm", "LearnStats", "PolicyGroups", "algorithm_for", "algorithm_for_env"]

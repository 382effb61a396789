"""Acting policies in numpy: what a rollout worker runs, one batched forward pass per env step, and
what an exported model serves.

The learner owns torch networks (`networks.py`) and ships their weights as numpy arrays once per
iteration; these classes run the same math without torch, so workers stay small and fast. A test
checks every policy here against its torch twin. `make_policy` builds the one an algorithm's
`policy_config()` names by its `kind`.
"""

from __future__ import annotations

from typing import Any

from kuberl.trainer.policies.actor_critic import ActorCriticPolicy
from kuberl.trainer.policies.continuous import NoisyDeterministicPolicy, SquashedGaussianPolicy
from kuberl.trainer.policies.groups import GroupPolicies
from kuberl.trainer.policies.q_network import BranchingQPolicy, QPolicy
from kuberl.trainer.policies.tabular import TabularQPolicy
from kuberl.trainer.spaces import SpaceInfo

POLICIES: dict[str, type] = {
    "ppo": ActorCriticPolicy,
    "dqn": QPolicy,
    "bdq": BranchingQPolicy,
    "tabular": TabularQPolicy,
    "sac": SquashedGaussianPolicy,
    "td3": NoisyDeterministicPolicy,
    "groups": GroupPolicies,
}


def make_policy(info: SpaceInfo, cfg: dict[str, Any]):
    """The acting policy for `cfg["kind"]`, with no weights loaded yet."""
    kind = cfg["kind"]
    if kind not in POLICIES:
        raise ValueError(f"policy kind {kind!r} is unknown; known kinds: {', '.join(POLICIES)}")
    if kind == GroupPolicies.kind:
        return GroupPolicies.from_config(info, cfg, make_policy)
    return POLICIES[kind].from_config(info, cfg)


__all__ = ["POLICIES", "ActorCriticPolicy", "BranchingQPolicy", "GroupPolicies", "NoisyDeterministicPolicy", "QPolicy",
           "SquashedGaussianPolicy", "TabularQPolicy", "make_policy"]

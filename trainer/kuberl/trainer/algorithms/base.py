"""What the learner loop needs from an algorithm; the name -> class table is the package's `__init__`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from kuberl.trainer.spaces import SpaceInfo


@dataclass
class LearnStats:
    """What one learn() call did; the learner turns it into metrics."""

    loss: float = float("nan")
    gradient_updates: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Collectives(Protocol):
    """What an algorithm asks of its data-parallel peers (`ddp.ProcessGroupCollectives` implements it)."""

    def average_gradients(self, params: list[torch.Tensor]) -> None: ...

    def mean(self, value: float) -> float: ...


class Algorithm:
    """Base class. On-policy algorithms learn from fresh batches; off-policy ones from a buffer."""

    name = "base"
    on_policy = True
    # Data-parallel learners (`ddp.py`): this learner's rank, how many there are, and the collectives
    # that average gradients (and the few figures every rank must agree on) across them. One learner
    # has none of it, and pays nothing.
    rank = 0
    world = 1
    collectives: Collectives | None = None

    def __init__(self, cfg: Any, info: SpaceInfo, device: torch.device, seed: int, total_env_steps: int | None):
        self.cfg, self.info, self.device = cfg, info, device
        self.total_env_steps = total_env_steps
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.gradient_updates = 0

    # The acting side: what a rollout worker builds (`policies.make_policy`) and the weights it loads.
    def policy_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def weights(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    # Off-policy algorithms: exploration rate and n-step return length for the workers' transitions.
    def exploration(self, env_steps: int) -> float:
        return 0.0

    @property
    def n_step(self) -> int:
        return 1

    #: Off-policy batches carry per-step records (`batch["steps"]`, preferences/steps.py) when True.
    records_steps = False

    def attach_run_dir(self, run_dir) -> None:
        """Where the run keeps its files (the preference head's candidates and pairs file)."""

    @property
    def updates_held_back(self) -> int:
        """Updates a `max_updates` bound postponed; the next learn() applies them first."""
        return 0

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        """One iteration's update from the workers' batches. `max_updates` (async collection's
        staleness bound, off-policy only) caps this call's gradient updates; the rest stay owed."""
        raise NotImplementedError

    def average_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """Between backward and the optimizer step: every learner's gradients become their mean."""
        if self.collectives is not None:
            self.collectives.average_gradients([p for p in params if p.grad is not None])

    def mean_across_learners(self, value: float) -> float:
        """`value`'s mean over the learners (a decision every rank must take alike); itself at one."""
        return value if self.collectives is None else self.collectives.mean(value)

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def make_adam(params, device: torch.device, **kwargs):
    """Adam on torch's fused kernel (one kernel per step instead of a dozen small ops per parameter
    tensor, about 3x less optimizer time for the small MLPs trained here), driven by `FusedAdam`
    rather than `torch.optim.Adam`, whose first use imports torch._dynamo (about 1 s before the first
    update). Where the kernel is missing, torch.optim.Adam."""
    from kuberl.trainer.optim import FusedAdam, fused_adam_available

    if device.type in ("cpu", "cuda") and fused_adam_available():
        return FusedAdam(params, **kwargs)
    return torch.optim.Adam(params, **kwargs)


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    if duration <= 0:
        return end
    frac = min(max(t / duration, 0.0), 1.0)
    return start + frac * (end - start)


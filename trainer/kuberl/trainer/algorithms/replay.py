"""What every replay-buffer learner shares (DQN, BDQ, SAC, TD3): storing the workers' transitions, the
replay ratio (gradient updates owed per env step), async collection's staleness bound, and the
checkpointed state of all of it. Subclasses give the buffer, the networks and one `update()`."""

from __future__ import annotations

from typing import Any

import numpy as np

from kuberl.trainer.algorithms.base import Algorithm, LearnStats
from kuberl.trainer.buffers import ReplayBuffer


class ReplayAlgorithm(Algorithm):
    """Off-policy learning from a replay buffer. `cfg` carries learningStarts, batchSize,
    trainFrequency and gradientSteps; `self.buffer` is made by the subclass."""

    on_policy = False
    buffer: ReplayBuffer

    def __init__(self, cfg, info, device, seed, total_env_steps):
        super().__init__(cfg, info, device, seed, total_env_steps)
        self._steps_since_train = 0
        self._held_back = 0  # updates owed but held back by async collection's staleness bound

    def updates_due(self, new_env_steps: int, env_steps: int, buffer_size: int | None = None) -> int:
        """Gradient updates owed for `new_env_steps` fresh steps (none before learningStarts, nor while a
        replay shard (`buffer_size`, this learner's own by default) holds less than one batch)."""
        buffer_size = self.buffer.size if buffer_size is None else buffer_size
        if env_steps < self.cfg.learning_starts or buffer_size < self.cfg.batch_size:
            return 0
        self._steps_since_train += new_env_steps
        calls, self._steps_since_train = divmod(self._steps_since_train, self.cfg.train_frequency)
        return calls * self.cfg.gradient_steps

    def learn(self, batches: list[dict[str, Any]], env_steps: int, max_updates: int | None = None) -> LearnStats:
        new_steps = self.store(batches)
        updates = self.updates_owed(new_steps, env_steps, max_updates)
        return self.stats(self.apply_updates(updates), updates, env_steps)

    # learn()'s three steps; data-parallel learners (`ddp.py`) run them on every rank, with the update
    # count decided once, by rank 0, for all.
    def store(self, batches: list[dict[str, Any]]) -> int:
        """The batches into this learner's replay; returns their env steps."""
        new_steps = 0
        for b in batches:
            self.buffer.add(b)
            new_steps += int(b["env_steps"])
        return new_steps

    def updates_owed(self, new_steps: int, env_steps: int, max_updates: int | None = None,
                     buffer_size: int | None = None) -> int:
        """This call's gradient updates: those due plus those held back, capped by `max_updates`
        (async collection's staleness bound); the rest stay owed, so trainFrequency holds."""
        updates = self.updates_due(new_steps, env_steps, buffer_size) + self._held_back
        self._held_back = 0
        if max_updates is not None and updates > max_updates:
            updates, self._held_back = max_updates, updates - max_updates
        return updates

    def apply_updates(self, updates: int) -> list[float]:
        return [self.update() for _ in range(updates)]

    def update(self) -> float:
        """One gradient update on `batchSize` transitions sampled from this learner's replay; its loss."""
        raise NotImplementedError

    def stats(self, losses: list[float], updates: int, env_steps: int) -> LearnStats:
        return LearnStats(loss=float(np.mean(losses)) if losses else float("nan"), gradient_updates=updates,
                          extra={**self.extra_stats(env_steps), "buffer_size": float(self.buffer.size)})

    def extra_stats(self, env_steps: int) -> dict[str, float]:
        """Figures of this algorithm's own for the iteration's metrics row."""
        return {}

    @property
    def updates_held_back(self) -> int:
        """Updates the staleness bound (async collection) postponed; the next learn() applies them first."""
        return self._held_back

    def replay_state(self) -> dict[str, Any]:
        """What a resumed run needs to sample and count on as this one would have."""
        return {"gradient_updates": self.gradient_updates, "generator": self.generator.get_state(),
                "buffer": self.buffer.state_dict(), "steps_since_train": self._steps_since_train,
                "held_back": self._held_back}

    def load_replay_state(self, state: dict[str, Any]) -> None:
        self.gradient_updates = int(state["gradient_updates"])
        self.generator.set_state(state["generator"])
        self.buffer.load_state_dict(state["buffer"])
        self._steps_since_train = int(state["steps_since_train"])
        self._held_back = int(state.get("held_back", 0))  # a checkpoint without the count owes no updates

"""What the autoscaling agents observe: the layouts (names, bounds, spaces) and the one function
that builds the observations of `n` copies from their service state (autoscaling_service.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

# --- Autoscaling-v0 observation layout -------------------------------------------------------
OBSERVATION_NAMES = (
    "utilisation",  # demand (backlog + arrivals) / capacity of running + booting instances, [0, 3]
    "running_utilisation",  # served / capacity of running instances, [0, 1]
    "queue",  # backlog / max_queue
    "running",  # running instances / max_instances
    "booting",  # booting instances / max_instances
    "influx",  # arrivals this interval / reference capacity (max_instances * capacity_per_instance), [0, 2]
    "influx_long",  # slow moving average (alpha 0.1) of arrivals / reference capacity, [0, 2]
    "trend",  # (fast average (alpha 0.5) - slow average) / slow average, [-1, 1]
    "latency",  # latency_ms / latency_slo, [0, 4]
    "dropped",  # dropped / arrivals this interval
    "cycle_sin",  # sin and cos of the load cycle phase of the NEXT interval (period load_params.period)
    "cycle_cos",
    "progress",  # steps taken / episode_length
)

# --- AutoscalingMulti-v0 observation layout --------------------------------------------------
# macro: platform-wide and slow (per-tier fleet, cost rate, priority setting, long-window load,
# time); micro: fast and local (queue, instantaneous influx, latency, utilisation). The flat
# observation is macro followed by micro, so a micro index counted from the end holds in both.
# Macro starts with running_tier0..T-1 and booting_tier0..T-1 (instances / max_instances), then:
MACRO_SHARED_NAMES = (
    "capacity",  # capacity of running + booting instances / (max_instances x the largest tier's)
    "cost_rate",  # this step's cost_instances / (max_instances x the dearest tier's cost)
    "priority_weight",  # the shedding weight applied last step, [0, 1]
    "influx_long",  # as in Autoscaling-v0
    "cycle_sin",
    "cycle_cos",
    "progress",
)
MICRO_NAMES = (
    "utilisation",
    "running_utilisation",
    "queue_high",
    "queue_low",
    "influx",
    "trend",
    "latency",
    "dropped_high",  # dropped high-priority requests / arrivals
    "dropped_low",  # dropped (shed or overflowed) low-priority requests / arrivals
)

_BOUNDS = {
    "utilisation": (0.0, 3.0),
    "influx": (0.0, 2.0),
    "influx_long": (0.0, 2.0),
    "trend": (-1.0, 1.0),
    "latency": (0.0, 4.0),
    "cycle_sin": (-1.0, 1.0),
    "cycle_cos": (-1.0, 1.0),
}


def _box(names: tuple[str, ...]) -> spaces.Box:
    low = np.array([_BOUNDS.get(n, (0.0, 1.0))[0] for n in names], dtype=np.float32)
    high = np.array([_BOUNDS.get(n, (0.0, 1.0))[1] for n in names], dtype=np.float32)
    return spaces.Box(low, high, dtype=np.float32)


def _clip(values: np.ndarray, space: spaces.Box) -> np.ndarray:
    # np.clip's result, in two ufunc calls without its Python wrappers: a step of the one-copy
    # env spends a good part of its time here.
    return np.minimum(np.maximum(values, space.low), space.high)


class Observer:
    """The observation space of one copy, and `observe(service)`: the observations of the service's
    copies ((size,) for one, (n, size) for a batch; a dict of them for the split multi observation)."""

    def __init__(self, config: Any, multi: bool, capacities: list[float], costs: list[float]) -> None:
        cfg = self.config = config
        self.multi = multi
        if multi:
            n_tiers = len(capacities)
            macro = (tuple(f"running_tier{k}" for k in range(n_tiers))
                     + tuple(f"booting_tier{k}" for k in range(n_tiers)) + MACRO_SHARED_NAMES)
            self.names: Any = {"macro": macro, "micro": MICRO_NAMES}
            self.parts = {"macro": len(macro), "micro": len(MICRO_NAMES)}
            self._macro, self._micro = _box(macro), _box(MICRO_NAMES)
            if cfg.observation_split:
                self.space = spaces.Dict({"macro": self._macro, "micro": self._micro})
            else:
                self.space = _box(macro + MICRO_NAMES)
        else:
            self.names, self.space = OBSERVATION_NAMES, _box(OBSERVATION_NAMES)
        self._ref_capacity = cfg.max_instances * cfg.capacity_per_instance
        self._max_capacity = cfg.max_instances * max(capacities)
        self._max_cost_rate = cfg.max_instances * max(max(costs), 1e-12)
        period = cfg.load_params.period
        phases = [2.0 * math.pi * (r % period) / period for r in range(period)]
        self._cycle_sin = np.array([math.sin(p) for p in phases])
        self._cycle_cos = np.array([math.cos(p) for p in phases])

    def observe(self, service) -> Any:
        """The observation of every copy of `service` (for one copy: its vector, or dict of them)."""
        xp, cfg, last = service.xp, self.config, service.last
        arrivals, slow, t = last["arrivals"], service.slow_influx, service.t
        # Arrivals are whole requests, so max(arrivals, 1) only keeps the zeros from dividing.
        per_arrival = xp.where(arrivals > 0, 1.0 / xp.maximum(arrivals, 1.0), 0.0)
        phase = (t + 1) % cfg.load_params.period
        cycle_sin, cycle_cos = xp.lookup(self._cycle_sin, phase), xp.lookup(self._cycle_cos, phase)
        influx, influx_long = arrivals / self._ref_capacity, slow / self._ref_capacity
        trend = (service.fast_influx - slow) / xp.maximum(slow, 1.0)
        latency, progress = last["latency_ms"] / cfg.latency_slo, t / cfg.episode_length
        if not self.multi:
            values = xp.stack_float32([
                last["utilisation"], last["running_utilisation"], self._per_queue(last["queue"]),
                last["running_instances"] / cfg.max_instances, last["booting_instances"] / cfg.max_instances,
                influx, influx_long, trend, latency, last["dropped"] * per_arrival,
                cycle_sin, cycle_cos, progress,
            ])
            return _clip(values, self.space)
        macro = xp.stack_float32(
            [n / cfg.max_instances for n in service.fleet.running]
            + [n / cfg.max_instances for n in last["booting_per_tier"]]
            + [last["provisioned_capacity"] / self._max_capacity, last["cost_rate"] / self._max_cost_rate,
               last["priority_weight"], influx_long, cycle_sin, cycle_cos, progress])
        micro = xp.stack_float32([
            last["utilisation"], last["running_utilisation"], self._per_queue(service.queue_high),
            self._per_queue(service.queue_low), influx, trend, latency,
            (last["dropped"] - last["dropped_low_priority"]) * per_arrival,
            last["dropped_low_priority"] * per_arrival,
        ])
        macro, micro = _clip(macro, self._macro), _clip(micro, self._micro)
        if cfg.observation_split:
            return {"macro": macro, "micro": micro}
        return np.concatenate([macro, micro], axis=-1)

    def _per_queue(self, queue):
        return queue / self.config.max_queue if self.config.max_queue > 0 else queue * 0.0

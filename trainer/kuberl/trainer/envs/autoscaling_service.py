"""The autoscaling service: the fleet of booting and running instances by tier, the request queues,
and the latency and cost accounting; the only implementation of the rules autoscaling.py's
docstring describes.

Written once against `xp` (elementwise.py): the gymnasium env runs it on one copy's Python numbers,
the numpy-batched env on arrays of `n` copies, so both play the same episodes float for float.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kuberl.trainer.envs.elementwise import Numbers
from kuberl.trainer.envs.load_patterns import generate_load

FAST_EMA, SLOW_EMA = 0.5, 0.1
"""Smoothing of the influx averages the observation's trend compares (fast and slow)."""
INITIAL_UTILISATION = 0.7
"""Sizing of the starting fleet when initial_instances is not given."""
MAX_RHO = 0.99
"""Utilisation the latency curve is capped at, so it stays finite at full load."""


def processing_latency(xp: Any, service_time_ms: float, rho):
    """Latency of a request at utilisation `rho` with an empty queue:
    service_time_ms * (1 + rho**4 / (1 - rho)), rho capped at MAX_RHO."""
    rho = xp.minimum(rho, MAX_RHO)
    rho2 = rho * rho
    return service_time_ms * (1.0 + rho2 * rho2 / (1.0 - rho))


def slo_utilisation(service_time_ms: float, latency_slo: float) -> float:
    """Highest utilisation whose processing latency (empty queue) still meets the SLO."""
    if processing_latency(Numbers, service_time_ms, 0.0) >= latency_slo:
        return 0.0
    low, high = 0.0, MAX_RHO
    for _ in range(50):
        mid = 0.5 * (low + high)
        meets = processing_latency(Numbers, service_time_ms, mid) <= latency_slo
        low, high = (mid, high) if meets else (low, mid)
    return low


class Fleet:
    """The instances of each copy by tier: `running` and `booting` counts, and `boots`, a bit mask
    per tier where bit i marks a boot that is i steps old (it serves once it is `delay` steps old).

    A step adds at most one boot, so no two boots of a copy are the same age and the bit mask holds
    them all; the youngest, which a remove cancels first (least sunk cost), is the lowest bit."""

    def __init__(self, xp: Any, capacities: Sequence[float], costs: Sequence[float], delay: int,
                 min_instances: int, max_instances: int) -> None:
        self.xp, self.capacities, self.costs = xp, list(capacities), list(costs)
        self.delay, self.min_instances, self.max_instances = delay, min_instances, max_instances
        self._age_mask = (1 << (delay + 1)) - 1
        self.reset(xp.full(0))

    def reset(self, initial) -> None:
        """`initial` tier-0 instances running, nothing else."""
        xp, tiers = self.xp, len(self.capacities)
        self.running = xp.per_tier(tiers, 0)
        self.running[0] = initial
        self.booting = xp.per_tier(tiers, 0)
        self.boots = xp.per_tier(tiers, 0)
        if self.delay >= 62 and isinstance(self.boots, np.ndarray):
            self.boots = self.boots.astype(object)  # ages past 61 overflow int64: a batch keeps Python ints

    def scale(self, delta, tier):
        """Each copy adds (delta 1) or removes (-1) one instance of its `tier`; True where the bounds
        blocked it. Adding boots one; removing cancels the youngest boot of the tier or else stops a
        running one, never going below min_instances running."""
        xp = self.xp
        if not xp.any(delta):
            return delta != 0
        running_total = sum(self.running)
        total = running_total + sum(self.booting)
        add, remove = delta > 0, delta < 0
        blocked = (add & (total >= self.max_instances)) | (remove & (total <= self.min_instances))
        grow = add & xp.not_(blocked)
        pending = remove & xp.not_(blocked)
        boots = xp.pick(self.boots, tier) | grow  # age 0 is free: the last tick aged every boot
        cancel = pending & (boots != 0)
        boots = boots ^ ((boots & -boots) * cancel)
        running = xp.pick(self.running, tier)
        left = pending & xp.not_(cancel)
        stop = left & (running > 0) & (running_total > self.min_instances)
        xp.put(self.boots, tier, boots)
        xp.put(self.booting, tier, xp.pick(self.booting, tier) + grow - cancel)
        xp.put(self.running, tier, running - stop)
        return blocked | (left & xp.not_(stop))

    def tick(self) -> dict[str, Any]:
        """One interval: the boots that are due start serving, the totals this interval is served
        and billed with are taken (a booting instance is billed, as clouds bill from launch), and
        every other boot gets a step older."""
        capacity = extra = cost_rate = 0
        booting_per_tier = []
        for k, (c, cost) in enumerate(zip(self.capacities, self.costs, strict=False)):  # tier order, as a sum() would
            due = (self.boots[k] >> self.delay) & 1
            running, booting = self.running[k] + due, self.booting[k] - due
            self.running[k], self.booting[k] = running, booting
            self.boots[k] = (self.boots[k] << 1) & self._age_mask
            capacity = capacity + running * c
            extra = extra + booting * c
            cost_rate = cost_rate + (running + booting) * cost
            booting_per_tier.append(booting)
        running_total, booting_total = sum(self.running), sum(booting_per_tier)
        return {"capacity": capacity, "provisioned_capacity": capacity + extra, "cost_rate": cost_rate,
                "booting_per_tier": booting_per_tier, "running_instances": running_total,
                "booting_instances": booting_total, "instances": running_total + booting_total}


class Service:
    """The service of one copy (`xp` Numbers) or of a batch (`xp` Arrays): fleet, queues by
    priority, influx averages and load traces.

    `rngs[i]` is copy i's generator; its load trace is drawn from it at each reset. `last` holds
    the latest interval's values per copy: the keys of the envs' info and what the observation
    reads. `tiers` are (capacity, cost) multipliers; Autoscaling-v0 is one tier (1, 1), one
    priority weight 0 (no shedding) and no low-priority traffic.
    """

    def __init__(self, xp: Any, config: Any, tiers: Sequence[tuple[float, float]], weights: Sequence[float],
                 low_fraction: float, low_drop_penalty: float) -> None:
        cfg = self.config = config
        self.xp = xp
        self.fleet = Fleet(xp, [c * cfg.capacity_per_instance for c, _ in tiers],
                           [k * cfg.instance_cost for _, k in tiers],
                           cfg.startup_delay, cfg.min_instances, cfg.max_instances)
        self.weights = np.asarray(weights, np.float64)
        self.low_fraction, self.low_drop_penalty = low_fraction, low_drop_penalty
        self.slo_utilisation = slo_utilisation(cfg.service_time_ms, cfg.latency_slo)
        n = xp.n
        self.traces = np.zeros((n, cfg.episode_length + 1))
        self.rngs: list[np.random.Generator | None] = [None] * n
        self.last: dict[str, Any] = {}
        self.t = xp.full(0)

    def reset(self) -> None:
        """A new episode in every copy: its load trace, a fleet sized for the first interval, empty
        queues; interval 0 is served before the agent acts, so the first observation carries real
        utilisation, latency and influx (its costs are no part of the return)."""
        xp, cfg = self.xp, self.config
        for i, rng in enumerate(self.rngs):
            self.traces[i] = generate_load(cfg.load_pattern, cfg.episode_length + 1, rng, cfg.load_params)
        first = xp.column(self.traces, 0)
        if cfg.initial_instances is not None:
            initial = xp.full(cfg.initial_instances)
        else:
            wanted = xp.ceil_int(first / (INITIAL_UTILISATION * self.fleet.capacities[0]))
            initial = xp.minimum(xp.maximum(wanted, cfg.min_instances), cfg.max_instances)
        self.fleet.reset(initial)
        self.queue_high = self.queue_low = xp.full(0.0)
        self.fast_influx = self.slow_influx = first
        self.t = xp.full(0)
        self.last = self.serve(xp.full(self.weights.item(0)))
        self.last["scaling_blocked"] = xp.full(False)

    def step(self, delta, tier, level) -> tuple[Any, Any]:
        """Scale each copy's fleet (delta -1 / 0 / 1 instance of `tier`), then serve the next interval
        with the shedding weight of priority `level`. Returns (reward, truncated)."""
        xp = self.xp
        blocked = self.fleet.scale(delta, tier)
        self.t = self.t + 1
        self.last = last = self.serve(xp.lookup(self.weights, level))
        last["scaling_blocked"] = blocked
        reward = -(last["cost_instances"] + last["cost_slo"] + last["cost_dropped"])
        return reward, self.t >= self.config.episode_length

    def serve(self, shed_weight) -> dict[str, Any]:
        """Serve the current interval; returns its values (the new `last`)."""
        xp, cfg = self.xp, self.config
        arrivals = xp.column(self.traces, self.t)
        fleet = self.fleet.tick()
        capacity = fleet["capacity"]
        backlog = self.queue_high + self.queue_low
        values = self._queues(arrivals, capacity, shed_weight)
        served, queue, dropped_high = values["served"], values["queue"], values.pop("dropped_high")
        # Processing at this utilisation, plus the time to drain the backlog left at the end.
        latency_ms = (processing_latency(xp, cfg.service_time_ms, served / capacity)
                      + queue / capacity * cfg.interval_ms)
        violation = latency_ms > cfg.latency_slo
        self.fast_influx = self.fast_influx + FAST_EMA * (arrivals - self.fast_influx)
        self.slow_influx = self.slow_influx + SLOW_EMA * (arrivals - self.slow_influx)
        values.update(fleet)
        values.update({
            "arrivals": arrivals, "utilisation": (backlog + arrivals) / fleet["provisioned_capacity"],
            "running_utilisation": served / capacity, "latency_ms": latency_ms, "slo_violation": violation,
            "priority_weight": shed_weight, "cost_instances": fleet["cost_rate"],
            "cost_slo": xp.where(violation, cfg.slo_violation_penalty, 0.0),
            "cost_dropped": (cfg.drop_penalty * dropped_high
                             + self.low_drop_penalty * values["dropped_low_priority"]),
        })
        return values

    def _queues(self, arrivals, capacity, shed_weight) -> dict[str, Any]:
        """Serve high priority first; shed the weight's fraction of the demand above what capacity
        serves within the SLO, from low priority only; queue what is left up to max_queue and drop
        the rest, low priority first."""
        xp = self.xp
        arrivals_low = arrivals * self.low_fraction
        arrivals_high = arrivals - arrivals_low
        demand_high = self.queue_high + arrivals_high
        demand_low = self.queue_low + arrivals_low
        shed = shed_weight * xp.minimum(
            demand_low, xp.maximum(0.0, demand_high + demand_low - self.slo_utilisation * capacity)
        )
        demand_low = demand_low - shed
        served_high = xp.minimum(demand_high, capacity)
        served_low = xp.minimum(demand_low, capacity - served_high)
        left_high = demand_high - served_high
        left_low = demand_low - served_low
        overflow = xp.maximum(0.0, left_high + left_low - self.config.max_queue)
        overflow_low = xp.minimum(overflow, left_low)
        dropped_high = overflow - overflow_low
        dropped_low = shed + overflow_low
        self.queue_high = left_high - dropped_high
        self.queue_low = left_low - overflow_low
        return {"served": served_high + served_low, "dropped": dropped_high + dropped_low,
                "dropped_high": dropped_high, "dropped_low_priority": dropped_low,
                "queue": self.queue_high + self.queue_low}

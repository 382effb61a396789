"""Cloud autoscaling environments: a service with a request queue and a fleet of booting/running instances.

Each step is one interval (`interval_ms`). In order, a step:
  1. applies the scaling action: "add" starts booting one instance (it serves from `startup_delay`
     steps later); "remove" cancels the newest booting instance or, if none boots, stops a running
     one. Neither goes beyond [min_instances, max_instances], nor stops running instances below
     min_instances: such an action is a no-op and `info["scaling_blocked"]` is True;
  2. serves the backlog plus this interval's arrivals, up to capacity = sum over running
     instances of capacity_per_instance (x the tier's capacity multiplier in the multi env);
  3. queues what is left up to `max_queue` and drops the rest.

Per-step accounting (all in `info`) and the reward:
  latency_ms  = service_time_ms * (1 + rho**4 / (1 - rho))  + queue / capacity * interval_ms
                with rho = served / capacity capped at 0.99: a queueing-delay curve under twice
                service_time_ms up to rho = 0.7 that climbs steeply after (with the defaults it
                reaches the SLO, 5x, at rho = 0.86), plus the time to drain the backlog left at
                the end of the interval.
  cost_instances = instance_cost * sum over running AND booting instances of the tier's cost
                   multiplier (a booting instance is billed, as clouds bill from launch)
  cost_slo       = slo_violation_penalty * [latency_ms > latency_slo]
  cost_dropped   = drop_penalty * dropped  (+ low_priority_drop_penalty * dropped low-priority
                   requests in the multi env)
  reward = -(cost_instances + cost_slo + cost_dropped)

Episodes never terminate; they are truncated after `episode_length` steps. Observations are
normalised float32; the layout is in `OBSERVATION_NAMES` (Autoscaling-v0) and in
`env.observation_names` / `env.observation_parts` (AutoscalingMulti-v0, whose micro part is
`MICRO_NAMES`), with index constants for what baselines read.

AutoscalingMulti-v0 (`AutoscalingMultiEnv`) acts on three dimensions at once, MultiDiscrete([3, T, P]):
  - instance delta (remove / keep / add), applied to
  - a capacity tier: instances are heterogeneous; "add" boots one of the chosen tier and "remove"
    removes one of it (blocked if the fleet has none). Bigger tiers carry more capacity for a
    slightly lower cost per unit, but move capacity in coarser steps;
  - a priority weight w (one of `priority_weights`): a fraction `low_priority_fraction` of
    requests is low priority and high priority is served first. Admission control sheds w times
    the demand above what capacity serves within the SLO (rho = 0.86 with the defaults), taken from
    low-priority requests only, each shed request costing `low_priority_drop_penalty`. Shedding
    keeps latency under the SLO at the price of dropped requests; it only acts when capacity falls
    short, which is what the instance and tier choices decide, so a lean fleet that sheds at peaks
    competes with a larger fleet that does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from kuberl.trainer.envs.kwargs import config_from_kwargs
from kuberl.trainer.envs.seeding import per_env_seeds
from kuberl.trainer.envs.load_patterns import LOAD_PATTERNS, LoadParams, check_pattern, generate_load

ACTION_REMOVE, ACTION_KEEP, ACTION_ADD = 0, 1, 2

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
OBS_UTILISATION = OBSERVATION_NAMES.index("utilisation")
"""The index ThresholdPolicy reads: utilisation counting booting instances, so it does not keep adding
while instances it already asked for are still starting."""
OBS_QUEUE = OBSERVATION_NAMES.index("queue")
OBS_RUNNING = OBSERVATION_NAMES.index("running")
OBS_BOOTING = OBSERVATION_NAMES.index("booting")
OBS_INFLUX = OBSERVATION_NAMES.index("influx")
OBS_TREND = OBSERVATION_NAMES.index("trend")
OBS_LATENCY = OBSERVATION_NAMES.index("latency")

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
MICRO_UTILISATION = MICRO_NAMES.index("utilisation")

DEFAULT_TIERS = ((1.0, 1.0), (2.0, 1.9), (4.0, 3.6))
DEFAULT_PRIORITY_WEIGHTS = (0.0, 0.5, 1.0)

_BOUNDS = {
    "utilisation": (0.0, 3.0),
    "influx": (0.0, 2.0),
    "influx_long": (0.0, 2.0),
    "trend": (-1.0, 1.0),
    "latency": (0.0, 4.0),
    "cycle_sin": (-1.0, 1.0),
    "cycle_cos": (-1.0, 1.0),
}
_FAST_EMA, _SLOW_EMA = 0.5, 0.1
_INITIAL_UTILISATION = 0.7  # sizing of the starting fleet when initial_instances is not given
_MAX_RHO = 0.99


@dataclass(frozen=True)
class AutoscalingConfig:
    """Keyword arguments of kuberl/Autoscaling-v0 (also the first part of the multi env's)."""

    load_pattern: str = "SINE_CURVE"
    """One of SINE_CURVE, SINUSOIDAL, STEADY, SPIKE, POISSON, RANDOM (see load_patterns.py)."""
    load_params: LoadParams = field(default_factory=LoadParams)
    """Shape of the load (base_load, period, amplitude, noise, spike_*, walk_*); a dict in a spec."""
    episode_length: int = 200
    """Steps (intervals) per episode."""
    min_instances: int = 1
    """Fewest instances; running instances never go below it."""
    max_instances: int = 20
    """Most instances, running and booting together."""
    initial_instances: int | None = None
    """Running (tier-0) instances at reset; None sizes them for the first interval's load at 70% utilisation."""
    capacity_per_instance: float = 10.0
    """Requests one instance serves per interval (times its tier's capacity multiplier in the multi env)."""
    max_queue: float = 100.0
    """Backlog the service holds; arrivals beyond it are dropped."""
    startup_delay: int = 3
    """Steps between asking for an instance and it serving (it is billed meanwhile)."""
    latency_slo: float = 250.0
    """Latency objective in milliseconds; a step whose latency estimate exceeds it is a violation."""
    service_time_ms: float = 50.0
    """Latency of one request on an idle instance, in milliseconds."""
    interval_ms: float = 1000.0
    """Length of one step in milliseconds (the backlog's drain time is counted in it)."""
    instance_cost: float = 0.1
    """Reward cost per instance per step, booting included (times its tier's cost multiplier in the multi env)."""
    slo_violation_penalty: float = 1.0
    """Reward cost of one step whose latency exceeds latency_slo."""
    drop_penalty: float = 0.05
    """Reward cost per dropped (high-priority, in the multi env) request."""

    def __post_init__(self) -> None:
        check_pattern(self.load_pattern)
        if not isinstance(self.load_params, LoadParams):
            object.__setattr__(self, "load_params", LoadParams.from_mapping(self.load_params))
        _require_int(self, "episode_length", 1)
        _require_int(self, "min_instances", 1)
        _require_int(self, "max_instances", self.min_instances)
        _require_int(self, "startup_delay", 0)
        if self.initial_instances is not None:
            _require_int(self, "initial_instances", self.min_instances)
            if self.initial_instances > self.max_instances:
                raise ValueError(
                    f"initial_instances={self.initial_instances!r}: must be within "
                    f"[min_instances={self.min_instances}, max_instances={self.max_instances}]"
                )
        for name in ("capacity_per_instance", "latency_slo", "service_time_ms", "interval_ms"):
            _require_number(self, name, positive=True)
        for name in ("max_queue", "instance_cost", "slo_violation_penalty", "drop_penalty"):
            _require_number(self, name, positive=False)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> AutoscalingConfig:
        """Build from env kwargs; an unknown name or a bad value raises ValueError naming it."""
        return config_from_kwargs(cls, kwargs)


@dataclass(frozen=True)
class AutoscalingMultiConfig(AutoscalingConfig):
    """Keyword arguments of kuberl/AutoscalingMulti-v0: the single env's plus these."""

    tiers: tuple = DEFAULT_TIERS
    """Capacity tiers as (capacity multiplier, cost multiplier) pairs; tier 0 is the starting fleet's."""
    priority_weights: tuple = DEFAULT_PRIORITY_WEIGHTS
    """Fraction of unserved low-priority requests shed each step, one per priority level, in [0, 1]."""
    low_priority_fraction: float = 0.4
    """Share of arrivals that are low priority."""
    low_priority_drop_penalty: float = 0.02
    """Reward cost per dropped or shed low-priority request."""
    observation_split: bool = True
    """True: Dict observation {"macro", "micro"}; False: one flat Box, macro then micro."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            tiers = tuple((float(c), float(k)) for c, k in self.tiers)
        except (TypeError, ValueError):
            raise ValueError(
                f"tiers={self.tiers!r}: must be a list of [capacity_multiplier, cost_multiplier] pairs"
            ) from None
        if not tiers or any(c <= 0 or k < 0 for c, k in tiers):
            raise ValueError(f"tiers={self.tiers!r}: needs >= 1 tier, capacities > 0 and costs >= 0")
        object.__setattr__(self, "tiers", tiers)
        try:
            weights = tuple(float(w) for w in self.priority_weights)
        except (TypeError, ValueError):
            raise ValueError(
                f"priority_weights={self.priority_weights!r}: must be a list of numbers"
            ) from None
        if not weights or any(not 0.0 <= w <= 1.0 for w in weights):
            raise ValueError(
                f"priority_weights={self.priority_weights!r}: needs >= 1 weight, each within [0, 1]"
            )
        object.__setattr__(self, "priority_weights", weights)
        if not 0.0 <= self.low_priority_fraction <= 1.0:
            raise ValueError(f"low_priority_fraction={self.low_priority_fraction!r}: must be within [0, 1]")
        _require_number(self, "low_priority_drop_penalty", positive=False)
        if not isinstance(self.observation_split, bool):
            raise ValueError(f"observation_split={self.observation_split!r}: must be true or false")  # noqa: TRY004


def _require_int(cfg: Any, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")


def _require_number(cfg: Any, name: str, positive: bool) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name}={value!r}: must be a number {'> 0' if positive else '>= 0'}")


def _processing_latency(service_time_ms: float, rho: float) -> float:
    rho = min(rho, _MAX_RHO)
    rho2 = rho * rho  # rho**4 as two products: the batched env computes the same bits with numpy
    return service_time_ms * (1.0 + rho2 * rho2 / (1.0 - rho))


def _slo_utilisation(service_time_ms: float, latency_slo: float) -> float:
    """Highest utilisation whose processing latency (empty queue) still meets the SLO."""
    if _processing_latency(service_time_ms, 0.0) >= latency_slo:
        return 0.0
    low, high = 0.0, _MAX_RHO
    for _ in range(50):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if _processing_latency(service_time_ms, mid) <= latency_slo else (low, mid)
    return low


def _box(names: tuple[str, ...]) -> spaces.Box:
    low = np.array([_BOUNDS.get(n, (0.0, 1.0))[0] for n in names], dtype=np.float32)
    high = np.array([_BOUNDS.get(n, (0.0, 1.0))[1] for n in names], dtype=np.float32)
    return spaces.Box(low, high, dtype=np.float32)


class AutoscalingEnv(gym.Env):
    """kuberl/Autoscaling-v0: Discrete(3) actions remove / keep / add one instance."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed values: None, ansi")
        self.render_mode = render_mode
        self.config = AutoscalingConfig.from_kwargs(kwargs)
        self._setup_service(
            tiers=((1.0, 1.0),), priority_weights=(0.0,), low_fraction=0.0, low_drop_penalty=0.0
        )
        self.action_space = spaces.Discrete(3)
        self.observation_names = OBSERVATION_NAMES
        self.observation_space = _box(OBSERVATION_NAMES)
        self._obs_low, self._obs_high = self.observation_space.low, self.observation_space.high

    # --- simulator ---------------------------------------------------------------------------

    def _setup_service(self, tiers, priority_weights, low_fraction: float, low_drop_penalty: float) -> None:
        cfg = self.config
        self._tier_capacity = [c * cfg.capacity_per_instance for c, _ in tiers]
        self._tier_cost = [k * cfg.instance_cost for _, k in tiers]
        self._priority_weights = priority_weights
        self._low_fraction = low_fraction
        self._low_drop_penalty = low_drop_penalty
        self._ref_capacity = cfg.max_instances * cfg.capacity_per_instance
        self._max_capacity = cfg.max_instances * max(self._tier_capacity)
        self._max_cost_rate = cfg.max_instances * max(max(self._tier_cost), 1e-12)
        self._slo_utilisation = _slo_utilisation(cfg.service_time_ms, cfg.latency_slo)
        self._trace: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cfg = self.config
        n_tiers = len(self._tier_capacity)
        self._trace = generate_load(cfg.load_pattern, cfg.episode_length + 1, self.np_random, cfg.load_params)
        first = float(self._trace[0])
        if cfg.initial_instances is not None:
            initial = cfg.initial_instances
        else:
            wanted = math.ceil(first / (_INITIAL_UTILISATION * self._tier_capacity[0]))
            initial = min(max(wanted, cfg.min_instances), cfg.max_instances)
        self._running = [initial] + [0] * (n_tiers - 1)
        # _booting[k][d]: instances of tier k that start serving d steps from now.
        self._booting = [[0] * (cfg.startup_delay + 1) for _ in range(n_tiers)]
        self._queue_high = self._queue_low = 0.0
        self._fast_influx = self._slow_influx = first
        self._t = 0
        # Interval 0 is served before the agent acts, so the first observation carries real
        # utilisation, latency and influx; its costs are not part of the return.
        info = self._serve(first, self._priority_weights[0])
        info["scaling_blocked"] = False
        return self._observation(), info

    def step(self, action):
        if self._trace is None:
            raise RuntimeError("step() called before reset()")
        if self._t >= self.config.episode_length:
            raise RuntimeError("step() called after the episode was truncated; call reset()")
        delta, tier, weight_index = self._decode(action)
        blocked = self._scale(delta, tier)
        self._t += 1
        info = self._serve(float(self._trace[self._t]), self._priority_weights[weight_index])
        info["scaling_blocked"] = blocked
        reward = -(info["cost_instances"] + info["cost_slo"] + info["cost_dropped"])
        truncated = self._t >= self.config.episode_length
        return self._observation(), reward, False, truncated, info

    def _decode(self, action) -> tuple[int, int, int]:
        a = int(action)
        if not 0 <= a <= 2:
            raise ValueError(
                f"action={action!r} is not allowed; allowed values: 0 (remove), 1 (keep), 2 (add)"
            )
        return a - 1, 0, 0

    def _scale(self, delta: int, tier: int) -> bool:
        """Apply one instance add/remove of `tier`; True when the bounds blocked it."""
        if delta == 0:
            return False
        cfg = self.config
        booting = self._booting[tier]
        total = sum(self._running) + sum(sum(b) for b in self._booting)
        if delta > 0:
            if total >= cfg.max_instances:
                return True
            booting[cfg.startup_delay] += 1
            return False
        if total <= cfg.min_instances:
            return True
        for d in range(cfg.startup_delay, -1, -1):  # cancel the newest boot first: least sunk cost
            if booting[d]:
                booting[d] -= 1
                return False
        if self._running[tier] > 0 and sum(self._running) > cfg.min_instances:
            self._running[tier] -= 1
            return False
        return True

    def _serve(self, arrivals: float, shed_weight: float) -> dict[str, Any]:
        cfg = self.config
        caps, costs = self._tier_capacity, self._tier_cost
        for k, booting in enumerate(self._booting):
            if booting[0]:
                self._running[k] += booting[0]
                booting[0] = 0
        capacity = sum(n * c for n, c in zip(self._running, caps))

        backlog = self._queue_high + self._queue_low
        arrivals_low = arrivals * self._low_fraction
        arrivals_high = arrivals - arrivals_low
        demand_high = self._queue_high + arrivals_high
        demand_low = self._queue_low + arrivals_low
        # Admission control: of the demand above what capacity serves within the SLO, shed the
        # priority weight's fraction, taken from low-priority requests only.
        shed = shed_weight * min(
            demand_low, max(0.0, demand_high + demand_low - self._slo_utilisation * capacity)
        )
        demand_low -= shed
        served_high = min(demand_high, capacity)
        served_low = min(demand_low, capacity - served_high)
        left_high = demand_high - served_high
        left_low = demand_low - served_low
        overflow = max(0.0, left_high + left_low - cfg.max_queue)
        overflow_low = min(overflow, left_low)
        dropped_high = overflow - overflow_low
        dropped_low = shed + overflow_low
        self._queue_high = left_high - dropped_high
        self._queue_low = left_low - overflow_low
        served = served_high + served_low
        queue = self._queue_high + self._queue_low

        latency_ms = (
            _processing_latency(cfg.service_time_ms, served / capacity) + queue / capacity * cfg.interval_ms
        )
        violation = latency_ms > cfg.latency_slo

        booting_per_tier = [sum(b) for b in self._booting]
        provisioned = capacity + sum(n * c for n, c in zip(booting_per_tier, caps))
        cost_rate = sum((r + b) * c for r, b, c in zip(self._running, booting_per_tier, costs))
        for booting in self._booting:  # one step closer to serving
            booting.append(booting.pop(0))

        self._fast_influx += _FAST_EMA * (arrivals - self._fast_influx)
        self._slow_influx += _SLOW_EMA * (arrivals - self._slow_influx)
        self._last = last = {
            "arrivals": arrivals,
            "served": served,
            "dropped": dropped_high + dropped_low,
            "dropped_low_priority": dropped_low,
            "queue": queue,
            "queue_high": self._queue_high,
            "queue_low": self._queue_low,
            "running_instances": sum(self._running),
            "booting_instances": sum(booting_per_tier),
            "instances": sum(self._running) + sum(booting_per_tier),
            "capacity": capacity,
            "utilisation": (backlog + arrivals) / provisioned,
            "running_utilisation": served / capacity,
            "latency_ms": latency_ms,
            "slo_violation": violation,
            "priority_weight": shed_weight,
            "cost_rate": cost_rate,
            "provisioned_capacity": provisioned,
            "booting_per_tier": booting_per_tier,
        }
        return {
            "t": self._t,
            **{k: last[k] for k in _INFO_KEYS},
            "cost_instances": cost_rate,
            "cost_slo": cfg.slo_violation_penalty if violation else 0.0,
            "cost_dropped": cfg.drop_penalty * dropped_high + self._low_drop_penalty * dropped_low,
        }

    # --- observation -------------------------------------------------------------------------

    def _shared_features(self) -> dict[str, float]:
        cfg, last = self.config, self._last
        arrivals = last["arrivals"]
        phase = 2.0 * math.pi * ((self._t + 1) % cfg.load_params.period) / cfg.load_params.period
        per_arrival = 1.0 / arrivals if arrivals > 0 else 0.0
        return {
            "utilisation": last["utilisation"],
            "running_utilisation": last["running_utilisation"],
            "influx": arrivals / self._ref_capacity,
            "influx_long": self._slow_influx / self._ref_capacity,
            "trend": (self._fast_influx - self._slow_influx) / max(self._slow_influx, 1.0),
            "latency": last["latency_ms"] / cfg.latency_slo,
            "cycle_sin": math.sin(phase),
            "cycle_cos": math.cos(phase),
            "progress": self._t / cfg.episode_length,
            "per_arrival": per_arrival,
        }

    def _observation(self) -> np.ndarray:
        cfg, last = self.config, self._last
        f = self._shared_features()
        values = [
            f["utilisation"],
            f["running_utilisation"],
            last["queue"] / cfg.max_queue if cfg.max_queue > 0 else 0.0,
            last["running_instances"] / cfg.max_instances,
            last["booting_instances"] / cfg.max_instances,
            f["influx"],
            f["influx_long"],
            f["trend"],
            f["latency"],
            last["dropped"] * f["per_arrival"],
            f["cycle_sin"],
            f["cycle_cos"],
            f["progress"],
        ]
        return np.clip(np.array(values, dtype=np.float32), self._obs_low, self._obs_high)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        if self._trace is None:
            return "(not reset)"
        last = self._last
        return (
            f"t={self._t:4d} arrivals={last['arrivals']:6.1f} instances={last['running_instances']:3d}"
            f"+{last['booting_instances']} booting queue={last['queue']:6.1f} "
            f"util={last['utilisation']:.2f} latency={last['latency_ms']:7.1f}ms"
            f"{' SLO-VIOLATION' if last['slo_violation'] else ''}"
        )


_INFO_KEYS = (
    "arrivals",
    "served",
    "dropped",
    "queue",
    "running_instances",
    "booting_instances",
    "instances",
    "capacity",
    "utilisation",
    "latency_ms",
    "slo_violation",
)
"""Per-step info keys (both envs) beside t, cost_instances, cost_slo, cost_dropped, scaling_blocked."""


class AutoscalingMultiEnv(AutoscalingEnv):
    """kuberl/AutoscalingMulti-v0: MultiDiscrete([3, tiers, priority levels]) actions."""

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed values: None, ansi")
        self.render_mode = render_mode
        self.config = cfg = AutoscalingMultiConfig.from_kwargs(kwargs)
        self._setup_service(
            tiers=cfg.tiers,
            priority_weights=cfg.priority_weights,
            low_fraction=cfg.low_priority_fraction,
            low_drop_penalty=cfg.low_priority_drop_penalty,
        )
        n_tiers, n_levels = len(cfg.tiers), len(cfg.priority_weights)
        self.action_space = spaces.MultiDiscrete([3, n_tiers, n_levels])
        macro = (
            tuple(f"running_tier{k}" for k in range(n_tiers))
            + tuple(f"booting_tier{k}" for k in range(n_tiers))
            + MACRO_SHARED_NAMES
        )
        self.observation_names = {"macro": macro, "micro": MICRO_NAMES}
        self.observation_parts = {"macro": len(macro), "micro": len(MICRO_NAMES)}
        """Sizes of the two parts, in the order the flat observation concatenates them."""
        self._macro_space, self._micro_space = _box(macro), _box(MICRO_NAMES)
        if cfg.observation_split:
            self.observation_space = spaces.Dict({"macro": self._macro_space, "micro": self._micro_space})
        else:
            self.observation_space = _box(macro + MICRO_NAMES)

    def _decode(self, action) -> tuple[int, int, int]:
        delta, tier, level = (int(a) for a in np.asarray(action).reshape(3))
        if not (
            0 <= delta <= 2
            and 0 <= tier < len(self._tier_capacity)
            and 0 <= level < len(self._priority_weights)
        ):
            raise ValueError(f"action={action!r} is outside {self.action_space}")
        return delta - 1, tier, level

    def _observation(self):
        cfg, last = self.config, self._last
        f = self._shared_features()
        n_max = cfg.max_instances
        per_arrival = f["per_arrival"]
        macro = (
            [n / n_max for n in self._running]
            + [n / n_max for n in last["booting_per_tier"]]
            + [
                last["provisioned_capacity"] / self._max_capacity,
                last["cost_rate"] / self._max_cost_rate,
                last["priority_weight"],
                f["influx_long"],
                f["cycle_sin"],
                f["cycle_cos"],
                f["progress"],
            ]
        )
        micro = [
            f["utilisation"],
            f["running_utilisation"],
            self._queue_high / cfg.max_queue if cfg.max_queue > 0 else 0.0,
            self._queue_low / cfg.max_queue if cfg.max_queue > 0 else 0.0,
            f["influx"],
            f["trend"],
            f["latency"],
            (last["dropped"] - last["dropped_low_priority"]) * per_arrival,
            last["dropped_low_priority"] * per_arrival,
        ]
        macro_obs = np.clip(np.array(macro, dtype=np.float32), self._macro_space.low, self._macro_space.high)
        micro_obs = np.clip(np.array(micro, dtype=np.float32), self._micro_space.low, self._micro_space.high)
        if cfg.observation_split:
            return {"macro": macro_obs, "micro": micro_obs}
        return np.concatenate([macro_obs, micro_obs])

    def _serve(self, arrivals: float, shed_weight: float) -> dict[str, Any]:
        info = super()._serve(arrivals, shed_weight)
        info["dropped_low_priority"] = self._last["dropped_low_priority"]
        info["priority_weight"] = shed_weight
        return info


# --- the numpy-batched version ----------------------------------------------------------------


class AutoscalingBatch(VectorEnv):
    """`num_envs` copies of Autoscaling-v0 (`multi=False`) or AutoscalingMulti-v0 (`multi=True`)
    stepped with array operations: the same episodes as a `SyncVectorEnv` of the per-env env
    (autoreset in the same step) under the same seeds, float for float.

    Each copy has its own generator, seeded as `SyncVectorEnv` seeds its copies; a copy's load trace
    is drawn from it at each of its resets, as the per-env env draws it, so only the resets cost a
    Python call per env. `info` holds the per-step accounting as arrays (the keys of the per-env
    env's info); `final_obs` for the copies whose episode was truncated.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, multi: bool = False, **kwargs: Any) -> None:
        # One per-env env describes the spaces and the derived constants; it is never stepped.
        proto = AutoscalingMultiEnv(**kwargs) if multi else AutoscalingEnv(**kwargs)
        self.config = cfg = proto.config
        self.multi = multi
        self.num_envs = num_envs
        self.single_observation_space = proto.observation_space
        self.single_action_space = proto.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_names = proto.observation_names
        self._proto = proto
        self._caps = list(proto._tier_capacity)
        self._costs = list(proto._tier_cost)
        self._weights = np.asarray(proto._priority_weights, np.float64)
        self._low_fraction = proto._low_fraction
        self._low_drop_penalty = proto._low_drop_penalty
        n_tiers = len(self._caps)
        self.running = np.zeros((num_envs, n_tiers), np.int64)
        # booting[:, k, d]: instances of tier k that start serving d steps from now.
        self.booting = np.zeros((num_envs, n_tiers, cfg.startup_delay + 1), np.int64)
        self.queue_high = np.zeros(num_envs)
        self.queue_low = np.zeros(num_envs)
        self.fast_influx = np.zeros(num_envs)
        self.slow_influx = np.zeros(num_envs)
        self.t = np.zeros(num_envs, np.int64)
        self.trace = np.zeros((num_envs, cfg.episode_length + 1))
        self.last: dict[str, np.ndarray] = {}
        period = cfg.load_params.period
        phases = [2.0 * math.pi * (r % period) / period for r in range(period)]  # as _shared_features
        self._cycle = np.array([[math.sin(p), math.cos(p)] for p in phases])
        self._seed_all([None] * num_envs)

    def _seed_all(self, seeds: list[int | None]) -> None:
        self.rngs = [gym.utils.seeding.np_random(s)[0] for s in seeds]

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._seed_all(per_env_seeds(seed, self.num_envs))
        self._reset_envs(np.arange(self.num_envs))
        # Interval 0 is served before the agent acts, as the per-env reset does.
        self.last = self._serve(slice(None), np.full(self.num_envs, self._weights[0]))
        info = self._info(self.last)
        info["scaling_blocked"] = np.zeros(self.num_envs, bool)
        return self._observation(), info

    def _reset_envs(self, idx: np.ndarray) -> None:
        cfg = self.config
        for i in idx:
            self.trace[i] = generate_load(cfg.load_pattern, cfg.episode_length + 1, self.rngs[i], cfg.load_params)
        first = self.trace[idx, 0]
        if cfg.initial_instances is not None:
            initial = np.full(len(idx), cfg.initial_instances, np.int64)
        else:
            wanted = np.ceil(first / (_INITIAL_UTILISATION * self._caps[0])).astype(np.int64)
            initial = np.minimum(np.maximum(wanted, cfg.min_instances), cfg.max_instances)
        self.running[idx] = 0
        self.running[idx, 0] = initial
        self.booting[idx] = 0
        self.queue_high[idx] = 0.0
        self.queue_low[idx] = 0.0
        self.fast_influx[idx] = first
        self.slow_influx[idx] = first
        self.t[idx] = 0

    def _serve(self, rows, shed_weight: np.ndarray) -> dict[str, np.ndarray]:
        """Serve the current interval of the copies in `rows` (a slice or indices): the per-env
        `_serve`, the same operations in the same order on arrays. Returns its values per row."""
        cfg = self.config
        caps, costs = self._caps, self._costs
        running, booting = self.running[rows], self.booting[rows]  # copies when rows are indices
        arrivals = self.trace[rows][np.arange(len(running)), self.t[rows]]
        running += booting[:, :, 0]
        booting[:, :, 0] = 0
        capacity = np.zeros(len(running))
        for k, c in enumerate(caps):  # in tier order, as sum() over the tiers
            capacity = capacity + running[:, k] * c
        queue_high, queue_low = self.queue_high[rows], self.queue_low[rows]
        backlog = queue_high + queue_low
        arrivals_low = arrivals * self._low_fraction
        arrivals_high = arrivals - arrivals_low
        demand_high = queue_high + arrivals_high
        demand_low = queue_low + arrivals_low
        shed = shed_weight * np.minimum(
            demand_low, np.maximum(0.0, demand_high + demand_low - self._proto._slo_utilisation * capacity)
        )
        demand_low = demand_low - shed
        served_high = np.minimum(demand_high, capacity)
        served_low = np.minimum(demand_low, capacity - served_high)
        left_high = demand_high - served_high
        left_low = demand_low - served_low
        overflow = np.maximum(0.0, left_high + left_low - cfg.max_queue)
        overflow_low = np.minimum(overflow, left_low)
        dropped_high = overflow - overflow_low
        dropped_low = shed + overflow_low
        queue_high = left_high - dropped_high
        queue_low = left_low - overflow_low
        served = served_high + served_low
        queue = queue_high + queue_low
        rho = np.minimum(served / capacity, _MAX_RHO)
        rho2 = rho * rho
        latency_ms = cfg.service_time_ms * (1.0 + rho2 * rho2 / (1.0 - rho)) + queue / capacity * cfg.interval_ms
        violation = latency_ms > cfg.latency_slo
        booting_per_tier = booting.sum(axis=2)
        extra = np.zeros(len(running))
        cost_rate = np.zeros(len(running))
        for k, (c, cost) in enumerate(zip(caps, costs)):
            extra = extra + booting_per_tier[:, k] * c
            cost_rate = cost_rate + (running[:, k] + booting_per_tier[:, k]) * cost
        provisioned = capacity + extra
        booting[:, :, :-1] = booting[:, :, 1:].copy()  # one step closer to serving
        booting[:, :, -1] = 0
        fast, slow = self.fast_influx[rows], self.slow_influx[rows]
        self.fast_influx[rows] = fast + _FAST_EMA * (arrivals - fast)
        self.slow_influx[rows] = slow + _SLOW_EMA * (arrivals - slow)
        self.running[rows], self.booting[rows] = running, booting
        self.queue_high[rows], self.queue_low[rows] = queue_high, queue_low
        running_total = running.sum(axis=1)
        booting_total = booting_per_tier.sum(axis=1)
        return {
            "arrivals": arrivals, "served": served, "dropped": dropped_high + dropped_low,
            "dropped_low_priority": dropped_low, "queue": queue, "running_instances": running_total,
            "booting_instances": booting_total, "instances": running_total + booting_total,
            "capacity": capacity, "utilisation": (backlog + arrivals) / provisioned,
            "running_utilisation": served / capacity, "latency_ms": latency_ms, "slo_violation": violation,
            "priority_weight": np.asarray(shed_weight, np.float64), "cost_rate": cost_rate,
            "provisioned_capacity": provisioned, "booting_per_tier": booting_per_tier,
            "cost_instances": cost_rate,
            "cost_slo": np.where(violation, cfg.slo_violation_penalty, 0.0),
            "cost_dropped": cfg.drop_penalty * dropped_high + self._low_drop_penalty * dropped_low,
        }

    def _info(self, values: dict[str, np.ndarray]) -> dict[str, Any]:
        keys = (*_INFO_KEYS, "cost_instances", "cost_slo", "cost_dropped")
        if self.multi:
            keys += ("dropped_low_priority", "priority_weight")
        return {"t": self.t.copy(), **{k: values[k].copy() for k in keys}}

    def _decode(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = np.asarray(actions)
        if not self.multi:
            a = a.reshape(self.num_envs).astype(np.int64)
            if ((a < 0) | (a > 2)).any():
                bad = int(a[(a < 0) | (a > 2)][0])
                raise ValueError(f"action={bad!r} is not allowed; allowed values: 0 (remove), 1 (keep), 2 (add)")
            return a - 1, np.zeros(self.num_envs, np.int64), np.zeros(self.num_envs, np.int64)
        a = a.reshape(self.num_envs, 3).astype(np.int64)
        high = np.array([3, len(self._caps), len(self._weights)])
        bad = ((a < 0) | (a >= high)).any(axis=1)
        if bad.any():
            raise ValueError(f"action={a[bad][0].tolist()!r} is outside {self.single_action_space}")
        return a[:, 0] - 1, a[:, 1], a[:, 2]

    def _scale(self, delta: np.ndarray, tier: np.ndarray) -> np.ndarray:
        """Apply each copy's add/remove of one instance of its tier; True where the bounds blocked it."""
        cfg = self.config
        rows = np.arange(self.num_envs)
        total = self.running.sum(axis=1) + self.booting.sum(axis=(1, 2))
        blocked = np.zeros(self.num_envs, bool)
        add = delta > 0
        blocked |= add & (total >= cfg.max_instances)
        grow = rows[add & ~blocked]
        self.booting[grow, tier[grow], cfg.startup_delay] += 1
        remove = delta < 0
        blocked |= remove & (total <= cfg.min_instances)
        shrink = rows[remove & ~blocked]
        if len(shrink):
            boots = self.booting[shrink, tier[shrink]] > 0  # (M, delay + 1)
            cancel = boots.any(axis=1)
            newest = cfg.startup_delay - np.argmax(boots[:, ::-1], axis=1)  # cancel the newest boot first
            c = shrink[cancel]
            self.booting[c, tier[c], newest[cancel]] -= 1
            r = shrink[~cancel]
            can_stop = (self.running[r, tier[r]] > 0) & (self.running[r].sum(axis=1) > cfg.min_instances)
            self.running[r[can_stop], tier[r[can_stop]]] -= 1
            blocked[r[~can_stop]] = True
        return blocked

    def step(self, actions):
        delta, tier, level = self._decode(actions)
        blocked = self._scale(delta, tier)
        self.t += 1
        self.last = self._serve(slice(None), self._weights[level])
        info = self._info(self.last)
        info["scaling_blocked"] = blocked
        last = self.last
        reward = -(last["cost_instances"] + last["cost_slo"] + last["cost_dropped"])
        truncated = self.t >= self.config.episode_length
        obs = self._observation()
        if truncated.any():
            # As SyncVectorEnv: the ended copies' step goes to final_obs / final_info, and what
            # their reset returns takes its place in obs and info.
            ended = np.flatnonzero(truncated)
            final_info = {k: v.copy() for k, v in info.items()}
            info["final_obs"] = obs
            info["_final_obs"] = truncated.copy()
            info["final_info"] = final_info
            info["_final_info"] = truncated.copy()
            self._reset_envs(ended)
            fresh = self._serve(ended, np.full(len(ended), self._weights[0]))
            for k, v in fresh.items():
                last[k][ended] = v
            for k in info["final_info"]:
                if k in fresh:
                    info[k][ended] = fresh[k]
            info["t"][ended] = 0
            info["scaling_blocked"][ended] = False
            obs = self._observation()
        return obs, reward, np.zeros(self.num_envs, bool), truncated, info

    def _observation(self):
        cfg, last = self.config, self.last
        arrivals = last["arrivals"]
        with np.errstate(divide="ignore"):
            per_arrival = np.where(arrivals > 0, 1.0 / arrivals, 0.0)
        cycle = self._cycle[(self.t + 1) % cfg.load_params.period]
        influx = arrivals / self._proto._ref_capacity
        influx_long = self.slow_influx / self._proto._ref_capacity
        trend = (self.fast_influx - self.slow_influx) / np.maximum(self.slow_influx, 1.0)
        latency = last["latency_ms"] / cfg.latency_slo
        progress = self.t / cfg.episode_length
        per_queue = (lambda q: q / cfg.max_queue) if cfg.max_queue > 0 else (lambda q: np.zeros_like(q))
        if not self.multi:
            values = np.stack([
                last["utilisation"], last["running_utilisation"], per_queue(last["queue"]),
                last["running_instances"] / cfg.max_instances, last["booting_instances"] / cfg.max_instances,
                influx, influx_long, trend, latency, last["dropped"] * per_arrival, cycle[:, 0], cycle[:, 1],
                progress,
            ], axis=1)
            space = self.single_observation_space
            return np.clip(values.astype(np.float32), space.low, space.high)
        macro = np.concatenate([
            self.running / cfg.max_instances, last["booting_per_tier"] / cfg.max_instances,
            np.stack([last["provisioned_capacity"] / self._proto._max_capacity,
                      last["cost_rate"] / self._proto._max_cost_rate, last["priority_weight"], influx_long,
                      cycle[:, 0], cycle[:, 1], progress], axis=1),
        ], axis=1)
        micro = np.stack([
            last["utilisation"], last["running_utilisation"], per_queue(self.queue_high), per_queue(self.queue_low),
            influx, trend, latency, (last["dropped"] - last["dropped_low_priority"]) * per_arrival,
            last["dropped_low_priority"] * per_arrival,
        ], axis=1)
        macro = np.clip(macro.astype(np.float32), self._proto._macro_space.low, self._proto._macro_space.high)
        micro = np.clip(micro.astype(np.float32), self._proto._micro_space.low, self._proto._micro_space.high)
        if self.config.observation_split:
            return {"macro": macro, "micro": micro}
        return np.concatenate([macro, micro], axis=1)


__all__ = [
    "ACTION_ADD",
    "ACTION_KEEP",
    "ACTION_REMOVE",
    "LOAD_PATTERNS",
    "MACRO_SHARED_NAMES",
    "MICRO_NAMES",
    "MICRO_UTILISATION",
    "OBSERVATION_NAMES",
    "OBS_UTILISATION",
    "AutoscalingBatch",
    "AutoscalingConfig",
    "AutoscalingEnv",
    "AutoscalingMultiConfig",
    "AutoscalingMultiEnv",
]

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

These rules are implemented once, in autoscaling_service.py (and the observation in
autoscaling_observation.py): `AutoscalingEnv` runs one copy of the service on Python numbers,
`AutoscalingBatch` n copies on numpy arrays (elementwise.py says why both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from kuberl.trainer.envs.autoscaling_observation import (
    MACRO_SHARED_NAMES,
    MICRO_NAMES,
    OBSERVATION_NAMES,
    Observer,
)
from kuberl.trainer.envs.autoscaling_service import Service
from kuberl.trainer.envs.elementwise import Arrays, Numbers
from kuberl.trainer.envs.kwargs import config_from_kwargs
from kuberl.trainer.envs.load_patterns import LOAD_PATTERNS, LoadParams, check_pattern
from kuberl.trainer.envs.seeding import per_env_seeds

ACTION_REMOVE, ACTION_KEEP, ACTION_ADD = 0, 1, 2

OBS_UTILISATION = OBSERVATION_NAMES.index("utilisation")
"""The index ThresholdPolicy reads: utilisation counting booting instances, so it does not keep adding
while instances it already asked for are still starting."""
OBS_QUEUE = OBSERVATION_NAMES.index("queue")
OBS_RUNNING = OBSERVATION_NAMES.index("running")
OBS_BOOTING = OBSERVATION_NAMES.index("booting")
OBS_INFLUX = OBSERVATION_NAMES.index("influx")
OBS_TREND = OBSERVATION_NAMES.index("trend")
OBS_LATENCY = OBSERVATION_NAMES.index("latency")
MICRO_UTILISATION = MICRO_NAMES.index("utilisation")

DEFAULT_TIERS = ((1.0, 1.0), (2.0, 1.9), (4.0, 3.6))
DEFAULT_PRIORITY_WEIGHTS = (0.0, 0.5, 1.0)


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



# --- the envs: one copy or n copies of the service (autoscaling_service.py) -------------------

_INFO_KEYS = ("arrivals", "served", "dropped", "queue", "running_instances", "booting_instances", "instances",
              "capacity", "utilisation", "latency_ms", "slo_violation",
              "cost_instances", "cost_slo", "cost_dropped")
"""Per-step info keys of both envs beside t and scaling_blocked (and the multi env's below)."""
_MULTI_INFO_KEYS = ("dropped_low_priority", "priority_weight")


def _service(config: AutoscalingConfig, xp: Any) -> tuple[Service, Observer, tuple[str, ...]]:
    """The service `config` describes on `xp`'s copies, their observer and the info keys.
    Autoscaling-v0 is the multi env's service with one tier, one priority level (no shedding)
    and no low-priority traffic."""
    if isinstance(config, AutoscalingMultiConfig):
        service = Service(xp, config, config.tiers, config.priority_weights, config.low_priority_fraction,
                          config.low_priority_drop_penalty)
    else:
        service = Service(xp, config, ((1.0, 1.0),), (0.0,), 0.0, 0.0)
    multi = isinstance(config, AutoscalingMultiConfig)
    observer = Observer(config, multi, service.fleet.capacities, service.fleet.costs)
    return service, observer, _INFO_KEYS + (_MULTI_INFO_KEYS if multi else ()) + ("scaling_blocked",)


def _action_space(config: AutoscalingConfig) -> spaces.Space:
    if isinstance(config, AutoscalingMultiConfig):
        return spaces.MultiDiscrete([3, len(config.tiers), len(config.priority_weights)])
    return spaces.Discrete(3)


def _decode(xp: Any, actions: Any, space: spaces.Space) -> tuple[Any, Any, Any]:
    """(instance delta -1 / 0 / 1, tier, priority level) per copy from its action in `space`."""
    if isinstance(space, spaces.Discrete):
        (a,) = xp.integers(actions, 1)
        bad = (a < 0) | (a > 2)
        if xp.any(bad):
            raise ValueError(
                f"action={int(xp.first(a, bad))!r} is not allowed; allowed values: 0 (remove), 1 (keep), 2 (add)"
            )
        return a - 1, a * 0, a * 0
    delta, tier, level = xp.integers(actions, 3)
    tiers, levels = int(space.nvec[1]), int(space.nvec[2])
    bad = (delta < 0) | (delta > 2) | (tier < 0) | (tier >= tiers) | (level < 0) | (level >= levels)
    if xp.any(bad):
        first_bad = [int(xp.first(v, bad)) for v in (delta, tier, level)]
        raise ValueError(f"action={first_bad!r} is outside {space}")
    return delta - 1, tier, level


class AutoscalingEnv(gym.Env):
    """kuberl/Autoscaling-v0: Discrete(3) actions remove / keep / add one instance.

    The service (autoscaling_service.py) of one copy, on Python numbers: the code AutoscalingBatch
    runs on arrays. Its generator is the env's `np_random`, so an episode is the one a batched copy
    seeded alike plays."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    config_class: ClassVar[type[AutoscalingConfig]] = AutoscalingConfig

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed values: None, ansi")
        self.render_mode = render_mode
        self.config = self.config_class.from_kwargs(kwargs)
        self._service, self._observer, self._info_keys = _service(self.config, Numbers)
        self.action_space = _action_space(self.config)
        self.observation_space = self._observer.space
        self.observation_names = self._observer.names
        self._started = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._service.rngs[0] = self.np_random
        self._service.reset()
        self._started = True
        return self._observer.observe(self._service), self._info()

    def step(self, action):
        if not self._started:
            raise RuntimeError("step() called before reset()")
        if self._service.t >= self.config.episode_length:
            raise RuntimeError("step() called after the episode was truncated; call reset()")
        reward, truncated = self._service.step(*_decode(Numbers, action, self.action_space))
        return self._observer.observe(self._service), reward, False, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        last = self._service.last
        return {"t": self._service.t, **{k: last[k] for k in self._info_keys}}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        if not self._started:
            return "(not reset)"
        last = self._service.last
        return (
            f"t={self._service.t:4d} arrivals={last['arrivals']:6.1f} "
            f"instances={last['running_instances']:3d}"
            f"+{last['booting_instances']} booting queue={last['queue']:6.1f} "
            f"util={last['utilisation']:.2f} latency={last['latency_ms']:7.1f}ms"
            f"{' SLO-VIOLATION' if last['slo_violation'] else ''}"
        )


class AutoscalingMultiEnv(AutoscalingEnv):
    """kuberl/AutoscalingMulti-v0: MultiDiscrete([3, tiers, priority levels]) actions."""

    config_class = AutoscalingMultiConfig

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        super().__init__(render_mode, **kwargs)
        self.observation_parts = self._observer.parts
        """Sizes of the two parts, in the order the flat observation concatenates them."""


class AutoscalingBatch(VectorEnv):
    """`num_envs` copies of Autoscaling-v0 (`multi=False`) or AutoscalingMulti-v0 (`multi=True`):
    the service the per-env env runs on one copy's numbers, run on arrays, so a copy plays the
    episodes of a `SyncVectorEnv` of the per-env env (autoreset in the same step) seeded alike.

    Each copy has its own generator, seeded as `SyncVectorEnv` seeds its copies; its load trace is
    drawn from it at each of its resets, so only the resets cost a Python call per copy. `info`
    holds the per-step accounting as arrays (the per-env env's keys); `final_obs` and `final_info`
    the truncated episodes' last step.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, multi: bool = False, **kwargs: Any) -> None:
        self.config = (AutoscalingMultiConfig if multi else AutoscalingConfig).from_kwargs(kwargs)
        self.multi = multi
        self.num_envs = num_envs
        self.service, self._observer, self._info_keys = _service(self.config, Arrays(num_envs))
        self.single_observation_space = self._observer.space
        self.single_action_space = _action_space(self.config)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_names = self._observer.names
        self._seed_all([None] * num_envs)

    def _seed_all(self, seeds: list[int | None]) -> None:
        self.service.rngs = [gym.utils.seeding.np_random(s)[0] for s in seeds]

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._seed_all(per_env_seeds(seed, self.num_envs))
        self.service.reset()
        return self._observer.observe(self.service), self._info()

    def _info(self) -> dict[str, Any]:
        # The service replaces its value arrays each step rather than changing them: no copies.
        last = self.service.last
        return {"t": self.service.t.copy(), **{k: last[k] for k in self._info_keys}}

    def step(self, actions):
        reward, truncated = self.service.step(*_decode(self.service.xp, actions, self.single_action_space))
        obs, info = self._observer.observe(self.service), self._info()
        terminated = np.zeros(self.num_envs, bool)
        if not truncated.any():
            return obs, reward, terminated, truncated, info
        # Every copy is truncated in the same step: all were reset together and none terminates.
        # As SyncVectorEnv, their last step goes to final_obs / final_info and their reset's
        # observation and info take its place.
        self.service.reset()
        fresh = self._info()
        fresh.update(final_obs=obs, _final_obs=truncated.copy(),
                     final_info=info, _final_info=truncated.copy())
        return self._observer.observe(self.service), reward, terminated, truncated, fresh

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

"""Autoscaling envs: load pattern shapes, queue/cost accounting, boot delay, multi env, baselines."""

from __future__ import annotations

import itertools
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from kuberl.trainer import envs
from kuberl.trainer.envs.autoscaling import (
    ACTION_ADD,
    ACTION_KEEP,
    ACTION_REMOVE,
    OBS_UTILISATION,
    AutoscalingEnv,
    AutoscalingMultiEnv,
)
from kuberl.trainer.envs.baselines import (
    MultiThresholdPolicy,
    RandomPolicy,
    ThresholdPolicy,
    evaluate_policy,
    grid_search_multi_thresholds,
    grid_search_thresholds,
)
from kuberl.trainer.envs.load_patterns import LOAD_PATTERNS, LoadParams, generate_load

BASE = 60.0
QUIET = {"noise": 0.0}  # deterministic rate, to test shapes exactly


def trace(pattern: str, length: int = 400, seed: int = 0, **params) -> np.ndarray:
    return generate_load(pattern, length, np.random.default_rng(seed), LoadParams(**params))


# --- load patterns ---------------------------------------------------------------------------------


def test_sine_curve_is_periodic_with_the_given_period_and_amplitude():
    t = trace("SINE_CURVE", period=40, amplitude=0.5, **QUIET)
    np.testing.assert_array_equal(t[:-40], t[40:])
    assert t.max() == pytest.approx(BASE * 1.5, abs=1) and t.min() == pytest.approx(BASE * 0.5, abs=1)
    assert abs(t.mean() - BASE) < 1


def test_sinusoidal_is_a_sum_of_cycles_periodic_in_the_base_period():
    t = trace("SINUSOIDAL", period=50, **QUIET)
    sine = trace("SINE_CURVE", period=50, **QUIET)
    np.testing.assert_array_equal(t[:-50], t[50:])
    assert not np.array_equal(t, sine)
    spectrum = np.abs(np.fft.rfft(t[:400] - t[:400].mean()))
    cycles = np.flatnonzero(spectrum > 0.05 * spectrum.max())  # 400 steps = 8 base periods
    assert {8, 16, 40} <= set(cycles.tolist())
    assert t.max() <= BASE * 1.5 + 1 and t.min() >= BASE * 0.5 - 1


def test_steady_is_nearly_constant():
    assert set(trace("STEADY", **QUIET).tolist()) == {int(BASE)}
    noisy = trace("STEADY")
    assert abs(noisy.mean() - BASE) < 1.5 and noisy.std() / noisy.mean() < 0.08


def test_spike_has_flash_crowds_well_above_baseline():
    t = trace("SPIKE", length=2000, spike_probability=0.02, spike_magnitude=2.5, spike_duration=8)
    assert np.median(t) == pytest.approx(BASE, abs=3)
    assert t.max() >= 2.2 * BASE
    crowded = t > 1.8 * BASE
    assert 0.02 < crowded.mean() < 0.4
    # A flash crowd lasts: runs of crowded intervals at least spike_duration long.
    runs = [len(list(g)) for k, g in itertools.groupby(crowded) if k]
    assert max(runs) >= 8


def test_poisson_counts_have_the_given_mean_and_poisson_dispersion():
    t = trace("POISSON", length=20_000, base_load=40.0)
    assert t.dtype == np.int64
    assert t.mean() == pytest.approx(40.0, rel=0.02)
    assert t.var() / t.mean() == pytest.approx(1.0, abs=0.06)
    assert np.mean(t == 40) == pytest.approx(0.0629, abs=0.01)  # Poisson(40) pmf at its mode


def test_random_walk_is_bounded_and_persistent():
    t = trace("RANDOM", length=5000, walk_low=0.5, walk_high=1.5, walk_step=0.05)
    assert t.min() >= 0.5 * BASE - 1 and t.max() <= 1.5 * BASE + 1
    assert t.std() > 5 * np.abs(np.diff(t)).mean() / 2  # wanders far compared with one step
    assert np.abs(np.diff(t)).max() <= 0.05 * BASE * 5


@pytest.mark.parametrize("pattern", LOAD_PATTERNS)
def test_each_pattern_is_deterministic_under_a_seed(pattern):
    np.testing.assert_array_equal(trace(pattern, seed=3), trace(pattern, seed=3))
    assert not np.array_equal(trace(pattern, seed=3), trace(pattern, seed=4))
    assert (trace(pattern) >= 0).all()


# --- kwargs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"load_pattern": "SAWTOOTH"},
            r"load_pattern='SAWTOOTH' is not allowed; allowed values: SINE_CURVE, ",
        ),
        ({"load_patern": "STEADY"}, r"'load_patern' is not allowed; allowed kwargs: load_pattern"),
        ({"load_params": {"base": 3}}, r"load_params key 'base' is not allowed; allowed keys: base_load"),
        ({"min_instances": 5, "max_instances": 2}, r"max_instances=2: must be an integer >= 5"),
        ({"startup_delay": -1}, r"startup_delay=-1"),
        ({"capacity_per_instance": 0}, r"capacity_per_instance=0"),
        ({"initial_instances": 50}, r"initial_instances=50"),
    ],
)
def test_bad_kwargs_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoscalingEnv(**kwargs)
    with pytest.raises(ValueError, match=message):
        envs.validate_env_kwargs("kuberl/Autoscaling-v0", kwargs)


def test_bad_multi_kwargs_raise_value_error():
    with pytest.raises(ValueError, match=r"priority_weights=\[0, 2\]"):
        AutoscalingMultiEnv(priority_weights=[0, 2])
    with pytest.raises(ValueError, match=r"tiers="):
        AutoscalingMultiEnv(tiers=[[1.0]])
    with pytest.raises(ValueError, match=r"'tiers' is not allowed"):
        AutoscalingEnv(tiers=[[1.0, 1.0]])
    with pytest.raises(ValueError, match=r"env_id='kuberl/Nope-v0'"):
        envs.validate_env_kwargs("kuberl/Nope-v0", {})


# --- accounting ------------------------------------------------------------------------------------


def run(env, actions, seed=0):
    """Step through `actions` (a policy or a list); yields (queue_before, info, reward, obs)."""
    obs, info = env.reset(seed=seed)
    queue = info["queue"]
    for i in itertools.count():
        action = actions(obs) if callable(actions) else actions[i]
        obs, reward, terminated, truncated, info = env.step(action)
        yield queue, info, reward, obs
        queue = info["queue"]
        if terminated or truncated or (not callable(actions) and i + 1 == len(actions)):
            return


@pytest.mark.parametrize("pattern", ["SPIKE", "RANDOM"])
def test_served_dropped_and_queued_conserve_arrivals(pattern):
    env = AutoscalingEnv(load_pattern=pattern, max_queue=30.0)
    policy = RandomPolicy(env.action_space, seed=1)
    totals = np.zeros(3)
    for queue_before, info, _, _ in run(env, policy):
        assert queue_before + info["arrivals"] == pytest.approx(
            info["served"] + info["dropped"] + info["queue"]
        )
        assert 0.0 <= info["queue"] <= 30.0 + 1e-9
        assert info["served"] <= info["capacity"] + 1e-9
        totals += [info["served"], info["dropped"], info["queue"] > 0]
    assert totals.min() > 0, "the random run should serve, drop and queue at some point"


def test_overload_queues_up_to_max_queue_then_drops():
    env = AutoscalingEnv(
        load_pattern="STEADY",
        load_params=QUIET,
        min_instances=1,
        max_instances=4,
        initial_instances=4,
        max_queue=50.0,
    )
    steps = list(run(env, [ACTION_KEEP] * 3))  # 60 arrive, 40 served each step
    assert [info["queue"] for _, info, _, _ in steps] == [40.0, 50.0, 50.0]
    assert [info["dropped"] for _, info, _, _ in steps] == [0.0, 10.0, 20.0]
    assert all(info["slo_violation"] for _, info, _, _ in steps)


def test_cost_accounting_and_reward_formula():
    kwargs = {"instance_cost": 0.25, "slo_violation_penalty": 3.0, "drop_penalty": 0.5, "max_queue": 20.0}
    env = AutoscalingEnv(load_pattern="SPIKE", **kwargs)
    policy = RandomPolicy(env.action_space, seed=2)
    seen_violation = seen_drop = False
    for _, info, reward, _ in run(env, policy, seed=5):
        assert info["instances"] == info["running_instances"] + info["booting_instances"]
        assert info["cost_instances"] == pytest.approx(0.25 * info["instances"])
        assert info["cost_slo"] == (3.0 if info["slo_violation"] else 0.0)
        assert info["slo_violation"] == (info["latency_ms"] > 250.0)
        assert info["cost_dropped"] == pytest.approx(0.5 * info["dropped"])
        assert reward == pytest.approx(-(info["cost_instances"] + info["cost_slo"] + info["cost_dropped"]))
        seen_violation |= info["slo_violation"]
        seen_drop |= info["dropped"] > 0
    assert seen_violation and seen_drop


def test_latency_grows_with_utilisation_and_backlog():
    env = AutoscalingEnv(load_pattern="STEADY", load_params=QUIET, initial_instances=12)
    latencies = [info["latency_ms"] for _, info, _, _ in run(env, [ACTION_REMOVE] * 7)]
    assert latencies == sorted(latencies)
    assert latencies[0] < 250.0 < latencies[-1]


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_added_instance_is_billed_while_booting_and_serves_after_the_delay(delay):
    env = AutoscalingEnv(load_pattern="STEADY", load_params=QUIET, initial_instances=5, startup_delay=delay)
    steps = list(run(env, [ACTION_ADD] + [ACTION_KEEP] * 4))
    running = [info["running_instances"] for _, info, _, _ in steps]
    assert running == [5] * delay + [6] * (5 - delay)
    assert [info["booting_instances"] for _, info, _, _ in steps] == [1] * delay + [0] * (5 - delay)
    assert all(info["cost_instances"] == pytest.approx(0.6) for _, info, _, _ in steps)
    assert [info["capacity"] for _, info, _, _ in steps] == [50.0] * delay + [60.0] * (5 - delay)


def test_remove_cancels_a_booting_instance_first_and_bounds_block():
    env = AutoscalingEnv(
        load_pattern="STEADY", load_params=QUIET, min_instances=2, max_instances=3, initial_instances=2
    )
    steps = list(run(env, [ACTION_ADD, ACTION_ADD, ACTION_REMOVE, ACTION_REMOVE, ACTION_REMOVE]))
    info = [s[1] for s in steps]
    assert [(i["running_instances"], i["booting_instances"]) for i in info] == [
        (2, 1),
        (2, 1),
        (2, 0),
        (2, 0),
        (2, 0),
    ]
    assert [i["scaling_blocked"] for i in info] == [False, True, False, True, True]


def test_observation_is_normalised_and_exposes_utilisation_at_its_constant_index():
    env = AutoscalingEnv(load_pattern="SINE_CURVE")
    for _, info, _, obs in run(env, RandomPolicy(env.action_space, seed=0)):
        assert env.observation_space.contains(obs)
        assert obs[OBS_UTILISATION] == pytest.approx(min(info["utilisation"], 3.0), rel=1e-5)


@pytest.mark.parametrize("env_id", ["kuberl/Autoscaling-v0", "kuberl/AutoscalingMulti-v0"])
def test_episode_is_deterministic_under_seed_and_truncates(env_id):
    def rollout(seed):
        env = gym.make(env_id, load_pattern="POISSON", episode_length=30)
        env.action_space.seed(0)
        out = [env.reset(seed=seed)[1]["arrivals"]]
        for _ in range(30):
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            out.append((reward, info["arrivals"], terminated, truncated))
        return out

    assert rollout(1) == rollout(1)
    assert rollout(1) != rollout(2)
    assert rollout(1)[-1][3] is True and not any(r[3] for r in rollout(1)[1:-1])


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("kuberl/Autoscaling-v0", {}),
        ("kuberl/Autoscaling-v0", {"load_pattern": "SPIKE", "startup_delay": 0}),
        ("kuberl/AutoscalingMulti-v0", {"observation_split": True}),
        ("kuberl/AutoscalingMulti-v0", {"observation_split": False, "load_pattern": "RANDOM"}),
    ],
)
def test_env_checker_passes(env_id, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id, **kwargs).unwrapped)


# --- multi-dimensional variant ---------------------------------------------------------------------


def test_multi_observation_parts_match_spaces_and_flat_is_macro_then_micro():
    split = AutoscalingMultiEnv(load_pattern="RANDOM")
    flat = AutoscalingMultiEnv(load_pattern="RANDOM", observation_split=False)
    parts = split.observation_parts
    assert list(parts) == ["macro", "micro"]
    assert split.observation_space["macro"].shape == (parts["macro"],)
    assert split.observation_space["micro"].shape == (parts["micro"],)
    assert flat.observation_space.shape == (parts["macro"] + parts["micro"],)
    assert len(split.observation_names["macro"]) == parts["macro"]
    a, _ = split.reset(seed=4)
    b, _ = flat.reset(seed=4)
    np.testing.assert_array_equal(np.concatenate([a["macro"], a["micro"]]), b)
    assert isinstance(split.action_space, gym.spaces.MultiDiscrete)
    assert split.action_space.nvec.tolist() == [3, 3, 3]


def test_multi_tier_sets_capacity_and_cost_of_added_instances():
    env = AutoscalingMultiEnv(load_pattern="STEADY", load_params=QUIET, initial_instances=6, startup_delay=1)
    steps = list(
        run(env, [[ACTION_ADD, 2, 0], [ACTION_KEEP, 0, 0], [ACTION_REMOVE, 1, 0], [ACTION_REMOVE, 2, 0]])
    )
    info = [s[1] for s in steps]
    assert [i["capacity"] for i in info] == [60.0, 100.0, 100.0, 60.0]
    assert info[0]["cost_instances"] == pytest.approx(0.1 * (6 + 3.6))
    assert info[2]["scaling_blocked"] is True  # no tier-1 instance to remove
    assert info[3]["cost_instances"] == pytest.approx(0.6)


def test_multi_priority_weight_sheds_low_priority_to_cut_latency():
    def overloaded(weight_index):
        env = AutoscalingMultiEnv(
            load_pattern="STEADY",
            load_params=QUIET,
            initial_instances=6,
            max_queue=200.0,
            low_priority_fraction=0.5,
        )
        return [s[1] for s in run(env, [[ACTION_KEEP, 0, weight_index]] * 3)]  # 60 arrive, 60 capacity

    keep, shed = overloaded(0), overloaded(2)
    assert all(i["dropped_low_priority"] == 0 for i in keep)
    assert all(i["dropped_low_priority"] > 0 and i["dropped"] == i["dropped_low_priority"] for i in shed)
    assert all(s["latency_ms"] < k["latency_ms"] for s, k in zip(shed, keep))
    assert not any(i["slo_violation"] for i in shed) and all(i["slo_violation"] for i in keep[1:])
    for queue_before, info, _, _ in run(
        AutoscalingMultiEnv(load_pattern="SPIKE", max_queue=20.0),
        RandomPolicy(AutoscalingMultiEnv().action_space, seed=3),
    ):
        assert queue_before + info["arrivals"] == pytest.approx(
            info["served"] + info["dropped"] + info["queue"]
        )


# --- baselines ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", LOAD_PATTERNS)
def test_threshold_baseline_beats_random_on_every_pattern(pattern):
    kwargs = {"load_pattern": pattern, "episode_length": 100}
    seeds = range(3)
    space = AutoscalingEnv().action_space
    threshold = evaluate_policy("kuberl/Autoscaling-v0", kwargs, ThresholdPolicy(0.8, 0.5), seeds)
    random = evaluate_policy("kuberl/Autoscaling-v0", kwargs, RandomPolicy(space, seed=0), seeds)
    assert threshold > random + 20
    multi = evaluate_policy("kuberl/AutoscalingMulti-v0", kwargs, MultiThresholdPolicy(0.8, 0.5), seeds)
    multi_random = evaluate_policy(
        "kuberl/AutoscalingMulti-v0", kwargs, RandomPolicy(AutoscalingMultiEnv().action_space, seed=0), seeds
    )
    assert multi > multi_random + 20


def test_multi_threshold_reads_flat_and_split_observations_alike():
    policy = MultiThresholdPolicy(0.8, 0.3, tier=1, priority=2)
    split = evaluate_policy("kuberl/AutoscalingMulti-v0", {"episode_length": 50}, policy, [0, 1])
    flat = evaluate_policy(
        "kuberl/AutoscalingMulti-v0", {"episode_length": 50, "observation_split": False}, policy, [0, 1]
    )
    assert split == flat
    assert policy({"macro": np.zeros(13), "micro": np.full(9, 0.9)}).tolist() == [ACTION_ADD, 1, 2]


def test_grid_search_returns_the_best_pair_of_its_grid():
    kwargs = {"load_pattern": "SINE_CURVE", "episode_length": 60}
    uppers, lowers, seeds = (0.7, 0.9), (0.3, 0.6, 0.8), (0, 1)
    upper, lower, score = grid_search_thresholds(kwargs, uppers, lowers, seeds)
    scores = {
        (u, l): evaluate_policy("kuberl/Autoscaling-v0", kwargs, ThresholdPolicy(u, l), seeds)
        for u in uppers
        for l in lowers
        if l < u
    }
    assert (0.7, 0.8) not in scores and len(scores) == 5
    assert score == max(scores.values()) == scores[(upper, lower)]

    best = grid_search_multi_thresholds(kwargs, (0.8,), (0.5,), seeds, tiers=(0, 1), priorities=(0, 2))
    multi_scores = {
        (t, p): evaluate_policy(
            "kuberl/AutoscalingMulti-v0", kwargs, MultiThresholdPolicy(0.8, 0.5, t, p), seeds
        )
        for t in (0, 1)
        for p in (0, 2)
    }
    assert best[4] == max(multi_scores.values()) == multi_scores[best[2:4]]
    with pytest.raises(ValueError, match="lower < upper"):
        grid_search_thresholds(kwargs, (0.3,), (0.5,), seeds)


def test_time_features_let_an_anticipating_policy_beat_the_best_threshold():
    """The env is learnable beyond thresholds: a policy that reads the time-of-cycle features and
    provisions for the load `startup_delay` steps ahead beats every threshold pair in the grid."""
    from kuberl.trainer.envs.autoscaling import OBSERVATION_NAMES

    index = {name: i for i, name in enumerate(OBSERVATION_NAMES)}
    params = LoadParams()

    def anticipating(obs):
        phase = np.arctan2(obs[index["cycle_sin"]], obs[index["cycle_cos"]])
        ahead = max(
            params.base_load * (1 + params.amplitude * np.sin(phase + 2 * np.pi * k / params.period))
            for k in range(4)  # the next interval up to the one an instance asked for now first serves
        )
        needed = int(np.ceil(ahead / (0.8 * 10.0)))
        instances = round(float(obs[index["running"]] + obs[index["booting"]]) * 20)
        if instances < needed:
            return ACTION_ADD
        return ACTION_REMOVE if instances > needed and obs[index["queue"]] == 0 else ACTION_KEEP

    kwargs, seeds = {"load_pattern": "SINE_CURVE"}, range(4)
    *_, best_threshold = grid_search_thresholds(kwargs, (0.6, 0.7, 0.8, 0.9), (0.3, 0.5, 0.6), seeds)
    assert evaluate_policy("kuberl/Autoscaling-v0", kwargs, anticipating, seeds) > best_threshold + 15

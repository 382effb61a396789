"""The sweep engine step by step with real Optuna (samplers, pruners, a journal file), and the statistics
with real SciPy: the order trials come in, what gets pruned, resuming, and the ranking's numbers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO
from scipy import stats

from kuberl.api.sweep import parse_sweep
from kuberl.api.sweep import TrialState
from kuberl.sweep.engine import SweepChanged, SweepEngine, TrialInfo, TrialOutcome
from kuberl.sweep.statistics import curve_band, difference_interval, iqm, iqm_interval, rank

LR = "algorithm.ppo.learningRate"


def make_sweep(**spec) -> dict:
    data = yaml.safe_load((REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml").read_text())
    data["spec"].update(spec)
    return data


def test_the_engine_imports_neither_torch_nor_ray():
    code = ("import sys, kuberl.sweep.engine, kuberl.sweep.statistics, kuberl.api.sweep, kuberl.api.crd; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_grid_runs_every_configuration_on_a_seed_before_the_next_seed():
    engine = SweepEngine(parse_sweep(make_sweep()))
    seen = []
    while (trial := engine.next_trial()) is not None:
        seen.append((trial.configuration, trial.params[LR], trial.seed))
        engine.finish(trial.number, TrialState.SUCCEEDED, trial.params[LR] * 1000 + trial.seed)
    assert len(seen) == 15
    assert [seed for _, _, seed in seen] == [s for s in range(5) for _ in range(3)]
    assert {lr for _, lr, _ in seen} == {0.0003, 0.0025, 0.01}
    # A configuration keeps its values on every seed.
    assert len({(c, lr) for c, lr, _ in seen}) == 3


def test_the_trial_job_is_the_template_with_the_values_and_the_seed():
    engine = SweepEngine(parse_sweep(make_sweep()))
    engine.next_trial()
    for trial in iter(engine.next_trial, None):
        if trial.seed == 1:
            break
    job = engine.trial_job(trial)
    assert job["kind"] == "RLTrainingJob" and job["metadata"]["name"] == f"cartpole-ppo-lr-t{trial.number:04d}"
    assert job["spec"]["algorithm"]["ppo"]["learningRate"] == trial.params[LR]
    assert job["spec"]["seed"] == 1 and job["spec"]["stopping"]["maxEnvSteps"] == 30000
    assert job["metadata"]["labels"]["kuberl.dev/sweep"] == "cartpole-ppo-lr"


def test_the_median_pruner_stops_a_trial_below_the_finished_ones():
    sweep = make_sweep(earlyStopping={"pruner": "median", "everyEnvSteps": 1000, "minEnvSteps": 2000,
                                      "startupTrials": 2})
    engine = SweepEngine(parse_sweep(sweep))
    first, second, third = engine.next_trial(), engine.next_trial(), engine.next_trial()
    for trial, level in ((first, 100.0), (second, 120.0)):
        for step in range(1000, 10001, 1000):
            assert not engine.report(trial.number, step, level * step / 10000)
        engine.finish(trial.number, TrialState.SUCCEEDED, level)
    assert not engine.report(third.number, 1000, 1.0)  # before minEnvSteps: never
    assert not engine.report(third.number, 1500, 1.0)  # not a new multiple of everyEnvSteps
    assert engine.report(third.number, 2048, 2.0)  # 2.0 at 2000 steps against a median of 22
    engine.finish(third.number, TrialState.STOPPED)
    states = {t.number: t.state for t in engine.trials()}
    assert states == {first.number: TrialState.SUCCEEDED, second.number: TrialState.SUCCEEDED, third.number: TrialState.STOPPED}
    assert engine.trials()[2].last_step == 2000 and engine.trials()[2].last_report == 2.0


def test_successive_halving_keeps_the_best_at_its_first_rung():
    sweep = make_sweep(earlyStopping={"pruner": "successiveHalving", "everyEnvSteps": 1000, "minEnvSteps": 1000,
                                      "reductionFactor": 2})
    engine = SweepEngine(parse_sweep(sweep))
    trials = [engine.next_trial() for _ in range(3)]
    assert not engine.report(trials[0].number, 1000, 50.0)
    assert not engine.report(trials[1].number, 1000, 60.0)
    assert engine.report(trials[2].number, 1000, 10.0)


def test_env_steps_to_target_is_minimized_and_counts_a_miss_as_its_budget():
    data = make_sweep(objective={"metric": "envStepsToTarget"})
    data["spec"]["template"]["stopping"]["targetReturn"] = 475
    engine = SweepEngine(parse_sweep(data))
    assert engine.study.direction.name == "MINIMIZE"
    assert engine.final_value(TrialOutcome.from_summary({"stopped_by": "target_return", "env_steps": 12_345})) == 12_345
    assert engine.final_value(TrialOutcome.from_summary({"stopped_by": "max_env_steps", "env_steps": 30_208})) == 30_208
    assert engine.final_value(TrialOutcome.from_summary({"stopped_by": "max_wall_clock_seconds", "env_steps": 900})) == 30_000


def test_random_and_tpe_draw_configurations_within_the_distribution():
    for sampler in ("random", "tpe"):
        data = make_sweep(search={"sampler": sampler, "seed": 3}, seeds=2, maxTrials=8)
        data["spec"]["parameters"] = [{"path": LR, "distribution": {"type": "logUniform", "low": 1e-4, "high": 1e-2}},
                                      {"path": "algorithm.ppo.epochs", "distribution": {"type": "int", "low": 2,
                                                                                        "high": 8}}]
        engine = SweepEngine(parse_sweep(data))
        trials = []
        while (trial := engine.next_trial()) is not None:
            trials.append(trial)
            engine.finish(trial.number, TrialState.SUCCEEDED, -abs(np.log10(trial.params[LR]) + 2.5))
        assert len(trials) == 8 and len({t.configuration for t in trials}) == 4
        assert all(1e-4 <= t.params[LR] <= 1e-2 and 2 <= t.params["algorithm.ppo.epochs"] <= 8 for t in trials)
        assert isinstance(trials[0].params["algorithm.ppo.epochs"], int)
        by_configuration = {}
        for t in trials:
            by_configuration.setdefault(t.configuration, set()).add((t.params[LR], t.seed))
        assert all(len({lr for lr, _ in runs}) == 1 and {s for _, s in runs} == {0, 1}
                   for runs in by_configuration.values())


def test_a_journal_resumes_without_redoing_finished_trials(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    def storage():
        return JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))

    sweep = parse_sweep(make_sweep())
    engine = SweepEngine(sweep, storage())
    done = []
    for _ in range(4):
        trial = engine.next_trial()
        engine.finish(trial.number, TrialState.SUCCEEDED, 1.0)
        done.append((trial.configuration, trial.seed))
    interrupted = engine.next_trial()  # running when the process stops

    again = SweepEngine(sweep, storage(), resume=True)
    assert [(t.configuration, t.seed) for t in again.trials()] == done
    rest = []
    while (trial := again.next_trial()) is not None:
        rest.append((trial.configuration, trial.seed))
        again.finish(trial.number, TrialState.SUCCEEDED, 1.0)
    # The interrupted one runs again, after the seed already queued beside it.
    assert (interrupted.configuration, interrupted.seed) in rest[:2]
    assert sorted(done + rest) == sorted((c, s) for c in range(3) for s in range(5))
    assert len(again.trials()) == 15

    changed = make_sweep(seeds=4, maxTrials=12)
    with pytest.raises(SweepChanged):
        SweepEngine(parse_sweep(changed), storage(), resume=True)


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 100, 200, 300, 400]) == pytest.approx(np.mean([3, 4, 100, 200]))
    assert iqm([10, 20, 30, 40, 1000]) == pytest.approx(30.0)
    assert iqm([5.0]) == 5.0


def test_the_iqm_interval_is_scipys_percentile_bootstrap():
    values = [120.5, 300.0, 250.25, 480.0, 410.0]
    interval = iqm_interval(values, resamples=2000, seed=7)
    expected = stats.bootstrap((np.array(values),), lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
                               n_resamples=2000, method="percentile", rng=np.random.default_rng(7))
    assert interval.estimate == pytest.approx(stats.trim_mean(values, 0.25))
    assert (interval.low, interval.high) == pytest.approx((expected.confidence_interval.low,
                                                           expected.confidence_interval.high))
    assert interval.low <= interval.estimate <= interval.high


def test_a_difference_is_significant_only_when_its_interval_leaves_out_zero():
    rng = np.random.default_rng(0)
    far = difference_interval(rng.normal(400, 20, 10), rng.normal(100, 20, 10), resamples=2000)
    near = difference_interval(rng.normal(400, 50, 5), rng.normal(390, 50, 5), resamples=2000)
    assert far.low > 0
    assert near.low < 0 < near.high


def test_rank_orders_by_iqm_marks_significance_and_puts_unfinished_last():
    def runs(configuration, values, state=TrialState.SUCCEEDED):
        return [TrialInfo(configuration * 10 + i, configuration, {LR: configuration}, i, state, v)
                for i, v in enumerate(values)]

    trials = (runs(0, [100.0, 110, 105, 95, 102]) + runs(1, [480.0, 490, 470, 500, 485])
              + runs(2, [470.0, 500, 460, 495, 490]) + runs(3, [5.0, 6, 7], TrialState.STOPPED)
              + [TrialInfo(99, 2, {LR: 2}, 9, TrialState.FAILED)])
    ranking = rank(trials, resamples=2000)
    assert [r.configuration for r in ranking] == [1, 2, 0, 3]
    assert [r.rank for r in ranking] == [1, 2, 3, None]
    assert ranking[0].significant is None and ranking[0].versus_best is None
    assert ranking[1].significant is False and ranking[2].significant is True
    assert ranking[1].trials == 6 and len(ranking[1].values) == 5
    assert ranking[3].interval is None and ranking[3].values == []
    steps_ranking = rank(trials, higher_is_better=False, resamples=500)
    assert steps_ranking[0].configuration == 0


def test_curve_band_averages_runs_over_the_steps_they_reached():
    curves = [[(0.0, 0.0), (100.0, 10.0)], [(0.0, 2.0), (100.0, 12.0)], [(0.0, 4.0), (50.0, 9.0)]]
    band = curve_band(curves, points=3, resamples=500)
    assert band.steps == [0.0, 50.0, 100.0]
    assert band.mean == pytest.approx([2.0, (5 + 7 + 9) / 3, 11.0])
    assert all(lo <= m <= hi for lo, m, hi in zip(band.low, band.mean, band.high, strict=True))

"""BDQ's preference-alignment head: the teacher, segments and the pairs file on their own;
then real training: held-out accuracy with the exact teacher, a pair a person appends while the
learner runs (real Ray, the real learner loop), the critic's TD loss with and without the head, and
`kuberl preferences` through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from kuberl.api.job import BDQConfig, PreferenceTeacherSpec
from kuberl.trainer.algorithms.bdq import BDQ
from kuberl.trainer.preferences.pairs_file import PairsReader, parse_ranking
from kuberl.trainer.preferences.steps import MEASURES, SegmentCutter
from kuberl.trainer.preferences.teacher import teacher_labels, violation_scores
from kuberl.trainer.rollout import RolloutWorker, make_env
from kuberl.trainer.spaces import space_info

CPU = torch.device("cpu")
ENV = "kuberl/Autoscaling-v0"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _measures(slo: list[int], util: list[float]) -> np.ndarray:
    m = np.zeros((1, len(slo), len(MEASURES)), np.float32)
    m[0, :, MEASURES.index("slo_violation")] = slo
    m[0, :, MEASURES.index("utilisation")] = util
    m[0, :, MEASURES.index("dropped_low_priority")] = np.nan  # Autoscaling-v0 has none
    return m


def test_teacher_prefers_the_segment_that_violates_less_and_flips_at_the_mistake_rate():
    teacher = PreferenceTeacherSpec(slo_violation=2.0)  # overload: utilisation above 0.9, weight 1
    a = _measures([1, 0, 0], [0.5, 0.95, 0.5])  # 2 + 1
    b = _measures([1, 1, 0], [0.5, 0.5, 0.5])  # 4
    assert violation_scores(teacher, a).tolist() == [3.0]
    rng = np.random.default_rng(0)
    assert teacher_labels(teacher, a, b, rng).tolist() == [1.0]
    assert teacher_labels(teacher, b, a, rng).tolist() == [0.0]
    assert teacher_labels(teacher, a, a, rng).tolist() == [0.5]
    many_a, many_b = np.repeat(a, 4000, axis=0), np.repeat(b, 4000, axis=0)
    noisy = teacher_labels(PreferenceTeacherSpec(slo_violation=2.0, mistake_rate=0.2), many_a, many_b, rng)
    assert abs(float((noisy == 0.0).mean()) - 0.2) < 0.03
    with pytest.raises(ValueError, match=r"teacher\.droppedLowPriority is above 0 .* no 'dropped_low_priority'"):
        violation_scores(PreferenceTeacherSpec(dropped_low_priority=1.0), a)


def test_segments_are_consecutive_steps_of_one_env_copy_carried_across_batches():
    cutter = SegmentCutter(4)
    def steps(t0, n):  # [n steps, 2 envs]: obs holds (step, env)
        obs = np.array([[[t, e] for e in range(2)] for t in range(t0, t0 + n)], np.float32)
        return {"obs": obs, "actions": np.zeros((n, 2, 1), np.int64), "rewards": np.zeros((n, 2), np.float32),
                "measures": np.zeros((n, 2, len(MEASURES)), np.float32)}
    assert cutter.cut(0, steps(0, 3)) is None
    seg = cutter.cut(0, steps(3, 6))  # 9 steps so far: two whole segments per env, one step left
    assert seg["obs"].shape == (4, 4, 2)
    assert seg["obs"][0, :, 0].tolist() == [0, 1, 2, 3] and set(seg["obs"][0, :, 1]) == {0}
    assert seg["obs"][1, :, 0].tolist() == [0, 1, 2, 3] and set(seg["obs"][1, :, 1]) == {1}
    assert seg["obs"][2, :, 0].tolist() == [4, 5, 6, 7]
    assert cutter.cut(0, steps(9, 3))["obs"][0, :, 0].tolist() == [8, 9, 10, 11]


def test_pairs_reader_takes_complete_new_lines_once_and_rereads_a_replaced_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    reader = PairsReader(path)
    assert reader.poll() == []  # no file yet
    path.write_text('{"a": "x1a", "b": "x1b", "prefer": "a"}\n{"a": "x2a"')
    assert [parse_ranking(line)[2] for line in reader.poll()] == [1.0]
    assert reader.poll() == []  # unchanged: one stat
    with open(path, "a") as f:
        f.write(', "b": "x2b", "prefer": "equal"}\nnot json\n')
    lines = reader.poll()
    assert parse_ranking(lines[0]) == ("x2a", "x2b", 0.5)
    with pytest.raises(ValueError, match="not JSON"):
        parse_ranking(lines[1])
    with pytest.raises(ValueError, match="allowed values: a, b, equal"):
        parse_ranking('{"a": "x", "b": "y", "prefer": "A"}')
    path.write_text('{"a": "x1a", "b": "x1b", "prefer": "a"}\n{"a": "x3a", "b": "x3b", "prefer": "b"}\n')
    assert [parse_ranking(line)[0] for line in reader.poll()] == ["x3a"]  # smaller file: from the start, seen skipped


def _bdq(preference: dict | None, seed: int, steps: int) -> BDQ:
    cfg = BDQConfig.model_validate({
        "learningRate": 5e-4, "gamma": 0.95, "batchSize": 64, "learningStarts": 500, "trainFrequency": 4,
        "explorationFraction": 0.5, "branchHiddenSize": 32, "network": {"hiddenSizes": [64, 64], "activation": "relu"},
        "preference": preference})
    probe = make_env(ENV, {"episode_length": 100})
    info = space_info(probe.observation_space, probe.action_space)
    return BDQ(cfg, info, CPU, seed, steps)


def _plain_loop(algo: BDQ, seed: int, steps: int) -> list:
    """The learner's loop without Ray: one RolloutWorker in this process, its batches to learn()."""
    worker = RolloutWorker(ENV, {"episode_length": 100}, 8, seed, algo.policy_config(),
                           record_steps=algo.records_steps)
    env_steps, out = 0, []
    while env_steps < steps:
        batch = worker.sample_offpolicy(algo.weights(), algo.gradient_updates, 16, algo.exploration(env_steps),
                                        algo.cfg.gamma, algo.n_step)
        env_steps += batch["env_steps"]
        out.append(algo.learn([batch], env_steps))
    return out


def test_td_loss_with_the_head_is_no_worse_than_without():
    """Same seeds, same data until the policies part: the critic's TD loss (what LearnStats.loss is, the
    head's loss excluded) with the head, weight 1, stays within the noise band of the runs without it.
    Band: 1.3x the larger of the no-head runs on two seeds (measured: seed-to-seed spread ~10-20%)."""
    steps = 6000
    def td(preference, seed):
        stats = _plain_loop(_bdq(preference, seed, steps), seed, steps)
        losses = [s.loss for s in stats[len(stats) // 2:] if not np.isnan(s.loss)]
        return float(np.mean(losses)), stats
    without = [td(None, seed)[0] for seed in (1, 2)]
    with_head, stats = td({"segmentLength": 10, "teacher": {"pairsPerIteration": 4}}, 1)
    assert stats[-1].extra["preference_pairs_used"] > 100  # the head did train alongside
    assert with_head <= 1.3 * max(without), (with_head, without)


def test_exact_teacher_accuracy_and_a_pair_appended_while_training_is_used(tmp_path):
    """One real run (Ray, the learner's loop): with the exact teacher the head orders >= 90% of the
    held-out pairs right; a ranking appended to the pairs file mid-run (from a candidate the run wrote)
    and a malformed line are taken in by the same process, no restart."""
    from kuberl.api.load import parse_job
    from kuberl.trainer.run import TrainOptions, train

    job = parse_job({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "pref"},
                     "spec": {"algorithm": {"name": "BDQ", "bdq": {
                         "learningRate": 5e-4, "gamma": 0.95, "batchSize": 64, "learningStarts": 500,
                         "trainFrequency": 8, "explorationFraction": 0.5,
                         "network": {"hiddenSizes": [64, 64], "activation": "relu"},
                         "preference": {"segmentLength": 10, "teacher": {"pairsPerIteration": 16},
                                        "heldOutFraction": 0.3}}},
                              "environment": {"id": ENV, "kwargs": {"episode_length": 100}},
                              "rolloutWorkers": {"replicas": 1, "envsPerWorker": 8},
                              "collection": {"fragmentSteps": 20},
                              "stopping": {"maxEnvSteps": 8000}, "evaluation": {"enabled": False},
                              "checkpointing": {"enabled": False}, "seed": 3}})
    pairs = tmp_path / "preferences" / "pairs.jsonl"
    rows = []

    def observe(row, loop):
        rows.append(row)
        if len(rows) == 10:  # a person ranks the newest candidate while training goes on
            pair = json.loads((tmp_path / "preferences" / "candidates.jsonl").read_text().splitlines()[-1])["pair"]
            pairs.write_text(json.dumps({"pair": pair, "a": pair + "a", "b": pair + "b", "prefer": "b"})
                             + '\n{"a": "nope-a", "b": "nope-b", "prefer": "a"}\n')

    train(job, TrainOptions(run_dir=tmp_path, metrics_port=0, progress=False, on_iteration=observe))
    assert all(r["preference_pairs_human"] == 0 for r in rows[:10])
    assert rows[10]["preference_pairs_human"] == 1 and rows[10]["preference_pairs_rejected"] == 1
    last = rows[-1]
    assert last["preference_held_out_pairs"] >= 50, last
    assert last["preference_accuracy"] >= 0.9, last
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["preference_pairs_used"] == last["preference_pairs_used"] > 500


def _candidate(pair: str, slo_a: list[int], readable: bool = True) -> dict:
    def seg(side, slo):
        n = len(slo)
        measures = {key: [None] * n for key in MEASURES}
        if readable:
            measures.update(arrivals=[40.0] * n, instances=[3.0] * n, utilisation=[0.8] * n,
                            latency_ms=[900.0 if s else 80.0 for s in slo], slo_violation=[float(s) for s in slo],
                            dropped=[0.0] * n)
        return {"id": pair + side, "obs": [[0.1, 0.2]] * n, "actions": [[1]] * n, "rewards": [-1.0] * n,
                "measures": measures}
    return {"pair": pair, "segments": {"a": seg("a", slo_a), "b": seg("b", [0] * len(slo_a))}}


def test_cli_shows_candidates_side_by_side_and_appends_rankings(tmp_path, capsys):
    from kuberl.trainer.cli import main

    prefs = tmp_path / "preferences"
    prefs.mkdir()
    (prefs / "candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in (
        _candidate("c0ffee01", [1, 1, 0]), _candidate("c0ffee02", [0, 1, 0]))))
    assert main(["preferences", str(tmp_path), "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 unranked candidate pairs; the newest 1:" in out and "pair c0ffee02" in out and "c0ffee01" not in out
    assert "load" in out and "lat ms" in out and "A: return -3.0, SLO-violation steps 1" in out
    assert "--pair c0ffee02 --prefer a|b|equal" in out

    assert main(["preferences", str(tmp_path), "--pair", "c0ffee02", "--prefer", "b"]) == 0
    line = json.loads((prefs / "pairs.jsonl").read_text())
    assert parse_ranking(json.dumps(line)) == ("c0ffee02a", "c0ffee02b", 0.0)
    assert main(["preferences", str(tmp_path)]) == 0
    assert "1 unranked" in capsys.readouterr().out  # the ranked pair is no longer offered

    assert main(["preferences", str(tmp_path), "--pair", "c0ffee02", "--prefer", "a"]) == 2
    assert "ranked already" in capsys.readouterr().err
    assert main(["preferences", str(tmp_path), "--pair", "nothere", "--prefer", "a"]) == 2
    assert "is not a candidate" in capsys.readouterr().err
    assert main(["preferences", str(tmp_path), "--pair", "c0ffee01"]) == 2
    assert "--pair and --prefer go together" in capsys.readouterr().err
    assert main(["preferences", str(tmp_path / "elsewhere")]) == 2
    assert "has no candidates" in capsys.readouterr().err


def test_cli_interactive_ranking_and_an_env_without_autoscaling_measures(tmp_path):
    import io

    from kuberl.trainer.preferences.ranking import show

    prefs = tmp_path / "preferences"
    prefs.mkdir()
    (prefs / "candidates.jsonl").write_text(json.dumps(_candidate("beef0001", [0, 0], readable=False)) + "\n")
    out = io.StringIO()
    assert show(tmp_path, prefs / "pairs.jsonl", 3, out=out, interactive=True, answers=io.StringIO("x\ne\n")) == 1
    assert "A: action, reward, obs[:4]" in out.getvalue() and "prefer equal" in out.getvalue()
    assert json.loads((prefs / "pairs.jsonl").read_text())["prefer"] == "equal"


def test_checkpoint_keeps_the_head_its_pairs_and_where_the_pairs_file_was_read_to(tmp_path):
    pref = {"segmentLength": 5}
    algo = _bdq(pref, 0, 1000)
    algo.attach_run_dir(tmp_path)
    rng = np.random.default_rng(0)
    seg = lambda: {"obs": rng.normal(size=(6, 5, algo.info.obs_dim)).astype(np.float32),
                   "actions": rng.integers(0, 3, size=(6, 5, 1))}
    algo.preference._add_pairs(seg(), seg(), np.ones(6, np.float32))
    pairs = tmp_path / "preferences" / "pairs.jsonl"
    pairs.parent.mkdir()
    pairs.write_text('{"a": "gone-a", "b": "gone-b", "prefer": "a"}\n')
    algo.preference.ingest([])
    assert algo.preference.human_pairs.counts["rejected"] == 1
    state = algo.state_dict()

    resumed = _bdq(pref, 5, 1000)
    resumed.load_state_dict(state)
    resumed.attach_run_dir(tmp_path)  # as run.py does, after the checkpoint is loaded
    for name, p in algo.preference.head.state_dict().items():
        torch.testing.assert_close(resumed.preference.head.state_dict()[name], p)
    assert resumed.preference.train.size + resumed.preference.held_out.size == 6
    resumed.preference.ingest([])
    assert resumed.preference.human_pairs.counts["rejected"] == 1  # the line is not read (and rejected) again

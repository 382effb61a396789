"""TensorBoard event files: every numeric field of every metrics.jsonl row and the final evaluation, at
step = env steps, read back by TensorBoard's own reader (EventAccumulator), live while a run trains and
continued (orphaned points purged) when a run resumes from a checkpoint."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard_events import read_events

from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train
from kuberl.trainer.tensorboard_log import evaluation_scalars, row_scalars


def test_row_fields_become_tags_by_section_and_fields_without_a_value_have_no_point():
    row = {"iteration": 3, "env_steps": 1536, "episodes": 40, "wall_clock": 1.25, "mean_return": None,
           "episodes_per_second": 12.5, "env_steps_per_second": 400.0, "loss": float("nan"),
           "gradient_updates": 48, "workers_ready": 2, "worker_nodes": 1, "learner_wait": 0.1,
           "worker_wait": 0.2, "approx_kl": 0.01, "note": "text", "flag": True}
    assert row_scalars(row) == {
        "run/iteration": 3.0, "rollout/env_steps": 1536.0, "rollout/episodes": 40.0, "run/wall_clock": 1.25,
        "rollout/episodes_per_second": 12.5, "rollout/env_steps_per_second": 400.0,
        "train/gradient_updates": 48.0, "rollout/workers_ready": 2.0, "rollout/worker_nodes": 1.0,
        "train/learner_wait": 0.1, "rollout/worker_wait": 0.2, "train/approx_kl": 0.01}


def test_evaluation_numbers_are_tagged_by_their_path():
    evaluation = {"deterministic": {"episodes": 4, "mean_return": 9.5, "std_return": 0.5},
                  "vs-random": {"win_rate": 0.75, "outcomes": {"win": 3, "loss": 1}, "opponent": "random"}}
    assert evaluation_scalars(evaluation) == {
        "eval/deterministic/episodes": 4.0, "eval/deterministic/mean_return": 9.5,
        "eval/deterministic/std_return": 0.5, "eval/vs-random/win_rate": 0.75,
        "eval/vs-random/outcomes/win": 3.0, "eval/vs-random/outcomes/loss": 1.0}


def _points(acc: EventAccumulator) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _iterations_in(log_dir: Path) -> set[int]:
    if not log_dir.exists():
        return set()
    acc = read_events(log_dir)
    if "run/iteration" not in acc.Tags()["scalars"]:
        return set()
    return {int(e.value) for e in acc.Scalars("run/iteration")}


def _expected(rows: list[dict], evaluation: dict) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for tag, value in row_scalars(row).items():
            out.setdefault(tag, []).append((row["env_steps"], value))
    for tag, value in evaluation_scalars(evaluation).items():
        out[tag] = [(rows[-1]["env_steps"], value)]
    return out


def _assert_same(points: dict, expected: dict) -> None:
    assert sorted(points) == sorted(expected)
    for tag, want in expected.items():
        got = points[tag]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        for (_, a), (_, b) in zip(got, want):  # event files hold float32
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (tag, a, b)


def test_a_run_and_its_resumption_read_back_by_tensorboard(local_ray, job_dict, tmp_path):
    spec = job_dict["spec"]
    spec["stopping"] = {"maxEnvSteps": 6_144}  # 12 iterations of 2 workers x 4 envs x 64 steps
    spec["rolloutWorkers"]["envsPerWorker"] = 4
    spec["evaluation"] = {"episodes": 4}
    spec["checkpointing"] = {"intervalIterations": 2, "intervalSeconds": None, "keepLast": 10}
    events = tmp_path / "tensorboard"
    live = {}

    def observe(row, loop):
        # A live TensorBoard sees the run: a row written two iterations ago is in the file by now or
        # soon after (flushed within a second); waited for with a generous deadline, not assumed.
        if row["iteration"] == 6:
            deadline = time.monotonic() + 30
            while 4 not in live.setdefault("seen", set()) and time.monotonic() < deadline:
                live["seen"] = _iterations_in(events)
                time.sleep(0.1)

    first = train(parse_job(job_dict), TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                                    shutdown_ray=False, on_iteration=observe))
    assert first.ok and first.counters.iterations == 12
    assert 4 in live["seen"], "the event file was not flushed while the run trained"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    _assert_same(_points(read_events(events)), _expected(rows, evaluation))
    # Every numeric field of a row has a tag (PPO's own figures included).
    assert {"train/loss", "train/approx_kl", "rollout/mean_return", "eval/deterministic/mean_return"} \
        <= set(_points(read_events(events)))

    # The run is interrupted after its checkpoint at iteration 6: later checkpoints are lost (deleted
    # here), so the resumed run repeats iterations 7-12 and writes its own points for them.
    for ckpt in (tmp_path / "checkpoints").glob("ckpt-*.pt"):
        if int(ckpt.stem.split("-")[1]) > 6:
            ckpt.unlink()
    job = parse_job(job_dict)
    job.spec.stopping.max_env_steps = 8_192
    second = train(job, TrainOptions(run_dir=tmp_path, resume=True, workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert second.ok and second.counters.iterations == 16
    assert len(list(events.glob("events.out.tfevents.*"))) == 2  # one file per start, in one directory
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    latest = {row["iteration"]: row for row in rows}  # metrics.jsonl keeps both runs' rows 7-12
    assert sorted(latest) == list(range(1, 17))
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    _assert_same(_points(read_events(events)), _expected([latest[i] for i in range(1, 17)], evaluation))

"""Checkpoints in a real S3-compatible store (SeaweedFS built from its Go module, on loopback: the
`s3_store` fixture): a run's checkpoints go up and the last keepLast stay, a new run on the same path
continues from them without its disk, resumeFrom starts a run from another's, a write cut off anywhere
leaves the previous checkpoint the newest, a store that is down mid-run costs checkpoints there and not
the run, and wrong credentials fail the job at once with the field to fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tcp_faults import TcpFaults

from kuberl.api.load import parse_job
from kuberl.trainer import checkpoint_store
from kuberl.trainer.checkpoint_store import CheckpointStoreRefused, ObjectCheckpoints
from kuberl.trainer.object_store import Credentials, ObjectStoreError, S3Client, parse_s3_uri
from kuberl.trainer.run import TrainOptions, train

pytestmark = [pytest.mark.slow]


@pytest.fixture
def creds(s3_store, monkeypatch):
    for key, value in s3_store.credentials_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return s3_store


def stored_job(job_dict: dict, name: str, s3: dict, max_env_steps: int = 8192) -> dict:
    job_dict["metadata"]["name"] = name
    job_dict["spec"]["stopping"] = {"maxEnvSteps": max_env_steps}
    job_dict["spec"]["evaluation"] = {"episodes": 3}
    job_dict["spec"]["checkpointing"] = {"intervalIterations": 4, "keepLast": 2, "s3": s3}
    return job_dict


def opts(run_dir: Path, **more) -> TrainOptions:
    return TrainOptions(run_dir=run_dir, workers=2, metrics_port=0, progress=False, shutdown_ray=False, **more)


def names(store, prefix: str) -> list[str]:
    """The checkpoints' objects and manifests under `prefix` (the run's record aside)."""
    return sorted(name for k in store.client().list_keys(prefix + "/")
                  if (name := k[len(prefix) + 1:]).startswith("ckpt-"))


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_keeps_its_last_checkpoints_in_the_store_and_a_new_run_on_the_path_continues(
        creds, local_ray, job_dict, tmp_path):
    s3 = {"uri": creds.uri("continue"), "endpoint": creds.endpoint}
    first = train(parse_job(stored_job(job_dict, "continue", s3)),
                  opts(tmp_path / "first"))
    assert first.ok
    last = rows(tmp_path / "first")[-1]
    # keepLast 2: the newest two, each an object and its manifest; the newest is the run's last iteration.
    stored = names(creds, "continue")
    assert stored[-2:] == [f"ckpt-{last['iteration']:09d}.json", f"ckpt-{last['iteration']:09d}.pt"], stored
    assert len(stored) == 4, stored
    manifest = json.loads(creds.client().get_bytes(f"continue/ckpt-{last['iteration']:09d}.json", 1 << 16))
    local = tmp_path / "first" / "checkpoints" / f"ckpt-{last['iteration']:09d}.pt"
    assert manifest["bytes"] == local.stat().st_size and manifest["job"] == "continue", manifest
    # The run's record beside them: its summary, and the learner's last log lines.
    client = creds.client()
    assert json.loads(client.get_bytes("continue/summary.json", 1 << 20)) == json.loads(
        (tmp_path / "first" / "summary.json").read_text())
    [log_key] = client.list_keys("continue/logs/")
    assert "training stopped: max_env_steps" in client.get_bytes(log_key, 1 << 20).decode()
    # The same path, a new run directory (a new pod's empty disk): it goes on from the store's newest.
    second = train(parse_job(stored_job(job_dict, "continue", s3, max_env_steps=16384)),
                   opts(tmp_path / "second"))
    assert second.ok
    resumed = rows(tmp_path / "second")
    assert resumed[0]["iteration"] == last["iteration"] + 1, (last, resumed[0])
    assert resumed[0]["env_steps"] > last["env_steps"] and resumed[0]["episodes"] >= last["episodes"]
    assert second.counters.env_steps >= 16384
    logs = [client.get_bytes(k, 1 << 20).decode() for k in client.list_keys("continue/logs/")]
    assert len(logs) == 2 and sum("resumed from s3://" in text for text in logs) == 1, logs


def test_resume_from_starts_a_run_from_another_runs_newest_and_leaves_those_alone(creds, local_ray, job_dict,
                                                                                  tmp_path):
    base = {"endpoint": creds.endpoint}
    train(parse_job(stored_job(job_dict, "parent", {**base, "uri": creds.uri("parent")})),
          opts(tmp_path / "parent"))
    parent = names(creds, "parent")
    parent_last = rows(tmp_path / "parent")[-1]
    child = train(parse_job(stored_job(job_dict, "child", {**base, "uri": creds.uri("child"),
                                                           "resumeFrom": creds.uri("parent")}, 16384)),
                  opts(tmp_path / "child"))
    assert child.ok
    assert rows(tmp_path / "child")[0]["iteration"] == parent_last["iteration"] + 1
    assert names(creds, "parent") == parent, "the run it started from was written to"
    assert names(creds, "child")[-1] == f"ckpt-{child.counters.iterations:09d}.pt"


def state_file(tmp_path: Path, value: float, size: int = 500_000) -> Path:
    path = tmp_path / f"state-{value}.pt"
    torch.save({"w": torch.full((size // 8,), value, dtype=torch.float64)}, path)
    return path


def test_a_write_cut_off_anywhere_leaves_the_previous_checkpoint_the_newest(creds, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(checkpoint_store, "RETRY_SECONDS", (0.0, 0.0))
    cutter = TcpFaults(int(creds.endpoint.rsplit(":", 1)[1]))
    uri = creds.uri("cut")
    bucket, prefix = parse_s3_uri(uri)
    direct = ObjectCheckpoints(uri, creds.client(), prefix)
    through = ObjectCheckpoints(uri, S3Client(bucket, creds.credentials, cutter.endpoint), prefix)
    direct.save(state_file(tmp_path, 1.0), 1, keep_last=3, job_name="cut")
    # The object's upload cut off halfway, on every try: nothing of iteration 2 is committed.
    cutter.actions.extend([("cut", 250_000)] * 3)
    with pytest.raises(ObjectStoreError):
        through.save(state_file(tmp_path, 2.0), 2, keep_last=3, job_name="cut")
    loaded, state = direct.load_latest()
    assert loaded.iteration == 1 and float(state["w"][0]) == 1.0
    # The object whole, its manifest cut off: the object is there, uncommitted, and not loaded.
    cutter.actions.extend([("pass",)] + [("cut", 100)] * 3)
    with pytest.raises(ObjectStoreError):
        through.save(state_file(tmp_path, 3.0), 3, keep_last=3, job_name="cut")
    assert "ckpt-000000003.pt" in names(creds, "cut") and "ckpt-000000003.json" not in names(creds, "cut")
    assert direct.load_latest()[0].iteration == 1
    # The next commit deletes what the cut-off writes left.
    direct.save(state_file(tmp_path, 4.0), 4, keep_last=3, job_name="cut")
    assert names(creds, "cut") == ["ckpt-000000001.json", "ckpt-000000001.pt", "ckpt-000000004.json",
                                   "ckpt-000000004.pt"]
    # An object that is not the one its manifest commits (overwritten, truncated by a broken store): skipped.
    creds.client().put_bytes("cut/ckpt-000000004.pt", b"not a checkpoint")
    loaded, state = direct.load_latest()
    assert loaded.iteration == 1 and float(state["w"][0]) == 1.0
    assert "ckpt-000000004.pt does not load" in caplog.text and "SHA-256" in caplog.text


def test_a_store_down_mid_run_costs_checkpoints_there_not_the_run(creds, local_ray, job_dict, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_store, "RETRY_SECONDS", (0.0, 0.0))
    cutter = TcpFaults(int(creds.endpoint.rsplit(":", 1)[1]))
    failures: list[float] = []
    took: list[float] = []

    def observe(row: dict, loop) -> None:
        # Down from the 6th iteration to the 14th: the checkpoints at 8 and 12 cannot go up.
        cutter.always = ("refuse",) if 6 <= row["iteration"] < 14 else None
        labels = dict(zip(("job_name", "namespace", "algorithm", "environment"), loop.metrics.labels.values(),
                          strict=True))
        failures.append(loop.metrics.registry.get_sample_value("kuberl_checkpoint_upload_failures_total", labels))
        if row["iteration"] == 5:  # the 4th iteration's checkpoint written and uploaded: what SIGTERM's would take
            took.extend(loop.metrics.registry.get_sample_value(name, labels)
                        for name in ("kuberl_checkpoint_seconds", "kuberl_checkpoint_upload_seconds"))

    job = parse_job(stored_job(job_dict, "down", {"uri": creds.uri("down"), "endpoint": cutter.endpoint}, 20_000))
    job.spec.checkpointing.keep_last = 10
    result = train(job, opts(tmp_path / "run", on_iteration=observe))
    assert result.ok and result.counters.iterations >= 16
    assert failures[-1] == 2.0, failures
    assert len(took) == 2 and all(0 < t < 60 for t in took), took
    committed = ObjectCheckpoints(creds.uri("down"), creds.client(), "down/").committed()
    assert 8 not in committed and 12 not in committed, committed
    assert {4, 16, result.counters.iterations} <= set(committed), committed


def test_refusals_name_the_field_to_fix(creds, local_ray, job_dict, tmp_path, monkeypatch):
    job = parse_job(stored_job(job_dict, "refused", {"uri": "s3://no-such-bucket/x", "endpoint": creds.endpoint}))
    with pytest.raises(CheckpointStoreRefused) as refused:
        train(job, opts(tmp_path / "a"))
    assert refused.value.field == "spec.checkpointing.s3.uri" and "no such bucket" in str(refused.value)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    job = parse_job(stored_job(job_dict, "refused", {"uri": creds.uri("refused"), "endpoint": creds.endpoint}))
    with pytest.raises(CheckpointStoreRefused) as refused:
        train(job, opts(tmp_path / "b"))
    assert refused.value.field == "spec.checkpointing.s3.credentialsSecret"
    assert "AWS_SECRET_ACCESS_KEY" in str(refused.value)


def test_kuberl_train_with_wrong_credentials_exits_2_naming_the_secret(s3_store, job_dict, tmp_path):
    """The user's whole command: one clear problem and the exit status the operator reads as InvalidSpec,
    no traceback, nothing written to the store."""
    job = stored_job(job_dict, "wrong-key", {"uri": s3_store.uri("wrong-key"), "endpoint": s3_store.endpoint,
                                             "credentialsSecret": "store-keys"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3_store.credentials.access_key,
           "AWS_SECRET_ACCESS_KEY": "not-" + s3_store.credentials.secret_key, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([str(Path(sys.executable).parent / "kuberl"), "train", str(path), "--run-dir",
                           str(tmp_path / "run"), "--metrics-port", "0", "--workers", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "spec.checkpointing.s3.credentialsSecret: " in done.stderr and "refused" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert names(s3_store, "wrong-key") == []
    # The same keys, right: S3Client signs for the store as the store checks.
    S3Client("kuberl", Credentials(s3_store.credentials.access_key, s3_store.credentials.secret_key),
             s3_store.endpoint).list_keys("wrong-key/")

"""Checkpoints are atomic, pruned to the last K, loaded weights-only, and a corrupt newest one falls back."""

from __future__ import annotations

import logging

import pytest
import torch

from kuberl.trainer.checkpoint import list_checkpoints, load_latest, save_checkpoint


def _state(i: int) -> dict:
    return {"counters": {"iterations": i}, "w": torch.full((3,), float(i))}


def test_keeps_only_the_last_k(tmp_path):
    for i in range(1, 6):
        save_checkpoint(tmp_path, i, _state(i), keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000004.pt", "ckpt-000000005.pt"]
    path, state = load_latest(tmp_path)
    assert path.name == "ckpt-000000005.pt" and state["counters"]["iterations"] == 5


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, _state(1), keep_last=3)
    newest = save_checkpoint(tmp_path, 2, _state(2), keep_last=3)
    newest.write_bytes(newest.read_bytes()[:40])  # truncated, as by a crash of the disk
    with caplog.at_level(logging.WARNING):
        path, state = load_latest(tmp_path)
    assert state["counters"]["iterations"] == 1
    assert "ckpt-000000002.pt does not load" in caplog.text


def test_a_failed_write_leaves_the_previous_checkpoint_untouched(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1), keep_last=3)
    before = (tmp_path / "ckpt-000000001.pt").read_bytes()

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 1, {"bad": Unpicklable()}, keep_last=3)
    assert (tmp_path / "ckpt-000000001.pt").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000001.pt"]  # no temp file left behind


def test_weights_only_load_refuses_arbitrary_objects(tmp_path):
    import argparse

    path = tmp_path / "ckpt-000000001.pt"
    torch.save({"x": argparse.Namespace(cmd="rm -rf /")}, path)  # any non-allowlisted class
    assert load_latest(tmp_path) is None  # weights_only=True refuses to unpickle it


def test_no_checkpoints_means_none(tmp_path):
    assert load_latest(tmp_path / "missing") is None

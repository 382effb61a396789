"""The bed's keeper of a real node's container logs (tests/bed/real_node_pods.py, LogKeeper): a log is kept
(hard-linked) as it appears, and a pod whose directory goes between the keeper's listing and its read (the
kubelet deletes a pod's logs with it) is no error: the keeper had raised on it in a CI run."""

from __future__ import annotations

from pathlib import Path

from bed import real_node_pods
from bed.real_node_pods import LogKeeper


def test_a_log_is_kept_and_outlives_its_pod(tmp_path: Path):
    logs, keep = tmp_path / "pod-logs", tmp_path / "kept"
    log = logs / "ml_learner_0a1b" / "learner" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("first line\n")
    keeper = LogKeeper(logs, keep)
    keep.mkdir()
    keeper.sync()
    with log.open("a") as more:
        more.write("after the link\n")
    log.unlink()
    assert (keep / "k8s_learner_learner_ml_0a1b_0.log").read_text() == "first line\nafter the link\n"


def test_a_pod_directory_gone_between_the_listing_and_the_read_is_skipped(tmp_path: Path, monkeypatch):
    logs, keep = tmp_path / "pod-logs", tmp_path / "kept"
    log = logs / "ml_worker_9f8e" / "rollout-worker" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("line\n")
    listed = real_node_pods._entries

    def listing_with_a_pod_gone(directory: Path) -> list[Path]:
        found = listed(directory)
        # The root's listing names a pod whose directory the kubelet has removed since.
        return [*found, logs / "ml_gone_7c6d"] if directory == logs else found

    monkeypatch.setattr(real_node_pods, "_entries", listing_with_a_pod_gone)
    keeper = LogKeeper(logs, keep)
    keep.mkdir()
    keeper.sync()
    assert [p.name for p in keep.iterdir()] == ["k8s_rollout-worker_worker_ml_9f8e_0.log"]

"""How `kuberl train` and the learner pod's `kuberl learner` run a job, from their flags and environment."""

from __future__ import annotations

from kuberl.trainer import cli


def test_a_learner_pod_joins_its_cluster_without_shipping_its_import_path_and_a_laptop_does(monkeypatch):
    """Every node of a job's pods runs the learner's image, so the learner gives its workers no runtime_env
    (Ray would start a fresh worker process per actor for one); a laptop joining a cluster hands over its
    import path, where a user's env module beside the job file lives."""
    monkeypatch.setenv("KUBERL_RAY_ADDRESS", "cartpole-ppo-head.rl.svc:6379")
    learner = cli.train_options(cli.build_parser().parse_args(["learner"]))
    assert learner.ray_address == "cartpole-ppo-head.rl.svc:6379" and learner.ship_import_path is False
    monkeypatch.delenv("KUBERL_RAY_ADDRESS")
    laptop = cli.train_options(cli.build_parser().parse_args(["train", "job.yaml", "--ray-address", "10.0.0.1:6379"]))
    assert laptop.ray_address == "10.0.0.1:6379" and laptop.ship_import_path is True
    local = cli.train_options(cli.build_parser().parse_args(["train", "job.yaml"]))
    assert local.ray_address is None

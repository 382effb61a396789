"""kuberl.trainer.ray_node's own parts that need no Ray node: what a failed start says."""

from __future__ import annotations

from kuberl.trainer import ray_node


def test_a_failed_start_quotes_the_end_of_its_raylet_out(tmp_path):
    """The session directory of a failed node may be gone when someone looks (a pod's, a test's), so the
    failure's message carries the raylet's last lines, bounded."""
    lines = [f"line {i}" for i in range(100)] + ["[FATAL] Timed out waiting for file .../metrics_agent_port"]
    (tmp_path / "raylet.out").write_text("\n".join(lines) + "\n")
    said = ray_node.raylet_says(str(tmp_path))
    assert said.startswith("; raylet.out ends:") and said.endswith("Timed out waiting for file .../metrics_agent_port")
    assert said.count("\n") == 8 and "line 93" in said and "line 92" not in said
    (tmp_path / "raylet.out").write_text("x" * 100_000)
    assert len(ray_node.raylet_says(str(tmp_path))) < 4200
    assert ray_node.raylet_says(str(tmp_path / "gone")) == "" and ray_node.raylet_says(None) == ""


def test_a_gcs_address_is_host_and_port_and_nothing_else_is():
    assert ray_node.host_and_port("cartpole-ppo-head.rl.svc:6379") == ("cartpole-ppo-head.rl.svc", 6379)
    assert ray_node.host_and_port("127.0.0.1:6379") == ("127.0.0.1", 6379)
    for other in ("auto", "ray://head:10001", "head:", ":6379", "head:port"):
        assert ray_node.host_and_port(other) is None, other


def test_a_failed_start_names_the_raylets_fatal_line_before_its_stack_trace(tmp_path):
    """A raylet that aborts ends its raylet.out with a stack trace: the line that says why (Ray's fatal
    level, "C") comes first in the message, whatever follows it."""
    fatal = ("[2026-11-27 22:01:40,002 C 13206 13206] (raylet) node_manager.cc:1012: [Timeout] Exiting because this "
             "node manager has mistakenly been marked as dead by the GCS")
    lines = ["[2026-11-27 22:01:39,001 I 13206 13206] (raylet) main.cc:100: Raylet started",
             "[2026-11-27 22:01:39,500 C 13206 13206] (raylet) an earlier fatal line", fatal,
             "*** StackTrace Information ***"] + [f"/raylet(+0x{i:x}) frame {i}" for i in range(200)]
    (tmp_path / "raylet.out").write_text("\n".join(lines) + "\n")
    said = ray_node.raylet_says(str(tmp_path))
    assert said.startswith("; raylet.out's fatal line:\n  " + fatal + "\n")
    assert "an earlier fatal line" not in said and said.endswith("frame 199") and "frame 191" not in said
    (tmp_path / "raylet.out").write_text(fatal + "\n" + "x" * 30_000)
    said = ray_node.raylet_says(str(tmp_path))
    assert len(said) <= 4096 and fatal in said

"""kuberl.trainer.ray_node's own parts that need no Ray node: what a failed start says."""

from __future__ import annotations

import os

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


def test_the_agents_port_files_are_written_before_the_raylet_starts(tmp_path, monkeypatch):
    """What the raylet will wait for is on disk when it starts: -1 for the dashboard agent's three ports (what
    that agent writes in minimal mode) and the runtime env agent's port, picked here where none was given."""
    from types import SimpleNamespace

    monkeypatch.delenv("RAY_agent_register_timeout_ms", raising=False)
    node_id = "ab" * 28
    seen = {}

    def start_raylet(node, *args, **kwargs):
        seen["files"] = {p.name.removesuffix(f"_{node_id}"): p.read_text() for p in tmp_path.iterdir()}
        seen["port"] = node._ray_params.runtime_env_agent_port
        return "started"

    node = SimpleNamespace(_ray_params=SimpleNamespace(runtime_env_agent_port=None), _session_dir=str(tmp_path),
                           _node_id=node_id)
    assert ray_node.ports_known_first(start_raylet)(node) == "started"
    port = seen["port"]
    assert isinstance(port, int) and 0 < port < 65536
    assert seen["files"] == {"metrics_agent_port": "-1", "metrics_export_port": "-1",
                             "dashboard_agent_listen_port": "-1", "runtime_env_agent_port": str(port)}
    assert os.environ["RAY_agent_register_timeout_ms"] == str(int(ray_node.REGISTER_S * 1000))
    # A port the node was given is kept, and a user's own timeout wins.
    monkeypatch.setenv("RAY_agent_register_timeout_ms", "1234")
    node._ray_params.runtime_env_agent_port = 40123
    ray_node.ports_known_first(start_raylet)(node)
    assert seen["port"] == 40123 and seen["files"]["runtime_env_agent_port"] == "40123"
    assert os.environ["RAY_agent_register_timeout_ms"] == "1234"


def test_a_raylet_is_given_the_stand_in_as_its_dashboard_agent_and_nothing_else_changes(tmp_path):
    """Only the raylet's `--dashboard_agent_command` is replaced; the stand-in runs as long as its parent does
    and exits once the parent is gone."""
    import shlex
    import subprocess
    import sys

    calls = []
    start = ray_node.without_dashboard_agent(lambda command, kind, *a, **k: calls.append((command, kind)))
    raylet = ["raylet", "--node_id=x", "--dashboard_agent_command=python agent.py --minimal",
              "--runtime_env_agent_command=python main.py"]
    start(raylet, "raylet")
    start(["gcs_server", "--dashboard_agent_command=kept"], "gcs_server")
    (given, _), (other, _) = calls
    assert given[:2] == raylet[:2] and given[3] == raylet[3] and other[1] == "--dashboard_agent_command=kept"
    stand_in = shlex.split(given[2].split("=", 1)[1])
    assert stand_in[:3] == [sys.executable, "-S", "-c"] and stand_in[3] == ray_node.AGENT_STAND_IN
    # Its parent stands for the raylet: a `cat` that ends when the test closes its stdin. The stand-in lives
    # while it does, and follows it.
    import psutil  # Ray's own copy, on the path once ray is imported

    pid_file = tmp_path / "pid"
    parent = subprocess.Popen(["sh", "-c", f'RAY_RAYLET_PID=$$ {shlex.join(stand_in)} & echo $! > {pid_file}; exec cat'],
                              stdin=subprocess.PIPE)
    try:
        _wait_for_file(pid_file)
        child = psutil.Process(int(pid_file.read_text()))
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    finally:
        parent.stdin.close()
        parent.wait(timeout=60)
    child.wait(timeout=60)
    # A raylet gone before the stand-in looked: it is not the stand-in's parent, and the stand-in exits at once.
    done = subprocess.run(stand_in, env={"RAY_RAYLET_PID": "1"}, timeout=60, check=False)
    assert done.returncode == 0


def _wait_for_file(path, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)

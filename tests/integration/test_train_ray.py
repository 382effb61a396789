"""Training through real Ray: rollout actors, /metrics over HTTP, actor death, kill-and-resume, a
multi-node Ray cluster started with `ray start`, and PPO learning CartPole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import ray
import yaml
from conftest import REPO
from prometheus_client.parser import text_string_to_metric_families

from kuberl.api.load import parse_job
from kuberl.trainer.run import TrainOptions, train

#: How the operator's pods start a Ray node (operator/kuberl/operator/builders.py RAY_START).
RAY_START = [sys.executable, "-m", "kuberl.trainer.ray_node"]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job_name"):
                out[sample.name] = sample.value
                out[sample.name + ":labels"] = sample.labels
    return out


def short_job(job_dict: dict, **stopping) -> dict:
    job_dict["spec"]["stopping"] = stopping
    job_dict["spec"]["rolloutWorkers"]["envsPerWorker"] = 4
    job_dict["spec"]["evaluation"] = {"episodes": 4}
    return job_dict


def test_ppo_with_two_workers_serves_growing_counters(local_ray, job_dict, tmp_path):
    job = parse_job(short_job(job_dict, maxEnvSteps=12_000))
    scrapes = []

    def observe(row, loop):
        if row["iteration"] in (2, 8):
            scrapes.append(scrape(loop.metrics.server.server_address[1]))

    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False, on_iteration=observe))
    assert result.ok and result.reason == "max_env_steps"
    first, second = scrapes
    for name in ("kuberl_env_steps_total", "kuberl_episodes_total", "kuberl_gradient_updates_total",
                 "kuberl_iterations_total"):
        assert second[name] > first[name] > 0, name
    assert second["kuberl_rollout_workers_ready"] == 2
    assert second["kuberl_env_steps_per_second"] > 0
    # When the first env steps came, set once: the same at iteration 8 as at 2, after this process started.
    assert second["kuberl_first_step_timestamp_seconds"] == first["kuberl_first_step_timestamp_seconds"] > 0
    assert 0 < first["kuberl_time_to_first_step_seconds"] <= time.time() - (
        first["kuberl_first_step_timestamp_seconds"] - first["kuberl_time_to_first_step_seconds"])
    labels = second["kuberl_env_steps_total:labels"]
    assert labels == {"job_name": "cartpole-ppo", "namespace": "default", "algorithm": "PPO",
                      "environment": "CartPole-v1"}
    # Each iteration collects 64 steps x 4 envs from each of the two workers.
    assert first["kuberl_env_steps_total"] == 2 * 64 * 4 * 2
    for name in ("metrics.jsonl", "metrics.csv", "learning_curve.svg", "evaluation.json", "job.yaml"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "evaluation.json").read_text())["deterministic"]["episodes"] == 4


def test_a_dead_rollout_actor_is_replaced_and_counted(local_ray, job_dict, tmp_path):
    job_dict["spec"]["algorithm"] = {"name": "DQN", "dqn": {"learningStarts": 200}}
    # A budget far beyond what the test needs: the run ends when the replacement has joined (below),
    # not when a step budget runs out, so a slow machine cannot end it before the replacement is ready.
    job = parse_job(short_job(job_dict, maxEnvSteps=2_000_000))
    seen = {"recovered_at": None}

    def observe(row, loop):
        if row["iteration"] == 3:
            victim = loop.workers.ready()[0]
            seen["pid"] = ray.get(victim.actor.pid.remote())
            os.kill(seen["pid"], signal.SIGKILL)
        elif row["iteration"] > 3 and row["workers_ready"] == 2 and loop.counters.worker_restarts >= 1:
            seen["recovered_at"] = row["iteration"]
            loop.stop_signal["set"] = True  # as SIGTERM would: checkpoint and leave cleanly

    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False, on_iteration=observe))
    assert seen["pid"]
    assert result.ok and result.counters.worker_restarts >= 1
    assert seen["recovered_at"] is not None, "the replacement never joined"  # training went on with both
    assert result.counters.env_steps < 2_000_000


def test_a_users_module_class_environment_trains(local_ray, job_dict, tmp_path):
    job_dict["spec"]["environment"] = {"id": "user_envs:Corridor", "kwargs": {"length": 4}, "maxEpisodeSteps": 50}
    job = parse_job(short_job(job_dict, maxEnvSteps=20_000, targetReturn=0.95, returnWindow=20))
    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False))
    assert result.ok
    assert result.evaluation["deterministic"]["mean_return"] == pytest.approx(1.0 - 3 * 0.01)  # 4 steps right


def test_rollout_workers_whose_python_lacks_the_envs_module_fail_the_start_at_once(local_ray):
    """Real Ray actors built for a module no process here has: the first reply ends the start with the
    reason, and no worker is replaced (a replacement would fail the same way)."""
    from kuberl.trainer.envs.resolve import EnvNotFound
    from kuberl.trainer.workers import WorkerSet

    workers = WorkerSet({"env_id": "gridgoal:GridGoal-v0", "env_kwargs": {}, "num_envs": 2,
                         "policy": {"kind": "categorical"}}, desired=2, cluster=False, seed=0, expected=2)
    try:
        with pytest.raises(EnvNotFound, match=r"rollout worker \d cannot use the environment: cannot import the "
                                              r"environment's module 'gridgoal'"):
            workers.reconcile(wait_for_all=60.0)
        assert workers.restarts == 0 and not workers.ready()
    finally:
        workers.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _own_node_flags(node: int, temp_root: Path) -> list[str]:
    """`ray start` flags giving one of several Ray nodes on one host ports and sockets no other node asks
    for. Each node gets its own temp dir: nodes sharing one pick their plasma-store and raylet socket
    names by "first free .N suffix", which two nodes starting at once both pick (seen: "bind: Address
    already in use" in the plasma store, that raylet aborts, and a rollout slot joins late or never)."""
    low = 20_000 + 1_000 * node
    temp = temp_root / f"n{node}"
    temp.mkdir(exist_ok=True)
    return [f"--temp-dir={temp}", f"--node-manager-port={_free_port()}", f"--object-manager-port={_free_port()}",
            f"--metrics-export-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
            f"--min-worker-port={low}", f"--max-worker-port={low + 999}"]


def _slots_offered(address: str, env: dict) -> int:
    """Rollout slots the Ray cluster at `address` offers, asked by a driver of its own (this process stays
    out of the cluster it tests)."""
    script = ("import sys, ray; from kuberl.api.rollout_slots import workers_offered; "
              "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
              "print(workers_offered(ray.cluster_resources()))")
    try:
        done = subprocess.run([sys.executable, "-c", script, address], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0
    lines = done.stdout.split()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill_after_first_checkpoint_then_resume_continues_counters(job_dict, tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    job_dict["spec"]["checkpointing"] = {"intervalIterations": 3, "intervalSeconds": None, "keepLast": 2}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(short_job(job_dict, maxEnvSteps=2_000_000)))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kuberl.trainer.cli", "train", str(path), "--run-dir",
                             str(run_dir), "--workers", "2", "--metrics-port", "0", "--no-progress"],
                            cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: list((run_dir / "checkpoints").glob("ckpt-*.pt")), 120, "the first checkpoint")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole training process group, Ray included
        proc.wait()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    import torch

    newest = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]
    saved = torch.load(newest, weights_only=True)["counters"]
    assert saved["iterations"] >= 3 and rows[-1]["iteration"] >= saved["iterations"]

    job = parse_job(yaml.safe_load(path.read_text()))
    job.spec.stopping.max_env_steps = saved["env_steps"] + 4_096
    seen = []

    def observe(row, loop):
        if not seen:
            seen.append((row, scrape(loop.metrics.server.server_address[1])))

    result = train(job, TrainOptions(run_dir=run_dir, resume=True, workers=2, metrics_port=0, progress=False,
                                     on_iteration=observe))
    row, metrics = seen[0]
    assert row["iteration"] == saved["iterations"] + 1
    assert row["env_steps"] == saved["env_steps"] + 64 * 4 * 2  # one iteration of two workers
    assert row["episodes"] >= saved["episodes"]
    assert metrics["kuberl_env_steps_total"] == row["env_steps"]  # the Prometheus counter continued
    assert metrics["kuberl_iterations_total"] == row["iteration"]
    assert result.counters.env_steps >= saved["env_steps"] + 4_096
    assert result.counters.wall_clock > saved["wall_clock"]


def test_sigterm_to_the_process_checkpoints_its_last_iteration_and_exits_0(job_dict, tmp_path):
    """What a deleted learner pod's PID 1 gets: a real SIGTERM, mid-training. ray.init replaces any
    SIGTERM handler set before it (with sys.exit), so this fails unless the trainer's handler outlives
    Ray's start: the process must finish its iteration, checkpoint it and exit 0."""
    job_dict["spec"]["checkpointing"] = {"intervalIterations": 1_000, "intervalSeconds": None, "keepLast": 2}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(short_job(job_dict, maxEnvSteps=5_000_000)))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kuberl.trainer.cli", "train", str(path), "--run-dir", str(run_dir),
                             "--metrics-port", "0", "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=(tmp_path / "train.log").open("w"), start_new_session=True)
    try:
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 180, "three iterations")
        assert not list((run_dir / "checkpoints").glob("ckpt-*.pt"))  # none yet: the one we see is the exit's
        proc.send_signal(signal.SIGTERM)  # the process only, as a container runtime signals PID 1
        assert proc.wait(timeout=120) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    newest = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert newest.name == f"ckpt-{rows[-1]['iteration']:09d}.pt", (newest, rows[-1])
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "signal"


def test_joins_a_multi_node_ray_cluster_one_actor_per_rollout_slot(job_dict, tmp_path):
    """The learner-pod path: a Ray head, two worker nodes with one rollout slot each, each started as the
    operator's pods start them (`python -m kuberl.trainer.ray_node`: `ray start` with minimal agents), and
    `kuberl train --ray-address` joining them (token authentication on, as a cluster should run)."""
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.urandom(16).hex())
    common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    temp_root = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: socket paths live under it
    # Three nodes share this one host (on a cluster each pod has its own IP): every node gets its own
    # agent, metrics and worker ports, or two of them race for Ray's defaults (52365 and the worker port
    # range) and a raylet exits with "address already in use" (seen in CI: one slot never joined).
    nodes = [subprocess.Popen([*RAY_START, "--head", f"--port={port}", "--num-cpus=0",
                               "--include-dashboard=false", "--object-store-memory=100000000", *common,
                               *_own_node_flags(0, temp_root)],
                              env=env, start_new_session=True, stdout=(tmp_path / "head.log").open("w"),
                              stderr=subprocess.STDOUT)]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(short_job(job_dict, maxEnvSteps=8_000)))

    def head_listening() -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        # Worker nodes need a live head to join (the operator's worker pods wait for it the same way).
        _wait_for(head_listening, 120, "the Ray head")
        worker_cmd = [*RAY_START, f"--address=127.0.0.1:{port}", "--num-cpus=1",
                      "--object-store-memory=100000000", '--resources={"rollout_slot": 1}', *common]
        workers = [None, None]

        def keep_workers_up() -> None:
            # A `ray start` that raced the head's start-up exits; start it again, as a pod restart would.
            for i, node in enumerate(workers):
                if node is None or node.poll() is not None:
                    out = (tmp_path / f"worker-{i}-{len(nodes)}.log").open("w")
                    workers[i] = subprocess.Popen([*worker_cmd, *_own_node_flags(i + 1, temp_root)], env=env, start_new_session=True,
                                                  stdout=out, stderr=subprocess.STDOUT)
                    nodes.append(workers[i])

        keep_workers_up()
        # Both worker nodes offer their slot before the learner starts. The learner's own wait for slots is
        # bounded (a minute) and a node that lost the race with the head's start-up is only started again
        # by this loop: on a loaded machine that took longer than the whole run and the learner trained on
        # one slot (seen in CI). What this test checks is where the actors land once the slots exist.
        def both_slots_offered() -> bool:
            keep_workers_up()
            return _slots_offered(f"127.0.0.1:{port}", env) == 2

        try:
            _wait_for(both_slots_offered, 300, "two rollout slots")
        except AssertionError as err:
            # What each worker node's start said, and its raylet's last lines (the temp dirs go with the test).
            said = [f"{log.name}: {log.read_text(errors='replace')[-1500:]}"
                    for log in [tmp_path / "head.log", *sorted(tmp_path.glob("worker-*.log"))]]
            said += [f"{out}: {out.read_text(errors='replace')[-1500:]}" for out in sorted(temp_root.glob("n*/session_*/logs/raylet.out"))]
            raise AssertionError(f"{err}\n" + "\n".join(said)[-12_000:]) from None
        learner = subprocess.Popen([sys.executable, "-m", "kuberl.trainer.cli", "train", str(path), "--ray-address",
                                    f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run"), "--metrics-port", "0",
                                    "--no-progress"], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=(tmp_path / "learner.log").open("w"), start_new_session=True)
        nodes.append(learner)
        deadline = time.monotonic() + 300
        while learner.poll() is None and time.monotonic() < deadline:
            keep_workers_up()
            time.sleep(0.5)
        assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
        rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["env_steps"] >= 8_000
        # Both slots were used, each actor on its own node (the head offers no slot and no CPU).
        assert max(r["workers_ready"] for r in rows) == 2
        assert rows[-1]["workers_ready"] == 2 and rows[-1]["worker_nodes"] == 2
        # Every node's port files said "no metrics agent" (-1) before its raylet started, so no raylet waited
        # on an agent's imports, and no node ran Ray's dashboard agent (it writes dashboard_agent.log).
        ports = sorted(temp_root.glob("n*/session_*/metrics_agent_port_*"))
        assert len(ports) >= 3 and {p.read_text().strip() for p in ports} == {"-1"}, ports
        assert not list(temp_root.glob("n*/session_*/logs/dashboard_agent.log"))
    finally:
        _stop_all(nodes[::-1], temp_root)


def _stop_all(procs: list[subprocess.Popen], temp_root: Path) -> None:
    """Each process's group stopped (SIGTERM, then SIGKILL after 30 s), in the order given; then their files."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    shutil.rmtree(temp_root, ignore_errors=True)


def _descendants(pid: int, name: str) -> list:
    import psutil  # Ray's own copy, on the path once ray is imported

    return [p for p in psutil.Process(pid).children(recursive=True)
            if p.name() == name and p.status() != psutil.STATUS_ZOMBIE]


def _command_lines(pid: int) -> list[str]:
    import psutil  # Ray's own copy, on the path once ray is imported

    lines = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            lines.append(" ".join(proc.cmdline()))
        except psutil.Error:
            pass  # ended meanwhile
    return lines


def test_a_node_whose_raylet_aborts_is_cleaned_up_and_started_again_leaving_other_nodes_alone(tmp_path):
    """A Ray node's start that fails (here its raylet's port is taken, so the raylet aborts at once, as it
    did when its agents were slow) is noticed at once, its processes are stopped, and the node starts
    again; another node on the same host (another job's, wherever nodes share a host) keeps running."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    temp_root = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: socket paths live under it
    common = ["--head", "--block", "--num-cpus=0", "--include-dashboard=false", "--object-store-memory=100000000",
              "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    nodes = []
    try:
        bystander = subprocess.Popen([*RAY_START, f"--port={_free_port()}", *common, *_own_node_flags(0, temp_root)],
                                     env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        nodes.append(bystander)
        _wait_for(lambda: _descendants(bystander.pid, "raylet"), 120, "the other node's raylet")
        log = tmp_path / "node.log"
        flags = [f for f in _own_node_flags(1, temp_root) if not f.startswith("--node-manager-port=")]
        node = subprocess.Popen([*RAY_START, f"--port={_free_port()}", f"--node-manager-port={taken}", *common,
                                 *flags], env=env, start_new_session=True, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
        nodes.append(node)
        _wait_for(lambda: "attempt 1 of 3" in log.read_text() or node.poll() is not None, 180, "the first start's failure")
        text = log.read_text()
        assert "its raylet exited before it registered" in text, text[-3000:]
        busy.close()  # the port is free for the second start
        _wait_for(lambda: "Ray runtime started" in log.read_text() or node.poll() is not None, 180, "the second start")
        text = log.read_text()
        assert node.poll() is None and "attempt 2 of 3" not in text, text[-3000:]
        # The failed start left nothing behind (its GCS and raylet were stopped and reaped) ...
        assert len(_descendants(node.pid, "raylet")) == 1 and len(_descendants(node.pid, "gcs_server")) == 1
        # ... and its clean-up stopped only its own processes (`ray stop` would have killed these too).
        assert bystander.poll() is None
        assert len(_descendants(bystander.pid, "raylet")) == 1 and len(_descendants(bystander.pid, "gcs_server")) == 1
    finally:
        busy.close()
        _stop_all(nodes, temp_root)


# Loaded at the start of every Python process of the node (through PYTHONPATH): Ray's agents wait at their
# first line until the test creates the gate file, as on a machine too busy to import them in time.
_HELD_AGENTS = """
import os, sys, time
if sys.argv and sys.argv[0].endswith(("dashboard/agent.py", "runtime_env/agent/main.py")):
    open(os.path.join(os.environ["KR_GATE_DIR"], "held-%d" % os.getpid()), "w").close()
    while not os.path.exists(os.path.join(os.environ["KR_GATE_DIR"], "open")):
        time.sleep(0.1)
"""


def test_a_node_whose_agents_are_slower_than_the_raylets_fixed_wait_starts_and_runs_tasks(tmp_path):
    """The raylet waits 15 s, fixed in Ray, for its agents' port files and aborts when one is late, which on
    a loaded machine failed every start of a node. Here the runtime env agent is held until the node has
    started (Ray's dashboard agent, which does nothing in minimal mode, does not run: a process that stays
    with the raylet stands in): the node starts anyway (the port files are written before the raylet
    starts), and once the agent comes up it runs a task, one with a runtime env (that agent's own work) and
    an actor."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_HELD_AGENTS)
    token = os.urandom(16).hex()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               KR_GATE_DIR=str(gate), PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "site"),
                                                                             os.environ.get("PYTHONPATH")])))
    temp_root = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: socket paths live under it
    port = _free_port()
    log = tmp_path / "node.log"
    node = subprocess.Popen([*RAY_START, "--head", f"--port={port}", "--block", "--num-cpus=1", "--no-monitor",
                             "--include-dashboard=false", "--object-store-memory=100000000",
                             "--node-ip-address=127.0.0.1", "--disable-usage-stats", *_own_node_flags(0, temp_root)],
                            env=env, start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: "Ray runtime started" in log.read_text() or node.poll() is not None, 300, "the node's start")
        text = log.read_text()
        assert node.poll() is None and "failed to start" not in text, text[-3000:]
        # The raylet starts its agents as it comes up, and "Ray runtime started" can come before the agent's
        # Python reaches the gate; the gate is still closed, so the node has started without it either way.
        held = _wait_for(lambda: sorted(p.name for p in gate.glob("held-*")), 300, "the runtime env agent's start")
        assert node.poll() is None, log.read_text()[-3000:]
        assert len(held) == 1, f"the runtime env agent, the one agent Ray starts, was started and is held: {held}"
        # A head as the operator starts it: no dashboard API server (no dashboard asked for), no autoscaler,
        # and in the dashboard agent's place the stand-in.
        started = _command_lines(node.pid)
        assert any("raylet" in c for c in started) and any("os.getppid() == raylet" in c for c in started), started
        assert not [c for c in started if "dashboard/" in c or "autoscaler" in c], started
        (gate / "open").touch()
        driver = ("import ray\n"
                  f"ray.init(address='127.0.0.1:{port}')\n"
                  "@ray.remote\ndef plain(): return 1\n"
                  "@ray.remote\ndef env_var(): import os; return int(os.environ['KR_X'])\n"
                  "@ray.remote\nclass Two:\n    def get(self): return 2\n"
                  "print('sum', ray.get(plain.remote()) + ray.get(env_var.options(runtime_env={'env_vars': {'KR_X': '4'}}).remote())"
                  " + ray.get(Two.remote().get.remote()))\n")
        done = subprocess.run([sys.executable, "-c", driver], env=dict(env, PYTHONPATH=os.environ.get("PYTHONPATH", "")),
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0 and "sum 7" in done.stdout, (done.stdout + done.stderr)[-3000:]
        assert node.poll() is None, log.read_text()[-3000:]
    finally:
        (gate / "open").touch()
        _stop_all([node], temp_root)


@pytest.mark.slow
def test_ppo_learns_cartpole(job_dict, tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    job_dict["spec"]["stopping"] = {"targetReturn": 195, "returnWindow": 100, "maxEnvSteps": 150_000}
    job_dict["spec"]["evaluation"] = {"episodes": 20}
    result = train(parse_job(job_dict), TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False))
    assert result.reason == "target_return", f"mean return {result.mean_return} after {result.counters.env_steps} steps"
    assert result.mean_return >= 195
    assert result.evaluation["deterministic"]["mean_return"] >= 195


def test_sigterm_saves_a_checkpoint_and_skips_the_evaluation_its_dying_workers_could_not_run(
        local_ray, job_dict, tmp_path):
    # A learner pod being deleted (kubectl delete, suspend, a new Ray head) gets SIGTERM while its
    # rollout workers go too: it must save the iteration it reached and exit, not evaluate and fail.
    job = parse_job(short_job(job_dict, maxEnvSteps=2_000_000))

    def observe(row, loop):
        if row["iteration"] == 3:
            for handle in loop.workers.ready():
                ray.kill(handle.actor, no_restart=True)
            loop.stop_signal["set"] = True

    result = train(job, TrainOptions(run_dir=tmp_path, workers=2, metrics_port=0, progress=False,
                                     shutdown_ray=False, on_iteration=observe))
    assert result.ok and result.reason == "signal" and result.evaluation == {}
    newest = sorted((tmp_path / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert newest.name == f"ckpt-{result.counters.iterations:09d}.pt"


def test_a_learner_that_fails_leaves_its_error_as_the_termination_message(tmp_path):
    """In a pod the learner's error line is its container's termination message, written by the learner: the
    pod's Ray node, started beside it, may still log after the learner ended, and the kubelet's fallback
    would quote those lines instead (the operator puts the message in the job's status)."""
    message = tmp_path / "termination-log"
    env = dict(os.environ, KUBERL_TERMINATION_MESSAGE_PATH=str(message), RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "train", str(REPO / "examples" / "cartpole-ppo.yaml"),
                           "--device", "cuda", "--no-progress", "--run-dir", str(tmp_path / "run")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert message.read_text() == "error: spec.learner.device is cuda but torch sees no CUDA device"

"""Serving: latency (p50/p99) and throughput of `kuberl serve` against Ray Serve, same exported policy.

For the CartPole (PPO) and autoscaling (DQN) policies, each server runs in its own process and answers
`POST /act` ({"observation": [...]} -> {"action": n}); the load generator here keeps 1, 16 and 64
clients busy (one keep-alive HTTP/1.1 connection each, a new request as soon as the answer is in) for
`--seconds` after a warm-up, and records every request's latency. Contenders:

  - kuberl: `kuberl serve ARTIFACT` (aiohttp, one event loop, requests of one loop turn share one numpy
    forward pass); also its Open Inference Protocol `infer` endpoint at 1 client;
  - ray-serve: Ray Serve (ray[serve] at the project's ray version, in its own virtualenv under
    /work/bench-venvs/rayserve) serving the same artifact with the same numpy code, batched with
    `@serve.batch` (max 256, no wait), behind its HTTP proxy.

A second part times one forward pass of the exported policy in-process: numpy (what `kuberl serve` runs),
ONNX Runtime and TorchScript, at batch 1 and 64 — the evidence for the numpy runtime.

    .venv/bin/python bench/bench_serving.py [--run-dir cartpole=runs/cartpole-ppo ...] [--seconds 5] \
        [--ray-python /work/bench-venvs/rayserve/bin/python] [--output bench/results/serving.json]

Without --run-dir, each policy comes from a short `kuberl train` of the example job (--max-env-steps
2000, a minute or less): the example's network, barely trained (latency depends on the shape, not on
the weights). The load average is recorded before every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# One BLAS thread everywhere (this process, kuberl serve, Ray Serve's replica), as `kuberl serve` sets it.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np
from common import EXAMPLES, REPO, RESULTS, Bench, free_port, load_average

KUBERL = REPO / ".venv" / "bin" / "kuberl"
RAY_PYTHON = "/work/bench-venvs/rayserve/bin/python"
POLICIES = {"cartpole": "cartpole-ppo", "autoscaling": "autoscaling-dqn"}
OBSERVATIONS = {  # one realistic observation per policy, sent by every client
    "cartpole": [0.02, -0.15, 0.03, 0.25],
    "autoscaling": [1.6, 1.0, 0.4, 0.3, 0.0, 1.2, 0.9, 0.3, 2.5, 0.1, 0.5, 0.8, 0.5],
}
CLIENTS = (1, 16, 64)

RAY_SERVE_APP = '''
import asyncio, os, sys, time
import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse
from kuberl.trainer.serving.artifact import ExportedPolicy

@serve.deployment(max_ongoing_requests=1024)
class Policy:
    def __init__(self, path):
        self.policy = ExportedPolicy.load(path)

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.0)
    async def act(self, observations):
        return list(self.policy.act(np.stack(observations)))

    async def __call__(self, request: Request):
        body = await request.json()
        action = await self.act(np.asarray(body["observation"], np.float32))
        return JSONResponse({"action": int(action)})

import ray
# A Ray of its own: other Ray clusters on this machine (trainings) must not be joined.
ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count())
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
serve.run(Policy.bind(sys.argv[1]), route_prefix="/act", name="policy")
print("READY", flush=True)
while True:
    time.sleep(3600)
'''


# ---- load generator ----------------------------------------------------------------------------------


async def _one_client(port: int, request: bytes, start_at: float, stop_at: float, out: list[float],
                      errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            headers = head.decode("latin-1").lower()
            if "transfer-encoding: chunked" in headers:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                length = int(headers.split("content-length:", 1)[1].split("\r\n", 1)[0])
                await reader.readexactly(length)
            t1 = time.perf_counter()
            if status != b"200":
                errors.append(status.decode())
            elif t0 >= start_at:
                out.append(t1 - t0)
    finally:
        writer.close()


def load(port: int, path: str, body: dict[str, Any], clients: int, seconds: float, warmup: float) -> dict[str, Any]:
    payload = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    latencies: list[float] = []
    errors: list[str] = []
    load_before = load_average()

    async def run() -> None:
        start_at = time.perf_counter() + warmup
        stop_at = start_at + seconds
        await asyncio.gather(*(_one_client(port, request, start_at, stop_at, latencies, errors)
                               for _ in range(clients)))

    asyncio.run(run())
    lat = np.asarray(latencies) * 1000.0
    return {"clients": clients, "requests": len(lat), "errors": len(errors),
            "decisions_per_second": round(len(lat) / seconds, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "mean_ms": round(float(lat.mean()), 3), "loadavg_before": load_before}


# ---- servers --------------------------------------------------------------------------------------------


def wait_http(port: int, path: str, timeout: float, proc: subprocess.Popen) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                if r.status in (200, 405):
                    return
        except OSError:  # not up yet: connection refused, 404 before the route exists (URLError, HTTPError)
            time.sleep(0.2)
    raise TimeoutError(f"no answer on port {port}{path} within {timeout}s")


def start_kuberl(artifact: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([str(KUBERL), "serve", str(artifact), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(port, "/v2/health/ready", 60, proc)
    return proc, port


def start_ray_serve(artifact: Path, ray_python: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'trainer'}:{REPO / 'operator'}", RAY_USAGE_STATS_ENABLED="0")
    script = Path(tempfile.mkdtemp()) / "ray_serve_policy.py"
    script.write_text(RAY_SERVE_APP)
    proc = subprocess.Popen([ray_python, str(script), str(artifact), str(port)], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "READY" not in log.read_text():
            if proc.poll() is not None:
                raise RuntimeError(f"Ray Serve exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray Serve not ready; see {log}")
            time.sleep(0.5)
        wait_http(port, "/-/healthz", 60, proc)
    except BaseException:
        stop(proc, group=True)
        raise
    return proc, port


def stop(proc: subprocess.Popen, group: bool = False) -> None:
    import signal

    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()


# ---- policies and forward-pass timings ----------------------------------------------------------------


def short_run(example: str, run_dir: Path, env_steps: int = 2000) -> None:
    """A run directory as `kuberl train` leaves it, from `env_steps` of the example job."""
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([str(KUBERL), "train", str(EXAMPLES / f"{example}.yaml"), "--run-dir", str(run_dir),
                           "--max-env-steps", str(env_steps), "--no-progress", "--metrics-port", "0"],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"kuberl train {example} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def make_artifacts(run_dirs: dict[str, Path], work: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    from kuberl.trainer.serving.export import export

    out = {}
    for name in names:
        example = POLICIES[name]
        run_dir = run_dirs.get(name)
        trained = run_dir is not None
        if run_dir is None:
            run_dir = work / example
            short_run(example, run_dir)
        artifact = export(run_dir, work / f"{name}-policy", fmt="onnx")
        out[name] = {"artifact": artifact, "run_dir": str(run_dir), "trained": trained}
    return out


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", action="append", default=[], metavar="POLICY=DIR",
                        help="use a trained run for a policy (cartpole=..., autoscaling=...)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (after a 2 s warm-up)")
    parser.add_argument("--ray-python", default=RAY_PYTHON, help="python of the Ray Serve virtualenv ('' to skip)")


def main() -> int:
    bench = Bench(__doc__, RESULTS / "serving.json", arguments)
    args = bench.args
    run_dirs = {k: Path(v) for k, v in (item.split("=", 1) for item in args.run_dir)}
    work = Path(tempfile.mkdtemp(prefix="kuberl-serving-bench-"))
    policies = make_artifacts(run_dirs, work, args.policies)
    results: dict[str, Any] = {"policies": {}, "forward_pass": {}}
    for name, info in policies.items():
        print(f"[{time.strftime('%H:%M:%S')}] {name}: forward-pass timings (load {load_average()[0]})", flush=True)
        results["forward_pass"][name] = forward_timings(info["artifact"], Path(info["run_dir"]), OBSERVATIONS[name])
        results["policies"][name] = {"run_dir": info["run_dir"], "trained": info["trained"], "servers": {}}
    # Every kuberl run first, then Ray Serve's: Ray's own processes (GCS, raylet, proxy, replica) load the
    # machine, and a kuberl run must not share the cores with a Ray that is still shutting down.
    for name, info in policies.items():
        servers = results["policies"][name]["servers"]
        body = {"observation": OBSERVATIONS[name]}
        proc, port = start_kuberl(info["artifact"])
        try:
            servers["kuberl"] = []
            for clients in CLIENTS:
                servers["kuberl"].append(load(port, "/act", body, clients, args.seconds, 2.0))
                print(f"  {name} kuberl     {clients:>2} clients: {servers['kuberl'][-1]}", flush=True)
            model = json.loads((info["artifact"] / "policy.json").read_text())["name"]
            oip = {"inputs": [{"name": "observation", "datatype": "FP32", "shape": [1, len(OBSERVATIONS[name])],
                               "data": OBSERVATIONS[name]}]}
            servers["kuberl-infer"] = [load(port, f"/v2/models/{model}/infer", oip, 1, args.seconds, 2.0)]
            print(f"  {name} kuberl-infer 1 client: {servers['kuberl-infer'][0]}", flush=True)
        finally:
            stop(proc)
    for name, info in policies.items() if args.ray_python else ():
        servers = results["policies"][name]["servers"]
        body = {"observation": OBSERVATIONS[name]}
        proc, port = start_ray_serve(info["artifact"], args.ray_python, work / f"ray-serve-{name}.log")
        try:
            servers["ray-serve"] = []
            for clients in CLIENTS:
                servers["ray-serve"].append(load(port, "/act", body, clients, args.seconds, 2.0))
                print(f"  {name} ray-serve  {clients:>2} clients: {servers['ray-serve'][-1]}", flush=True)
        finally:
            stop(proc, group=True)
    results["targets"] = targets(results)
    bench.write(results)
    print(json.dumps(results["targets"], indent=2))
    return 0


def forward_timings(artifact: Path, run_dir: Path, obs_row: list[float], repeats: int = 3000) -> dict[str, Any]:
    """One forward pass in-process: numpy (served), ONNX Runtime, TorchScript; 1 thread each."""
    import onnxruntime as ort
    import torch
    from kuberl.trainer.serving.artifact import ExportedPolicy

    torch.set_num_threads(1)
    policy = ExportedPolicy.load(artifact)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(artifact / "policy.onnx"), options, providers=["CPUExecutionProvider"])
    from kuberl.trainer.serving.export import load_run, write_graph

    ts_path = artifact.parent / f"{artifact.name}.pt"
    _, algo, _, _, _ = load_run(run_dir)
    write_graph(algo, False, ts_path, "torchscript")
    traced = torch.jit.load(str(ts_path))
    out = {}
    for batch in (1, 64):
        obs = np.tile(np.asarray(obs_row, np.float32), (batch, 1))
        tobs = torch.as_tensor(obs)
        contenders = {"numpy": lambda obs=obs: policy.act(obs),
                      "onnxruntime": lambda obs=obs: session.run(["action"], {"observation": obs}),
                      "torchscript": lambda tobs=tobs: traced(tobs)}
        row = {}
        with torch.no_grad():
            for name, fn in contenders.items():
                for _ in range(300):
                    fn()
                times = np.empty(repeats)
                for i in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    times[i] = time.perf_counter() - t0
                times *= 1e6
                row[name] = {"p50_us": round(float(np.percentile(times, 50)), 1),
                             "p99_us": round(float(np.percentile(times, 99)), 1)}
        out[f"batch_{batch}"] = row
    return out


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, entry in results["policies"].items():
        kuberl = {r["clients"]: r for r in entry["servers"]["kuberl"]}
        ray = {r["clients"]: r for r in entry["servers"].get("ray-serve", [])}
        out[name] = {
            "p99_at_1_client_ms": kuberl[1]["p99_ms"], "p99_at_1_client_le_2ms": kuberl[1]["p99_ms"] <= 2.0,
            "decisions_per_second_at_64": kuberl[64]["decisions_per_second"],
            "ge_5000_at_64": kuberl[64]["decisions_per_second"] >= 5000,
            "ahead_of_ray_serve": (all(kuberl[c]["p99_ms"] < ray[c]["p99_ms"]
                                       and kuberl[c]["decisions_per_second"] > ray[c]["decisions_per_second"]
                                       for c in CLIENTS) if ray else None),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())

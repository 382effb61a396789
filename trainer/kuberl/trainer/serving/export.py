"""`kuberl export RUN_DIR`: the newest loadable checkpoint of a run as a self-contained policy artifact.

The artifact is a directory: `policy.json` (format, job, algorithm, observation and action spaces, the
action-mask convention, the checkpoint it came from) and `weights.npz` (the acting network's weights,
what `kuberl serve` runs with numpy), plus `policy.onnx` (`--format onnx`) or `policy.pt` (TorchScript,
`--format torchscript`) for other runtimes: greedy actions from the flattened observation (and mask).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kuberl.trainer.serving.artifact import FORMAT, MANIFEST, MASK_INPUT, WEIGHTS, ExportedPolicy, json_safe

FORMATS = ("numpy", "onnx", "torchscript")
GRAPH_FILES = {"onnx": "policy.onnx", "torchscript": "policy.pt"}


class ExportError(RuntimeError):
    """A run directory that cannot be exported; the message says what is missing."""


def describe_space(space) -> dict[str, Any]:
    """A gymnasium space as JSON: what a client needs to build a valid observation."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": np.asarray(space.low, np.float64).ravel().tolist(),
                "high": np.asarray(space.high, np.float64).ravel().tolist()}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).ravel().tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(np.atleast_1d(space.n))}
    raise ExportError(f"cannot describe space {space}")


def load_run(run_dir: Path):
    """(job, algorithm with the newest loadable checkpoint's weights, env probe, checkpoint path, state)."""
    import torch

    from kuberl.api.load import InvalidJob, load_job_file
    from kuberl.trainer import checkpoint as ckpt
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.rollout import policy_spaces, probe_env
    from kuberl.trainer.spaces import space_info

    job_file = run_dir / "job.yaml"
    if not job_file.is_file():
        raise ExportError(f"{run_dir} is not a run directory: job.yaml is missing (`kuberl train` writes it)")
    try:
        job = load_job_file(job_file)
    except InvalidJob as err:
        raise ExportError(f"{job_file} does not load: {'; '.join(str(p) for p in err.problems)}") from None
    loaded = ckpt.load_latest(run_dir / "checkpoints")
    if loaded is None:
        raise ExportError(f"{run_dir / 'checkpoints'} holds no loadable checkpoint (ckpt-*.pt)")
    path, state = loaded
    spec = job.spec
    multi = spec.environment.multi_agent
    if multi is not None and multi.groups is not None:
        raise ExportError("policies: groups trains a policy per group, and an exported artifact holds one policy: "
                          "exporting policy groups is not built yet")
    env = probe_env(spec.environment)  # a PettingZoo env's shared policy acts for one agent: its spaces
    info = space_info(*policy_spaces(env))
    algo = algorithm_for(spec, info, torch.device("cpu"), spec.seed, spec.stopping.max_env_steps)
    algo.load_state_dict(state["algorithm"])
    return job, algo, env, path, state


def build_artifact(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest and weights of a run's newest loadable checkpoint (nothing written)."""
    manifest, weights, _ = _build(Path(run_dir))
    return manifest, weights


def _build(run_dir: Path):
    from kuberl.trainer.rollout import policy_spaces

    job, algo, env, path, state = load_run(run_dir)
    try:
        _, reset_info = env.reset(seed=0)
        masked = "action_mask" in reset_info and algo.info.action_kind == "Discrete"
        names = getattr(getattr(env, "unwrapped", env), "observation_names", None)
        obs_space, action_space = policy_spaces(env)
        observation = describe_space(obs_space)
        if names is not None and observation["type"] == "Box" and len(names) == observation["shape"][0]:
            observation["names"] = list(names)
        action = describe_space(action_space)
    finally:
        env.close()
    weights = {k: np.ascontiguousarray(v) for k, v in algo.weights().items()}
    manifest = {
        "format": FORMAT,
        "name": job.metadata.name,
        "algorithm": job.spec.algorithm.name.value,
        "environment": {"id": job.spec.environment.id, "kwargs": job.spec.environment.kwargs},
        "observation": observation,
        "action": action,
        "action_mask": {
            "input": MASK_INPUT, "size": int(algo.info.action_dims[0]),
            "convention": "true (or 1) marks a legal action; the greedy action is the highest-valued legal one; "
                          "no mask means every action is legal",
        } if masked else None,
        "policy": algo.policy_config(),
        "space_info": dataclasses.asdict(algo.info),
        "checkpoint": {"file": path.name, "iteration": int(state["counters"]["iterations"]),
                       "env_steps": int(state["counters"]["env_steps"]),
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
        "files": {"weights": WEIGHTS},
    }
    return manifest, weights, algo


def export(run_dir: str | Path, out: str | Path | None = None, fmt: str = "numpy") -> Path:
    """Write the artifact to `out` (default RUN_DIR/policy) and return it; replaces an older export whole."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "policy"
    manifest, weights, algo = _build(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        np.savez(tmp / WEIGHTS, **weights)
        if fmt != "numpy":
            manifest["files"][fmt] = GRAPH_FILES[fmt]
            manifest["graph"] = {
                "inputs": ([{"name": "observation", "datatype": "FP32", "shape": [-1, algo.info.obs_dim],
                             "note": "the flattened observation: Dict parts concatenated in key order, "
                                     "Discrete parts one-hot"}]
                           + ([{"name": MASK_INPUT, "datatype": "BOOL",
                                "shape": [-1, manifest["action_mask"]["size"]]}] if manifest["action_mask"] else [])),
                "outputs": ExportedPolicy(manifest, weights).outputs(),
            }
            write_graph(algo, manifest["action_mask"] is not None, tmp / GRAPH_FILES[fmt], fmt)
        (tmp / MANIFEST).write_text(json.dumps(json_safe(manifest), indent=2, allow_nan=False) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---- graphs for other runtimes (torch) --------------------------------------------------------------


def greedy_module(algo, masked: bool):
    """A torch module: flattened observation (and bool mask) -> greedy actions, as the numpy policy acts."""
    import torch
    from torch import nn

    info, cfg = algo.info, algo.policy_config()
    kind = cfg["kind"]

    def masked_argmax(values, mask):
        if mask is not None:
            values = torch.where(mask, values, torch.full_like(values, float("-inf")))
        return values.argmax(dim=-1)

    class Greedy(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "ppo":
                self.net = algo.net.actor
            elif kind in ("dqn", "bdq"):
                self.net = algo.q
            elif kind in ("sac", "td3"):
                self.net = algo.actor
            else:
                d = algo.discretise
                self.register_buffer("table", torch.as_tensor(algo.table, dtype=torch.float32))
                self.discrete_n = d.discrete_n
                if d.discrete_n is None:
                    strides = np.cumprod([1, *d.bins[::-1][:-1]])[::-1].copy()
                    self.register_buffer("low", torch.as_tensor(d.low, dtype=torch.float64))
                    self.register_buffer("width", torch.as_tensor(np.maximum(d.high - d.low, 1e-12),
                                                                  dtype=torch.float64))
                    self.register_buffer("bins", torch.as_tensor(d.bins, dtype=torch.float64))
                    self.register_buffer("strides", torch.as_tensor(strides, dtype=torch.int64))

        def forward(self, obs, mask=None):
            if kind == "ppo":
                out = self.net(obs)
                if info.action_kind == "Discrete":
                    return masked_argmax(out, mask)
                if info.action_kind == "MultiDiscrete":
                    return torch.stack([part.argmax(dim=-1) for part in out.split(list(info.action_dims), -1)], 1)
                low = torch.tensor(info.action_low, dtype=torch.float32).reshape(info.action_dims)
                high = torch.tensor(info.action_high, dtype=torch.float32).reshape(info.action_dims)
                return torch.minimum(torch.maximum(out.reshape(-1, *info.action_dims), low), high)
            if kind == "dqn":
                return masked_argmax(self.net(obs), mask)
            if kind == "sac":  # the squashed Gaussian's mode: tanh of its mean, on the Box
                return torch.tanh(self.net(obs)[0]) * self.net.scale + self.net.bias
            if kind == "td3":
                return self.net(obs)
            if kind == "bdq":
                qs = self.net(obs)
                if info.action_kind == "Discrete":
                    return masked_argmax(qs[0], mask)
                return torch.stack([q.argmax(dim=-1) for q in qs], 1)
            if self.discrete_n is not None:
                rows = obs.argmax(dim=1)
            else:
                # float64 like the numpy Discretiser, so cell edges fall the same way
                cells = torch.floor((obs.double() - self.low) / self.width * self.bins)
                cells = torch.minimum(torch.clamp(cells, min=0), self.bins - 1).long()
                rows = (cells * self.strides).sum(dim=1)
            return masked_argmax(self.table[rows], mask)

    module = Greedy().eval()
    return module


def write_graph(algo, masked: bool, path: Path, fmt: str) -> None:
    import torch

    module = greedy_module(algo, masked)
    example = (torch.zeros(2, algo.info.obs_dim),)
    if masked:
        example = (*example, torch.ones(2, algo.info.action_dims[0], dtype=torch.bool))
    names = ["observation", MASK_INPUT][: len(example)]
    with torch.no_grad():
        if fmt == "torchscript":
            torch.jit.save(torch.jit.trace(module, example), str(path))
            return
        try:
            import onnx  # noqa: F401  (torch's exporter needs it; say so instead of its own message)
        except ImportError:
            raise ExportError("--format onnx needs the onnx package: pip install 'kuberl[export]'") from None
        torch.onnx.export(module, example, str(path), dynamo=False, input_names=names, output_names=["action"],
                          dynamic_axes={n: {0: "batch"} for n in [*names, "action"]}, opset_version=17)

"""Serving: an exported policy acts like the trainer's networks; the server speaks the Open Inference
Protocol, answers bad requests with a 400 naming the field, batches concurrent requests, and counts."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from aiohttp.test_utils import TestClient, TestServer
from kuberl.api.load import parse_job
from kuberl.trainer.algorithms import algorithm_for
from kuberl.trainer.checkpoint import save_checkpoint
from kuberl.trainer.rollout import make_env
from kuberl.trainer.serving.artifact import BadInput, ExportedPolicy
from kuberl.trainer.serving.export import ExportError, export, greedy_module
from kuberl.trainer.serving.server import create_app, load_policy
from kuberl.trainer.spaces import flatten_obs, space_info

ROOT = Path(__file__).resolve().parents[2]
N_STATES = 1_000


def make_run(example: str, run_dir: Path, iteration: int = 3, algorithm: str | None = None):
    """A run directory as `kuberl train` leaves it (job.yaml + checkpoints/ckpt-*.pt, the learner's state
    layout), from the example's job (its algorithm swapped for `algorithm` where given) with weights drawn
    at random so greedy actions vary by state."""
    manifest = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    if algorithm:
        manifest["spec"]["algorithm"] = {"name": algorithm}
    job = parse_job(manifest)
    spec = job.spec
    env = make_env(spec.environment.id, spec.environment.kwargs, spec.environment.max_episode_steps)
    info = space_info(env.observation_space, env.action_space)
    torch.manual_seed(iteration)
    algo = algorithm_for(spec, info, torch.device("cpu"), spec.seed, spec.stopping.max_env_steps)
    if hasattr(algo, "table"):
        algo.table = np.random.default_rng(iteration).normal(size=algo.table.shape)
    else:
        with torch.no_grad():
            trained = next(getattr(algo, name) for name in ("net", "q", "actor") if hasattr(algo, name))
            for p in trained.parameters():
                p.normal_(0.0, 0.5)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job.manifest(), sort_keys=False))
    state = {"format": 1, "job_name": job.metadata.name, "algorithm_name": spec.algorithm.name.value,
             "algorithm": algo.state_dict(), "counters": {"iterations": iteration, "env_steps": 100 * iteration},
             "recent_returns": torch.zeros(1, dtype=torch.float64), "torch_rng": torch.get_rng_state()}
    save_checkpoint(run_dir / "checkpoints", iteration, state, keep_last=3)
    return algo, env


def trainer_greedy(algo, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The trainer's own torch networks, argmax written out here (not the exported code)."""
    x = torch.as_tensor(obs)
    with torch.no_grad():
        if algo.name == "PPO":
            return algo.net.actor(x).argmax(-1).numpy()
        if algo.name == "QLearning":
            q = algo.table[algo.discretise(obs)]
        elif algo.name == "BDQ":
            return torch.stack([q.argmax(-1) for q in algo.q(x)], 1).numpy()
        else:
            q = algo.q(x).numpy()
    if mask is not None:
        q = np.where(mask, q, -np.inf)
    return q.argmax(-1)


def sample_states(env, n: int, seed: int):
    space = env.observation_space
    space.seed(seed)
    raw = [space.sample() for _ in range(n)]
    if isinstance(raw[0], dict):
        return {k: np.stack([r[k] for r in raw]) for k in raw[0]}
    return np.stack(raw)


CASES = [  # (example, algorithm, what it covers)
    ("cartpole-ppo", "PPO"),  # Box observation, Discrete action
    ("tictactoe-dqn", "DQN"),  # action masks
    ("autoscaling-bdq", "BDQ"),  # Dict observation (macro/micro), MultiDiscrete action
    ("autoscaling-qlearning", "QLearning"),  # Q-table over a discretised Box
]


@pytest.mark.parametrize("example,algorithm", CASES)
def test_exported_policy_picks_the_trainers_greedy_actions_on_1000_states(example, algorithm, tmp_path):
    algo, env = make_run(example, tmp_path / "run")
    assert algo.name == algorithm
    artifact = export(tmp_path / "run", fmt="torchscript")
    policy = ExportedPolicy.load(artifact)  # from disk, as `kuberl serve ARTIFACT` loads it

    raw = sample_states(env, N_STATES, seed=1)
    obs = flatten_obs(env.observation_space, raw, N_STATES)
    mask = None
    if policy.mask_size:
        mask = np.random.default_rng(2).random((N_STATES, policy.mask_size)) < 0.5
        mask[np.arange(N_STATES), np.random.default_rng(3).integers(0, policy.mask_size, N_STATES)] = True
    expected = trainer_greedy(algo, obs, mask)
    assert len(np.unique(expected, axis=0)) > 1, "random weights should give varied actions"

    # The served path: the raw observation, checked and flattened by the artifact, numpy forward.
    parts = raw if isinstance(raw, dict) else {"observation": raw}
    served = policy.act(policy.encode(parts, N_STATES), mask)
    np.testing.assert_array_equal(served, expected)

    # The TorchScript graph (other runtimes) picks the same actions.
    graph = torch.jit.load(str(artifact / "policy.pt"))
    args = (torch.as_tensor(obs),) + ((torch.as_tensor(mask),) if mask is not None else ())
    np.testing.assert_array_equal(graph(*args).numpy(), expected)

    manifest = json.loads((artifact / "policy.json").read_text())
    assert manifest["algorithm"] == algorithm and manifest["checkpoint"]["file"] == "ckpt-000000003.pt"
    assert (manifest["action_mask"] is not None) == (example == "tictactoe-dqn")


@pytest.mark.parametrize("algorithm", ["SAC", "TD3"])
def test_an_exported_continuous_policy_acts_as_the_trainers_actor_on_1000_states(algorithm, tmp_path):
    algo, env = make_run("pendulum-sac", tmp_path / "run", algorithm=algorithm)
    artifact = export(tmp_path / "run", fmt="torchscript")
    policy = ExportedPolicy.load(artifact)
    raw = sample_states(env, N_STATES, seed=1)
    obs = flatten_obs(env.observation_space, raw, N_STATES)
    with torch.no_grad():  # the trainer's actor, its mode written out here: tanh of the mean, on [-2, 2]
        x = torch.as_tensor(obs)
        expected = (torch.tanh(algo.actor(x)[0]) * 2.0 if algorithm == "SAC" else algo.actor(x)).numpy()
    assert expected.shape == (N_STATES, 1) and np.ptp(expected) > 0.5
    served = policy.act(policy.encode({"observation": raw}, N_STATES), None)
    # float32 sums over 256-wide layers of N(0, 0.5) weights (pre-activations in the tens) round apart
    # between numpy and torch by up to ~1e-4; a wrong scale, offset or head is off by far more.
    np.testing.assert_allclose(served, expected, rtol=1e-3, atol=1e-3)
    graph = torch.jit.load(str(artifact / "policy.pt"))
    np.testing.assert_allclose(graph(torch.as_tensor(obs)).detach().numpy(), expected, rtol=1e-5, atol=1e-5)
    assert json.loads((artifact / "policy.json").read_text())["algorithm"] == algorithm


def test_onnx_export_matches_on_1000_states(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the export extra (onnx, onnxruntime) is not installed")
    algo, env = make_run("tictactoe-dqn", tmp_path / "run")
    artifact = export(tmp_path / "run", fmt="onnx")
    obs = flatten_obs(env.observation_space, sample_states(env, N_STATES, seed=4), N_STATES)
    mask = np.random.default_rng(5).random((N_STATES, 9)) < 0.5
    mask[:, 4] = True
    session = ort.InferenceSession(str(artifact / "policy.onnx"), providers=["CPUExecutionProvider"])
    (actions,) = session.run(["action"], {"observation": obs, "action_mask": mask})
    np.testing.assert_array_equal(actions, trainer_greedy(algo, obs, mask))


def test_export_takes_the_newest_loadable_checkpoint(tmp_path):
    make_run("cartpole-ppo", tmp_path / "run", iteration=3)
    _algo, _ = make_run("cartpole-ppo", tmp_path / "run", iteration=5)
    newest = tmp_path / "run" / "checkpoints" / "ckpt-000000005.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated: not loadable
    manifest = json.loads((export(tmp_path / "run") / "policy.json").read_text())
    assert manifest["checkpoint"]["file"] == "ckpt-000000003.pt"


def test_export_errors_say_what_is_missing(tmp_path):
    with pytest.raises(ExportError, match="job.yaml is missing"):
        export(tmp_path)
    make_run("cartpole-ppo", tmp_path / "run")
    for p in (tmp_path / "run" / "checkpoints").iterdir():
        p.unlink()
    with pytest.raises(ExportError, match="no loadable checkpoint"):
        export(tmp_path / "run")


def test_greedy_module_is_the_numpy_policy_for_a_box_discretiser(tmp_path):
    # The tabular graph re-implements the Discretiser in torch: edges must fall the same way.
    algo, _env = make_run("autoscaling-qlearning", tmp_path / "run")
    low, high = algo.discretise.low, algo.discretise.high
    edges = low + (high - low) * np.arange(algo.discretise.bins.max() + 1)[:, None] / algo.discretise.bins
    obs = np.clip(edges, low, high).astype(np.float32)
    expected = trainer_greedy(algo, obs, None)
    np.testing.assert_array_equal(greedy_module(algo, False)(torch.as_tensor(obs)).numpy(), expected)


# ---- the server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    make_run("autoscaling-dqn", base / "autoscaling")
    make_run("tictactoe-dqn", base / "tictactoe")
    make_run("autoscaling-bdq", base / "bdq")
    return {name: export(base / name) for name in ("autoscaling", "tictactoe", "bdq")} | {"run": base / "autoscaling"}


@pytest.fixture
async def client(artifacts):
    app = create_app(load_policy(artifacts["autoscaling"]))
    async with TestClient(TestServer(app)) as c:
        yield c


def infer_body(obs, datatype="FP32", name="observation", shape=None):
    arr = np.asarray(obs)
    return {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape or arr.shape),
                        "data": arr.ravel().tolist()}]}


LOAD = {"utilisation": 1.6, "running_utilisation": 1.0, "queue": 0.4, "running": 0.3, "booting": 0.0,
        "influx": 1.2, "influx_long": 0.9, "trend": 0.3, "latency": 2.5, "dropped": 0.1, "cycle_sin": 0.5,
        "cycle_cos": 0.8, "progress": 0.5}


async def test_open_inference_protocol_endpoints(client):
    assert (await client.get("/v2/health/live")).status == 200
    assert (await client.get("/v2/health/ready")).status == 200
    server = await (await client.get("/v2")).json()
    assert server["name"] == "kuberl" and server["extensions"] == ["binary_tensor_data"]
    meta = await (await client.get("/v2/models/autoscaling-dqn")).json()
    assert meta["name"] == "autoscaling-dqn" and meta["versions"] == ["3"]
    assert meta["inputs"] == [{"name": "observation", "datatype": "FP32", "shape": [-1, 13]}]
    assert meta["outputs"] == [{"name": "action", "datatype": "INT64", "shape": [-1]}]
    assert meta["parameters"]["observation"]["names"][0] == "utilisation"
    ready = await client.get("/v2/models/autoscaling-dqn/ready")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    assert (await client.get("/v2/models/autoscaling-dqn/versions/3/ready")).status == 200

    obs = np.tile(np.array(list(LOAD.values()), np.float32), (3, 1))
    body = infer_body(obs) | {"id": "req-1", "outputs": [{"name": "action"}]}
    response = await client.post("/v2/models/autoscaling-dqn/infer", json=body)
    assert response.status == 200
    answer = await response.json()
    assert answer["id"] == "req-1" and answer["model_name"] == "autoscaling-dqn" and answer["model_version"] == "3"
    (out,) = answer["outputs"]
    assert out["name"] == "action" and out["datatype"] == "INT64" and out["shape"] == [3]
    policy = client.app["policy"]
    assert out["data"] == policy.act(obs).tolist()
    versioned = await client.post("/v2/models/autoscaling-dqn/versions/3/infer", json=infer_body(obs))
    assert (await versioned.json())["outputs"][0]["data"] == out["data"]


async def test_act_takes_a_list_or_named_observation(client):
    values = list(LOAD.values())
    by_list = await (await client.post("/act", json={"observation": values})).json()
    by_name = await (await client.post("/act", json={"observation": LOAD})).json()
    assert by_list == by_name and by_list["action"] in (0, 1, 2)
    batch = await (await client.post("/act", json={"observations": [values, LOAD]})).json()
    assert batch == {"actions": [by_list["action"]] * 2}


BAD_INFER = [  # (body, status, field named in the error)
    ({"inputs": []}, 400, "inputs"),
    ({"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 13], "data": [0.5] * 13}]}, 400, "inputs[0].name"),
    (infer_body(np.zeros((1, 12))), 400, "inputs[0].shape"),  # wrong shape
    (infer_body(np.zeros((1, 13)), shape=[2, 13]), 400, "inputs[0].data"),  # data does not fill the shape
    (infer_body(np.zeros((1, 13), np.int64), datatype="INT64"), 400, "inputs[0].datatype"),  # wrong dtype
    ({"inputs": [{"name": "observation", "datatype": "FP32", "shape": [1, 13], "data": ["x"] * 13}]}, 400,
     "inputs[0].data"),
    ({"inputs": [{"name": "observation", "datatype": "FP32", "shape": [1, 13], "data": [True] * 13}]}, 400,
     "inputs[0].data"),
    ({"inputs": [{"name": "observation", "datatype": "FP32", "shape": "1x13", "data": [0.5] * 13}]}, 400,
     "inputs[0].shape"),
    (infer_body(np.full((1, 13), 0.5)) | {"outputs": [{"name": "q_values"}]}, 400, "outputs"),
    (infer_body(np.full((1, 13), 9.0)), 400, "inputs.observation"),  # outside the observation space
    (infer_body(np.zeros((0, 13))), 400, "inputs[0].shape"),
]


@pytest.mark.parametrize("body,status,field", BAD_INFER)
async def test_bad_infer_requests_get_a_400_naming_the_field(client, body, status, field):
    response = await client.post("/v2/models/autoscaling-dqn/infer", json=body)
    assert response.status == status, await response.text()
    answer = await response.json()
    assert answer["field"] == field and answer["error"].startswith(field)


async def test_nan_and_non_json_get_a_400(client):
    nan_body = json.dumps(infer_body(np.full((1, 13), 0.5))).replace("0.5", "NaN", 1)
    response = await client.post("/v2/models/autoscaling-dqn/infer", data=nan_body)
    assert response.status == 400 and "finite" in (await response.json())["error"]
    response = await client.post("/v2/models/autoscaling-dqn/infer", data=b"{not json")
    assert response.status == 400 and (await response.json())["field"] == "body"
    # Infinity is no more JSON than NaN; a number too large for a float is, and the space refuses it
    response = await client.post("/act", data=json.dumps({"observation": [math.inf] + [0.5] * 12}))
    answer = await response.json()
    assert response.status == 400 and answer["field"] == "body" and "Infinity" in answer["error"]
    response = await client.post("/act", data=json.dumps({"observation": [0.5] * 13}).replace("0.5", "1e999", 1))
    answer = await response.json()
    assert response.status == 400 and answer["field"] == "observation" and "finite" in answer["error"]


BAD_ACT = [
    ({"observation": [0.5] * 12}, "observation"),
    ({"observation": LOAD | {"utilisation": 7.0}}, "observation"),  # outside [0, 3]
    ({"observation": {k: v for k, v in LOAD.items() if k != "queue"}}, "observation.queue"),
    ({"observation": LOAD | {"cpu": 0.5}}, "observation.cpu"),
    ({"observation": [0.5] * 13, "extra": 1}, "extra"),
    ({"observations": [[0.5] * 13, [0.5] * 12]}, "observations[1]"),
    ({"observations": []}, "observations"),
    ({}, "observation"),
    ({"observation": [0.5] * 13, "action_mask": [1, 0, 1]}, "action_mask"),  # this env gives no masks
]


@pytest.mark.parametrize("body,field", BAD_ACT)
async def test_bad_act_requests_get_a_400_naming_the_field(client, body, field):
    response = await client.post("/act", json=body)
    assert response.status == 400, await response.text()
    assert (await response.json())["field"] == field


async def test_unknown_model_or_path_is_a_404_not_a_500(client):
    response = await client.post("/v2/models/other/infer", json=infer_body(np.zeros((1, 13))))
    assert response.status == 404 and (await response.json())["field"] == "model"
    assert (await client.get("/v2/models/autoscaling-dqn/versions/9/ready")).status == 404
    assert (await client.get("/nowhere")).status == 404
    assert (await client.get("/act")).status == 405


async def test_masks_follow_the_exported_convention(artifacts):
    app = create_app(load_policy(artifacts["tictactoe"]))
    async with TestClient(TestServer(app)) as c:
        meta = await (await c.get("/v2/models/tictactoe-dqn")).json()
        assert {"name": "action_mask", "datatype": "BOOL", "shape": [-1, 9]} in meta["inputs"]
        assert "legal" in meta["parameters"]["action_mask"]["convention"]
        board = [0] * app["policy"].parts[0].shape[0]
        for legal in range(9):  # only one legal move: the policy must take it
            mask = [i == legal for i in range(9)]
            answer = await (await c.post("/act", json={"observation": board, "action_mask": mask})).json()
            assert answer == {"action": legal}
        body = infer_body([board], datatype=app["policy"].parts[0].datatype)
        body["inputs"].append({"name": "action_mask", "datatype": "BOOL", "shape": [1, 9], "data": [False] * 9})
        response = await c.post("/v2/models/tictactoe-dqn/infer", json=body)
        assert response.status == 400 and "allows no action" in (await response.json())["error"]


async def test_dict_observations_are_inputs_by_key(artifacts):
    policy = load_policy(artifacts["bdq"])
    app = create_app(policy)
    async with TestClient(TestServer(app)) as c:
        meta = await (await c.get(f"/v2/models/{app['model_name']}")).json()
        assert [i["name"] for i in meta["inputs"]] == [p.name for p in policy.parts] == ["macro", "micro"]
        obs = {p.name: np.clip(np.zeros(p.shape), p._bounds()[0], p._bounds()[1]).tolist() for p in policy.parts}
        answer = await (await c.post("/act", json={"observation": obs})).json()
        assert len(answer["action"]) == 3  # MultiDiscrete([3, tiers, levels])
        response = await c.post("/act", json={"observation": {"macro": obs["macro"]}})
        assert response.status == 400 and (await response.json())["field"] == "observation.micro"


async def test_a_run_directory_is_served_from_its_newest_checkpoint(artifacts):
    from_run, from_artifact = load_policy(artifacts["run"]), load_policy(artifacts["autoscaling"])
    obs = np.random.default_rng(0).random((64, 13)).astype(np.float32)
    np.testing.assert_array_equal(from_run.act(obs), from_artifact.act(obs))


async def test_requests_in_one_loop_iteration_share_one_forward_pass(client):
    batcher = client.app["batcher"]
    policy = client.app["policy"]
    rows = [np.random.default_rng(i).random((1 + i % 3, 13)).astype(np.float32) for i in range(32)]
    before = batcher.forward_passes
    answers = await asyncio.gather(*(batcher.act(r, None) for r in rows))  # all submitted before the loop turns
    assert batcher.forward_passes - before == 1
    for r, a in zip(rows, answers):
        np.testing.assert_array_equal(a, policy.act(r))
    # max_batch splits a large group into several passes, each answer still its own rows
    batcher.max_batch = 16
    before = batcher.forward_passes
    answers = await asyncio.gather(*(batcher.act(r, None) for r in rows))
    assert batcher.forward_passes - before >= math.ceil(sum(len(r) for r in rows) / 16)
    for r, a in zip(rows, answers):
        np.testing.assert_array_equal(a, policy.act(r))


async def test_metrics_count_requests_latency_and_batches(client):
    values = list(LOAD.values())
    await asyncio.gather(*(client.post("/act", json={"observation": values}) for _ in range(20)))
    await client.post("/act", json={"observation": [0.5]})
    text = await (await client.get("/metrics")).text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    model = 'model="autoscaling-dqn"'
    assert samples[f'kuberl_serving_requests_total{{code="200",endpoint="act",{model}}}'] == 20
    assert samples[f'kuberl_serving_requests_total{{code="400",endpoint="act",{model}}}'] == 1
    assert samples[f'kuberl_serving_request_duration_seconds_count{{endpoint="act",{model}}}'] == 21
    assert samples[f'kuberl_serving_decisions_total{{{model}}}'] == 20
    passes = samples[f'kuberl_serving_batch_size_count{{{model}}}']
    assert 1 <= passes <= 20 and samples[f'kuberl_serving_batch_size_sum{{{model}}}'] == 20


def test_bad_input_names_its_field():
    err = BadInput("inputs[0].shape", "wrong")
    assert err.field == "inputs[0].shape" and str(err) == "inputs[0].shape: wrong"

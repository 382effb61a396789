"""`kuberl serve` speaks strict JSON and the protocol's clients: every response parses in a strict parser
(Python's with NaN/Infinity refused, and Node's JSON.parse), Triton's own HTTP client (tritonclient.http)
works with its default binary tensor data and with JSON, and every malformed request (nested too deep,
too large, wrong lengths, non-finite numbers, wrong datatype or shape) gets a 4xx naming what is wrong,
never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kuberl.trainer.serving.export import export
from kuberl.trainer.serving.protocol import HEADER_LENGTH, MAX_BODY_BYTES, MAX_DEPTH
from kuberl.trainer.serving.server import create_app, load_policy
from test_serving import BAD_ACT, BAD_INFER, LOAD, infer_body, make_run, sample_states

EXAMPLES = {  # served name -> (example, what it covers)
    "cartpole": "cartpole-ppo",  # Box observation with infinite bounds
    "autoscaling": "autoscaling-dqn",  # named observation
    "tictactoe": "tictactoe-dqn",  # INT64 observation, BOOL action mask
    "bdq": "autoscaling-bdq",  # Dict observation, MultiDiscrete action
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """name -> (policy path, observation space); "cartpole-run" is served from the run directory
    (manifest built in memory, bounds still floats), the others from exported artifacts."""
    base = tmp_path_factory.mktemp("protocol")
    out = {}
    for name, example in EXAMPLES.items():
        _, env = make_run(example, base / name)
        out[name] = (export(base / name), env.observation_space)
    out["cartpole-run"] = (base / "cartpole", out["cartpole"][1])
    return out


def states(policy, space, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n observations from the space, by input name, in each input's datatype."""
    raw = sample_states(_Sampler(space), n, seed)
    parts = raw if isinstance(raw, dict) else {"observation": raw}
    return {p.name: np.asarray(parts[p.name], np.float32 if p.datatype == "FP32" else np.int64)
            for p in policy.parts}


class _Sampler:  # sample_states takes an env
    def __init__(self, space):
        self.observation_space = space


def strict_loads(text: str | bytes):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def binary_body(inputs: list[tuple[str, str, np.ndarray]], **extra) -> tuple[bytes, dict[str, str]]:
    """A request as the binary tensor data extension frames it: JSON header, then each tensor's bytes."""
    header = {"inputs": [{"name": n, "datatype": d, "shape": list(a.shape),
                          "parameters": {"binary_data_size": a.nbytes}} for n, d, a in inputs], **extra}
    text = json.dumps(header).encode()
    return text + b"".join(a.tobytes() for _, _, a in inputs), {HEADER_LENGTH: str(len(text))}


# ---- every response is strict JSON -------------------------------------------------------------------


async def _exchange(c: TestClient, policy, space) -> list[tuple[str, int, bytes]]:
    """(what, status, JSON text) for every endpoint, good and bad requests, of one served policy."""
    name = c.app["model_name"]
    version = str(policy.manifest["checkpoint"]["iteration"])
    obs = states(policy, space, 3)
    good = {"inputs": [{"name": k, "datatype": p.datatype, "shape": list(obs[k].shape), "data": obs[k].tolist()}
                       for k, p in zip(obs, policy.parts)]}
    act_obs = [{k: v[i].tolist() for k, v in obs.items()} for i in range(3)]
    if len(policy.parts) == 1:
        act_obs = [row["observation"] for row in act_obs]
    binary, headers = binary_body([(k, p.datatype, obs[k]) for k, p in zip(obs, policy.parts)],
                                  parameters={"binary_data_output": True})
    requests = [("GET", path, {}) for path in (
        "/v2", "/v2/health/live", "/v2/health/ready", f"/v2/models/{name}", f"/v2/models/{name}/versions/{version}",
        f"/v2/models/{name}/ready", f"/v2/models/{name}/versions/{version}/ready", "/v2/models/nope",
        f"/v2/models/{name}/versions/999/ready", "/nowhere", "/act")]
    infer = f"/v2/models/{name}/infer"
    requests += [("POST", infer, {"json": good}), ("POST", infer, {"data": binary, "headers": headers}),
                 ("POST", "/act", {"json": {"observations": act_obs}}),
                 ("POST", infer, {"data": b"[" * 100_000}), ("POST", "/act", {"data": b'{"observation": NaN}'}),
                 ("POST", infer, {"json": good | {"id": 7}}), ("POST", infer, {"data": b"[1, 2]"}),
                 ("POST", infer, {"data": binary, "headers": {HEADER_LENGTH: "-3"}})]
    if name == "autoscaling-dqn":
        requests += [("POST", infer, {"json": body}) for body, _, _ in BAD_INFER]
        requests += [("POST", "/act", {"json": body}) for body, _ in BAD_ACT]
    answers = []
    for method, path, kwargs in requests:
        response = await c.request(method, path, **kwargs)
        raw = await response.read()
        header_length = response.headers.get(HEADER_LENGTH)
        assert response.content_type == ("application/octet-stream" if header_length else "application/json"), path
        answers.append((f"{method} {path}", response.status, raw[: int(header_length)] if header_length else raw))
    return answers


async def test_every_response_is_strict_json(served, tmp_path):
    answers = []
    for name, (path, space) in served.items():
        policy = load_policy(path)
        async with TestClient(TestServer(create_app(policy))) as c:
            exchanged = await _exchange(c, policy, space)
        assert {status for _, status, _ in exchanged} >= {200, 400, 404, 405}, name
        answers += exchanged
    for what, status, text in answers:
        strict_loads(text)  # raises on NaN, Infinity, -Infinity
        assert status < 500, (what, text)

    # Infinite bounds travel as the strings "Infinity" / "-Infinity", in memory as on disk.
    for name in ("cartpole", "cartpole-run"):
        policy = load_policy(served[name][0])
        async with TestClient(TestServer(create_app(policy))) as c:
            meta = strict_loads(await (await c.get("/v2/models/cartpole-ppo")).read())
        box = meta["parameters"]["observation"]
        assert box["high"][1] == "Infinity" and box["low"][3] == "-Infinity", name
        np.testing.assert_array_equal(np.asarray(box["high"], np.float64).astype(np.float32), served[name][1].high)

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: Python's strict parser checked every response, JavaScript's did not")
    bodies = tmp_path / "bodies.json"
    # The last one is what model metadata printed before: JSON.parse must refuse it, or this proves nothing.
    bodies.write_text(json.dumps([text.decode() for _, _, text in answers] + ['{"low": [-Infinity]}']))
    script = ("const bodies = JSON.parse(require('fs').readFileSync(process.argv[1], 'utf8'));"
              "const bad = []; bodies.forEach((b, i) => { try { JSON.parse(b) } catch (e) { bad.push(i) } });"
              "console.log(JSON.stringify(bad));")
    proc = await asyncio.create_subprocess_exec(node, "-e", script, str(bodies), stdout=asyncio.subprocess.PIPE)
    stdout, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0
    bad = json.loads(stdout)
    assert bad == [len(answers)], [answers[i] for i in bad if i < len(answers)]


# ---- bad requests: a 4xx naming what is wrong, never a 500 -------------------------------------------


@pytest.fixture
async def client(served):
    async with TestClient(TestServer(create_app(load_policy(served["autoscaling"][0])))) as c:
        yield c


INFER = "/v2/models/autoscaling-dqn/infer"
OBS = np.array([list(LOAD.values())], np.float32)
HALF = json.dumps(infer_body(np.full((1, 13), 0.5)))  # a valid request whose first "0.5" the cases replace


def _binary(**changes) -> tuple[bytes, dict[str, str]]:
    """The autoscaling observation as binary data, then `changes` to the header, length or bytes."""
    body, headers = binary_body([("observation", "FP32", OBS)])
    header = json.loads(body[: int(headers[HEADER_LENGTH])])
    header["inputs"][0].update(changes.get("input", {}))
    text = json.dumps(header).encode()
    data = changes.get("data", OBS.tobytes())
    return text + data, {HEADER_LENGTH: changes.get("length", str(len(text)))}


BAD_REQUESTS = [  # (id, path, body, headers, status, field, words in the message)
    ("deep", INFER, b"[" * 100_000 + b"]" * 100_000, {}, 400, "body", ["100000 levels", f"at most {MAX_DEPTH}"]),
    ("deep-act", "/act", b'{"observation": ' + b"[" * 40 + b"]" * 40 + b"}", {}, 400, "body", ["41 levels"]),
    ("nan", "/act", json.dumps({"observation": [float("nan")] * 13}).encode(), {}, 400, "body",
     ["NaN at byte 17", "finite"]),
    ("infinity", INFER, HALF.replace("0.5", "-Infinity", 1).encode(), {}, 400, "body",
     ["-Infinity", "finite"]),
    ("overflow", "/act", json.dumps({"observation": [0.5] * 13}).replace("0.5", "1e999", 1).encode(), {}, 400,
     "observation", ["inf", "finite"]),  # a JSON number too large for a float
    ("fp32-overflow", INFER, HALF.replace("0.5", "1e39", 1).encode(), {}, 400,
     "inputs.observation", ["finite"]),  # finite as float64, infinite as float32
    ("id", INFER, json.dumps(infer_body(OBS) | {"id": 1}).encode(), {}, 400, "id", ["string"]),
    ("name", INFER, json.dumps({"inputs": [{"name": ["x"], "datatype": "FP32", "shape": [1, 13],
                                            "data": [0.5] * 13}]}).encode(), {}, 400, "inputs[0].name", ["['x']"]),
    ("digits", "/act", b'{"observation": [' + b"9" * 5000 + b"]}", {}, 400, "body", ["not JSON"]),
    ("fp64", INFER, json.dumps(infer_body(OBS, datatype="FP64")).encode(), {}, 400, "inputs[0].datatype", ["FP32"]),
    ("binary-length-text", INFER, *_binary(length="12a"), 400, HEADER_LENGTH, ["'12a'"]),
    ("binary-length-negative", INFER, *_binary(length="-1"), 400, HEADER_LENGTH, ["'-1'"]),
    ("binary-length-beyond", INFER, *_binary(length="100000"), 400, HEADER_LENGTH, ["100000", "bytes"]),
    ("binary-length-short", INFER, *_binary(length="20"), 400, "body", ["not JSON"]),
    ("binary-size-shape", INFER, *_binary(input={"parameters": {"binary_data_size": 48}}), 400,
     "inputs[0].parameters.binary_data_size", ["48 bytes", "[1, 13]", "52 bytes"]),
    ("binary-size-text", INFER, *_binary(input={"parameters": {"binary_data_size": "52"}}), 400,
     "inputs[0].parameters.binary_data_size", ["non-negative integer"]),
    ("binary-missing-bytes", INFER, *_binary(data=OBS.tobytes()[:40]), 400,
     "inputs[0].parameters.binary_data_size", ["only 40 bytes"]),
    ("binary-extra-bytes", INFER, *_binary(data=OBS.tobytes() + b"\0" * 8), 400, "body", ["8 bytes", "no input"]),
    ("binary-and-data", INFER, *_binary(input={"data": [0.5] * 13}), 400, "inputs[0].data", ["once"]),
    ("binary-nan", INFER, *_binary(data=np.full((1, 13), np.nan, np.float32).tobytes()), 400,
     "inputs.observation", ["finite"]),
    ("binary-shape", INFER, *_binary(input={"shape": [13, 1]}), 400, "inputs[0].shape", ["[-1, 13]"]),
    ("binary-datatype", INFER, *_binary(input={"datatype": "INT32"}), 400, "inputs[0].datatype", ["FP32"]),
    ("shared-memory", INFER, *_binary(input={"parameters": {"shared_memory_region": "r"}}), 400,
     "inputs[0].parameters.shared_memory_region", ["not supported"]),
    ("no-header", INFER, json.dumps({"inputs": [{"name": "observation", "datatype": "FP32", "shape": [1, 13],
                                                 "parameters": {"binary_data_size": 52}}]}).encode(), {}, 400,
     "inputs[0].parameters.binary_data_size", [HEADER_LENGTH]),
    ("binary-output-flag", INFER, json.dumps(infer_body(OBS) | {"parameters": {"binary_data_output": 1}}).encode(),
     {}, 400, "parameters.binary_data_output", ["true or false"]),
    ("classification", INFER, json.dumps(infer_body(OBS) | {"outputs": [{"name": "action", "parameters": {
        "classification": 2}}]}).encode(), {}, 400, "outputs[0].parameters.classification", ["not supported"]),
    ("too-large", "/act", b" " * (MAX_BODY_BYTES + 1), {}, 413, "body", [str(MAX_BODY_BYTES)]),
]


@pytest.mark.parametrize("path,body,headers,status,field,words", [b[1:] for b in BAD_REQUESTS],
                         ids=[b[0] for b in BAD_REQUESTS])
async def test_a_bad_request_gets_a_4xx_naming_what_is_wrong(client, path, body, headers, status, field, words):
    response = await client.post(path, data=body, headers=headers)
    answer = strict_loads(await response.read())
    assert response.status == status, answer
    assert answer["field"] == field and answer["error"].startswith(f"{field}: "), answer
    for word in words:
        assert word in answer["error"], answer


async def test_a_chunked_body_over_the_limit_is_a_413(served):
    app = create_app(load_policy(served["autoscaling"][0]), max_body_bytes=4096)

    async def chunks():  # no Content-Length: the limit is found while reading
        for _ in range(8):
            yield b" " * 1024

    async with TestClient(TestServer(app)) as c:
        response = await c.post("/act", data=chunks())
        assert "Content-Length" not in response.request_info.headers
        answer = strict_loads(await response.read())
        assert response.status == 413 and answer["field"] == "body" and "4096 bytes" in answer["error"]
        # a body under the limit is read and parsed
        nested = {"observation": [[[[[[list(LOAD.values())]]]]]]}  # deep but within MAX_DEPTH: the shape is wrong
        response = await c.post("/act", json=nested)
        assert response.status == 400 and (await response.json())["field"] == "observation"


async def test_a_bug_is_a_json_500_not_a_stack_trace(client, caplog, monkeypatch):
    def broken(obs, mask):  # a fault injected where no request can reach: the forward pass
        raise RuntimeError("forward pass broke")

    monkeypatch.setattr(client.app["policy"], "act", broken)
    response = await client.post("/act", json={"observation": LOAD})
    answer = strict_loads(await response.read())
    assert response.status == 500 and answer["field"] == "server" and "RuntimeError" in answer["error"]
    assert "forward pass broke" in caplog.text


# ---- the binary tensor data extension, framed by hand ------------------------------------------------


async def test_binary_tensor_data_in_and_out(client):
    obs = np.tile(OBS, (4, 1))
    obs[1, 0] = 0.1  # little load in one row
    expected = client.app["policy"].act(obs)
    body, headers = binary_body([("observation", "FP32", obs)], id="b-1",
                                outputs=[{"name": "action", "parameters": {"binary_data": True}}])
    response = await client.post(INFER, data=body, headers=headers)
    raw = await response.read()
    assert response.status == 200, raw
    n = int(response.headers[HEADER_LENGTH])
    header = strict_loads(raw[:n])
    (out,) = header["outputs"]
    assert header["id"] == "b-1" and out == {"name": "action", "datatype": "INT64", "shape": [4],
                                             "parameters": {"binary_data_size": 32}}
    np.testing.assert_array_equal(np.frombuffer(raw[n:], "<i8"), expected)

    # binary in, JSON out: binary_data false on the output overrides binary_data_output
    body, headers = binary_body([("observation", "FP32", obs)], parameters={"binary_data_output": True},
                                outputs=[{"name": "action", "parameters": {"binary_data": False}}])
    response = await client.post(INFER, data=body, headers=headers)
    assert HEADER_LENGTH not in response.headers
    assert (await response.json())["outputs"][0]["data"] == expected.tolist()


# ---- Triton's own HTTP client ------------------------------------------------------------------------


@contextlib.contextmanager
def serving_in_a_thread(policy):
    """The app on a real port with its event loop in a thread: tritonclient.http's calls block."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(policy), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def _triton_inputs(httpclient, policy, obs: dict[str, np.ndarray], binary: bool, mask=None):
    inputs = []
    for part in policy.parts:
        tensor = httpclient.InferInput(part.name, list(obs[part.name].shape), part.datatype)
        inputs.append(tensor.set_data_from_numpy(obs[part.name], binary_data=binary))
    if mask is not None:
        inputs.append(httpclient.InferInput("action_mask", list(mask.shape), "BOOL")
                      .set_data_from_numpy(mask, binary_data=binary))
    return inputs


@pytest.mark.parametrize("name", ["autoscaling", "tictactoe", "bdq", "cartpole-run"])
def test_tritonclient_http_with_its_defaults_and_with_json(served, name):
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra")
    policy = load_policy(served[name][0])
    obs = states(policy, served[name][1], 16, seed=3)
    mask = None
    if policy.mask_size:
        mask = np.random.default_rng(4).random((16, policy.mask_size)) < 0.5
        mask[:, 0] = True
    encoded = policy.encode(obs, 16)
    expected = policy.act(encoded, mask)
    with serving_in_a_thread(policy) as url:
        client = httpclient.InferenceServerClient(url=url)
        try:
            model, version = policy.name, str(policy.manifest["checkpoint"]["iteration"])
            assert client.is_server_live() and client.is_server_ready()
            assert client.is_model_ready(model) and client.is_model_ready(model, version)
            assert not client.is_model_ready("nope")
            assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
            meta = client.get_model_metadata(model, version)
            assert meta["inputs"] == policy.inputs() and meta["outputs"] == policy.outputs()

            # The client's defaults: binary data in, and (no outputs named) binary_data_output out.
            result = client.infer(model, _triton_inputs(httpclient, policy, obs, binary=True, mask=mask))
            out = result.get_output("action")
            assert "data" not in out and out["parameters"]["binary_data_size"] == expected.nbytes
            np.testing.assert_array_equal(result.as_numpy("action"), expected)

            # JSON both ways: binary_data=False on the inputs and on the requested output.
            result = client.infer(model, _triton_inputs(httpclient, policy, obs, binary=False, mask=mask),
                                  outputs=[httpclient.InferRequestedOutput("action", binary_data=False)],
                                  request_id="json-1", model_version=version)
            assert result.get_response()["id"] == "json-1" and "data" in result.get_output("action")
            np.testing.assert_array_equal(result.as_numpy("action"), expected)
        finally:
            client.close()


def test_tritonclient_http_reports_a_bad_request(served):
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra")
    from tritonclient.utils import InferenceServerException

    policy = load_policy(served["autoscaling"][0])
    with serving_in_a_thread(policy) as url:
        client = httpclient.InferenceServerClient(url=url)
        try:
            bad = httpclient.InferInput("observation", [1, 13], "FP32")
            bad.set_data_from_numpy(np.full((1, 13), 9.0, np.float32))  # outside the observation space
            with pytest.raises(InferenceServerException) as err:
                client.infer(policy.name, [bad])
            assert err.value.status() == "400" and "outside the observation space" in err.value.message()
            with pytest.raises(InferenceServerException) as err:
                client.get_model_metadata("nope")
            assert err.value.status() == "404" and "'nope' is not served" in err.value.message()
        finally:
            client.close()


async def test_tritonclient_http_aio(served):
    aio = pytest.importorskip("tritonclient.http.aio", reason="tritonclient[http] is in the dev extra")
    import tritonclient.http as httpclient

    policy = load_policy(served["tictactoe"][0])
    obs = states(policy, served["tictactoe"][1], 8, seed=5)
    expected = policy.act(policy.encode(obs, 8))
    async with TestServer(create_app(policy)) as server:
        client = aio.InferenceServerClient(url=f"{server.host}:{server.port}")
        try:
            assert await client.is_model_ready(policy.name)
            result = await client.infer(policy.name, _triton_inputs(httpclient, policy, obs, binary=True))
            np.testing.assert_array_equal(result.as_numpy("action"), expected)
        finally:
            await client.close()

"""`kuberl serve`: an exported policy over HTTP — the Open Inference Protocol (KServe v2 REST) and `/act`.

aiohttp (already installed with ray[default]) runs one event loop; every request that arrives in the
same loop iteration joins one numpy forward pass (`Batcher`), so concurrent clients are batched without
a waiting window. Requests are checked against the exported spaces: a bad one gets a 400 naming the
field. `/metrics` serves request counts and latency histograms (prometheus_client).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from kuberl.trainer.serving.artifact import MASK_INPUT, BadInput, ExportedPolicy
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

#: OIP datatype -> the numpy kinds its JSON data may hold
DATATYPES = {"FP32": "fiu", "FP64": "fiu", "INT64": "iu", "INT32": "iu", "BOOL": "biu"}
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServingMetrics:
    """The server's Prometheus metrics, in a registry of its own (one per server)."""

    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        self.requests = Counter("kuberl_serving_requests_total", "HTTP requests answered, by endpoint and status code",
                                ["model", "endpoint", "code"], registry=self.registry)
        self.latency = Histogram("kuberl_serving_request_duration_seconds",
                                 "Time from a request's arrival to its answer, by endpoint",
                                 ["model", "endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("kuberl_serving_decisions_total", "Actions returned (one per observation)",
                                 ["model"], registry=self.registry).labels(model)
        self.batch_size = Histogram("kuberl_serving_batch_size", "Observations per forward pass",
                                    ["model"], buckets=BATCH_BUCKETS, registry=self.registry).labels(model)
        self.forward = Histogram("kuberl_serving_forward_duration_seconds", "Time of one batched forward pass",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=self.registry).labels(model)
        self.model = model
        self._children: dict[tuple, Any] = {}

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        key = (endpoint, code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(self.model, endpoint, str(code)),
                                              self.latency.labels(self.model, endpoint))
        children[0].inc()
        children[1].observe(seconds)


class Batcher:
    """Joins the observations of every request submitted in one event-loop iteration into one forward
    pass (at most `max_batch` rows each), then hands each request its own rows of the answer."""

    def __init__(self, policy: ExportedPolicy, metrics: ServingMetrics, max_batch: int = 256):
        self.policy, self.metrics, self.max_batch = policy, metrics, max_batch
        self.pending: list[tuple[np.ndarray, np.ndarray | None, asyncio.Future]] = []
        self.forward_passes = 0

    def submit(self, obs: np.ndarray, mask: np.ndarray | None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending.append((obs, mask, future))
        return future

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        start = 0
        while start < len(pending):
            rows, end = 0, start
            while end < len(pending) and (end == start or rows + len(pending[end][0]) <= self.max_batch):
                rows += len(pending[end][0])
                end += 1
            try:
                self._forward(pending[start:end])
            except Exception as err:  # noqa: BLE001 — a bug must fail its requests (a 500), not leave them waiting
                for _, _, future in pending[start:end]:
                    if not future.done():
                        future.set_exception(err)
            start = end

    def _forward(self, group) -> None:
        t0 = time.perf_counter()
        obs = group[0][0] if len(group) == 1 else np.concatenate([g[0] for g in group])
        mask = None
        if any(g[1] is not None for g in group):
            mask = np.concatenate([g[1] if g[1] is not None else np.ones((len(g[0]), self.policy.mask_size), bool)
                                   for g in group])
        actions = self.policy.act(obs, mask)
        self.forward_passes += 1
        self.metrics.batch_size.observe(len(obs))
        self.metrics.decisions.inc(len(obs))
        self.metrics.forward.observe(time.perf_counter() - t0)
        start = 0
        for g_obs, _, future in group:
            if not future.done():  # a client that went away cancelled its future
                future.set_result(actions[start : start + len(g_obs)])
            start += len(g_obs)

    async def act(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return await self.submit(obs, mask)


# ---- request parsing (every error names its field) ---------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadInput("body", f"is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise BadInput("body", f"must be a JSON object, got {type(body).__name__}")
    return body


def _shape(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in value):
        raise BadInput(field, f"must be a list of non-negative integers, got {value!r}")
    return value


def parse_infer(policy: ExportedPolicy, body: dict[str, Any]) -> tuple[int, dict[str, np.ndarray], np.ndarray | None]:
    """An OIP infer request -> (batch, observation parts, mask); checks names, shapes and datatypes."""
    expected = {spec["name"]: spec for spec in policy.inputs()}
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadInput("inputs", f"must be a non-empty list of tensors; this model's inputs: {', '.join(expected)}")
    arrays: dict[str, np.ndarray] = {}
    batch = None
    for i, tensor in enumerate(inputs):
        field = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise BadInput(field, "must be an object with name, shape, datatype and data")
        name = tensor.get("name")
        if name not in expected:
            raise BadInput(f"{field}.name", f"{name!r} is not an input of this model; its inputs: {', '.join(expected)}")
        if name in arrays:
            raise BadInput(f"{field}.name", f"{name!r} is given twice")
        want = expected[name]
        shape = _shape(tensor.get("shape"), f"{field}.shape")
        datatype = tensor.get("datatype")
        if datatype != want["datatype"]:
            raise BadInput(f"{field}.datatype", f"{datatype!r} does not match the model's {want['datatype']} "
                                                f"for {name!r}")
        if "data" not in tensor:
            raise BadInput(f"{field}.data", "is missing")
        data = _numbers(tensor["data"], datatype, f"{field}.data")
        if data.size != math.prod(shape):
            raise BadInput(f"{field}.data", f"holds {data.size} values; shape {shape} needs {math.prod(shape)}")
        if len(shape) != len(want["shape"]) or any(w != -1 and w != s for w, s in zip(want["shape"], shape)):
            raise BadInput(f"{field}.shape", f"{shape} does not match the model's {want['shape']} for {name!r} "
                                             "(-1: any batch size)")
        if batch is not None and shape[0] != batch:
            raise BadInput(f"{field}.shape", f"batch size {shape[0]} differs from the other inputs' {batch}")
        batch = shape[0]
        arrays[name] = data.reshape(shape)
    missing = [n for n in expected if n != MASK_INPUT and n not in arrays]
    if missing:
        raise BadInput("inputs", f"missing input(s) {', '.join(missing)}")
    if batch == 0:
        raise BadInput("inputs[0].shape", "batch size 0: send at least one observation")
    outputs = body.get("outputs")
    if outputs is not None:
        names = [o.get("name") if isinstance(o, dict) else o for o in outputs] if isinstance(outputs, list) else None
        if names is None or any(n != "action" for n in names):
            raise BadInput("outputs", f"this model has one output, 'action'; asked for {outputs!r}")
    mask = policy.check_mask(arrays.pop(MASK_INPUT), batch, MASK_INPUT) if MASK_INPUT in arrays else None
    return batch, arrays, mask


def _numbers(data: Any, datatype: str, field: str) -> np.ndarray:
    if not isinstance(data, list):
        raise BadInput(field, f"must be a list of numbers, got {type(data).__name__}")
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        raise BadInput(field, "is not a rectangular list of numbers") from None
    if arr.dtype == object or arr.dtype.kind not in DATATYPES[datatype]:
        raise BadInput(field, f"values of type {arr.dtype} (e.g. {arr.ravel()[:1].tolist()}) are not {datatype}")
    if datatype != "BOOL" and arr.dtype.kind == "b":
        raise BadInput(field, f"booleans are not {datatype}")
    return arr


def parse_act(policy: ExportedPolicy, body: dict[str, Any]) -> tuple[int, dict[str, Any], Any, bool]:
    """A /act request -> (batch, observation parts, mask, batched?)."""
    if ("observation" in body) == ("observations" in body):
        raise BadInput("observation", "give either observation (one) or observations (a list)")
    unknown = set(body) - {"observation", "observations", "action_mask"}
    if unknown:
        raise BadInput(min(unknown), "unknown field; /act takes observation or observations, and action_mask")
    batched = "observations" in body
    field = "observations" if batched else "observation"
    rows = body[field] if batched else [body[field]]
    if not isinstance(rows, list) or not rows:
        raise BadInput(field, "must be a non-empty list of observations")
    parts: dict[str, list] = {p.name: [] for p in policy.parts}
    for i, row in enumerate(rows):
        row_field = f"{field}[{i}]" if batched else field
        for name, value in _split(policy, row, row_field).items():
            parts[name].append(value)
    for name, values in parts.items():  # ragged rows: name the first one that differs
        shapes = [np.shape(v) for v in values]
        if len(set(shapes)) > 1:
            i = next(i for i, s in enumerate(shapes) if s != shapes[0])
            raise BadInput(f"{field}[{i}]" + ("" if len(policy.parts) == 1 else f".{name}"),
                           f"shape {list(shapes[i])} differs from the first observation's {list(shapes[0])}")
    mask = body.get("action_mask")
    if mask is not None and not batched:
        mask = [mask]
    return len(rows), parts, mask, batched


def _split(policy: ExportedPolicy, row: Any, field: str) -> dict[str, Any]:
    """One observation -> {part name: value}: a list, a dict by observation name, or a dict by Dict key."""
    if len(policy.parts) > 1:
        if not isinstance(row, dict):
            raise BadInput(field, f"must be an object with keys {', '.join(p.name for p in policy.parts)}")
        extra = set(row) - {p.name for p in policy.parts}
        if extra:
            raise BadInput(f"{field}.{min(extra)}", "is not a key of the observation space")
        missing = [p.name for p in policy.parts if p.name not in row]
        if missing:
            raise BadInput(f"{field}.{missing[0]}", "is missing")
        return {p.name: row[p.name] for p in policy.parts}
    part = policy.parts[0]
    if isinstance(row, dict):
        names = part.space.get("names")
        if not names:
            raise BadInput(field, "must be a list (this observation space has no named dimensions)")
        extra = set(row) - set(names)
        if extra:
            raise BadInput(f"{field}.{min(extra)}", f"is not an observation name; names: {', '.join(names)}")
        missing = [n for n in names if n not in row]
        if missing:
            raise BadInput(f"{field}.{missing[0]}", "is missing")
        return {part.name: [row[n] for n in names]}
    return {part.name: row}


# ---- the application -------------------------------------------------------------------------------


def create_app(policy: ExportedPolicy, model_name: str | None = None, max_batch: int = 256) -> web.Application:
    name = model_name or policy.name
    version = str(policy.manifest["checkpoint"]["iteration"])
    metrics = ServingMetrics(name)
    batcher = Batcher(policy, metrics, max_batch)
    model_metadata = {
        "name": name, "versions": [version], "platform": "kuberl-numpy",
        "inputs": policy.inputs(), "outputs": policy.outputs(),
        "parameters": {k: policy.manifest[k] for k in ("algorithm", "observation", "action", "action_mask",
                                                        "checkpoint")},
    }

    def error(status: int, field: str, message: str) -> web.Response:
        return web.json_response({"error": f"{field}: {message}", "field": field}, status=status)

    def check_model(request: web.Request) -> web.Response | None:
        req_name, req_version = request.match_info["model"], request.match_info.get("version")
        if req_name != name:
            return error(404, "model", f"{req_name!r} is not served here; this server serves {name!r}")
        if req_version is not None and req_version != version:
            return error(404, "version", f"{req_version!r} is not served; version {version!r} is")
        return None

    async def infer(request: web.Request) -> web.Response:
        if (missing := check_model(request)) is not None:
            return missing
        body = await _json_body(request)
        batch, parts, mask = parse_infer(policy, body)
        obs = policy.encode(parts, batch, prefix="inputs.")
        actions = await batcher.act(obs, mask)
        out = policy.outputs()[0]
        answer = {"model_name": name, "model_version": version,
                  "outputs": [{"name": "action", "datatype": out["datatype"], "shape": [batch, *actions.shape[1:]],
                               "data": actions.ravel().tolist()}]}
        if "id" in body:
            answer["id"] = body["id"]
        return web.Response(text=json.dumps(answer), content_type="application/json")

    async def act(request: web.Request) -> web.Response:
        body = await _json_body(request)
        batch, parts, mask_value, batched = parse_act(policy, body)
        field = "observations" if batched else "observation"
        if len(policy.parts) == 1:  # name the request's own field, not the part
            obs = policy.parts[0].encode(parts[policy.parts[0].name], batch, field)
        else:
            obs = policy.encode(parts, batch, prefix=field + ".")
        mask = policy.check_mask(mask_value, batch, "action_mask") if mask_value is not None else None
        actions = (await batcher.act(obs, mask)).tolist()
        return web.Response(text=json.dumps({"actions": actions} if batched else {"action": actions[0]}),
                            content_type="application/json")

    async def server_metadata(request: web.Request) -> web.Response:
        return web.json_response({"name": "kuberl", "version": _version(), "extensions": []})

    async def live(request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def model_ready(request: web.Request) -> web.Response:
        if (missing := check_model(request)) is not None:
            return missing
        return web.json_response({"name": name, "ready": True})

    async def metadata(request: web.Request) -> web.Response:
        if (missing := check_model(request)) is not None:
            return missing
        return web.json_response(model_metadata)

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    endpoints: dict[Any, str] = {}

    @web.middleware
    async def measured(request: web.Request, handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        try:
            response = await handler(request)
        except BadInput as err:
            response = error(400, err.field, str(err).split(": ", 1)[1])
        except web.HTTPException as err:  # 404 / 405 from the router
            response = error(err.status, "path", f"{request.method} {request.path}: {err.reason}")
        endpoint = endpoints.get(handler, "other")
        metrics.observe(endpoint, response.status, time.perf_counter() - t0)
        return response

    app = web.Application(middlewares=[measured], client_max_size=16 * 1024 * 1024)
    routes = [
        ("GET", "/v2", server_metadata, "server_metadata"),
        ("GET", "/v2/health/live", live, "live"),
        ("GET", "/v2/health/ready", ready, "ready"),
        ("GET", "/v2/models/{model}", metadata, "model_metadata"),
        ("GET", "/v2/models/{model}/versions/{version}", metadata, "model_metadata"),
        ("GET", "/v2/models/{model}/ready", model_ready, "model_ready"),
        ("GET", "/v2/models/{model}/versions/{version}/ready", model_ready, "model_ready"),
        ("POST", "/v2/models/{model}/infer", infer, "infer"),
        ("POST", "/v2/models/{model}/versions/{version}/infer", infer, "infer"),
        ("POST", "/act", act, "act"),
        ("GET", "/metrics", prometheus, "metrics"),
    ]
    for method, path, handler, endpoint in routes:
        app.router.add_route(method, path, handler)
        endpoints[handler] = endpoint
    app["policy"], app["batcher"], app["metrics"], app["model_name"] = policy, batcher, metrics, name
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kuberl")
    except PackageNotFoundError:
        return "unknown"


def load_policy(path: str | Path) -> ExportedPolicy:
    """An artifact directory (or its policy.json) as is; a run directory exported from its newest checkpoint."""
    path = Path(path)
    if (path / "policy.json").is_file() or path.name == "policy.json":
        return ExportedPolicy.load(path)
    if (path / "job.yaml").is_file():
        from kuberl.trainer.serving.export import build_artifact

        manifest, weights = build_artifact(path)
        return ExportedPolicy(manifest, weights, path)
    raise FileNotFoundError(f"{path} is neither an exported policy (policy.json) nor a run directory (job.yaml)")


def serve(path: str | Path, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          max_batch: int = 256, metrics_port: int | None = None) -> None:
    policy = load_policy(path)
    app = create_app(policy, model_name, max_batch)
    if metrics_port:
        # /metrics alone on a port of its own (a PodMonitor's `metrics` port); the main port serves it too.
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=host, registry=app["metrics"].registry)
    log.info("serving %s (%s, checkpoint %s) on http://%s:%d", app["model_name"], policy.manifest["algorithm"],
             policy.manifest["checkpoint"]["file"], host, port)
    web.run_app(app, host=host, port=port, access_log=None, print=None)

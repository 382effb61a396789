"""`kuberl serve`: an exported policy over HTTP — the Open Inference Protocol (KServe v2 REST) and `/act`.

aiohttp (already installed with ray[default]) runs one event loop; every request that arrives in the
same loop iteration joins one numpy forward pass (`Batcher`), so concurrent clients are batched without
a waiting window. Requests are parsed by protocol.py and checked against the exported spaces: a bad one
gets a 4xx in JSON naming the field, never a 500. `/metrics` serves request counts and latency histograms
(prometheus_client).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kuberl.trainer.serving.artifact import BadInput, ExportedPolicy
from kuberl.trainer.serving.protocol import (
    HEADER_LENGTH,
    MAX_BODY_BYTES,
    NotServed,
    dumps,
    infer_response,
    parse_act,
    parse_infer,
    parse_json,
    read_body,
    split_binary,
)

log = logging.getLogger(__name__)

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


# ---- the application -------------------------------------------------------------------------------


def error_response(status: int, field: str, message: str) -> web.Response:
    return web.json_response({"error": f"{field}: {message}", "field": field}, status=status, dumps=dumps)


class Endpoints:
    """The handlers of one served policy: the protocol's metadata, health and infer, and `/act`."""

    def __init__(self, policy: ExportedPolicy, name: str, batcher: Batcher, max_body_bytes: int):
        self.policy, self.name, self.batcher, self.max_body_bytes = policy, name, batcher, max_body_bytes
        self.version = str(policy.manifest["checkpoint"]["iteration"])
        # Serialised once, strictly: a manifest that is not strict JSON fails at startup, not per request.
        self.metadata_json = dumps({
            "name": name, "versions": [self.version], "platform": "kuberl-numpy",
            "inputs": policy.inputs(), "outputs": policy.outputs(),
            "parameters": {k: policy.manifest[k] for k in ("algorithm", "observation", "action", "action_mask",
                                                            "checkpoint")},
        })

    def check_model(self, request: web.Request) -> None:
        req_name, req_version = request.match_info["model"], request.match_info.get("version")
        if req_name != self.name:
            raise NotServed("model", f"{req_name!r} is not served here; this server serves {self.name!r}")
        if req_version is not None and req_version != self.version:
            raise NotServed("version", f"{req_version!r} is not served; version {self.version!r} is")

    async def infer(self, request: web.Request) -> web.Response:
        self.check_model(request)
        raw = await read_body(request, self.max_body_bytes)
        header, binary = split_binary(raw, request.headers.get(HEADER_LENGTH))
        body = parse_json(header)
        infer = parse_infer(self.policy, body, binary)
        obs = self.policy.encode(infer.inputs, infer.batch, prefix="inputs.")
        actions = await self.batcher.act(obs, infer.mask)
        return infer_response({"model_name": self.name, "model_version": self.version}, infer, actions,
                              self.policy.outputs()[0]["datatype"], body.get("id"))

    async def act(self, request: web.Request) -> web.Response:
        body = parse_json(await read_body(request, self.max_body_bytes))
        batch, parts, mask_value, batched = parse_act(self.policy, body)
        field = "observations" if batched else "observation"
        if len(self.policy.parts) == 1:  # name the request's own field, not the part
            obs = self.policy.parts[0].encode(parts[self.policy.parts[0].name], batch, field)
        else:
            obs = self.policy.encode(parts, batch, prefix=field + ".")
        mask = self.policy.check_mask(mask_value, batch, "action_mask") if mask_value is not None else None
        actions = (await self.batcher.act(obs, mask)).tolist()
        return web.Response(text=dumps({"actions": actions} if batched else {"action": actions[0]}),
                            content_type="application/json")

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "kuberl", "version": _version(), "extensions": ["binary_tensor_data"]},
                                 dumps=dumps)

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True}, dumps=dumps)

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True}, dumps=dumps)

    async def model_ready(self, request: web.Request) -> web.Response:
        self.check_model(request)
        return web.json_response({"name": self.name, "ready": True}, dumps=dumps)

    async def model_metadata(self, request: web.Request) -> web.Response:
        self.check_model(request)
        return web.Response(text=self.metadata_json, content_type="application/json")

    def routes(self) -> list[tuple[str, str, Any, str]]:
        """(method, path, handler, the `endpoint` label of its metrics)."""
        return [
            ("GET", "/v2", self.server_metadata, "server_metadata"),
            ("GET", "/v2/health/live", self.live, "live"),
            ("GET", "/v2/health/ready", self.ready, "ready"),
            ("GET", "/v2/models/{model}", self.model_metadata, "model_metadata"),
            ("GET", "/v2/models/{model}/versions/{version}", self.model_metadata, "model_metadata"),
            ("GET", "/v2/models/{model}/ready", self.model_ready, "model_ready"),
            ("GET", "/v2/models/{model}/versions/{version}/ready", self.model_ready, "model_ready"),
            ("POST", "/v2/models/{model}/infer", self.infer, "infer"),
            ("POST", "/v2/models/{model}/versions/{version}/infer", self.infer, "infer"),
            ("POST", "/act", self.act, "act"),
        ]


def answer_errors(metrics: ServingMetrics, endpoints: dict[Any, str]):
    """Middleware: every error becomes a JSON answer naming its field (a bad request a 4xx, a bug a 500
    that the log explains), and every answer is counted and timed under its endpoint's label."""

    @web.middleware
    async def answered(request: web.Request, handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        try:
            response = await handler(request)
        except BadInput as err:
            response = error_response(err.status, err.field, err.message)
        except web.HTTPException as err:  # 404 / 405 from the router
            response = error_response(err.status, "path", f"{request.method} {request.path}: {err.reason}")
        except Exception as err:  # a bug still answers in JSON; the traceback goes to the log
            log.exception("%s %s failed", request.method, request.path)
            response = error_response(500, "server", f"internal error ({type(err).__name__}); see the server's log")
        metrics.observe(endpoints.get(handler, "other"), response.status, time.perf_counter() - t0)
        return response

    return answered


def create_app(policy: ExportedPolicy, model_name: str | None = None, max_batch: int = 256,
               max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    name = model_name or policy.name
    metrics = ServingMetrics(name)
    batcher = Batcher(policy, metrics, max_batch)
    handlers = Endpoints(policy, name, batcher, max_body_bytes)

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    endpoints: dict[Any, str] = {}
    app = web.Application(middlewares=[answer_errors(metrics, endpoints)], client_max_size=max_body_bytes)
    for method, path, handler, endpoint in [*handlers.routes(), ("GET", "/metrics", prometheus, "metrics")]:
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

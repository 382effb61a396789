"""
Faults the real API server does not produce on demand (a 500, a slow answer, a dropped watch, a watch
whose resourceVersion has expired), from
an HTTPS proxy in front of it: every request goes through to the server unchanged, except those a rule
matches.

    with FaultProxy(plane) as proxy:
        proxy.fail("POST", r"/api/v1/namespaces/ns/pods", status=500, times=3)
        client = kubernetes.config.new_client_from_config(str(proxy.kubeconfig(operator_kubeconfig)))

The proxy serves the API server's own certificate (it names 127.0.0.1), so clients keep verifying
the cluster's CA and keep their tokens: only the address in their kubeconfig changes.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from .common import free_port
from .control_plane import ControlPlane

#: Headers that belong to one connection, never forwarded (RFC 9110, 7.6.1), and the body's framing,
#: which each side of the proxy sets for itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "content-length", "host"}


@dataclass
class Rule:
    """Requests whose method is `method` and whose path fully matches `path` (a regex), and, with `query`,
    whose query string contains it: the next `times` of them (None: all) get the fault."""

    method: str
    path: str
    query: str | None = None
    status: int | None = None       # answer this instead of forwarding
    delay: float = 0.0              # forward after this many seconds
    drop: bool = False              # forward, then cut the connection after the response's headers
    expire: bool = False            # answer a watch with the server's 410 Expired event, forward nothing
    release: threading.Event | None = None  # hold the answer until the test sets this
    times: int | None = 1
    hits: int = 0

    def matches(self, request: web.Request) -> bool:
        return (request.method == self.method.upper() and re.fullmatch(self.path, request.path) is not None
                and (self.query is None or self.query in request.query_string)
                and (self.times is None or self.hits < self.times))


class FaultProxy:
    """The proxy (see the module doc), in a thread with its own event loop. Use as a context manager."""

    def __init__(self, plane: ControlPlane):
        self.plane = plane
        self.port = free_port()
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # ---- rules ---------------------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail(self, method: str, path: str, status: int = 500, times: int | None = 1, query: str | None = None
             ) -> Rule:
        """Answer `status` (with a Kubernetes Status body) instead of the server."""
        return self.add(Rule(method, path, query, status=status, times=times))

    def slow(self, method: str, path: str, seconds: float, times: int | None = 1, query: str | None = None) -> Rule:
        return self.add(Rule(method, path, query, delay=seconds, times=times))

    def drop(self, method: str, path: str, times: int | None = 1, query: str | None = "watch=") -> Rule:
        """Cut the connection once the server's answer began (by default: a watch, mid-stream)."""
        return self.add(Rule(method, path, query, drop=True, times=times))

    def expire(self, method: str, path: str, times: int | None = 1, query: str | None = "watch=",
               release: threading.Event | None = None) -> Rule:
        """Answer a watch as the server does when its resourceVersion is older than the server keeps (etcd
        compacted it): one ERROR event with a 410 Expired Status, then the end of the stream. With
        `release`, the answer waits until the test sets it (what happens meanwhile, this watch misses)."""
        return self.add(Rule(method, path, query, expire=True, times=times, release=release))

    def _take(self, request: web.Request) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(request):
                    rule.hits += 1
                    return rule
        return None

    # ---- clients -------------------------------------------------------------------------------------

    def kubeconfig(self, original: Path, path: Path | None = None) -> Path:
        """A copy of a kubeconfig of this cluster that leads through the proxy."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.server
        path = path or original.with_name(f"{original.stem}-via-proxy.yaml")
        path.write_text(yaml.safe_dump(config))
        return path

    # ---- serving -------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rule = self._take(request)
        if rule is not None and rule.status is not None:
            return web.json_response(status=rule.status, data={
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": rule.status,
                "reason": "InternalError" if rule.status >= 500 else "BadRequest",
                "message": f"injected by the test's fault proxy: {request.method} {request.path}"})
        if rule is not None and rule.release is not None:
            await asyncio.to_thread(rule.release.wait)
        if rule is not None and rule.expire:
            version = request.query.get("resourceVersion", "0")
            event = {"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
                "code": 410, "message": f"too old resource version: {version} (injected by the test's fault proxy)"}}
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
            return response
        if rule is not None and rule.delay:
            await asyncio.sleep(rule.delay)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(request.method, self.plane.server + request.path_qs, headers=headers,
                                         data=await request.read() if request.can_read_body else None) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            if rule is not None and rule.drop:
                assert request.transport is not None
                request.transport.close()
                return response
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):  # either side went away: so does this answer
                return response
            await response.write_eof()
            return response

    async def _start(self) -> None:
        upstream = ssl.create_default_context(cafile=str(self.plane.ca))
        # Bytes pass through as the server sent them (gzip included): no decompression on the way.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream, limit=0),
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(self.plane.ca, self.plane.work / "pki" / "apiserver.key")
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=serving).start()

    async def _stop(self) -> None:
        # The upstream side first: a watch still open (its client gone quiet) ends with it.
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers of connections their clients left open: ended here, not left to a closed loop.
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


__all__ = ["FaultProxy", "Rule"]

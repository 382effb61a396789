"""
The requests a kubelet makes to the API server, as its node (`system:node:<name>`, so the Node authorizer
and NodeRestriction hold it to what a kubelet may do): `Api`, and `register_node`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .common import Body, node_manifest, ready_node_status

logger = logging.getLogger(__name__)


class Api:
    """Just the requests a kubelet makes, with the node's token: watch its pods, read what they
    reference, write their status, request their ServiceAccount tokens, delete them at the end."""

    def __init__(self, server: str, token: str, ca: Path):
        self.server = server.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca))
        # No proxy from the environment: the API server is on this machine, as Rest's session has it.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=self.context))
        self.open_watches: set[Any] = set()

    def close_watches(self) -> None:
        for response in list(self.open_watches):
            with contextlib.suppress(Exception):
                response.fp.raw._sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                response.close()

    def _open(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
              timeout: float = 30) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Content-Type": content_type, "Accept": "application/json", "Authorization": f"Bearer {self.token}"})
        return self.opener.open(req, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        try:
            with self._open(method, path, body, content_type, timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            exc.msg = f"{exc.msg}: {exc.read().decode(errors='replace')[:2000]}"
            raise

    def get(self, path: str, forbidden_for: float = 10) -> Any:
        """GET; None when absent. The Node authorizer lets a node read a Secret, ConfigMap or claim only
        once it has seen a pod of the node that references it: a 403 right after binding is retried."""
        deadline = time.monotonic() + forbidden_for
        while True:
            try:
                return self.request("GET", path)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code != 403 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def patch(self, path: str, patch: Mapping[str, Any], content_type: str = "application/merge-patch+json") -> Any:
        try:
            return self.request("PATCH", path, patch, content_type)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # deleted meanwhile
                return None
            raise

    def delete(self, path: str, grace: int | None = None, uid: str | None = None) -> None:
        """DELETE; with `uid`, only that object (a kubelet's last word on a pod must not remove a
        new pod of the same name: 409 then, and nothing is deleted)."""
        body: dict[str, Any] | None = None
        if grace is not None or uid is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1"}
            if grace is not None:
                body["gracePeriodSeconds"] = grace
            if uid is not None:
                body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code not in (404, 409):
                raise

    def watch(self, path: str, query: Mapping[str, str], resource_version: str, stop: threading.Event
              ) -> Iterator[Body]:
        """The events after `resource_version`; ends when the server closes the watch or says the
        version is too old (an ERROR event: the caller lists again)."""
        params = urllib.parse.urlencode({**query, "watch": "true", "resourceVersion": resource_version,
                                         "allowWatchBookmarks": "true", "timeoutSeconds": "600"})
        with self._open("GET", f"{path}?{params}", timeout=3600) as response:
            self.open_watches.add(response)
            try:
                while not stop.is_set():
                    line = response.readline()
                    if not line:
                        return
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        return
                    yield event
            finally:
                self.open_watches.discard(response)

    def list_and_watch(self, path: str, query: Mapping[str, str], handle: Callable[[str, Body], Any],
                       stop: threading.Event, errors: list[str]) -> None:
        """Every object at `path` to `handle("ADDED", obj)`, then each event of a watch from there, and again
        from a fresh list whenever the watch ends, until `stop` is set. A failure other than a connection's
        goes to `errors`."""
        while not stop.is_set():
            try:
                listing = self.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
                for obj in listing["items"]:
                    handle("ADDED", obj)
                resource_version = listing["metadata"]["resourceVersion"]
                for event in self.watch(path, query, resource_version, stop):
                    if event["type"] != "BOOKMARK":
                        handle(event["type"], event["object"])
            except Exception as exc:  # noqa: BLE001 (a stopped agent closes its own watches under them)
                if stop.is_set():
                    return
                if not isinstance(exc, (OSError, urllib.error.URLError, ValueError, http.client.HTTPException)):
                    errors.append(f"watch {path}: {exc!r}")
                logger.info("node agent: watch interrupted (%r); re-listing", exc)
                stop.wait(0.2)
            else:  # the server ended the watch, or the version was too old: list again
                continue

    def source_data(self, namespace: str, kind: str, name: str) -> dict[str, str]:
        """A ConfigMap's data or a Secret's decoded data, as a kubelet reads them for envFrom and volumes."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        found = self.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        if found is None:
            raise LookupError(f'CreateContainerConfigError: {kind.lower()} "{name}" not found')
        if kind == "configMap":
            return dict(found.get("data") or {})
        return {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}


def register_node(api: Api, name: str, message: str, **status: Any) -> None:
    """Create the Node `name` as itself (NodeRestriction lets a node create only its own) and report it Ready
    with `status`'s other fields. A Node that exists already (a node agent started again on the same
    cluster) is kept. Admission taints a new Node not-ready; lifting that is the node-lifecycle
    controller's job, which the bed's control plane does not run, so whoever runs the cluster lifts it."""
    try:
        api.request("POST", "/api/v1/nodes", node_manifest(name))
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
    api.request("PATCH", f"/api/v1/nodes/{name}/status", ready_node_status(message, **status),
                "application/merge-patch+json")


__all__ = ["Api", "register_node"]

"""
The node agent's kubelet port: the HTTPS server the API server calls for `kubectl logs`, serving each
container's log from podman.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .common import self_signed_certificate

if TYPE_CHECKING:
    from .node_agent import NodeAgent


class KubeletServer:
    """The kubelet's HTTPS port, as much of it as the API server calls for `kubectl logs`:
    `GET /containerLogs/{namespace}/{pod}/{container}`. It listens on the network's gateway (the Node's
    InternalIP) with a self-signed certificate: the API server, given no kubelet CA, does not verify it,
    and it authenticates no client (a test node on a network of the test's own)."""

    def __init__(self, agent: NodeAgent):
        self.agent = agent
        self.server: http.server.ThreadingHTTPServer | None = None
        self.port = 0

    def start(self) -> None:
        cert, key = self_signed_certificate(self.agent.workdir / "kubelet-pki", "kubelet", self.agent.node_name,
                                            [f"IP:{self.agent.host_ip}"], ca=False)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        agent, kubelet = self.agent, self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._text(404, f"{url.path} is not served by the test node agent\n")
                    return
                query = dict(urllib.parse.parse_qsl(url.query))
                try:
                    argv = kubelet.log_argv(parts[1], parts[2], parts[3], query)
                except (LookupError, ValueError) as exc:
                    self._text(400, str(exc).strip("'\"") + "\n")
                    return
                limit = int(query["limitBytes"]) if query.get("limitBytes") else None
                if query.get("tailLines") and "--follow" not in argv:
                    done = subprocess.run(argv, env=agent.podman.env, capture_output=True, check=False)
                    lines = (done.stdout + done.stderr).splitlines(keepends=True)
                    text = b"".join(lines[len(lines) - min(len(lines), int(query["tailLines"])):])
                    self._send(200, text[:limit] if limit is not None else text)
                    return
                process = subprocess.Popen(argv, env=agent.podman.env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT)
                assert process.stdout is not None
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                try:
                    while chunk := process.stdout.read1(65536):
                        if limit is not None:
                            chunk, limit = chunk[:limit], limit - len(chunk[:limit])
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        if limit == 0:
                            break
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped following
                finally:
                    if process.poll() is None:
                        process.kill()
                    process.wait()

            def _text(self, code: int, text: str) -> None:
                self._send(code, text.encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((self.agent.host_ip, 0), Handler)
        self.server.daemon_threads = True
        # The handshake on the first read, in the connection's own thread: a slow client holds up no other.
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="node-agent-kubelet", daemon=True).start()

    def log_argv(self, namespace: str, name: str, container: str, query: Mapping[str, str]) -> list[str]:
        """`podman logs` for a kubelet's `/containerLogs/{namespace}/{name}/{container}`: previous,
        follow, tailLines. Raises LookupError with the kubelet's message when there is nothing to read."""
        runner = self.agent.runner(namespace, name)
        if runner is None:
            raise LookupError(f"pod {namespace}/{name} has no containers on this node")
        state = runner.containers.get(container) or runner.init_containers.get(container)
        if state is None:
            raise LookupError(f"container {container} is not valid for pod {name}")
        if query.get("previous") in ("true", "1"):
            target = state.previous
            if target is None:
                raise LookupError(f'previous terminated container "{container}" in pod "{name}" not found')
        else:
            target = state.current
            if target is None:
                raise LookupError(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        argv = self.agent.podman.argv("logs")
        if query.get("follow") in ("true", "1"):
            # podman's own --tail can join the last lines; without follow the server tails (do_GET).
            if query.get("tailLines"):
                argv += ["--tail", str(int(query["tailLines"]))]
            argv.append("--follow")
        return [*argv, target]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


__all__ = ["KubeletServer"]

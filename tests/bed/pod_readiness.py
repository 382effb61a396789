"""
Readiness probes of a pod's containers on the node agent (tcpSocket, httpGet, exec), as a kubelet runs them,
and each container's `ready` from their answers.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from .pod_containers import PodState


class ReadinessProbes(PodState):
    """A part of `PodRunner`: probes its containers at the pod's address while the pod runs."""

    def _probe_loop(self) -> None:
        specs = [c for c in self.spec["containers"] if c.get("readinessProbe")]
        if not specs:
            return
        next_at = {c["name"]: time.monotonic() + float(c["readinessProbe"].get("initialDelaySeconds", 0))
                   for c in specs}
        failures = {c["name"]: 0 for c in specs}
        successes = {c["name"]: 0 for c in specs}
        while not self.terminating.is_set() and self.phase == "Running":
            now = time.monotonic()
            for c in specs:
                state = self.containers[c["name"]]
                if now < next_at[c["name"]] or "running" not in state.state:
                    continue
                probe = c["readinessProbe"]
                next_at[c["name"]] = now + float(probe.get("periodSeconds", 10))
                ok = self._probe(c, probe)
                if ok:
                    successes[c["name"]] += 1
                    failures[c["name"]] = 0
                else:
                    failures[c["name"]] += 1
                    successes[c["name"]] = 0
                ready = state.ready
                if ok and successes[c["name"]] >= int(probe.get("successThreshold", 1)):
                    ready = True
                elif not ok and failures[c["name"]] >= int(probe.get("failureThreshold", 3)):
                    ready = False
                if ready != state.ready:
                    state.ready = ready
                    self.write_status()
            # Fast first answer: until a container is ready, probe every 0.25 s (a kubelet would wait
            # periodSeconds; the tests measure start-up, not probe periods).
            pending = [c for c in specs if not self.containers[c["name"]].ready]
            for c in pending:
                next_at[c["name"]] = min(next_at[c["name"]], time.monotonic() + 0.25)
            self.terminating.wait(min(max(0.05, min(next_at.values()) - time.monotonic()), 1.0))

    def _port(self, container: Mapping[str, Any], port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise LookupError(f"container {container['name']} has no port named {port!r}")

    def _probe(self, container: Mapping[str, Any], probe: Mapping[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "tcpSocket" in probe:
                with socket.create_connection((self.ip, self._port(container, probe["tcpSocket"]["port"])),
                                              timeout=timeout):
                    return True
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"http://{self.ip}:{self._port(container, get['port'])}{get.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    return 200 <= response.status < 400
            if "exec" in probe:
                state = self.containers[container["name"]]
                result = self.agent.podman("exec", state.current, *probe["exec"]["command"], check=False,
                                           timeout=timeout + 5)
                return result.returncode == 0
        except (OSError, urllib.error.URLError, LookupError, subprocess.TimeoutExpired):
            return False
        return False


__all__ = ["ReadinessProbes"]

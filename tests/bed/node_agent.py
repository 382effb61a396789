"""
A one-node kubelet for tests: runs the Pods the scheduler binds to its Node as podman containers.

`NodeAgent` talks to a real API server as `system:node:<name>` (so the Node authorizer and
NodeRestriction hold it to what a kubelet may do): it registers its Node, watches the Pods bound to it
(`spec.nodeName`) and runs each: initContainers one after another, then its containers, each a
`podman run` of the container's image with the Pod's command/args/env, volumes (emptyDir as a
directory, a memory emptyDir as tmpfs, /dev/shm as the container's shm, a PersistentVolumeClaim as a
host directory that outlives the pod, configMap and secret, the projected `kube-api-access-*` volume
with a TokenRequest token bound to the pod, the cluster's CA and the namespace), securityContext (user,
group, fsGroup as a supplemental group, read-only root, capabilities, no-new-privileges) and resource
limits (cpu/memory, where the sandbox's cgroups allow them). Each Pod gets its own address on a podman
network of the test's own; every container of a namespace mounts one hosts file that maps pod names
and Service names (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) to the addresses of
their pods, rewritten in place as pods come and go (there is no DNS server here).

It writes status through `pods/status` the way a kubelet does (phase, podIP, hostIP, conditions with
Ready from the readiness probes, containerStatuses and initContainerStatuses with state, exit code,
reason and restartCount, a termination message from the log for `FallbackToLogsOnError`), honours
restartPolicy, stops containers on Pod deletion (SIGTERM, then SIGKILL after the grace period), writes
the Pod's terminal phase and then deletes it for good (grace 0, its uid as precondition), and serves
container logs on the Node's kubelet port (`KubeletServer`) so `kubectl logs` works through the API
server.

Like a kubelet, it keeps a container whose image is not in podman's store waiting (ErrImagePull, then
ImagePullBackOff: there is no registry here, so a missing local image is the pull error) and one whose
Secret key is missing (CreateContainerConfigError), retrying with back-off.

Not done: image pulls (images must be present), liveness/startup probes, cgroup-enforced CPU shares
between pods, Service port remapping (a Service name resolves to the pod's address, so its port must
equal the target port), NetworkPolicy enforcement, DNS search domains, hostPath volumes (a Pod using
one fails with a message naming it), token refresh, exec/attach/port-forward, heartbeats (the
control plane runs no node-lifecycle controller to miss them).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import http.server
import ipaddress
import json
import logging
import math
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools import file_lock

from kuberl.api.kube import parse_quantity

from .control_plane import NODE

logger = logging.getLogger(__name__)

Body = dict[str, Any]

#: Ulimits podman sets by default need CAP_SYS_RESOURCE, which this sandbox lacks.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"
RESTART_BACKOFF_SECONDS = (10, 20, 40, 80, 160, 300)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Podman:
    """The podman command line, with the runtime and configuration this sandbox needs."""

    def __init__(self, workdir: pathlib.Path):
        self.conf = pathlib.Path(os.environ.get("CONTAINERS_CONF") or workdir / "containers.conf")
        if "CONTAINERS_CONF" not in os.environ:
            self.conf.parent.mkdir(parents=True, exist_ok=True)
            self.conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        self.base = ["podman", "--runtime", "runc"]

    def argv(self, *args: str) -> list[str]:
        return [*self.base, *args]

    def __call__(self, *args: str, check: bool = True, timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    @staticmethod
    def available() -> bool:
        return shutil.which("podman") is not None and shutil.which("runc") is not None

    def image_exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0


# --------------------------------------------------------------------------------------------------
# The API, over HTTP, as a kubelet uses it
# --------------------------------------------------------------------------------------------------


class Api:
    """Just the requests a kubelet makes, with the node's token: watch its pods, read what they
    reference, write their status, request their ServiceAccount tokens, delete them at the end."""

    def __init__(self, server: str, token: str, ca: pathlib.Path):
        self.server = server.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca))
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
        return urllib.request.urlopen(req, timeout=timeout, context=self.context)

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

    def patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        try:
            return self.request("PATCH", path, patch, "application/merge-patch+json")
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


# --------------------------------------------------------------------------------------------------
# One pod
# --------------------------------------------------------------------------------------------------


@dataclass
class ContainerState:
    """What the agent knows of one container of a pod: its podman names and last state."""

    name: str
    init: bool
    restart_count: int = 0
    current: str | None = None        # podman container name now (or last) running
    previous: str | None = None       # the one before the last restart, for `kubectl logs --previous`
    state: Body = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Body = field(default_factory=dict)
    ready: bool = False
    started: bool = False

    def status(self, spec: Mapping[str, Any]) -> Body:
        out: Body = {
            "name": self.name,
            "image": spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.current:
            out["containerID"] = f"podman://{self.current}"
        return out


class PodRunner:
    """Runs one Pod to its end (or until it is deleted) in a thread of its own."""

    def __init__(self, agent: NodeAgent, pod: Body, ip: str):
        self.agent = agent
        self.pod = pod
        self.meta = pod["metadata"]
        self.spec = pod["spec"]
        self.ns, self.name, self.uid = self.meta["namespace"], self.meta["name"], self.meta["uid"]
        self.ip = ip
        self.dir = agent.workdir / "pods" / self.uid
        self.containers = {c["name"]: ContainerState(c["name"], init=False) for c in self.spec["containers"]}
        self.init_containers = {
            c["name"]: ContainerState(c["name"], init=True) for c in self.spec.get("initContainers") or []
        }
        self.phase = "Pending"
        self.initialized = False
        self.message: str | None = None
        self.reason: str | None = None
        self.start_time = _now()
        self.terminating = threading.Event()
        self.grace = int(self.spec.get("terminationGracePeriodSeconds", 30))
        self.finished = threading.Event()
        self._status_lock = threading.Lock()
        self.sandbox = f"k8s_{self.name}_{self.ns}_{self.uid[:8]}"
        self.thread = threading.Thread(target=self._main, name=f"pod-{self.ns}-{self.name}", daemon=True)

    # ---- the pod's life ----------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a failure of the agent, not of the pod: report it on the pod
            logger.exception("node agent: pod %s/%s", self.ns, self.name)
            self.agent.errors.append(f"{self.ns}/{self.name}: {exc!r}")
            self.phase, self.reason, self.message = "Failed", "NodeAgentError", str(exc)
            self.write_status()
        finally:
            self.finished.set()
            self.agent.pod_finished(self)

    def _run(self) -> None:
        self.write_status()
        try:
            volumes = self._prepare_volumes()
        except (ValueError, LookupError) as exc:
            self.phase, self.reason, self.message = "Failed", "FailedMount", str(exc)
            self.write_status()
            return
        # The pod sandbox: a podman pod whose infra container holds the pod's address (and its
        # network namespace, shared by every container of the pod, init containers included).
        labels = [a for k, v in self.agent.labels.items() for a in ("--label", f"{k}={v}")]
        self.agent.podman("pod", "create", "--name", self.sandbox, "--network", self.agent.network,
                          "--ip", self.ip, "--hostname", self.name[:63], "--share", "net,uts", *labels)
        restart_policy = self.spec.get("restartPolicy", "Always")
        for spec in self.spec.get("initContainers") or []:
            state = self.init_containers[spec["name"]]
            while True:
                if self.terminating.is_set():
                    return
                code = self._run_to_end(spec, state, volumes)
                if code == 0:
                    break
                if self.terminating.is_set():
                    return
                if restart_policy == "Never":
                    self.phase, self.reason = "Failed", None
                    self.write_status()
                    return
                self._backoff(state)
        self.initialized = True
        self.write_status()
        mains = [c for c in self.spec["containers"]]
        if not all(self._pull(spec, self.containers[spec["name"]]) for spec in mains):
            return
        for spec in mains:
            self._start(spec, self.containers[spec["name"]], volumes)
        self.phase = "Running"
        self.write_status()
        waiters = {spec["name"]: threading.Thread(target=self._supervise, args=(spec, volumes), daemon=True)
                   for spec in mains}
        for waiter in waiters.values():
            waiter.start()
        probe = threading.Thread(target=self._probe_loop, daemon=True)
        probe.start()
        for waiter in waiters.values():
            waiter.join()
        if self.terminating.is_set():
            return
        codes = [int(self.containers[s["name"]].state["terminated"]["exitCode"]) for s in mains]
        self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self.write_status()

    def _supervise(self, spec: Body, volumes: list[str]) -> None:
        """Wait for a main container; restart it as restartPolicy says, until the pod ends."""
        state = self.containers[spec["name"]]
        policy = self.spec.get("restartPolicy", "Always")
        while True:
            code = self._wait(state)
            if self.terminating.is_set():
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            last = {"terminated": state.state["terminated"]}
            self._backoff(state)
            if self.terminating.is_set():
                return
            state.last_state, state.previous = last, state.current
            state.restart_count += 1
            self._start(spec, state, volumes)
            self.write_status()

    def _backoff(self, state: ContainerState) -> None:
        steps = self.agent.restart_backoff
        delay = steps[min(state.restart_count, len(steps) - 1)]
        state.state = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": f"back-off {delay}s restarting failed container={state.name}"}}
        self.write_status()
        self.terminating.wait(delay)

    def _pull(self, spec: Body, state: ContainerState) -> bool:
        """Wait until the container's image is on the node, as a kubelet retrying a failed pull: ErrImagePull,
        then ImagePullBackOff for a growing back-off. False when the pod was deleted meanwhile."""
        image, tries = spec["image"], 0
        while not self.agent.podman.image_exists(image):
            steps = self.agent.restart_backoff
            for reason, message, delay in (
                    ("ErrImagePull", f'failed to pull and unpack image "{image}": {image}: not found', 1.0),
                    ("ImagePullBackOff", f'Back-off pulling image "{image}"', steps[min(tries, len(steps) - 1)])):
                state.state = {"waiting": {"reason": reason, "message": message}}
                self.write_status()
                if self.terminating.wait(delay):
                    return False
            tries += 1
        return True

    def _run_to_end(self, spec: Body, state: ContainerState, volumes: list[str]) -> int:
        if not self._pull(spec, state):
            return 137
        if state.current:
            state.previous = state.current
            state.restart_count += 1
        self._start(spec, state, volumes)
        self.write_status()
        return self._wait(state)

    def _start(self, spec: Body, state: ContainerState, volumes: list[str]) -> None:
        podman_name = f"k8s_{spec['name']}_{self.name}_{self.ns}_{self.uid[:8]}_{state.restart_count}"
        argv, config_error, tries = None, "", 0
        while argv is None:
            try:
                argv = self.agent.run_argv(self, spec, podman_name, volumes)
            except LookupError as exc:  # a missing Secret key: the kubelet's CreateContainerConfigError, retried
                config_error = str(exc).removeprefix("CreateContainerConfigError: ")
                state.state = {"waiting": {"reason": "CreateContainerConfigError", "message": config_error}}
                self.write_status()
                steps = self.agent.restart_backoff
                if self.terminating.wait(steps[min(tries, len(steps) - 1)]):
                    break
                tries += 1
        result = self.agent.podman(*argv, check=False) if argv else None
        state.current = podman_name
        if result is None or result.returncode != 0:
            message = config_error if result is None else (result.stderr.strip() or result.stdout.strip())
            state.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                                          "startedAt": _now(), "finishedAt": _now()}}
            state.started = False
            logger.warning("node agent: %s/%s %s failed to start: %s", self.ns, self.name, spec["name"], message)
            return
        state.state = {"running": {"startedAt": _now()}}
        state.started = True
        state.ready = not spec.get("readinessProbe") and not state.init

    def _wait(self, state: ContainerState) -> int:
        """Block until the container exits; record its terminated state; return its exit code."""
        if "terminated" in state.state:  # never started
            return int(state.state["terminated"]["exitCode"])
        result = self.agent.podman("wait", state.current, check=False, timeout=None)
        try:
            code = int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            code = 137
        info = self.agent.podman("inspect", "--format", "{{json .State}}", state.current, check=False)
        started = finished = _now()
        oom = False
        if info.returncode == 0:
            raw = json.loads(info.stdout)
            started = (raw.get("StartedAt") or started)[:19] + "Z"
            finished = (raw.get("FinishedAt") or finished)[:19] + "Z"
            oom = bool(raw.get("OOMKilled"))
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        terminated: Body = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": finished}
        spec = self._spec_of(state)
        message_file = self.termination_message_file(state)
        text = message_file.read_text(errors="replace")[:4096] if message_file.exists() else ""
        if text:  # what the container wrote to its terminationMessagePath
            terminated["message"] = text
        elif code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = self.agent.podman("logs", "--tail", "80", state.current, check=False)
            text = (tail.stdout + tail.stderr)[-4096:]
            if text.strip():
                terminated["message"] = text
        state.state = {"terminated": terminated}
        state.ready = False
        self.write_status()
        return code

    def termination_message_file(self, state: ContainerState) -> pathlib.Path:
        return self.dir / "termination" / f"{state.name}-{state.restart_count}"

    def _spec_of(self, state: ContainerState) -> Body:
        key = "initContainers" if state.init else "containers"
        return next(c for c in self.spec.get(key) or [] if c["name"] == state.name)

    # ---- readiness ---------------------------------------------------------------------------------

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

    # ---- volumes -----------------------------------------------------------------------------------

    def _prepare_volumes(self) -> dict[str, tuple[str, Body]]:
        """Volume name -> (kind, details) with host directories made; raises for what is unsupported."""
        out: dict[str, tuple[str, Body]] = {}
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        for volume in self.spec.get("volumes") or []:
            name = volume["name"]
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    out[name] = ("tmpfs", {"sizeLimit": empty.get("sizeLimit")})
                else:
                    path = self.dir / "volumes" / name
                    path.mkdir(parents=True, exist_ok=True)
                    path.chmod(0o777)  # as a kubelet makes an emptyDir
                    out[name] = ("dir", {"path": str(path)})
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if self.agent.api.get(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}") is None:
                    raise LookupError(f'persistentvolumeclaim "{claim}" not found')
                path = self.agent.claim_dir(self.ns, claim)
                if fs_group is not None:  # a kubelet makes the volume group-owned by fsGroup, setgid
                    os.chown(path, 0, int(fs_group))
                    path.chmod(0o2775)
                out[name] = ("dir", {"path": str(path)})
            elif "configMap" in volume or "secret" in volume:
                kind = "configMap" if "configMap" in volume else "secret"
                source = volume[kind]
                data = self.agent.source_data(self.ns, kind, source.get("name") or source.get("secretName"))
                path = self.dir / "volumes" / name
                path.mkdir(parents=True, exist_ok=True)
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    target = path / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item["key"]])
                    target.chmod(int(item.get("mode", source.get("defaultMode", 0o644))))
                out[name] = ("dir", {"path": str(path), "readOnly": True})
            elif "projected" in volume:
                out[name] = ("dir", {"path": str(self._project(name, volume["projected"])), "readOnly": True})
            else:
                kinds = sorted(set(volume) - {"name"})
                raise ValueError(f"volume {name!r}: {kinds} volumes are not supported by the test node agent")
        return out

    def _project(self, name: str, projected: Mapping[str, Any]) -> pathlib.Path:
        """A projected volume's files: what admission adds to every pod of a ServiceAccount
        (`kube-api-access-*`: a token, the cluster's CA from `kube-root-ca.crt`, the namespace), or a
        pod's own mix of those sources."""
        path = self.dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        default_mode = int(projected.get("defaultMode", 0o644))
        files: dict[str, tuple[str, int | None]] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = (self._token(token), None)
            elif "configMap" in source or "secret" in source:
                kind = "configMap" if "configMap" in source else "secret"
                ref = source[kind]
                try:
                    data = self.agent.source_data(self.ns, kind, ref["name"])
                except LookupError:
                    if ref.get("optional"):
                        continue
                    raise
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = (data[item["key"]], item.get("mode"))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    files[item["path"]] = (self._field(item["fieldRef"]["fieldPath"]), item.get("mode"))
            else:
                raise ValueError(f"projected volume {name!r}: source {sorted(source)} is not supported by the "
                                 f"test node agent")
        for relative, (text, mode) in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(int(mode if mode is not None else default_mode))
        return path

    def _token(self, source: Mapping[str, Any]) -> str:
        """A token of the pod's ServiceAccount, requested as its kubelet does: with the node's identity,
        bound to this pod (so it dies with it). The server stretches the default hour of a
        `kube-api-access` token to a year (--service-account-extend-token-expiration), so no test lives
        to see it refreshed; this agent does not refresh it."""
        account = self.spec.get("serviceAccountName") or "default"
        spec: Body = {"expirationSeconds": int(source.get("expirationSeconds", 3600)),
                      "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}}
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = self.agent.api.request(
            "POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return answer["status"]["token"]

    def _field(self, path: str) -> str:
        """A downward API field of this pod, as a file or env var carries it."""
        values = {"metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
                  "status.podIP": self.ip, "status.hostIP": self.agent.host_ip,
                  "spec.nodeName": self.agent.node_name,
                  "spec.serviceAccountName": self.spec.get("serviceAccountName") or "default"}
        if path in values:
            return values[path]
        for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
            mapping = self.meta.get(key) or {}
            if path == prefix:
                return "\n".join(f'{k}="{v}"' for k, v in sorted(mapping.items()))
            if path.startswith(prefix + "['") and path.endswith("']"):
                return mapping.get(path[len(prefix) + 2:-2], "")
        raise ValueError(f"downward API field {path!r} is not supported by the test node agent")

    # ---- status ------------------------------------------------------------------------------------

    def status(self) -> Body:
        containers = [self.containers[c["name"]].status(c) for c in self.spec["containers"]]
        inits = [self.init_containers[c["name"]].status(c) for c in self.spec.get("initContainers") or []]
        ready = self.phase == "Running" and all(c["ready"] for c in containers)
        now = _now()
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True" if self.initialized else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
        for condition in conditions:
            condition["lastTransitionTime"] = now
        status: Body = {
            "phase": self.phase,
            "conditions": conditions,
            "hostIP": self.agent.host_ip,
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "containerStatuses": containers,
        }
        if inits:
            status["initContainerStatuses"] = inits
        if self.reason:
            status["reason"] = self.reason
        if self.message:
            status["message"] = self.message
        return status

    def write_status(self) -> None:
        with self._status_lock:
            self.agent.api.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                                 {"status": self.status()})

    def end_deleted(self) -> None:
        """A deleted pod's terminal phase, which a kubelet writes (since Kubernetes 1.27) once its
        containers stopped and before the final delete: Succeeded when every container exited 0, else
        Failed. A controller that keeps a finalizer on the pod (Kueue) reads from it that the pod is over."""
        if self.phase in ("Succeeded", "Failed"):
            return
        codes = [(state.state.get("terminated") or {}).get("exitCode") for state in self.containers.values()]
        self.phase = "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
        with self._status_lock:
            try:  # the uid: never a new pod of the same name
                self.agent.api.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                                     {"metadata": {"uid": self.uid}, "status": self.status()})
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise

    # ---- the end -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """The pod was deleted: SIGTERM its containers, SIGKILL after the grace period."""
        self.terminating.set()
        for state in [*self.init_containers.values(), *self.containers.values()]:
            if state.current and "running" in state.state:
                self.agent.podman("stop", "--time", str(self.grace), state.current, check=False,
                                  timeout=self.grace + 60)

    def remove_containers(self) -> None:
        """The pod is gone: remove its containers (kept until now for their logs, as on a node). With
        KUBERL_BED_LOG_DIR set, each container's log is saved there first (for a post-mortem)."""
        keep = os.environ.get("KUBERL_BED_LOG_DIR")
        for state in [*self.init_containers.values(), *self.containers.values()]:
            for name in (state.previous, state.current):
                if name:
                    if keep:
                        out = self.agent.podman("logs", name, check=False)
                        path = pathlib.Path(keep) / f"{name}.log"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(out.stdout + out.stderr)
                    self.agent.podman("rm", "--force", "--time", "0", name, check=False)
        self.agent.podman("pod", "rm", "--force", "--time", "0", self.sandbox, check=False)

    def all_container_names(self) -> list[str]:
        return [n for s in [*self.init_containers.values(), *self.containers.values()]
                for n in (s.previous, s.current) if n]


# --------------------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------------------


class NodeAgent:
    """One node: registers its Node, runs the Pods the scheduler binds to it, stops the deleted ones,
    and serves their logs on the Node's kubelet port."""

    def __init__(self, api_server: str, token: str, ca: pathlib.Path, workdir: pathlib.Path, *, network: str,
                 subnet: str, node_name: str = NODE, podman: Podman | None = None,
                 resource_limits: bool = True, labels: Mapping[str, str] | None = None,
                 restart_backoff: Sequence[float] = RESTART_BACKOFF_SECONDS):
        """`token`: the node's own (`system:node:<node_name>`); `ca`: the API server's CA."""
        self.api = Api(api_server, token, ca)
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.podman = podman or Podman(self.workdir)
        self.network = network
        self.subnet = ipaddress.ip_network(subnet)
        hosts = self.subnet.hosts()
        self.host_ip = str(next(hosts))  # the bridge's gateway
        self._free_ips = hosts
        self.node_name = node_name
        #: The Node's well-known labels, which the scheduler matches nodeSelectors against.
        self.node_labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64"}
        # No kube-proxy runs, so the `kubernetes` Service's address leads nowhere: in-cluster clients
        # are pointed at the API server itself (the network's gateway, where it listens).
        server = urllib.parse.urlsplit(api_server)
        self.service_host, self.service_port = server.hostname or "", str(server.port or 443)
        self.resource_limits = resource_limits
        self.labels = dict(labels or {})
        self.restart_backoff = tuple(restart_backoff)
        self.pods: dict[str, PodRunner] = {}  # by uid
        self.errors: list[str] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch_loop, args=("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node_name}"},
                                           self._on_pod), name="node-agent-pods", daemon=True)
        self._services_thread = threading.Thread(
            target=self._watch_loop, args=("/api/v1/services", {}, lambda *_: self.refresh_hosts()),
            name="node-agent-services", daemon=True)
        self._hosts: pathlib.Path | None = None
        self.kubelet = KubeletServer(self)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        self.kubelet.start()
        self.register()
        self._thread.start()
        self._services_thread.start()
        return self

    def register(self) -> None:
        """Create this node's Node (as itself: NodeRestriction lets a node create only its own) and
        report it Ready. Admission taints a new Node not-ready; lifting that is the node-lifecycle
        controller's job, so whoever runs the cluster without it lifts it (`OneNodeCluster`)."""
        # What the scheduler fits requests into; nothing enforces it (containers share the machine).
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "1Ti"}
        now = _now()
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name, "labels": self.node_labels}}
        try:
            self.api.request("POST", "/api/v1/nodes", node)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # a node agent started again on the same cluster
                raise
        self.api.request("PATCH", f"/api/v1/nodes/{self.node_name}/status", {"status": {
            "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": self.host_ip},
                          {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet.port}},
            "nodeInfo": {"kubeletVersion": "kuberl-node-agent", "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "podman", "kernelVersion": os.uname().release,
                         "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the test node agent is running pods with podman",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
            "application/merge-patch+json")

    def stop(self) -> None:
        self._stop.set()
        self.api.close_watches()
        with self._lock:
            runners = list(self.pods.values())
        for runner in runners:
            runner.grace = min(runner.grace, 2)
            runner.stop()
        for runner in runners:
            runner.finished.wait(60)
            runner.remove_containers()
        self._thread.join(10)
        self._services_thread.join(10)
        self.kubelet.stop()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- watching ----------------------------------------------------------------------------------

    def _watch_loop(self, path: str, query: Mapping[str, str], handle: Any) -> None:
        while not self._stop.is_set():
            try:
                listing = self.api.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
                for obj in listing["items"]:
                    handle("ADDED", obj)
                resource_version = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(path, query, resource_version, self._stop):
                    if event["type"] != "BOOKMARK":
                        handle(event["type"], event["object"])
            except Exception as exc:  # noqa: BLE001 (a stopped agent closes its own watches under them)
                if self._stop.is_set():
                    return
                if not isinstance(exc, (OSError, urllib.error.URLError, ValueError, http.client.HTTPException)):
                    self.errors.append(f"watch {path}: {exc!r}")
                logger.info("node agent: watch interrupted (%r); re-listing", exc)
                self._stop.wait(0.2)
            else:  # the server ended the watch, or the version was too old: list again
                continue

    def _on_pod(self, event_type: str, pod: Body) -> None:
        """A pod the scheduler bound to this node (the watch selects only those)."""
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            runner = self.pods.get(uid)
            if event_type == "DELETED" or meta.get("deletionTimestamp"):
                if runner is not None and not runner.terminating.is_set():
                    runner.terminating.set()
                    threading.Thread(target=self._terminate, args=(runner,), daemon=True).start()
                elif runner is None and event_type != "DELETED":  # never ran here: nothing to stop
                    self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", grace=0,
                                    uid=uid)
                return
            if runner is not None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return
            runner = PodRunner(self, pod, str(next(self._free_ips)))
            self.pods[uid] = runner
        self.refresh_hosts(meta["namespace"])
        runner.start()

    def _terminate(self, runner: PodRunner) -> None:
        runner.stop()
        runner.finished.wait(runner.grace + 120)
        runner.remove_containers()
        with self._lock:
            self.pods.pop(runner.uid, None)
        try:
            runner.end_deleted()
            self.refresh_hosts(runner.ns)
            # The kubelet's last word: the containers are gone, so is the pod.
            self.api.delete(f"/api/v1/namespaces/{runner.ns}/pods/{runner.name}", grace=0, uid=runner.uid)
        except (OSError, urllib.error.URLError):
            if not self._stop.is_set():  # the API server goes away only when the test is over
                raise

    def pod_finished(self, runner: PodRunner) -> None:
        self.refresh_hosts(runner.ns)

    # ---- names -------------------------------------------------------------------------------------

    def hosts_file(self) -> pathlib.Path:
        """The node's hosts file, bind-mounted at /etc/hosts into every container."""
        with self._lock:
            if self._hosts is None:
                self._hosts = self.workdir / "hosts"
                self._hosts.write_text("127.0.0.1 localhost\n")
                self._hosts.chmod(0o644)
            return self._hosts

    def refresh_hosts(self, namespace: str | None = None) -> None:
        """Rewrite the hosts file in place (containers bind-mount its inode): pod names and the fully
        qualified Service names (`svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) of every namespace."""
        with self._lock:
            running = [r for r in self.pods.values()
                       if not r.terminating.is_set() and r.phase in ("Pending", "Running")]
            services = (self.api.get("/api/v1/services") or {"items": []})["items"]
            lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
            for runner in sorted(running, key=lambda r: (r.ns, r.name)):
                lines.append(f"{runner.ip} {runner.name}")
            for service in services:
                selector = (service.get("spec") or {}).get("selector") or {}
                if not selector:
                    continue
                svc, ns = service["metadata"]["name"], service["metadata"]["namespace"]
                names = f"{svc}.{ns}.svc.cluster.local {svc}.{ns}.svc {svc}.{ns}"
                for runner in sorted(running, key=lambda r: r.name):
                    labels = runner.meta.get("labels") or {}
                    if runner.ns == ns and all(labels.get(k) == v for k, v in selector.items()):
                        lines.append(f"{runner.ip} {names}")
            with open(self.hosts_file(), "r+") as handle:
                handle.seek(0)
                handle.write("\n".join(lines) + "\n")
                handle.truncate()

    def claim_dir(self, namespace: str, claim: str) -> pathlib.Path:
        """The host directory behind a PersistentVolumeClaim: it outlives every pod."""
        path = self.workdir / "claims" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ---- podman run --------------------------------------------------------------------------------

    def run_argv(self, runner: PodRunner, spec: Body, podman_name: str, volumes: Mapping[str, tuple[str, Body]]
                 ) -> list[str]:
        pod_sc = runner.spec.get("securityContext") or {}
        sc = {**pod_sc, **(spec.get("securityContext") or {})}
        argv = ["run", "--detach", "--name", podman_name, "--pull", "never", "--pod", runner.sandbox,
                "--volume", f"{self.hosts_file()}:/etc/hosts:ro",
                "--label", f"io.kubernetes.pod.uid={runner.uid}",
                "--label", f"io.kubernetes.pod.namespace={runner.ns}",
                "--label", f"io.kubernetes.pod.name={runner.name}",
                "--log-driver", "k8s-file"]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        user = sc.get("runAsUser")
        if user is not None:
            group = sc.get("runAsGroup", 0)
            argv += ["--user", f"{user}:{group}"]
        if pod_sc.get("fsGroup") is not None:
            argv += ["--group-add", str(pod_sc["fsGroup"])]
        for gid in pod_sc.get("supplementalGroups") or []:
            argv += ["--group-add", str(gid)]
        if sc.get("readOnlyRootFilesystem"):
            argv += ["--read-only", "--read-only-tmpfs=false"]
        capabilities = sc.get("capabilities") or {}
        for cap in capabilities.get("drop") or []:
            argv += ["--cap-drop", cap.lower() if cap == "ALL" else cap]
        for cap in capabilities.get("add") or []:
            argv += ["--cap-add", cap]
        if sc.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        if sc.get("runAsNonRoot") and user in (None, 0):
            raise ValueError(f"container {spec['name']}: runAsNonRoot and no non-zero runAsUser")
        limits = (spec.get("resources") or {}).get("limits") or {}
        if self.resource_limits:
            if "cpu" in limits:
                argv += ["--cpus", str(_cpu(limits["cpu"]))]
            if "memory" in limits:
                argv += ["--memory", str(_bytes(limits["memory"]))]
        # First, as a kubelet puts a namespace's service variables first: the pod's own env wins.
        argv += ["--env", f"KUBERNETES_SERVICE_HOST={self.service_host}",
                 "--env", f"KUBERNETES_SERVICE_PORT={self.service_port}"]
        for source in spec.get("envFrom") or []:  # first: an env entry of the same name wins, as on a node
            kind = "configMap" if "configMapRef" in source else "secret"
            for key, value in self.source_data(runner.ns, kind, source[f"{kind}Ref"]["name"]).items():
                argv += ["--env", f"{source.get('prefix', '')}{key}={value}"]
        for env in spec.get("env") or []:
            value = env.get("value")
            if value is None and "valueFrom" in env:
                value = self._env_from(runner, env["valueFrom"])
            argv += ["--env", f"{env['name']}={value or ''}"]
        if spec.get("workingDir"):
            argv += ["--workdir", spec["workingDir"]]
        for mount in spec.get("volumeMounts") or []:
            kind, details = volumes[mount["name"]]
            target, ro = mount["mountPath"], mount.get("readOnly", False) or details.get("readOnly", False)
            if kind == "tmpfs":  # /dev/shm included: podman's own shm mount gives way to it
                # Without a sizeLimit, a memory emptyDir is as big as the node lets it be: tmpfs's default.
                size = f",tmpfs-size={_bytes(details['sizeLimit'])}" if details.get("sizeLimit") else ""
                argv += ["--mount", f"type=tmpfs,destination={target}{size},tmpfs-mode=1777"]
            else:
                argv += ["--volume", f"{details['path']}:{target}:{'ro' if ro else 'rw'}"]
        states = runner.init_containers if spec in (runner.spec.get("initContainers") or []) else runner.containers
        message_file = runner.termination_message_file(states[spec["name"]])
        message_file.parent.mkdir(parents=True, exist_ok=True)
        message_file.write_text("")
        message_file.chmod(0o666)
        argv += ["--volume", f"{message_file}:{spec.get('terminationMessagePath', '/dev/termination-log')}:rw"]
        command, args = spec.get("command"), spec.get("args")
        if command:
            argv += ["--entrypoint", json.dumps(command)]
        argv.append(spec["image"])
        if args:
            argv += list(args)
        return argv

    def source_data(self, namespace: str, kind: str, name: str) -> dict[str, str]:
        """A ConfigMap's data or a Secret's decoded data, as a kubelet reads them for envFrom and volumes."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        found = self.api.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        if found is None:
            raise LookupError(f'CreateContainerConfigError: {kind.lower()} "{name}" not found')
        if kind == "configMap":
            return dict(found.get("data") or {})
        return {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}

    def _env_from(self, runner: PodRunner, source: Mapping[str, Any]) -> str:
        path = (source.get("fieldRef") or {}).get("fieldPath")
        if path:
            return runner._field(path)
        ref = source.get("secretKeyRef")
        if ref:  # as a kubelet does: the Secret read with the node's credentials, the key's bytes decoded
            secret = self.api.get(f"/api/v1/namespaces/{runner.ns}/secrets/{ref['name']}")
            data = (secret or {}).get("data") or {}
            if ref["key"] not in data:
                raise LookupError(f"CreateContainerConfigError: secret {ref['name']!r} or its key "
                                  f"{ref['key']!r} not found")
            return base64.b64decode(data[ref["key"]]).decode()
        raise ValueError(f"env valueFrom {dict(source)} is not supported by the test node agent")

    # ---- logs, for the API server -------------------------------------------------------------------

    def runner(self, namespace: str, name: str) -> PodRunner | None:
        with self._lock:
            for runner in self.pods.values():
                if runner.ns == namespace and runner.name == name:
                    return runner
        return None

    def log_argv(self, namespace: str, name: str, container: str, query: Mapping[str, str]) -> list[str]:
        """`podman logs` for a kubelet's `/containerLogs/{namespace}/{name}/{container}`: previous,
        follow, tailLines. Raises LookupError with the kubelet's message when there is nothing to read."""
        runner = self.runner(namespace, name)
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
        argv = self.podman.argv("logs")
        if query.get("follow") in ("true", "1"):
            # podman's own --tail can join the last lines; without follow the server tails (KubeletServer).
            if query.get("tailLines"):
                argv += ["--tail", str(int(query["tailLines"]))]
            argv.append("--follow")
        return [*argv, target]


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
        pki = self.agent.workdir / "kubelet-pki"
        pki.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                        "-keyout", str(pki / "kubelet.key"), "-out", str(pki / "kubelet.crt"),
                        "-subj", f"/CN={self.agent.node_name}",
                        "-addext", f"subjectAltName=IP:{self.agent.host_ip}"], check=True, capture_output=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "kubelet.crt", pki / "kubelet.key")
        agent = self.agent

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._text(404, f"{url.path} is not served by the test node agent\n")
                    return
                query = dict(urllib.parse.parse_qsl(url.query))
                try:
                    argv = agent.log_argv(parts[1], parts[2], parts[3], query)
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

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _cpu(quantity: Any) -> float:
    """CPUs for `podman --cpus`, read as the API server reads a quantity (kuberl.api.kube)."""
    return float(parse_quantity(str(quantity)))


def _bytes(quantity: Any) -> int:
    """Bytes for `podman --memory` and tmpfs sizes; Kubernetes rounds a fractional byte count up."""
    return math.ceil(parse_quantity(str(quantity)))


# --------------------------------------------------------------------------------------------------
# The test's own network
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def podman_network(podman: Podman, name: str, seed: int) -> Iterator[str]:
    """A podman bridge network of the test's own on a /16 no other network uses; yields its subnet, and
    removes it (with anything left on it) at the end. Picking the subnet and creating the network hold a
    machine-wide lock: beds started at once (test workers, a benchmark beside the tests) never pick the
    same free /16."""
    podman("network", "rm", "--force", name, check=False)
    with file_lock(pathlib.Path(tempfile.gettempdir()) / "kuberl-podman-networks.lock"):
        subnet = free_subnet(podman, seed)
        podman("network", "create", "--subnet", subnet, "--disable-dns", name)
    try:
        yield subnet
    finally:
        podman("network", "rm", "--force", name, check=False)


def free_subnet(podman: Podman, seed: int) -> str:
    """A /16 in 10.0.0.0/8 no podman network here uses yet."""
    used = set()
    listing = podman("network", "ls", "--format", "{{json .}}", check=False).stdout
    for line in listing.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            for sub in json.loads(line).get("subnets") or []:
                used.add(str(sub.get("subnet")))
    for offset in range(200):
        second = 100 + (seed + offset) % 150
        candidate = f"10.{second}.0.0/16"
        if candidate not in used:
            return candidate
    raise RuntimeError("no free 10.x.0.0/16 for a podman network")


def wait_until(predicate: Any, timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(interval)


__all__ = ["KubeletServer", "NodeAgent", "Podman", "free_subnet", "podman_network", "wait_until"]

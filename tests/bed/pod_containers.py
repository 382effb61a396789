"""
The containers of a pod on the node agent: what each one is (`ContainerState`), how the agent runs it with
podman (`ContainerRuns`: pull, start, wait, restart with back-off, remove) and the `podman run` it starts
it with (`run_argv`).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import pathlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kuberl.api.kube import parse_quantity

from .common import Body, utc_now

if TYPE_CHECKING:
    from .node_agent import NodeAgent
    from .pod_runner import PodRunner

logger = logging.getLogger(__name__)


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


class PodState:
    """What the parts of a `PodRunner` (`ContainerRuns`, `ReadinessProbes`, `PodVolumes`) read and write of it:
    the pod, the agent running it, its directory and address, its containers' states, and whether it is
    being deleted. `PodRunner.__init__` sets them."""

    agent: NodeAgent
    pod: Body
    meta: Body
    spec: Body
    ns: str
    name: str
    uid: str
    ip: str
    dir: pathlib.Path
    phase: str
    containers: dict[str, ContainerState]
    init_containers: dict[str, ContainerState]
    terminating: threading.Event
    grace: int  # the pod's termination grace period, seconds
    write_status: Callable[[], None]


class ContainerRuns(PodState):
    """The containers of one pod, run with podman: a part of `PodRunner`."""

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
                argv = run_argv(self.agent, self, spec, podman_name, volumes)
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
                                          "startedAt": utc_now(), "finishedAt": utc_now()}}
            state.started = False
            logger.warning("node agent: %s/%s %s failed to start: %s", self.ns, self.name, spec["name"], message)
            return
        state.state = {"running": {"startedAt": utc_now()}}
        state.started = True
        state.ready = not spec.get("readinessProbe") and not state.init
        if self.terminating.is_set():
            # The pod was deleted while this container started: `stop` found it not yet running and left it,
            # so it stops here, with the pod's grace period, as a kubelet's pod worker stops what it started.
            # (A worker pod created just before its job finished ran on for minutes so, a leftover.)
            self.agent.podman("stop", "--time", str(self.grace), podman_name, check=False, timeout=self.grace + 60)

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
        started = finished = utc_now()
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


def run_argv(agent: NodeAgent, runner: PodRunner, spec: Body, podman_name: str,
             volumes: Mapping[str, tuple[str, Body]]) -> list[str]:
    """`podman run` of one container of a pod, in the pod's sandbox: the container's image, command, env,
    mounts, user and limits, as a kubelet gives them to its runtime."""
    pod_sc = runner.spec.get("securityContext") or {}
    sc = {**pod_sc, **(spec.get("securityContext") or {})}
    argv = ["run", "--detach", "--name", podman_name, "--pull", "never", "--pod", runner.sandbox,
            "--volume", f"{agent.hosts.path}:/etc/hosts:ro",
            "--label", f"io.kubernetes.pod.uid={runner.uid}",
            "--label", f"io.kubernetes.pod.namespace={runner.ns}",
            "--label", f"io.kubernetes.pod.name={runner.name}",
            "--log-driver", "k8s-file"]
    for key, value in agent.labels.items():
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
    if agent.resource_limits:
        if "cpu" in limits:
            argv += ["--cpus", str(_cpu(limits["cpu"]))]
        if "memory" in limits:
            argv += ["--memory", str(_bytes(limits["memory"]))]
    # First, as a kubelet puts a namespace's service variables first: the pod's own env wins.
    argv += ["--env", f"KUBERNETES_SERVICE_HOST={agent.service_host}",
             "--env", f"KUBERNETES_SERVICE_PORT={agent.service_port}"]
    for source in spec.get("envFrom") or []:  # first: an env entry of the same name wins, as on a node
        kind = "configMap" if "configMapRef" in source else "secret"
        for key, value in agent.api.source_data(runner.ns, kind, source[f"{kind}Ref"]["name"]).items():
            argv += ["--env", f"{source.get('prefix', '')}{key}={value}"]
    for env in spec.get("env") or []:
        value = env.get("value")
        if value is None and "valueFrom" in env:
            value = env_value(agent, runner, env["valueFrom"])
            if value is None:  # an optional key that is not there: no variable, as on a node
                continue
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


def env_value(agent: NodeAgent, runner: PodRunner, source: Mapping[str, Any]) -> str | None:
    """An env entry's valueFrom: a downward API field of the pod, or a Secret's key (None: an optional
    key, or Secret, that is not there)."""
    path = (source.get("fieldRef") or {}).get("fieldPath")
    if path:
        return runner._field(path)
    ref = source.get("secretKeyRef")
    if ref:  # as a kubelet does: the Secret read with the node's credentials, the key's bytes decoded
        secret = agent.api.get(f"/api/v1/namespaces/{runner.ns}/secrets/{ref['name']}")
        data = (secret or {}).get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise LookupError(f"CreateContainerConfigError: secret {ref['name']!r} or its key "
                              f"{ref['key']!r} not found")
        return base64.b64decode(data[ref["key"]]).decode()
    raise ValueError(f"env valueFrom {dict(source)} is not supported by the test node agent")


def _cpu(quantity: Any) -> float:
    """CPUs for `podman --cpus`, read as the API server reads a quantity (kuberl.api.kube)."""
    return float(parse_quantity(str(quantity)))


def _bytes(quantity: Any) -> int:
    """Bytes for `podman --memory` and tmpfs sizes; Kubernetes rounds a fractional byte count up."""
    return math.ceil(parse_quantity(str(quantity)))


__all__ = ["ContainerRuns", "ContainerState", "PodState", "run_argv"]

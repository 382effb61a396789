"""
One Pod on the node agent, run to its end (or until it is deleted) in a thread of its own: its sandbox (a
podman pod holding its address), init containers one after another, then its containers, their restarts as
restartPolicy says, readiness, and the status a kubelet writes for all that. Its parts: `pod_containers`
(the containers), `pod_readiness` (the probes), `pod_volumes` (the volumes).
"""

from __future__ import annotations

import logging
import threading
import urllib.error
from typing import TYPE_CHECKING

from .common import Body, utc_now
from .pod_containers import ContainerRuns, ContainerState
from .pod_readiness import ReadinessProbes
from .pod_volumes import PodVolumes

if TYPE_CHECKING:
    from .node_agent import NodeAgent

logger = logging.getLogger(__name__)


class PodRunner(ContainerRuns, ReadinessProbes, PodVolumes):
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
        self.start_time = utc_now()
        self.terminating = threading.Event()
        self.gone = False  # the API server's pod of this name is another one now: no more writes
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

    # ---- status ------------------------------------------------------------------------------------

    def write_status(self) -> None:
        """The pod's status, written only onto this pod: as a kubelet's status manager does, the patch
        carries the pod's uid, so a pod deleted without grace and created again under its name (a
        controller replacing it) never gets the old one's containers. That refusal ends this pod here. A
        strategic merge, as a kubelet's: the conditions merge by type, so those others set (the eviction API's
        DisruptionTarget, a scheduler's) stay."""
        with self._status_lock:
            if self.gone:
                return
            try:
                self.agent.api.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                                     {"metadata": {"uid": self.uid}, "status": pod_status(self)},
                                     "application/strategic-merge-patch+json")
            except urllib.error.HTTPError as exc:
                if exc.code not in (409, 422) or not self._replaced():
                    raise
                self.gone = True  # its containers stop when the watch brings the pod's deletion

    def _replaced(self) -> bool:
        """Whether the API server's pod of this name is no longer this one (gone, or a new uid)."""
        pod = self.agent.api.get(f"/api/v1/namespaces/{self.ns}/pods/{self.name}")
        return pod is None or pod["metadata"]["uid"] != self.uid

    def end_deleted(self) -> None:
        """A deleted pod's terminal phase, which a kubelet writes (since Kubernetes 1.27) once its
        containers stopped and before the final delete: Succeeded when every container exited 0, else
        Failed. A controller that keeps a finalizer on the pod (Kueue) reads from it that the pod is over."""
        if self.phase in ("Succeeded", "Failed"):
            return
        codes = [(state.state.get("terminated") or {}).get("exitCode") for state in self.containers.values()]
        self.phase = "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
        self.write_status()

    # ---- the end -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """The pod was deleted: SIGTERM its containers, SIGKILL after the grace period."""
        self.terminating.set()
        for state in [*self.init_containers.values(), *self.containers.values()]:
            if state.current and "running" in state.state:
                self.agent.podman("stop", "--time", str(self.grace), state.current, check=False,
                                  timeout=self.grace + 60)


def pod_status(runner: PodRunner) -> Body:
    """The pod's status as its kubelet writes it: phase, conditions, addresses and each container's state."""
    containers = [runner.containers[c["name"]].status(c) for c in runner.spec["containers"]]
    inits = [runner.init_containers[c["name"]].status(c) for c in runner.spec.get("initContainers") or []]
    ready = runner.phase == "Running" and all(c["ready"] for c in containers)
    now = utc_now()
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True" if runner.initialized else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    for condition in conditions:
        condition["lastTransitionTime"] = now
    status: Body = {
        "phase": runner.phase,
        "conditions": conditions,
        "hostIP": runner.agent.host_ip,
        "podIP": runner.ip,
        "podIPs": [{"ip": runner.ip}],
        "startTime": runner.start_time,
        "containerStatuses": containers,
    }
    if inits:
        status["initContainerStatuses"] = inits
    if runner.reason:
        status["reason"] = runner.reason
    if runner.message:
        status["message"] = runner.message
    return status


__all__ = ["PodRunner", "pod_status"]

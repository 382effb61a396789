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

import ipaddress
import os
import pathlib
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence

from .common import NODE, Body
from .kubelet_api import Api, register_node
from .kubelet_server import KubeletServer
from .pod_runner import PodRunner
from .podman import Podman

RESTART_BACKOFF_SECONDS = (10, 20, 40, 80, 160, 300)


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
            target=self.api.list_and_watch, args=("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node_name}"},
                                                  self._on_pod, self._stop, self.errors),
            name="node-agent-pods", daemon=True)
        self._services_thread = threading.Thread(
            target=self.api.list_and_watch,
            args=("/api/v1/services", {}, lambda *_: self.refresh_hosts(), self._stop, self.errors),
            name="node-agent-services", daemon=True)
        self.hosts = HostsFile(self.workdir / "hosts")
        self.kubelet = KubeletServer(self)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        self.kubelet.start()
        self.register()
        self._thread.start()
        self._services_thread.start()
        return self

    def register(self) -> None:
        """This node's Node, registered as itself and Ready (`kubelet_api.register_node`)."""
        register_node(self.api, self.node_name, "the test node agent is running pods with podman", addresses=[
            {"type": "InternalIP", "address": self.host_ip}, {"type": "Hostname", "address": self.node_name}],
            daemonEndpoints={"kubeletEndpoint": {"Port": self.kubelet.port}},
            nodeInfo={"kubeletVersion": "kuberl-node-agent", "operatingSystem": "linux", "architecture": "amd64",
                      "containerRuntimeVersion": "podman", "kernelVersion": os.uname().release,
                      "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""})

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

    def refresh_hosts(self, namespace: str | None = None) -> None:
        """The hosts file rewritten for the pods that run now and every Service."""
        with self._lock:
            running = [r for r in self.pods.values()
                       if not r.terminating.is_set() and r.phase in ("Pending", "Running")]
            services = (self.api.get("/api/v1/services") or {"items": []})["items"]
            self.hosts.write(running, services)

    def claim_dir(self, namespace: str, claim: str) -> pathlib.Path:
        """The host directory behind a PersistentVolumeClaim: it outlives every pod."""
        path = self.workdir / "claims" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ---- a pod by name, for the kubelet port's logs ------------------------------------------------

    def runner(self, namespace: str, name: str) -> PodRunner | None:
        """The pod of that name; the live one where a pod deleted without grace still stops beside the new
        one its controller made under the same name."""
        with self._lock:
            named = [r for r in self.pods.values() if r.ns == namespace and r.name == name]
        return min(named, key=lambda r: r.gone or r.terminating.is_set(), default=None)


class HostsFile:
    """The node's hosts file, bind-mounted at /etc/hosts into every container (there is no DNS server here):
    pod names and the fully qualified Service names (`svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) of
    every namespace. Rewritten in place: containers bind-mount its inode."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.path.write_text("127.0.0.1 localhost\n")
        self.path.chmod(0o644)

    def write(self, running: Iterable[PodRunner], services: Iterable[Body]) -> None:
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
        with open(self.path, "r+") as handle:
            handle.seek(0)
            handle.write("\n".join(lines) + "\n")
            handle.truncate()


__all__ = ["HostsFile", "NodeAgent"]

"""
A real Kubernetes node for the bed: the kubelet and kube-proxy built with the control plane
(scripts/build-control-plane), containerd with Debian's runc and CNI plugins, CoreDNS as the cluster DNS,
and kube-router's firewall enforcing NetworkPolicies (scripts/build-node), each a host process of the test.

    node = RealNode(work)
    node.prepare()                      # a node slot, its network namespace and the link to it, whose
                                        # host end (node.host_address) the API server then listens on
    plane = ControlPlane(..., address=node.host_address, publish_endpoint=True).start()
    node.start(plane, registry.address) # containerd (pulling ghcr.io/kuberl/... from that registry), the
                                        # kubelet, kube-proxy, CoreDNS, kube-router; Ready
    ...
    node.stop()

The layout (`real_node_config`): each node process runs in the node's network namespace (`nsenter --net`,
nothing else of it apart: it shares the host's files, mounts and cgroups as a node's daemons do), so the
pods' bridge (10.244.<slot>.0/24, whose gateway is the node's address, where the kubelet serves and CoreDNS
answers), kube-proxy's Services and kube-router's firewall are the node's own; each pod's resolv.conf is
written by the kubelet (CoreDNS, the search domains of its namespace). The host reaches the pods through the
link, and the pods reach the host (the API server, the registry, a test's servers) at its end of it. Only the
host and the node's pods reach any of it.

`NODE_SLOTS` nodes per machine, each in a slot of its own: its network, its cgroup root, its image store
(which containerd holds alone) and a lock there that holds another node back until the slot is free. A
node leaves the machine as it found it: its processes, mounts, network namespace, cgroups and the three
sysctls the kubelet sets (`HostState`); a run killed before that is cleaned up by the slot's next node's
`prepare`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import yaml
from tools import CACHE_DIR, file_lock

from .common import NODE, SCRIPTS, free_port, http_ok, pinned, self_signed_certificate, stop_process, wait_until
from .control_plane import ADMIN, ControlPlane
from .real_cluster import Objects, Rest
from .real_node_config import (
    IMAGE_REGISTRY,
    NODE_SLOTS,
    NodeLayout,
    NodeNetwork,
    cni_network,
    containerd_config,
    corefile,
    json_file,
    kube_proxy_config,
    kube_router_argv,
    kubelet_config,
    node_parts_rbac,
    own_registry_hosts,
    registry_hosts,
)
from .real_node_host import HostState, NodeProcesses, make_node_network
from .real_node_pods import NodeContainers

#: Node slot 0's containerd image store (and the slot's lock and record), kept between runs: pulling the
#: trainer image takes a minute. The other slots' are beside it (`image_store`).
IMAGE_STORE = CACHE_DIR / "node-images"
#: The pause image's name, as scripts/build-node writes it into its archive (pinned there only).
PAUSE_IMAGE = pinned("build-node", "PAUSE_IMAGE")


def node_bin() -> Path:
    found = subprocess.run([str(SCRIPTS / "build-node"), "--print-bin"], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise RuntimeError("the node is not built: run ./scripts/build-node (./scripts/test does)")
    return Path(found.stdout.strip().splitlines()[-1])


def image_store(slot: int) -> Path:
    return IMAGE_STORE if slot == 0 else IMAGE_STORE.with_name(f"{IMAGE_STORE.name}-{slot}")


@contextlib.contextmanager
def node_slot(timeout: float = 3600) -> Iterator[int]:
    """The first node slot free on this machine, held until the context ends (the kernel lets go when the
    holder dies, however it dies). Waits while every slot is held: the test scheduler never starts more
    beds than there are slots, so only a benchmark beside the tests waits here."""
    deadline = time.monotonic() + timeout
    while True:
        for slot in range(NODE_SLOTS):
            store = image_store(slot)
            store.mkdir(parents=True, exist_ok=True)
            lock = open(store / ".node.lock", "w")  # noqa: SIM115 (held past this function, closed below)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            try:
                yield slot
            finally:
                lock.close()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"every one of the machine's {NODE_SLOTS} node slots stayed held for {timeout:.0f} s")
        time.sleep(1)


def delete_node_pods(api: Objects, node_name: str, timeout: float = 90) -> None:
    """Every pod of the node deleted while its kubelet runs, so each sandbox's network is torn down through
    CNI (its address, its masquerade rules) as on any node. Cordoned first: the replacements a controller
    makes (the operator's, a Deployment's) then stay Pending, bound to no node."""
    api.patch("nodes", node_name, {"spec": {"unschedulable": True}})
    selector = f"spec.nodeName={node_name}"
    for pod in api.list("pods", all_namespaces=True, field_selector=selector):
        api.rest.call("DELETE", api.url("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]),
                      params={"gracePeriodSeconds": "1"})
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not api.list("pods", all_namespaces=True, field_selector=selector), timeout, 0.5,
                   "the node's pods gone")


class RealNode(NodeProcesses):
    """One node of real parts: see the module docstring."""

    def __init__(self, work: Path, *, node_name: str = NODE):
        self.work = Path(work)
        self.node_name = node_name
        self.registry = ""
        self.errors: list[str] = []
        self._stack = contextlib.ExitStack()
        self.containers = NodeContainers(self.ctr)
        self.timings: dict[str, float] = {}

    # ---- start ---------------------------------------------------------------------------------------

    def prepare(self) -> str:
        """Hold a node slot, clean up what a killed run left in it, and make the node's network (whose
        host end, `host_address`, the API server is to listen on). Returns that address."""
        slot = self._stack.enter_context(node_slot())
        store = image_store(slot)
        self.layout = NodeLayout(network=NodeNetwork(slot), work=self.work, images=store / "containerd",
                                 node_bin=node_bin(), pause_image=PAUSE_IMAGE, kubelet_port=free_port(),
                                 proxy_health_port=free_port(), proxy_metrics_port=free_port())
        self.host = HostState(store / "host-state.json", self.layout)
        NodeProcesses.__init__(self, self.work, self.host)
        net = self.layout.network
        self.address, self.host_address, self.pod_subnet = net.gateway, net.host_address, net.pod_subnet
        self.host.clean_up()
        self.work.mkdir(parents=True, exist_ok=True)
        make_node_network(self.layout.network)
        return self.host_address

    def start(self, plane: ControlPlane, registry: str, timeout: float = 180) -> RealNode:
        """`registry`: where the node pulls ghcr.io's images from (`registry.Registry`'s address)."""
        t0 = time.monotonic()
        self.plane, self.registry = plane, registry
        self.api = Objects(Rest(plane, plane.tokens[ADMIN]), "default")
        plane.apply(node_parts_rbac())
        self._start_containerd()
        self.ctr("images", "import", "--local", str(self.layout.node_bin / "pause.tar"))
        self.host.make_cgroup_root()
        # The kubelet sets three machine-wide sysctls as it starts; the machine is shared, so they go back
        # once it is up, one starting node at a time (another's would be recorded as the machine's).
        with file_lock(IMAGE_STORE / ".sysctls.lock"):
            self.host.record_sysctls()
            self._start_kubelet()
            wait_until(self._node_ready, timeout, 0.5, f"node {self.node_name} Ready (see {self.work}/kubelet.log)")
            self.host.restore_sysctls()
        # The others find their Node by name as they start: kube-router gives up without it.
        self._start_services()
        wait_until(lambda: http_ok(f"http://{self.address}:{self.layout.proxy_health_port}/healthz"), timeout, 0.2,
                   "kube-proxy healthy")
        wait_until(lambda: http_ok(f"http://{self.address}:{self.coredns_ready_port}/ready"), timeout, 0.2,
                   "CoreDNS ready (its kubernetes plugin synced)")
        wait_until(self.host.firewall_installed, timeout, 0.5, "kube-router's firewall chains in place")
        # Admission tainted the new Node not-ready; the node-lifecycle controller would lift it once the
        # node reports Ready, and it does not run here (control_plane), so the admin does, once the node's
        # Services, names and policies work: no pod lands on it before.
        self.api.patch("nodes", self.node_name, {"spec": {"taints": None}})
        self.timings["node_seconds"] = time.monotonic() - t0
        return self

    def ctr(self, *args: str, stdin: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.layout.node_bin / "ctr"), "--address", str(self.layout.containerd_socket),
                               "--namespace", "k8s.io", *args], stdin=stdin, capture_output=True, text=True,
                              timeout=timeout, check=True)

    def _start_containerd(self) -> None:
        (self.work / "containerd").mkdir(parents=True, exist_ok=True)
        config = self.work / "containerd.toml"
        config.write_text(containerd_config(self.layout))
        json_file(self.layout.cni_conf_dir / "10-kuberl-node.conflist", cni_network(self.layout))
        for name, text in ((IMAGE_REGISTRY, registry_hosts(self.registry)),
                           (self.registry, own_registry_hosts(self.registry))):
            hosts = self.layout.registry_hosts / name / "hosts.toml"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(text)
        # containerd finds its runc shim on PATH
        env = {**os.environ, "PATH": f"{self.layout.node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._spawn("containerd", [self.layout.node_bin / "containerd", "--config", config], env=env)

        def up() -> bool:
            self._check_alive()
            return self.layout.containerd_socket.exists()

        wait_until(up, 60, 0.1, "containerd's socket")

    def _start_kubelet(self) -> None:
        pki = self.work / "pki"
        serving = self_signed_certificate(pki, "kubelet", self.node_name, [f"IP:{self.address}",
                                                                          f"DNS:{self.node_name}"])
        (self.work / "resolv.conf").write_text(f"nameserver {self.address}\n")
        config = self.work / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.layout, self.plane.work / "pki" / "kubelet-client.crt",
                                                        serving)))
        self._spawn("kubelet", [
            self.plane.bin / "kubelet", f"--config={config}",
            f"--kubeconfig={self.plane.kubeconfig('kubelet', self.plane.tokens['node'])}",
            f"--root-dir={self.work / 'kubelet'}", f"--cert-dir={pki}", f"--hostname-override={self.node_name}",
            f"--node-ip={self.address}", "--v=1"])

    def _start_services(self) -> None:
        """kube-proxy, CoreDNS (with its readiness on loopback) and kube-router, each as its own identity."""
        plane = self.plane
        proxy_config = self.work / "kube-proxy.yaml"
        proxy_config.write_text(yaml.safe_dump(kube_proxy_config(
            self.layout, plane.kubeconfig("kube-proxy", plane.tokens["kube-proxy"]), self.node_name)))
        self._spawn("kube-proxy", [plane.bin / "kube-proxy", f"--config={proxy_config}", "--v=1"])
        self.coredns_ready_port = free_port()
        dns_config = self.work / "Corefile"
        dns_config.write_text(corefile(plane.kubeconfig("coredns", plane.tokens["coredns"]), self.coredns_ready_port,
                                          self.address))
        self._spawn("coredns", [self.layout.node_bin / "coredns", "-conf", dns_config])
        self._spawn("kube-router", kube_router_argv(
            self.layout.node_bin, plane.kubeconfig("kube-router", plane.tokens["kube-router"]), self.node_name))

    def _node_ready(self) -> bool:
        self._check_alive()
        node = self.api.get("nodes", self.node_name) or {}
        conditions = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
        return conditions.get("Ready") == "True"

    # ---- what the bed asks of a node -----------------------------------------------------------------

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The host directory behind a PersistentVolumeClaim (a hostPath volume the kubelet mounts). Open
        to every user, as a local-path provisioner makes its directories: a hostPath gets no fsGroup."""
        path = self.work / "claims" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        return path

    # ---- stop ----------------------------------------------------------------------------------------

    def stop(self) -> None:
        try:
            if not hasattr(self, "host"):  # no slot held: nothing made
                return
            if "kubelet" in self.processes and self.processes["kubelet"].poll() is None:
                with contextlib.suppress(Exception):
                    delete_node_pods(self.api, self.node_name)
            for name in ("kube-router", "coredns", "kube-proxy", "kubelet"):
                if name in self.processes:
                    stop_process(self.processes[name], 15)
            self.host.stop_containers(self)
            if "containerd" in self.processes:
                stop_process(self.processes["containerd"], 15)
            self.host.clean_up()
        finally:
            self._stack.close()
            shutil.rmtree(self.work / "claims", ignore_errors=True)


__all__ = ["IMAGE_STORE", "PAUSE_IMAGE", "RealNode", "image_store", "node_bin", "node_slot"]

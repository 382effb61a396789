"""
What a real node's parts read (`real_node.RealNode`): containerd's configuration, the CNI network, the
kubelet's and kube-proxy's configuration files, CoreDNS's Corefile, and the RBAC that CoreDNS and
kube-router run under. Pure functions of the node's layout (`NodeLayout`), so a unit test reads them
without starting anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .common import Body

#: Real nodes one machine runs at once: each in a network namespace of its own (`NodeNetwork`), so its
#: bridge, firewall, Services and DNS are its own; the kernel, the cgroups and the disk are shared.
NODE_SLOTS = 2
#: The pods' bridge, in the node's network namespace (each node has one of that name).
BRIDGE = "kuberl-pods"
CNI_NETWORK = "kuberl-node"
#: The control plane's Service range (control_plane.apiserver_flags), which kube-proxy and kube-router are told.
SERVICE_SUBNET = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"


@dataclasses.dataclass(frozen=True)
class NodeNetwork:
    """Node slot `slot`'s network. Its namespace holds the node's processes' network (the kubelet, containerd
    and so the pods' bridge, kube-proxy's and kube-router's firewall rules, CoreDNS) as a machine's own
    network holds a node's. Pods on 10.244.<slot>.0/24 behind a bridge whose address, the gateway, is the
    node's (the kubelet serves and CoreDNS answers there); a link to the host, whose end 10.243.<slot>.1 is
    where the API server and the registry listen, and the host's route to the pods through it. Nothing else
    on this machine uses the ranges."""

    slot: int

    @property
    def netns(self) -> str:
        return f"kuberl-node{self.slot}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def enter(self) -> list[str]:
        """The prefix that runs a command in the namespace (and nothing else of it apart)."""
        return ["nsenter", f"--net={self.netns_path}", "--"]

    @property
    def pod_subnet(self) -> str:
        return f"10.244.{self.slot}.0/24"

    @property
    def gateway(self) -> str:
        return f"10.244.{self.slot}.1"

    @property
    def host_address(self) -> str:
        """The host's end of the link: what the node and its pods reach the host at."""
        return f"10.243.{self.slot}.1"

    @property
    def link_address(self) -> str:
        """The node's end of the link (the source of the pods' traffic to the host, masqueraded)."""
        return f"10.243.{self.slot}.2"

    @property
    def host_link(self) -> str:
        return f"kuberl-host{self.slot}"

    @property
    def node_link(self) -> str:
        return f"kuberl-link{self.slot}"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's parent cgroup, made in every cgroup v1 hierarchy before it starts."""
        return f"/kuberl-node{self.slot}"


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """Where one node's parts keep their files, and the ports its servers take."""

    network: NodeNetwork
    work: Path           # this node's files, removed with it
    images: Path         # containerd's root: the image store, kept between runs (imports take minutes)
    node_bin: Path       # scripts/build-node's binaries
    pause_image: str
    kubelet_port: int
    proxy_health_port: int
    proxy_metrics_port: int

    @property
    def containerd_socket(self) -> Path:
        return self.work / "containerd" / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.work / "cni"

    @property
    def pod_logs(self) -> Path:
        return self.work / "pod-logs"

    @property
    def registry_hosts(self) -> Path:
        return self.work / "registries"


def containerd_config(layout: NodeLayout) -> str:
    """containerd v2's configuration (version 3) for the kubelet's CRI, on cgroup v1 with cgroupfs.

    `restrict_oom_score_adj`: this machine lacks CAP_SYS_RESOURCE, so runc cannot give a sandbox the
    oom_score_adj of -998 the kubelet asks, and every sandbox would fail without it. Images are pulled
    through the registries' hosts files (`registry_hosts`); the pause image is imported from its archive
    and pinned, so that garbage collection never removes it. A layer's compressed blob is dropped once
    unpacked (the transfer service would ignore that, so pulls are containerd's local ones): each node slot
    has a store of its own, and the unpacked snapshots are what pods run from."""
    state = layout.work / "containerd"
    return f"""version = 3
root = "{layout.images}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{layout.containerd_socket}"
[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"
[debug]
  address = ""
  level = "warn"
[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "{state / 'opt'}"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    discard_unpacked_layers = true
    use_local_image_pull = true
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{layout.pause_image}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{layout.registry_hosts}'
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    restrict_oom_score_adj = true
    disable_apparmor = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/sbin/runc'
          Root = '{state / 'runc'}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = '{layout.cni_conf_dir}'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


#: The registry KubeRL's images are named after (the chart's defaults: ghcr.io/kuberl/kuberl-*).
IMAGE_REGISTRY = "ghcr.io"


def own_registry_hosts(registry: str) -> str:
    """containerd's hosts file for the bed's registry under its own name (a user's own images, pushed there
    as to a cluster's private registry): plain HTTP."""
    return f"""server = "http://{registry}"

[host."http://{registry}"]
  capabilities = ["pull", "resolve"]
"""


def registry_hosts(mirror: str) -> str:
    """containerd's hosts file for ghcr.io: resolve and pull from `mirror` (a registry on loopback, plain
    HTTP), as an air-gapped cluster's nodes pull through a mirror; the upstream stays the server of record,
    which this machine cannot reach."""
    return f"""server = "https://{IMAGE_REGISTRY}"

[host."http://{mirror}"]
  capabilities = ["pull", "resolve"]
"""


def cni_network(layout: NodeLayout) -> dict[str, Any]:
    """The pods' network: Debian's bridge (on the node's bridge, made beforehand), host-local addresses,
    portmap for hostPorts and loopback; masquerade for traffic leaving the pod range."""
    net = layout.network
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": str(layout.work / "cni-ipam"),
                  "ranges": [[{"subnet": net.pod_subnet, "gateway": net.gateway}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "loopback"},
    ]}


def kubelet_config(layout: NodeLayout, client_ca: Path, serving: tuple[Path, Path]) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration. What this machine needs: cgroup v1 allowed (`failCgroupV1`,
    refused by default since 1.35) with the cgroupfs driver (no systemd), swap tolerated, no node
    allocatable enforcement (its cgroups would need controllers the VM's hybrid layout lacks). Image
    garbage collection off (100%): the trainer image takes minutes to import, and the machine's disk is
    shared with everything else; eviction only when a resource is nearly gone."""
    cert, key = serving
    net = layout.network
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": net.cgroup_root, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": [], "failSwapOn": False,
        "address": net.gateway, "port": layout.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "imageServiceEndpoint": f"unix://{layout.containerd_socket}",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(client_ca)}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "rotateCertificates": False, "serverTLSBootstrap": False,
        "clusterDomain": CLUSTER_DOMAIN, "clusterDNS": [net.gateway], "resolvConf": str(layout.work / "resolv.conf"),
        # The kubelet would set vm.overcommit_memory, kernel.panic and kernel.panic_on_oops for the whole
        # machine; it checks them instead only when told to protect them, so the node puts them back.
        "protectKernelDefaults": False,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "maxPods": 110, "podPidsLimit": 4096, "podLogsDir": str(layout.pod_logs),
        "staticPodPath": "", "registerNode": True,
    }


def kube_proxy_config(layout: NodeLayout, kubeconfig: Path, node_name: str) -> dict[str, Any]:
    """kube-proxy in iptables mode, its servers on the node's address. No machine-wide conntrack settings
    (a zero leaves each as it is) and no NodePorts on 127.0.0.1 (which would need route_localnet for every
    interface): NodePorts answer on the node's bridge address only."""
    net = layout.network
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": node_name, "mode": "iptables",
        "clusterCIDR": net.pod_subnet, "bindAddress": net.gateway,
        "healthzBindAddress": f"{net.gateway}:{layout.proxy_health_port}",
        "metricsBindAddress": f"{net.gateway}:{layout.proxy_metrics_port}",
        "nodePortAddresses": [f"{net.gateway}/32"],
        "iptables": {"localhostNodePorts": False},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(kubeconfig: Path, ready_port: int, address: str) -> str:
    """CoreDNS as a cluster's DNS answers: Services and pods of cluster.local from the API server, reverse
    lookups of the pod and Service ranges. No upstream: this machine reaches no outside resolver, so any
    other name fails at once rather than after a timeout. It answers on the node's `address`, where `ready`
    answers 200 once the kubernetes plugin has synced with the API server."""
    return f""".:53 {{
    bind {address}
    errors
    ready {address}:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    loop
}}
"""


def kube_router_argv(node_bin: Path, kubeconfig: Path, node_name: str) -> list[str]:
    """kube-router's firewall only: pod routing is the bridge's, Services kube-proxy's."""
    return [str(node_bin / "kube-router"), f"--kubeconfig={kubeconfig}", "--run-firewall=true", "--run-router=false",
            "--run-service-proxy=false", "--enable-cni=false", "--enable-pod-egress=false",
            f"--hostname-override={node_name}", f"--service-cluster-ip-range={SERVICE_SUBNET}", "--health-port=0",
            "--metrics-port=0", "--v=1"]


def _cluster_role(name: str, rules: list[Body], user: str) -> list[Body]:
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]


def node_parts_rbac() -> list[Body]:
    """What CoreDNS and kube-router may read: the rules of their own release manifests (CoreDNS's
    `system:coredns` ClusterRole; kube-router's, less what its router and service proxy need, which the
    node does not run). kube-proxy's is Kubernetes' own bootstrap role, `system:node-proxier`."""
    read = ["get", "list", "watch"]
    watch = ["list", "watch"]
    coredns = [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": watch},
               {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": watch}]
    router = [{"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
               "verbs": read},
              {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
              {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
              {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]
    return [*_cluster_role("kuberl-bed:coredns", coredns, "system:coredns"),
            *_cluster_role("kuberl-bed:kube-router", router, "system:kube-router")]


def json_file(path: Path, body: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1))
    return path


__all__ = ["BRIDGE", "CLUSTER_DOMAIN", "CNI_NETWORK", "IMAGE_REGISTRY", "NODE_SLOTS", "SERVICE_SUBNET",
           "NodeLayout", "NodeNetwork", "cni_network", "containerd_config", "corefile", "json_file",
           "kube_proxy_config", "kube_router_argv", "kubelet_config", "node_parts_rbac", "own_registry_hosts",
           "registry_hosts"]

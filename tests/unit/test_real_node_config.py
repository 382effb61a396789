"""What a real node's parts are told (tests/bed/real_node_config.py): each node slot's network is its own,
and every part of a node reads its own slot's addresses. Two nodes run at once on one machine, so an
address, link, namespace or cgroup two slots shared would mix their pods."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from bed.real_node import image_store
from bed.real_node_config import (
    NODE_SLOTS,
    SERVICE_SUBNET,
    NodeLayout,
    NodeNetwork,
    cni_network,
    corefile,
    kube_proxy_config,
    kubelet_config,
)


def layout(slot: int) -> NodeLayout:
    return NodeLayout(network=NodeNetwork(slot), work=Path(f"/tmp/node{slot}"), images=image_store(slot) / "containerd",
                      node_bin=Path("/bin"), pause_image="pause", kubelet_port=10250, proxy_health_port=10256,
                      proxy_metrics_port=10249)


def test_no_two_slots_share_an_address_a_link_a_namespace_a_cgroup_or_a_store():
    slots = [layout(slot) for slot in range(NODE_SLOTS)]
    for field in ("netns", "pod_subnet", "gateway", "host_address", "link_address", "host_link", "node_link",
                  "cgroup_root"):
        values = [getattr(each.network, field) for each in slots]
        assert len(set(values)) == NODE_SLOTS, (field, values)
    assert len({each.images for each in slots}) == NODE_SLOTS
    networks = [ipaddress.ip_network(each.network.pod_subnet) for each in slots]
    links = [ipaddress.ip_network(f"{each.network.host_address}/30", strict=False) for each in slots]
    ranges = [*networks, *links, ipaddress.ip_network(SERVICE_SUBNET)]
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1:]), ranges
    for each in slots:
        net = each.network
        assert ipaddress.ip_address(net.gateway) in ipaddress.ip_network(net.pod_subnet)
        assert ipaddress.ip_address(net.link_address) in ipaddress.ip_network(f"{net.host_address}/30", strict=False)
        assert net.enter == ["nsenter", f"--net=/run/netns/{net.netns}", "--"]


def test_every_part_of_a_node_reads_its_own_slots_addresses():
    each = layout(1)
    net = each.network
    ipam = cni_network(each)["plugins"][0]["ipam"]
    assert ipam["ranges"] == [[{"subnet": net.pod_subnet, "gateway": net.gateway}]]
    kubelet = kubelet_config(each, Path("/ca.crt"), (Path("/tls.crt"), Path("/tls.key")))
    assert (kubelet["address"], kubelet["clusterDNS"], kubelet["cgroupRoot"]) == (net.gateway, [net.gateway],
                                                                                   net.cgroup_root)
    proxy = kube_proxy_config(each, Path("/kubeconfig"), "node")
    assert proxy["clusterCIDR"] == net.pod_subnet and proxy["bindAddress"] == net.gateway
    assert proxy["healthzBindAddress"].startswith(f"{net.gateway}:")
    assert proxy["nodePortAddresses"] == [f"{net.gateway}/32"]
    dns = corefile(Path("/kubeconfig"), 8181, net.gateway)
    assert f"bind {net.gateway}" in dns and f"ready {net.gateway}:8181" in dns

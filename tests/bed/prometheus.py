"""
Prometheus for a bed, configured as a cluster's Prometheus that discovers pods by annotation: Debian's
binary scraping the pods that ask for it (`prometheus.io/scrape`, `/port`, `/path`), found through the
targets a `kubernetes_sd_configs` role `pod` would give (`pod_targets`, served over HTTP SD).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import threading
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import yaml

from .common import free_port, http_ok, start_process, stop_process, wait_until

if TYPE_CHECKING:
    from .cluster_bed import BedApi


class BedPrometheus:
    """A part of `OneNodeCluster`: Prometheus started on request (`prometheus=True`), stopped with the bed."""

    workdir: pathlib.Path
    cluster: BedApi
    prometheus_url: str | None
    _stack: contextlib.ExitStack

    def _start_prometheus(self) -> None:
        from tools import prometheus_binary

        port = free_port()
        sd_port = self._serve_pod_targets()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                # Prometheus's own example for annotation-driven pod discovery
                # (documentation/examples/prometheus-kubernetes.yml, job "kubernetes-pods").
                "job_name": "kubernetes-pods",
                # Debian builds Prometheus without kubernetes_sd_configs: the bed serves the same
                # targets with the same __meta_kubernetes_pod_* labels over HTTP SD (see pod_targets).
                "http_sd_configs": [{"url": f"http://127.0.0.1:{sd_port}/targets", "refresh_interval": "1s"}],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                     "action": "keep", "regex": "true"},
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                     "action": "replace", "target_label": "__metrics_path__", "regex": "(.+)"},
                    {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                     "action": "replace", "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
                     "target_label": "__address__"},
                    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace",
                     "target_label": "kubernetes_pod_name"},
                ],
            }],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        proc = start_process(
            [prometheus_binary(), f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], self.workdir / "prometheus.log")
        self._stack.callback(stop_process, proc)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{self.prometheus_url}/-/ready"), 30, 0.2, "Prometheus ready")

    def _serve_pod_targets(self) -> int:
        bed = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(pod_targets(bed.cluster.list("pods", all_namespaces=True))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._stack.callback(server.server_close)
        self._stack.callback(server.shutdown)
        return server.server_address[1]

    def prometheus_query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]


def _label_name(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus's `kubernetes_sd_configs` role `pod`, as HTTP SD: a target per container port
    (`podIP:port`), or one per pod without ports, with the `__meta_kubernetes_pod_*` labels."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        labels = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
            "__meta_kubernetes_pod_node_name": (pod.get("spec") or {}).get("nodeName", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": conditions.get("Ready", "unknown").lower(),
        }
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{_label_name(key)}"] = value
            labels[f"__meta_kubernetes_pod_labelpresent_{_label_name(key)}"] = "true"
        for key, value in (meta.get("annotations") or {}).items():
            labels[f"__meta_kubernetes_pod_annotation_{_label_name(key)}"] = value
            labels[f"__meta_kubernetes_pod_annotationpresent_{_label_name(key)}"] = "true"
        targets = []
        for container in (pod.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                targets.append((f"{ip}:{port['containerPort']}", {
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")}))
        if not targets:
            targets.append((ip, {}))
        for address, extra in targets:
            groups.append({"targets": [address], "labels": {**labels, **extra}})
    return groups


__all__ = ["BedPrometheus", "pod_targets"]

"""
A one-node Kubernetes stand-in for end-to-end tests and benchmarks: the API emulator, a node agent
that runs Pods as podman containers, the chart's CRD and RBAC, and the operator running from its
image as a Pod made from the chart's Deployment, all on a podman network of the bed's own.

    with OneNodeCluster(workdir) as bed:
        bed.kubectl("apply", "-f", "examples/cartpole-ppo.yaml")
        bed.kubectl("wait", "--for=condition=Complete", "rltj/cartpole-ppo", "--timeout=300s")

The emulator listens on the network's gateway address, which the host and every container reach;
nothing listens beyond this machine and the bed's own bridge. Images come from
`scripts/build-images` (`ensure_images`).

The operator's Pod is the chart's Deployment template as a ReplicaSet would stamp it, plus one
thing: a ConfigMap with a kubeconfig for the emulator (`$KUBECONFIG`), standing in for the
service-account token a real cluster mounts (the emulator speaks plain HTTP and has no tokens).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import kmock
import yaml

from .k8s_emulator import ALL_VERBS, EmulatedCluster, KubernetesApiEmulator, write_kubeconfig
from .node_agent import NodeAgent, Podman, free_subnet, podman_network, wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kuberl-operator"
OPERATOR_IMAGE = "ghcr.io/kuberl/kuberl-operator:0.1.0"
TRAINER_IMAGE = "ghcr.io/kuberl/kuberl-trainer:0.1.0"
OPERATOR_NAMESPACE = "kuberl-system"
BED_LABEL = "kuberl.dev/test-bed"


def _resource(group: str, version: str, plural: str, kind: str, namespaced: bool, short: tuple[str, ...] = ()
              ) -> tuple[kmock.resource, kmock.ResourceInfo]:
    return kmock.resource(group, version, plural), kmock.ResourceInfo(
        kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=ALL_VERBS, shortnames=set(short),
        categories=set(), subresources=set())


#: What `helm template` of the chart and the operator's children need beyond the emulator's built-ins.
EXTRA_RESOURCES = dict([
    _resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ("netpol",)),
    _resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _resource("apps", "v1", "deployments", "Deployment", True, ("deploy",)),
])


def ensure_images(force: bool = False) -> dict[str, float]:
    """Build both images with scripts/build-images (a no-op when their inputs are unchanged).

    KUBERL_E2E_PREBUILT=1 uses the images as they are (when you built them yourself)."""
    started = time.monotonic()
    if os.environ.get("KUBERL_E2E_PREBUILT") == "1" and not force:
        return {"seconds": 0.0}
    cmd = [str(REPO / "scripts" / "build-images")] + (["--force"] if force else [])
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/build-images failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return {"seconds": time.monotonic() - started}


def helm(*args: str) -> str:
    from tools import helm_binary

    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {result.stderr}")
    return result.stdout


class OneNodeCluster:
    """The bed: see the module docstring. Use as a context manager."""

    def __init__(self, workdir: pathlib.Path, *, namespaces: tuple[str, ...] = ("default",),
                 helm_values: Mapping[str, str] | None = None, prometheus: bool = False,
                 operator: bool = True):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.id = secrets.token_hex(3)
        self.podman = Podman(self.workdir)
        self.namespaces = namespaces
        self.helm_values = {"operator.reconcileIntervalSeconds": "2", "operator.progressIntervalSeconds": "2",
                            **(helm_values or {})}
        self.want_prometheus = prometheus
        self.want_operator = operator
        self.network = f"kuberl-bed-{self.id}"
        self.anchor = f"kuberl-bed-{self.id}-gateway"
        self._stack = contextlib.ExitStack()
        self.timings: dict[str, float] = {}
        self.prometheus_url: str | None = None

    # ---- start and stop ----------------------------------------------------------------------------

    def __enter__(self) -> OneNodeCluster:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        t0 = time.monotonic()
        subnet = free_subnet(self.podman, int(self.id, 16))
        self._stack.enter_context(podman_network(self.podman, self.network, subnet))
        # The bridge and its gateway address exist once something is attached: an empty pod (its
        # infra container only) holds them up, so the API server can listen there before any pod runs.
        last_ip = str(list(__import__("ipaddress").ip_network(subnet).hosts())[-1])
        self.podman("pod", "create", "--name", self.anchor, "--network", self.network, "--ip", last_ip,
                    "--label", f"{BED_LABEL}={self.id}")
        self.podman("pod", "start", self.anchor)
        self._stack.callback(self.podman, "pod", "rm", "--force", "--time", "0", self.anchor, check=False)
        self.agent = NodeAgent("http://unset", self.workdir / "node", network=self.network, subnet=subnet,
                               podman=self.podman, labels={BED_LABEL: self.id})
        self.gateway = self.agent.host_ip
        self.emulator = KubernetesApiEmulator(
            crds=(), namespaces=["default", OPERATOR_NAMESPACE, *self.namespaces],
            extra_resources=EXTRA_RESOURCES, graceful_pod_deletion=True, pod_logs=self.agent.pod_logs)
        self.cluster = EmulatedCluster(self.emulator, self.workdir / "k8s", namespace=self.namespaces[0],
                                       host=self.gateway)
        self._stack.enter_context(self.cluster)
        self._stack.callback(self._check_emulator)
        self.agent.api.server = self.cluster.url
        self._stack.enter_context(self.agent)
        self.timings["bed_seconds"] = time.monotonic() - t0
        self.install_chart()
        if self.want_prometheus:
            self._start_prometheus()
        if self.want_operator:
            self.start_operator()

    def _check_emulator(self) -> None:
        assert not self.emulator.internal_errors, f"the Kubernetes emulator failed: {self.emulator.internal_errors!r}"

    @property
    def env(self) -> dict[str, str]:
        return self.cluster.env

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, check=check, timeout=timeout, input=input)

    # ---- the chart ---------------------------------------------------------------------------------

    def render_chart(self) -> list[dict[str, Any]]:
        sets = [a for k, v in self.helm_values.items() for a in ("--set", f"{k}={v}")]
        text = helm("template", "kuberl-operator", str(CHART), "--namespace", OPERATOR_NAMESPACE, *sets)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def install_chart(self) -> None:
        """What `helm install` does, by hand: the CRDs, then the chart's RBAC and ServiceAccount."""
        self.kubectl("apply", "--validate=false", "-f", str(CHART / "crds"))
        self.manifests = self.render_chart()
        wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
        docs = [doc for doc in self.manifests if doc["kind"] in wanted]
        self.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(docs))

    def operator_pod(self) -> dict[str, Any]:
        """The Pod the chart's Deployment would get, plus the kubeconfig (see the module docstring)."""
        deployment = next(d for d in self.manifests if d["kind"] == "Deployment")
        template = json.loads(json.dumps(deployment["spec"]["template"]))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**template["metadata"], "name": f"{deployment['metadata']['name']}-{self.id}",
                            "namespace": OPERATOR_NAMESPACE},
               "spec": template["spec"]}
        container = pod["spec"]["containers"][0]
        container.setdefault("env", []).append({"name": "KUBECONFIG", "value": "/var/run/kuberl-test/kubeconfig"})
        container.setdefault("volumeMounts", []).append(
            {"name": "kube-api-access", "mountPath": "/var/run/kuberl-test", "readOnly": True})
        pod["spec"].setdefault("volumes", []).append(
            {"name": "kube-api-access", "configMap": {"name": "kuberl-test-kubeconfig"}})
        return pod

    def start_operator(self) -> None:
        kubeconfig = write_kubeconfig(self.workdir / "operator-kubeconfig", self.cluster.url, OPERATOR_NAMESPACE)
        config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "kuberl-test-kubeconfig", "namespace": OPERATOR_NAMESPACE},
                      "data": {"kubeconfig": kubeconfig.read_text()}}
        if self.cluster.get("configmaps", "kuberl-test-kubeconfig", OPERATOR_NAMESPACE) is None:
            self.cluster.create(config_map)
        pod = self.operator_pod()
        self.operator_pod_name = pod["metadata"]["name"]
        self.cluster.create(pod)
        self.wait_pod_ready(OPERATOR_NAMESPACE, self.operator_pod_name, 120)

    def stop_operator(self) -> None:
        self.kubectl("delete", "pod", "-n", OPERATOR_NAMESPACE, self.operator_pod_name, "--wait=true",
                     "--timeout=120s")

    def operator_logs(self) -> str:
        return self.kubectl("logs", "-n", OPERATOR_NAMESPACE, self.operator_pod_name, check=False).stdout

    # ---- waiting -----------------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cluster.get("pods", name, namespace)

    def wait_pod_ready(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            status = (pod or {}).get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {namespace}/{name} ended: {json.dumps(status, indent=1)}\n"
                                     f"{self.kubectl('logs', '-n', namespace, name, check=False).stdout[-3000:]}")
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return pod if conditions.get("Ready") == "True" else None

        return wait_until(ready, timeout, 0.2, f"pod {namespace}/{name} Ready")

    def stamp_deployment(self, namespace: str, name: str) -> list[str]:
        """What a Deployment's ReplicaSet would do, once: its replicas as Pods (owned by the Deployment,
        so they go with it). The emulator runs no controllers; returns the pod names."""
        deployment = self.cluster.get("deployments", name, namespace)
        template = json.loads(json.dumps(deployment["spec"]["template"]))
        owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                 "uid": deployment["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        pods = []
        for i in range(int(deployment["spec"].get("replicas", 1))):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {**template.get("metadata", {}), "name": f"{name}-{self.id}-{i}",
                                "namespace": namespace, "ownerReferences": [owner]},
                   "spec": template["spec"]}
            self.cluster.create(pod)
            pods.append(pod["metadata"]["name"])
        return pods

    def wait_complete(self, namespace: str, job: str, timeout: int) -> None:
        """`kubectl wait --for=condition=Complete`; on failure, fail the test with what a user would look at."""
        import pytest

        result = self.kubectl("wait", "-n", namespace, f"rltj/{job}", "--for=condition=Complete",
                              f"--timeout={timeout}s", check=False, timeout=timeout + 30)
        if result.returncode != 0:
            status = self.cluster.get("rltj", job, namespace).get("status")
            pods = self.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            logs = self.kubectl("logs", "-n", namespace, f"{job}-learner", "--tail=60", check=False)
            pytest.fail(f"{job} did not complete: {result.stderr}\nstatus: {json.dumps(status, indent=1)}\n{pods}\n"
                        f"learner log:\n{logs.stdout}{logs.stderr}\noperator log:\n{self.operator_logs()[-4000:]}")

    def bed_containers(self, running_only: bool = True) -> list[str]:
        """Names of this bed's pod containers (the gateway holder excluded)."""
        args = ["ps", "--format", "{{.Names}}", "--filter", f"label={BED_LABEL}={self.id}"]
        if not running_only:
            args.append("--all")
        names = self.podman(*args).stdout.split()
        return [n for n in names if n != self.anchor]

    # ---- Prometheus, configured as a cluster's Prometheus that discovers pods by annotation --------

    def _start_prometheus(self) -> None:
        from tools import prometheus_binary

        port = _free_port(self.gateway)
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
        log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115 (closed by the stack)
        self._stack.callback(log.close)
        proc = subprocess.Popen(
            [str(prometheus_binary()), f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._stack.callback(_stop_process, proc)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _http_ok(f"{self.prometheus_url}/-/ready"), 30, 0.2, "Prometheus ready")

    def _serve_pod_targets(self) -> int:
        import http.server
        import threading

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


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def require_podman_and_images() -> None:
    """For a test module on real containers: fail in CI when podman is missing (skip elsewhere), and
    build the images when their inputs changed."""
    import pytest
    from tools import in_ci

    reason = podman_ready()
    if reason:
        if in_ci():
            pytest.fail(f"the end-to-end bed cannot run: {reason}")
        pytest.skip(reason)
    ensure_images()


@contextlib.contextmanager
def bed_for_tests(workdir: pathlib.Path, **options: Any) -> Iterator[OneNodeCluster]:
    """A bed for a test module: fails in CI when podman is missing (skips elsewhere), builds the images
    when their inputs changed, and checks at the end that the node agent itself saw no error."""
    require_podman_and_images()
    with OneNodeCluster(workdir, **options) as running:
        print(f"end-to-end mode: podman containers on network {running.network}")
        yield running
        assert not running.agent.errors, running.agent.errors


def podman_ready() -> str | None:
    """Why the bed cannot run here, or None when it can."""
    if not Podman.available():
        return "podman and runc are not installed (./scripts/test installs them with apt-get)"
    if not (REPO / "scripts" / "build-images").exists() and os.environ.get("KUBERL_E2E_PREBUILT") != "1":
        return "scripts/build-images is missing"
    return None


__all__ = ["OPERATOR_IMAGE", "TRAINER_IMAGE", "OneNodeCluster", "ensure_images", "podman_ready"]

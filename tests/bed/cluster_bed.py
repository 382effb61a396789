"""
A one-node Kubernetes cluster for end-to-end tests and benchmarks: the real control plane
(`control_plane.ControlPlane`), a real node (`real_node.RealNode`: a kubelet, containerd, kube-proxy,
CoreDNS, kube-router, in a network namespace of its own), and the operator installed with its chart
(`helm install`) and running from its image.

    with OneNodeCluster(workdir) as bed:
        bed.kubectl("apply", "-f", "examples/cartpole-ppo.yaml")
        bed.kubectl("wait", "--for=condition=Complete", "rltj/cartpole-ppo", "--timeout=300s")

The API server listens on the host's end of the node's link, which the host and every pod reach;
nothing listens beyond this machine and the node's own network. The operator is the chart's Deployment:
the Deployment and ReplicaSet controllers make its Pod, the scheduler binds it to the node, and it talks
to the API server with its ServiceAccount's token, as on any cluster. Claims get a volume the bed
provisions (a directory of the node's), as a cluster's default StorageClass would. Images come from
`scripts/build-images` (`ensure_images`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml
from tools import CACHE_DIR, file_lock

from .common import CHART, OPERATOR_CRDS, OPERATOR_NAMESPACE, RELEASE, REPO, Body, wait_until
from .control_plane import ADMIN, BUILD_SCRIPT, ControlPlane
from .kueue import Kueue
from .podman import Podman
from .prometheus import BedPrometheus
from .real_cluster import ApiError, Objects, Rest
from .real_node import RealNode
from .real_node_pods import LogKeeper
from .registry import Registry, store_lock

#: What a job's pods ask for on the bed's node, which offers this machine's two cores: a job with a few
#: workers fits beside the operator and a second job (the defaults, a CPU per worker and learner, would
#: leave it Pending, as on any 2-core node). Role -> spec.<role>.resources.
SMALL_REQUESTS = {"head": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                  "rolloutWorkers": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                  "learner": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}}
OPERATOR_IMAGE = "ghcr.io/kuberl/kuberl-operator:0.1.0"
TRAINER_IMAGE = "ghcr.io/kuberl/kuberl-trainer:0.1.0"
ROLLOUT_IMAGE = "ghcr.io/kuberl/kuberl-rollout:0.1.0"

#: The bed registry's blobs, kept between runs (a push of the trainer image takes about a minute).
REGISTRY_STORE = CACHE_DIR / "node-registry"


def push_images(registry: str) -> None:
    """`scripts/build-images --push`: each image the registry does not hold yet, pushed (one at a time on
    this machine, as the builds are, and never beside a garbage collection of the bed's store)."""
    with file_lock(REPO / ".cache" / "build-images.lock"), store_lock(REGISTRY_STORE):
        result = subprocess.run([str(REPO / "scripts" / "build-images"), "--push", registry], cwd=REPO,
                                capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/build-images --push failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")


def ensure_images(force: bool = False) -> dict[str, float]:
    """Build the images with scripts/build-images (a no-op when their inputs are unchanged).

    KUBERL_E2E_PREBUILT=1 uses the images as they are (when you built them yourself)."""
    started = time.monotonic()
    if os.environ.get("KUBERL_E2E_PREBUILT") == "1" and not force:
        return {"seconds": 0.0}
    cmd = [str(REPO / "scripts" / "build-images")] + (["--force"] if force else [])
    # One build at a time on this machine: test workers starting their beds together would otherwise
    # build the same images side by side. A second caller finds them up to date and returns at once.
    with file_lock(REPO / ".cache" / "build-images.lock"):
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/build-images failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return {"seconds": time.monotonic() - started}


class BedApi(Objects):
    """The bed's API server as its admin, in a default namespace (`Objects`; `kubectl` for the real thing)."""

    def __init__(self, plane: ControlPlane, namespace: str):
        super().__init__(Rest(plane, plane.tokens[ADMIN]), namespace)
        self.plane = plane
        self.kubeconfig = plane.kubeconfig(f"admin-{namespace}", plane.tokens[ADMIN], namespace)
        self.kubecache_dir = plane.work / "kube-cache"

    @property
    def env(self) -> dict[str, str]:
        """A subprocess's environment as the admin in this namespace, with the bed's kubectl first on PATH."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.kubecache_dir),
                "PATH": f"{self.plane.bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    def api_client(self) -> Any:
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        """The real kubectl, as the admin in this namespace."""
        done = self.plane.kubectl(*args, kubeconfig=self.kubeconfig, stdin=input, check=False, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done


class ClaimProvisioner:
    """What a default StorageClass's provisioner does, for this one node: each pending claim gets a
    PersistentVolume of its own (a directory of the node's, `RealNode.claim_dir`) that the controller
    manager's binder binds it to; the scheduler places no pod whose claim is unbound."""

    def __init__(self, api: BedApi, node: RealNode):
        self.api, self.node = api, node
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bed-claim-provisioner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        made: set[str] = set()
        while not self._stop.wait(0.2):  # a poll: claims are few, and a watch would add nothing here
            try:
                for claim in self.api.list("persistentvolumeclaims", all_namespaces=True):
                    uid = claim["metadata"]["uid"]
                    if uid not in made and not claim["spec"].get("volumeName"):
                        self._provision(claim)
                        made.add(uid)
            except (ApiError, OSError) as exc:
                if not self._stop.is_set():
                    self.errors.append(repr(exc))

    def _provision(self, claim: Body) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        path = self.node.claim_dir(meta["namespace"], meta["name"])
        self.api.create({"apiVersion": "v1", "kind": "PersistentVolume",
                         "metadata": {"name": f"pvc-{meta['uid']}"},
                         "spec": {"capacity": {"storage": size},
                                  "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                                  "storageClassName": spec.get("storageClassName") or "",
                                  "persistentVolumeReclaimPolicy": "Retain",
                                  "hostPath": {"path": str(path)},
                                  "claimRef": {"namespace": meta["namespace"], "name": meta["name"],
                                               "uid": meta["uid"]}}})


class ChartOperator:
    """A part of `OneNodeCluster`: the operator as its chart installs it (the CRDs first, then `helm install`
    without them), scaled, waited for and read from; and what a test waits for of the pods it makes."""

    cluster: BedApi
    helm_values: dict[str, str]
    manifests: list[Body]
    operator_deployment: str

    plane: ControlPlane
    workdir: pathlib.Path

    kubectl: Callable[..., subprocess.CompletedProcess[str]]

    def helm(self, *args: str, timeout: float = 300) -> str:
        """The helm built with the control plane, as the admin."""
        done = subprocess.run([str(self.plane.bin / "helm"), f"--kubeconfig={self.plane.admin_kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
                                   "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
                                   "HELM_DATA_HOME": str(self.workdir / "helm-data")})
        if done.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def install_chart(self) -> None:
        """The CRDs applied server-side (as the docs tell users: they are too big for client-side apply) and
        Established, then `helm install` of the chart without its CRDs: ServiceAccount, RBAC, the operator's
        Deployment."""
        self.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        self.cluster.rest.wait_established(*OPERATOR_CRDS)
        sets = [a for k, v in self.helm_values.items() for a in ("--set", f"{k}={v}")]
        self.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
                  "--skip-crds", *sets)
        self.manifests = [doc for doc in yaml.safe_load_all(self.helm(
            "get", "manifest", RELEASE, "--namespace", OPERATOR_NAMESPACE)) if doc]
        self.operator_deployment = next(d for d in self.manifests if d["kind"] == "Deployment")["metadata"]["name"]

    def operator_pods(self) -> list[Body]:
        deployment = self.cluster.get("deployments", self.operator_deployment, OPERATOR_NAMESPACE)
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        return self.cluster.list("pods", OPERATOR_NAMESPACE, label_selector=selector)

    @property
    def operator_pod_name(self) -> str:
        pods = [p for p in self.operator_pods() if not p["metadata"].get("deletionTimestamp")]
        if not pods:
            raise AssertionError(f"no operator pod in {OPERATOR_NAMESPACE}")
        return pods[0]["metadata"]["name"]

    def wait_operator_ready(self, timeout: float = 180) -> None:
        name = wait_until(lambda: next((p["metadata"]["name"] for p in self.operator_pods()
                                        if not p["metadata"].get("deletionTimestamp")), None),
                          60, 0.2, "the Deployment's ReplicaSet to make the operator's pod")
        self.wait_pod_ready(OPERATOR_NAMESPACE, name, timeout)

    def start_operator(self) -> None:
        """Scale the operator's Deployment back to its one replica and wait until it is Ready."""
        self.kubectl("scale", "deployment", self.operator_deployment, "-n", OPERATOR_NAMESPACE, "--replicas=1")
        self.wait_operator_ready()

    def stop_operator(self) -> None:
        """Scale the operator's Deployment to zero and wait until its pod is gone."""
        self.kubectl("scale", "deployment", self.operator_deployment, "-n", OPERATOR_NAMESPACE, "--replicas=0")
        wait_until(lambda: not self.operator_pods(), 120, 0.2, "the operator's pod gone")

    def operator_logs(self) -> str:
        return self.kubectl("logs", "-n", OPERATOR_NAMESPACE, f"deployment/{self.operator_deployment}",
                            check=False).stdout

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

    def deployment_pods(self, namespace: str, name: str, timeout: float = 60) -> list[str]:
        """The names of a Deployment's pods, once its ReplicaSet made all its replicas."""
        deployment = self.cluster.wait_for("deployments", name, namespace=namespace, timeout=timeout)
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        replicas = int(deployment["spec"].get("replicas", 1))

        def made() -> list[str] | None:
            pods = [p["metadata"]["name"] for p in self.cluster.list("pods", namespace, label_selector=selector)
                    if not p["metadata"].get("deletionTimestamp")]
            return pods if len(pods) >= replicas else None

        return wait_until(made, timeout, 0.2, f"deployment {namespace}/{name}'s {replicas} pod(s)")

    def wait_complete(self, namespace: str, job: str, timeout: int) -> None:
        """`kubectl wait --for=condition=Complete`; on failure, fail the test with what a user would look at."""
        import pytest

        result = self.kubectl("wait", "-n", namespace, f"rltj/{job}", "--for=condition=Complete",
                              f"--timeout={timeout}s", check=False, timeout=timeout + 30)
        if result.returncode != 0:
            status = (self.cluster.get("rltj", job, namespace) or {}).get("status")
            pods = self.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            logs = self.kubectl("logs", "-n", namespace, f"{job}-learner", "--tail=60", check=False)
            pytest.fail(f"{job} did not complete: {result.stderr}\nstatus: {json.dumps(status, indent=1)}\n{pods}\n"
                        f"learner log:\n{logs.stdout}{logs.stderr}\noperator log:\n{self.operator_logs()[-4000:]}")


class OneNodeCluster(ChartOperator, BedPrometheus):
    """The bed: see the module docstring. Use as a context manager. `operator=False`: no CRD, no chart,
    no operator (a cluster and its node only). `kueue=True`: Kueue's controller and webhooks
    (`kueue.Kueue`), managing the bed's namespaces."""

    def __init__(self, workdir: pathlib.Path, *, namespaces: tuple[str, ...] = ("default",),
                 helm_values: Mapping[str, str] | None = None, prometheus: bool = False,
                 operator: bool = True, kueue: bool = False):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.id = secrets.token_hex(3)
        self.podman = Podman(self.workdir)
        self.namespaces = namespaces
        self.helm_values = {"operator.reconcileIntervalSeconds": "2", "operator.progressIntervalSeconds": "2",
                            **(helm_values or {})}
        self.want_prometheus = prometheus
        self.want_operator = operator
        self.want_kueue = kueue
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
        self._start_real_node()
        self.provisioner = ClaimProvisioner(self.cluster, self.node)
        self.provisioner.start()
        self._stack.callback(self.provisioner.stop)
        for namespace in self.namespaces:
            self.create_namespace(namespace)
        if self.want_kueue:
            self.kueue = self._stack.enter_context(Kueue(self.plane, self.cluster, self.workdir / "kueue",
                                                         self.namespaces))
        self.timings["bed_seconds"] = time.monotonic() - t0
        if self.want_operator:
            self.install_chart()
        if self.want_prometheus:
            self._start_prometheus()
        if self.want_operator:
            self.wait_operator_ready()

    def _start_real_node(self) -> None:
        """The node's network first (`real_node.RealNode.prepare`: a node slot of this machine), the control
        plane on the host's end of its link, where the pods reach the host, then the node, which stops before
        the control plane does: its pods are deleted through the API server first."""
        self.node = RealNode(self.workdir / "node")
        self._stack.callback(self.node.stop)
        self.gateway = self.node.prepare()
        self.plane = ControlPlane(self.workdir / "control-plane", address=self.gateway,
                                  kubelet_address_types=("InternalIP",), publish_endpoint=True)
        self.plane.work.mkdir(parents=True, exist_ok=True)
        self._stack.callback(self.plane.stop)
        # The images reach the node as on an air-gapped cluster: pushed to a registry (its blobs kept between
        # runs), which the node's containerd mirrors ghcr.io to.
        self.registry = Registry(REGISTRY_STORE, self.workdir / "registry", host=self.gateway).start()
        self._stack.callback(self.registry.stop)
        t0 = time.monotonic()
        push_images(self.registry.address)
        self.timings["push_seconds"] = time.monotonic() - t0
        t0 = time.monotonic()
        self.plane.start()
        self.timings["control_plane_seconds"] = time.monotonic() - t0
        self.cluster = BedApi(self.plane, self.namespaces[0])
        self.node.start(self.plane, self.registry.address)
        self.timings.update(self.node.timings)
        keep = os.environ.get("KUBERL_BED_LOG_DIR")
        if keep:  # every container's log kept past its pod, for a failed test's post-mortem
            self.log_keeper = LogKeeper(self.node.layout.pod_logs, pathlib.Path(keep)).start()
            self._stack.callback(self.log_keeper.stop)

    def create_namespace(self, name: str) -> None:
        """A namespace with Pod Security `restricted` enforced (also the cluster's default), once its
        `default` ServiceAccount exists (admission refuses pods before)."""
        if self.cluster.get("namespaces", name) is None:
            self.cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        self.cluster.wait_for("serviceaccounts", "default", namespace=name, timeout=60)

    @property
    def env(self) -> dict[str, str]:
        return self.cluster.env

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, check=check, timeout=timeout, input=input)

    def bed_containers(self, running_only: bool = True) -> list[str]:
        """Names of this bed's pod containers (k8s_<container>_<pod>_<namespace>_<pod uid>); one that
        exited is listed until the kubelet removes it."""
        return [c.name for c in self.node.containers.list() if c.running or not running_only]


def require_podman_and_images() -> None:
    """For a test module on real containers: fail in CI when podman or the real node's build is missing
    (skip elsewhere), and build the images when their inputs changed."""
    import pytest
    from tools import in_ci

    reason = podman_ready()
    if reason is None and subprocess.run(
            [str(REPO / "scripts" / "build-node"), "--print-bin"], capture_output=True, check=False).returncode:
        reason = "the real node is not built: run ./scripts/build-node (./scripts/test does)"
    if reason:
        if in_ci():
            pytest.fail(f"the end-to-end bed cannot run: {reason}")
        pytest.skip(reason)
    ensure_images()


@contextlib.contextmanager
def bed_for_tests(workdir: pathlib.Path, **options: Any) -> Iterator[OneNodeCluster]:
    """A bed for a test module: fails in CI when podman or the real node's build is missing (skips
    elsewhere), builds the images when their inputs changed, and checks at the end that the node and the
    bed's helpers saw no error."""
    require_podman_and_images()
    with OneNodeCluster(workdir, **options) as running:
        print(f"end-to-end mode: a real node on {running.node.address}")
        yield running
        assert not running.node.errors, running.node.errors
        keeper = getattr(running, "log_keeper", None)
        assert keeper is None or not keeper.errors, keeper.errors
        assert not running.provisioner.errors, running.provisioner.errors


def podman_ready() -> str | None:
    """Why the bed cannot run here, or None when it can."""
    if not Podman.available():
        return "podman and runc are not installed (./scripts/test installs them with apt-get)"
    if subprocess.run([str(BUILD_SCRIPT), "--print-bin"], capture_output=True, check=False).returncode != 0 \
            and not os.environ.get("KUBERL_CONTROL_PLANE_BIN"):
        return "the control plane is not built: run ./scripts/build-control-plane"
    if not (REPO / "scripts" / "build-images").exists() and os.environ.get("KUBERL_E2E_PREBUILT") != "1":
        return "scripts/build-images is missing"
    return None


__all__ = ["OPERATOR_IMAGE", "ROLLOUT_IMAGE", "SMALL_REQUESTS", "TRAINER_IMAGE", "BedApi", "OneNodeCluster",
           "ensure_images", "podman_ready"]

"""
The real control plane (`control_plane.ControlPlane`) as the tests use it: one per test session,
a fresh namespace per test, and the operator's own identity.

- `ClusterSession`: the control plane with the operator's CRDs (RLTrainingJob, RLSweep) installed from
  `crds/` (server-side apply, as the docs tell users), the chart's ServiceAccount and RBAC rendered by
  `helm template` and applied, a kubeconfig holding a TokenRequest token of that ServiceAccount for the
  operator, and a registered Node whose kubelet the tests play (`NodeKubelet`).
- `ClusterNamespace`: what a test holds: a namespace of its own (Pod Security `restricted`), REST
  helpers as a person with kubectl would use them (the admin identity), `set_pod_phase` as the node,
  `requests()` and `history()` read from the API server's audit log.
- `NodeKubelet`: the part of a kubelet the API server waits for when no container runs: a Node the
  scheduler can bind pods to, and the final delete of a pod whose graceful deletion began (a kubelet
  does it once the containers stopped; without it a bound pod stays Terminating for ever). It writes
  no status of its own: the tests (or the node agent) write what the containers did.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml

from .common import CHART, NODE, OPERATOR_CRDS, OPERATOR_NAMESPACE, RELEASE, REPO, Body, wait_until
from .control_plane import ADMIN, ControlPlane, running_control_plane
from .kubelet_api import Api, register_node
from .kubelet_status import kubelet_pod_status

# resource -> (API prefix, namespaced): what the tests, the beds and the benchmarks read and write.
RESOURCES: dict[str, tuple[str, bool]] = {
    **{r: ("/api/v1", True) for r in ("pods", "services", "events", "configmaps", "secrets", "serviceaccounts",
                                      "resourcequotas", "persistentvolumeclaims", "limitranges")},
    **{r: ("/api/v1", False) for r in ("namespaces", "nodes", "persistentvolumes")},
    "deployments": ("/apis/apps/v1", True), "replicasets": ("/apis/apps/v1", True),
    "networkpolicies": ("/apis/networking.k8s.io/v1", True),
    "poddisruptionbudgets": ("/apis/policy/v1", True),
    "roles": ("/apis/rbac.authorization.k8s.io/v1", True),
    "rolebindings": ("/apis/rbac.authorization.k8s.io/v1", True),
    "rltrainingjobs": ("/apis/kuberl.dev/v1alpha1", True),
    "rlsweeps": ("/apis/kuberl.dev/v1alpha1", True),
    "priorityclasses": ("/apis/scheduling.k8s.io/v1", False),
    **{r: ("/apis/kueue.x-k8s.io/v1beta2", True) for r in ("workloads", "localqueues")},
    **{r: ("/apis/kueue.x-k8s.io/v1beta2", False) for r in ("clusterqueues", "resourceflavors")},
}
ALIASES = {"rltj": "rltrainingjobs", "v1/events": "events", "netpol": "networkpolicies", "deploy": "deployments", "pdb": "poddisruptionbudgets",
           "pvc": "persistentvolumeclaims", "po": "pods", "svc": "services", "cm": "configmaps"}
PATCH_TYPES = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
               "strategic": "application/strategic-merge-patch+json"}


def _plural(kind: str) -> str:
    lower = kind.lower()
    return lower + ("es" if lower.endswith("s") else "s") if not lower.endswith("y") else lower[:-1] + "ies"


def volume_claim(name: str, namespace: str) -> list[Body]:
    """A claim and a volume it binds to (the controller manager's binder binds them; the scheduler then
    places pods that mount it). The volume is a hostPath nobody mounts: no kubelet runs the pods."""
    volume = f"{namespace}-{name}"  # a PersistentVolume name may be 253 characters
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                  "storageClassName": "", "hostPath": {"path": f"/tmp/kuberl-test-volumes/{volume}"},
                  "claimRef": {"namespace": namespace, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]


class ApiError(Exception):
    def __init__(self, status: int, body: Body):
        self.status, self.body = status, body
        super().__init__(f"HTTP {status}: {body.get('message', body)}")


class Rest:
    """Plain REST calls with one identity's token: what kubectl does, without a process per call."""

    def __init__(self, plane: ControlPlane, token: str):
        self.server = plane.server
        self.session = requests.Session()
        # Neither $REQUESTS_CA_BUNDLE (which would replace the cluster's CA) nor a proxy from the environment.
        self.session.trust_env = False
        self.session.verify = str(plane.ca)
        self.session.headers["Authorization"] = f"Bearer {token}"

    def url(self, resource: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        resource = ALIASES.get(resource, resource)
        prefix, namespaced = RESOURCES[resource]
        path = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{resource}"
        return self.server + path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def crd_established(self, name: str) -> bool:
        found = self.call("GET", f"{self.server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
        conditions = {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}
        return conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"

    def wait_established(self, *names: str, timeout: float = 60) -> None:
        """Each CRD Established, its names accepted: what a client waits for after applying a CRD before it
        uses the new resource."""
        for name in names:
            wait_until(lambda name=name: self.crd_established(name), timeout, 0.1, f"the CRD {name} Established")

    def call(self, method: str, url: str, *, body: Any = None, params: Mapping[str, str] | None = None,
             content_type: str = "application/json") -> Body | None:
        for _ in range(20):
            answer = self.session.request(method, url, params=params, timeout=30,
                                          data=None if body is None else json.dumps(body),
                                          headers={"Content-Type": content_type})
            # 429 (a resource's storage re-initialising after its CRD changed, priority and fairness):
            # wait as the server says and ask again, as client-go does.
            if answer.status_code != 429:
                break
            time.sleep(min(float(answer.headers.get("Retry-After") or 1), 5))
        if answer.status_code == 404 and method in ("GET", "DELETE"):
            return None
        payload = answer.json() if answer.content else {}
        if answer.status_code >= 300:
            raise ApiError(answer.status_code, payload)
        return payload


class Objects:
    """Objects of the API server through one identity's `Rest`, in a default namespace: what a person with
    kubectl does, without a process per call. `namespace=None` in a call means the default one."""

    def __init__(self, rest: Rest, namespace: str):
        self.rest, self.namespace = rest, namespace

    def url(self, resource: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        resource = ALIASES.get(resource, resource)
        if resource not in RESOURCES:
            raise ValueError(f"resource {resource!r} is not one the beds know: {sorted(RESOURCES)}")
        return self.rest.url(resource, namespace or self.namespace, name, sub)

    def create(self, body: Mapping[str, Any], namespace: str | None = None, **params: str) -> Body:
        namespace = namespace or (body.get("metadata") or {}).get("namespace")
        return self.rest.call("POST", self.url(_plural(body["kind"]), namespace), body=dict(body),
                              params=params or None) or {}

    def get(self, resource: str, name: str, namespace: str | None = None) -> Body | None:
        return self.rest.call("GET", self.url(resource, namespace, name))

    def list(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, all_namespaces: bool = False) -> list[Body]:
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        url = self.rest.url(ALIASES.get(resource, resource), None) if all_namespaces else self.url(resource, namespace)
        return (self.rest.call("GET", url, params=params) or {}).get("items", [])

    def patch(self, resource: str, name: str, patch: Any, namespace: str | None = None, *,
              subresource: str | None = None, patch_type: str = "merge") -> Body:
        return self.rest.call("PATCH", self.url(resource, namespace, name, subresource), body=patch,
                              content_type=PATCH_TYPES[patch_type]) or {}

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Body | None:
        return self.rest.call("DELETE", self.url(resource, namespace, name))

    def events(self, namespace: str | None = None, involved_name: str | None = None) -> list[Body]:
        selector = f"involvedObject.name={involved_name}" if involved_name else None
        return self.list("events", namespace, field_selector=selector)

    def wait_for(self, resource: str, name: str, predicate: Callable[[Body], bool] | None = None,
                 namespace: str | None = None, timeout: float = 10, interval: float = 0.05) -> Body:
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(resource, name, namespace)
            if obj is not None and (predicate is None or predicate(obj)):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(f"{resource} {name!r} did not reach the expected state in {timeout}s; "
                                     f"last state: {json.dumps(obj, indent=1)}")
            time.sleep(interval)

    def wait_for_absent(self, resource: str, name: str, namespace: str | None = None, timeout: float = 10,
                        interval: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while (obj := self.get(resource, name, namespace)) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{resource} {name!r} still exists after {timeout}s: {json.dumps(obj)}")
            time.sleep(interval)


class NodeKubelet:
    """The Node, and the final delete of its pods once their deletion began (see the module doc)."""

    def __init__(self, plane: ControlPlane):
        self.rest = Rest(plane, plane.tokens["node"])
        self.token, self.ca = plane.tokens["node"], plane.ca
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-kubelet", daemon=True)
        self.errors: list[BaseException] = []

    def register(self) -> None:
        """The Node, registered as itself and Ready (`kubelet_api.register_node`); then the final deletes."""
        register_node(Api(self.rest.server, self.token, self.ca), NODE, "test node")
        self._thread.start()

    def _run(self) -> None:
        url = self.rest.url("pods", None)
        selector = {"fieldSelector": f"spec.nodeName={NODE}"}
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self.rest.call("GET", url, params=selector) or {}
                    version = listed["metadata"]["resourceVersion"]
                    for pod in listed.get("items", []):
                        self._finish_deletion(pod)
                params = {**selector, "watch": "1", "resourceVersion": version, "timeoutSeconds": "5",
                          "allowWatchBookmarks": "true"}
                with self.rest.session.get(url, params=params, stream=True, timeout=30) as stream:
                    if stream.status_code == 410:
                        version = ""
                        continue
                    for line in stream.iter_lines():
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410 Gone in the stream: list again
                            version = ""
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._finish_deletion(event["object"])
            except (requests.RequestException, ApiError, ValueError) as err:
                if self._stop.is_set():
                    return
                self.errors.append(err)
                time.sleep(0.2)  # the server restarting or busy: try again, never spin

    def _finish_deletion(self, pod: Body) -> None:
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        try:
            self.rest.call("DELETE", self.rest.url("pods", meta["namespace"], meta["name"]),
                           body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiError as err:
            if err.status != 409:  # 409: a new pod of that name already; this one is gone
                raise

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class ClusterSession:
    """The session's control plane, with the CRD, the operator's identity and a node (module doc)."""

    def __init__(self, plane: ControlPlane):
        self.plane = plane
        self.admin = Rest(plane, plane.tokens[ADMIN])
        self.node = NodeKubelet(plane)
        self.operator_account = ""
        self.operator_kubeconfig = Path()
        self._counter = itertools.count(1)

    def set_up(self, *, node: bool = True) -> ClusterSession:
        """`node=False`: no node of the tests' own (a benchmark brings its kwok nodes)."""
        # Both kinds, as the chart installs them: the operator watches sweeps wherever their CRD exists.
        self.plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        self.admin.wait_established(*OPERATOR_CRDS)
        self.admin.call("POST", self.admin.url("namespaces", None), body={"metadata": {"name": OPERATOR_NAMESPACE}})
        rendered = self.chart_rbac()
        self.plane.apply(rendered)
        account = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")
        name = account["metadata"]["name"]
        self.operator_account = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{name}"
        self.operator_kubeconfig = self.plane.service_account_kubeconfig(OPERATOR_NAMESPACE, name)
        if node:
            self.node.register()
            self.untaint(NODE)
        return self

    def untaint(self, node: str) -> None:
        """A new Node is tainted not-ready on admission; the node-lifecycle controller lifts the taint once
        the node reports Ready. That controller is not run (control_plane's doc), so the bed lifts it."""
        self.admin.call("PATCH", self.admin.url("nodes", None, node), content_type=PATCH_TYPES["merge"],
                        body={"spec": {"taints": None}})

    def chart_rbac(self, *values: str) -> str:
        """The chart's ServiceAccount and RBAC, rendered by helm as `helm install` would."""
        from tools import helm_binary

        done = subprocess.run(
            [str(helm_binary()), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
             "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml", *values],
            capture_output=True, text=True, check=True)
        return done.stdout

    def namespace_name(self, test_name: str) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
        return f"t{next(self._counter)}-{slug}"[:63].rstrip("-")

    def stop(self) -> None:
        if self.node._thread.is_alive():
            self.node.stop()



class ClusterNamespace(Objects):
    """One test's namespace on the session's cluster, and the helpers a test uses (module doc); its
    objects as the admin."""

    def __init__(self, session: ClusterSession, namespace: str, workdir: Path):
        super().__init__(session.admin, namespace)
        self.session, self.plane = session, session.plane
        self.admin, self.node = session.admin, Rest(session.plane, session.plane.tokens["node"])
        self.workdir = workdir
        self.audit_start = self.plane.audit_offset()
        self.kubeconfig = self.plane.kubeconfig(f"admin-{namespace}", self.plane.tokens[ADMIN], namespace)
        self.operator_kubeconfig = workdir / "operator-kubeconfig.yaml"
        config = yaml.safe_load(session.operator_kubeconfig.read_text())
        config["contexts"][0]["context"]["namespace"] = namespace
        self.operator_token = config["users"][0]["user"]["token"]
        self.operator_kubeconfig.write_text(yaml.safe_dump(config))

    # ---- set-up ------------------------------------------------------------------------------------------

    def create_namespace(self) -> None:
        self.admin.call("POST", self.admin.url("namespaces", None), body={"metadata": {
            "name": self.namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        # Pods name no ServiceAccount: admission needs the namespace's `default` one, which the
        # controller manager creates shortly after the namespace.
        self.wait_for("serviceaccounts", "default", timeout=60)

    def tear_down(self) -> None:
        """Let go of the jobs (the operator is gone, so its finalizers would never be removed) and
        delete the namespace; the namespace controller and the garbage collector finish it."""
        for job in self.list("rltrainingjobs"):
            if job["metadata"].get("finalizers"):
                with contextlib.suppress(ApiError):
                    self.patch("rltrainingjobs", job["metadata"]["name"], {"metadata": {"finalizers": None}})
        self.admin.call("DELETE", self.admin.url("namespaces", None, self.namespace))

    # ---- clients -----------------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """A subprocess's environment as the operator: its ServiceAccount token, this namespace."""
        import os

        return {**os.environ, "KUBECONFIG": str(self.operator_kubeconfig),
                "KUBECACHEDIR": str(self.workdir / "kube-cache")}

    def operator_api_client(self) -> Any:
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.operator_kubeconfig))

    def kubectl(self, *args: str, check: bool = True, timeout: float = 30,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real kubectl as a person with admin rights in this namespace."""
        done = self.plane.kubectl(*args, kubeconfig=self.kubeconfig, stdin=input, check=False, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    # ---- objects (as the admin; the rest in Objects) ------------------------------------------------------

    def patch_status(self, resource: str, name: str, status: Mapping[str, Any], namespace: str | None = None) -> Body:
        if ALIASES.get(resource, resource) == "pods":  # a pod's status is its kubelet's to write
            self.wait_for("pods", name, lambda p: bool(p["spec"].get("nodeName")), namespace, timeout=30)
            url = self.node.url("pods", namespace or self.namespace, name, "status")
            return self.node.call("PATCH", url, body={"status": status},
                                  content_type=PATCH_TYPES["strategic"]) or {}
        return self.patch(resource, name, {"status": status}, namespace, subresource="status")

    def set_pod_phase(self, namespace: str | None, name: str, phase: str, **how: Any) -> Body:
        """Write a pod's status as its kubelet would (`kubelet_pod_status`), with the node's identity."""
        # The node may write only the pods bound to it: wait for the scheduler.
        pod = self.wait_for("pods", name, lambda p: bool(p["spec"].get("nodeName")), namespace, timeout=30)
        status = kubelet_pod_status(pod, phase, **how)
        url = self.node.url("pods", pod["metadata"]["namespace"], name, "status")
        # A merge patch replaces the lists whole, as a kubelet's status update does.
        return self.node.call("PATCH", url, body={"status": status}, content_type=PATCH_TYPES["merge"]) or {}

    # ---- the audit log -----------------------------------------------------------------------------------

    def audit(self) -> Iterator[Body]:
        """The audit events of this test (from its start), about this namespace or cluster-scoped."""
        for event in self.plane.audit_events(self.audit_start):
            ref = event.get("objectRef") or {}
            if ref.get("namespace") in (None, self.namespace):
                yield event

    def requests(self, user: str | None = None) -> list[Body]:
        """Every finished request of `user` (default: the operator's ServiceAccount) in this test."""
        user = user or self.session.operator_account
        return [e for e in self.audit() if e["user"]["username"] == user and e.get("objectRef")]

    def history(self, resource: str, name: str, namespace: str | None = None) -> list[Body | None]:
        """Every version of a job that a write produced, oldest first (from the audit log's responses)."""
        resource = ALIASES.get(resource, resource)
        namespace = namespace or self.namespace
        versions = []
        for event in self.plane.audit_events(self.audit_start):
            ref = event.get("objectRef") or {}
            body = event.get("responseObject") or {}
            if (ref.get("resource"), ref.get("namespace"), ref.get("name") or body.get("metadata", {}).get("name"))\
                    != (resource, namespace, name) or body.get("kind") == "Status" or "metadata" not in body:
                continue
            if event["responseStatus"]["code"] < 300 and "dryRun" not in event.get("requestURI", ""):
                versions.append(body)
        return sorted(versions, key=lambda v: int(v["metadata"]["resourceVersion"]))


@contextlib.contextmanager
def cluster_session(work: Path) -> Iterator[ClusterSession]:
    with running_control_plane(work) as plane:
        session = ClusterSession(plane).set_up()
        try:
            yield session
        finally:
            session.stop()

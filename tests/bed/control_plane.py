"""
A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, the binaries `scripts/build-control-plane` built from source.

It is set up as a small production cluster is, not as envtest is: RBAC and the Node authorizer,
service-account tokens signed by the API server (TokenRequest), every default admission plugin
(ServiceAccount, PodSecurity, ResourceQuota, NamespaceLifecycle, ...) plus NodeRestriction, Pod
Security `restricted` enforced in every namespace unless the namespace says otherwise, and an audit
log of what every client other than the control plane's own components asked.

Identities (a static token file; every component and test knows which one it uses):
- `admin` (system:masters): the test itself, as a person with kubectl would be;
- `system:kube-controller-manager`, `system:kube-scheduler`: the components;
- `system:node:<NODE>` (system:nodes): the node's kubelet (the node agent's, or a real one's);
- `system:kube-proxy`, `system:coredns`, `system:kube-router`: a real node's other parts (`real_node`).
The operator never gets any of these: it runs with a TokenRequest token of the chart's ServiceAccount
(`ControlPlane.service_account_kubeconfig`). The server calls a kubelet with a client certificate of
its own (`kube-apiserver-kubelet-client`, system:masters), which a real kubelet authenticates.

Not run here: the node (the node agent, or `real_node.RealNode` with a real kubelet, kube-proxy, CoreDNS
and a NetworkPolicy enforcer), the node-lifecycle and taint-eviction controllers (the test node has no
heartbeat to keep: without them nobody marks it unreachable in the middle of a long suite).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .common import NODE, REPO, free_port, self_signed_certificate, start_process, stop_process, wait_until

BUILD_SCRIPT = REPO / "scripts" / "build-control-plane"

ADMIN = "admin"
#: The users whose requests the audit log leaves out: the control plane's own components talk a lot
#: and are not what any test asks about.
COMPONENT_USERS = ("system:kube-controller-manager", "system:kube-scheduler", "system:apiserver")
#: kube-controller-manager's controllers, each with its own ServiceAccount in kube-system.
COMPONENT_GROUPS = ("system:serviceaccounts:kube-system",)
#: A real node's parts besides its kubelet, each with an identity of its own (`real_node`).
NODE_PARTS = ("kube-proxy", "coredns", "kube-router")
CONTROLLERS = "*,-node-lifecycle-controller,-taint-eviction-controller,-device-taint-eviction-controller"


def bin_dir() -> Path:
    """Where the built binaries are: $KUBERL_CONTROL_PLANE_BIN, else what the build script reports."""
    override = os.environ.get("KUBERL_CONTROL_PLANE_BIN")
    if override:
        return Path(override)
    found = subprocess.run([str(BUILD_SCRIPT), "--print-bin"], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise RuntimeError("the control plane is not built: run ./scripts/build-control-plane "
                           "(./scripts/test does; about 21 minutes on 2 cores the first time, then none)")
    return Path(found.stdout.strip().splitlines()[-1])


def _kubeconfig(server: str, ca: Path, token: str, namespace: str = "default", user: str = "user") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
    }


def token_file(tokens: Mapping[str, str]) -> str:
    """The static token file: each identity of the module docstring, with its groups."""
    return "\n".join([
        f"{tokens[ADMIN]},admin,admin,system:masters",
        f"{tokens['controller-manager']},system:kube-controller-manager,kcm",
        f"{tokens['scheduler']},system:kube-scheduler,scheduler",
        f'{tokens["node"]},system:node:{NODE},node,"system:nodes"',
        f"{tokens['kube-proxy']},system:kube-proxy,kube-proxy",
        f"{tokens['coredns']},system:coredns,coredns",
        f"{tokens['kube-router']},system:kube-router,kube-router",
    ]) + "\n"


def admission_configuration() -> dict[str, Any]:
    """Every namespace is `restricted` unless labelled otherwise: what a careful platform team sets."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": "PodSecurity", "configuration": {
            "apiVersion": "pod-security.admission.config.k8s.io/v1", "kind": "PodSecurityConfiguration",
            "defaults": {"enforce": "restricted", "enforce-version": "latest",
                         "audit": "restricted", "audit-version": "latest",
                         "warn": "restricted", "warn-version": "latest"},
            "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": ["kube-system"]}}}],
    }


def audit_policy() -> dict[str, Any]:
    return {
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        # (ResponseStarted is kept: a watch that is still open has no ResponseComplete yet.)
        "omitStages": ["RequestReceived"],
        "rules": [
            # Every pod created, whoever created it (a Job's pod comes from the controller manager): when a
            # workload's pods came into being, for the comparison of operators (bench_operator_overhead.py).
            {"level": "Metadata", "verbs": ["create"], "resources": [{"group": "", "resources": ["pods"]}]},
            {"level": "None", "users": list(COMPONENT_USERS)},
            {"level": "None", "userGroups": list(COMPONENT_GROUPS)},
            # Every version of a job its writers made, whole: what a test reads a job's history from.
            {"level": "RequestResponse", "verbs": ["create", "update", "patch", "delete"],
             "resources": [{"group": "kuberl.dev", "resources": ["rltrainingjobs", "rltrainingjobs/status"]}]},
            # What a node and KubeRay wrote (a pod's phase, readiness and containers; a RayJob's state), with
            # its time: when a container ended or a job was marked Complete.
            {"level": "Request", "verbs": ["update", "patch"], "resources": [
                {"group": "", "resources": ["pods/status"]}, {"group": "ray.io", "resources": ["rayjobs/status"]}]},
            {"level": "Metadata"},
        ],
    }


def etcd_flags(data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    return [
        f"--data-dir={data_dir}", "--name=default", "--log-level=error",
        f"--listen-client-urls=http://127.0.0.1:{client_port}",
        f"--advertise-client-urls=http://127.0.0.1:{client_port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        # A test cluster's data is thrown away: no fsync (etcd >= 3.5).
        "--unsafe-no-fsync=true",
    ]


def apiserver_flags(plane: ControlPlane, etcd_client_port: int) -> list[str]:
    """kube-apiserver's flags for `plane`: its files (`ControlPlane._write_config`), address and port."""
    work, pki = plane.work, plane.work / "pki"
    # No --kubelet-certificate-authority: the server then dials a node's kubelet port over TLS
    # without verifying its certificate (k8s.io/kubernetes pkg/kubelet/client, transportConfig),
    # so a test kubelet serves logs with a self-signed one.
    kubelet = ([f"--kubelet-preferred-address-types={','.join(plane.kubelet_address_types)}"]
               if plane.kubelet_address_types else [])
    return [
        f"--etcd-servers=http://127.0.0.1:{etcd_client_port}",
        f"--bind-address={plane.address}", f"--secure-port={plane.port}", f"--advertise-address={plane.address}",
        f"--tls-cert-file={plane.ca}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--token-auth-file={work / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        # The `kubernetes` Service: published only where pods reach the server through it (a real node's
        # kube-proxy); it could never point at 127.0.0.1, which the server refuses to publish.
        f"--endpoint-reconciler-type={'lease' if plane.publish_endpoint else 'none'}",
        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        # Privileged pods are allowed by the server, as on most clusters: Pod Security is what refuses them.
        "--allow-privileged=true",
        # OwnerReferencesPermissionEnforcement: a child with blockOwnerDeletion needs update on its
        # owner's finalizers, as on clusters that enable it (OpenShift does by default).
        "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
        f"--admission-control-config-file={work / 'admission.yaml'}",
        f"--audit-policy-file={work / 'audit-policy.yaml'}",
        f"--audit-log-path={plane.audit_log}", "--audit-log-mode=blocking", "--audit-log-maxsize=0",
        "--profiling=false", "--v=1", *kubelet,
    ]


class ControlPlane:
    """The four processes, their configuration in `work`, and kubeconfigs for each identity."""

    def __init__(self, work: Path, binaries: Path | None = None, *, address: str = "127.0.0.1",
                 kubelet_address_types: Sequence[str] = (), publish_endpoint: bool = False):
        """`address`: where the API server listens and what it advertises (the host's end of a real node's
        link lets pods reach it; the serving certificate then names it too). `kubelet_address_types`:
        which Node addresses the server dials for logs and exec, in order (its default prefers a
        Hostname, which a test node cannot resolve). `publish_endpoint`: the `kubernetes` Service leads
        to `address` (for pods whose Service traffic a kube-proxy carries)."""
        self.work = work
        self.bin = binaries or bin_dir()
        self.address = address
        self.publish_endpoint = publish_endpoint
        self.kubelet_address_types = tuple(kubelet_address_types)
        self.tokens = {name: base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
                       for name in (ADMIN, "controller-manager", "scheduler", "node", *NODE_PARTS)}
        self.port = 0
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.audit_log = work / "audit.log"
        self.ca = work / "pki" / "apiserver.crt"

    # ---- files ----------------------------------------------------------------------------------------

    def _write_config(self) -> None:
        pki = self.work / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
                       check=True, capture_output=True)
        # The serving certificate names 127.0.0.1, localhost and the listening address; it is also the
        # clients' CA.
        extra = [f"IP:{self.address}"] if self.address != "127.0.0.1" else []
        self_signed_certificate(pki, "apiserver", "kube-apiserver", ["IP:127.0.0.1", "DNS:localhost",
                                                                     "DNS:kubernetes.default.svc", "IP:10.96.0.1",
                                                                     *extra])
        # The server's identity towards kubelets: a real one authenticates it by this certificate (its own CA,
        # being self-signed) and asks the server whether system:masters may (it may).
        self_signed_certificate(pki, "kubelet-client", "kube-apiserver-kubelet-client", ["DNS:kube-apiserver"],
                                organization="system:masters")
        (self.work / "tokens.csv").write_text(token_file(self.tokens))
        (self.work / "admission.yaml").write_text(yaml.safe_dump(admission_configuration()))
        (self.work / "audit-policy.yaml").write_text(yaml.safe_dump(audit_policy()))

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    def kubeconfig(self, name: str, token: str, namespace: str = "default") -> Path:
        """A kubeconfig file for a token (written once per name)."""
        path = self.work / "kubeconfigs" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(_kubeconfig(self.server, self.ca, token, namespace, user=name)))
        return path

    # ---- processes --------------------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        self.processes[name] = start_process([self.bin / name, *args], self.work / f"{name}.log", cwd=self.work)

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.work / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def start(self, timeout: float = 120) -> ControlPlane:
        self._write_config()
        etcd_client, etcd_peer, self.port = free_port(), free_port(), free_port()
        self._spawn("etcd", etcd_flags(self.work / "etcd", etcd_client, etcd_peer))
        self._spawn("kube-apiserver", apiserver_flags(self, etcd_client))
        wait_until(self._ready, timeout, 0.2, f"kube-apiserver ready (see {self.work}/kube-apiserver.log)")
        pki = self.work / "pki"
        for name, token in (("kube-controller-manager", "controller-manager"), ("kube-scheduler", "scheduler")):
            kubeconfig = self.kubeconfig(name, self.tokens[token])
            extra = []
            if name == "kube-controller-manager":
                extra = [f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={self.ca}",
                         "--use-service-account-credentials=true", f"--controllers={CONTROLLERS}",
                         # Namespaces of finished tests go quickly; the default syncs every 5 minutes.
                         "--concurrent-namespace-syncs=4"]
            self._spawn(name, [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--secure-port=0",
                               "--v=1", *extra])
        return self

    def _ready(self) -> bool:
        """/readyz answers 200; a process that exited raises with its log's tail."""
        self._check_alive()
        request = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {self.tokens[ADMIN]}"})
        try:
            with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(self.ca)),
                                        timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.get(name)
            if process is not None:
                stop_process(process, 15)
        shutil.rmtree(self.work / "etcd", ignore_errors=True)

    # ---- clients ------------------------------------------------------------------------------------------

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig(ADMIN, self.tokens[ADMIN])

    @property
    def node_kubeconfig(self) -> Path:
        return self.kubeconfig("node", self.tokens["node"])

    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / "kubectl"), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "KUBECACHEDIR": str(self.work / "kube-cache")})
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def apply(self, manifests: str | Sequence[Mapping[str, Any]], **kwargs: Any) -> None:
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(list(manifests))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text, **kwargs)

    def service_account_token(self, namespace: str, name: str, hours: int = 6) -> str:
        """A TokenRequest token of a ServiceAccount, as a pod of it would get (bound, expiring)."""
        return self.kubectl("create", "token", name, "-n", namespace, f"--duration={hours}h").stdout.strip()

    def service_account_kubeconfig(self, namespace: str, name: str, default_namespace: str = "default") -> Path:
        token = self.service_account_token(namespace, name)
        return self.kubeconfig(f"sa-{namespace}-{name}", token, default_namespace)

    # ---- the audit log ----------------------------------------------------------------------------------

    def audit_offset(self) -> int:
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit_events(self, since: int = 0) -> Iterator[dict[str, Any]]:
        """Audit events written after byte `since`: one JSON object per finished request."""
        with open(self.audit_log, "rb") as log:
            log.seek(since)
            for line in log:
                if line.endswith(b"\n"):
                    yield json.loads(line)


@contextlib.contextmanager
def running_control_plane(work: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(work)
    try:
        yield plane.start()
    finally:
        plane.stop()

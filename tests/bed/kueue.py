"""
Kueue's own controller and webhooks on a bed's control plane: the binary `scripts/build-kueue` built
from `sigs.k8s.io/kueue`, its CRDs, its ClusterRole and its webhook configurations from the same module.

    with Kueue(plane, admin, workdir, namespaces=("ml-jobs",)):
        ...  # pods of a LocalQueue in ml-jobs are gated, queued and admitted by Kueue

Kueue runs as a host process beside the API server (as the control plane's own components do here),
with a TokenRequest token of its own ServiceAccount bound to the release's roles, not the admin's.
Its webhooks serve on 127.0.0.1 with a self-signed certificate; the webhook configurations and the
CRDs' conversion webhooks are the release's, pointed at that URL with that certificate as their CA.
Kueue manages only the namespaces it is given: its Configuration's managedJobsNamespaceSelector and
every webhook's namespaceSelector select those, so pod creation anywhere else never calls it. The
webhook configurations are removed, and the API server seen to stop calling them, before the process
stops.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import yaml

from .common import REPO, Body, free_port, pinned, self_signed_certificate, start_process, wait_until
from .control_plane import ControlPlane
from .host_controller import HostController, built_binary
from .real_cluster import ApiError, Objects

BUILD_SCRIPT = REPO / "scripts" / "build-kueue"
VERSION = pinned("build-kueue", "KUEUE_VERSION")
NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
#: Names as Kueue's release manifests give them (kustomize adds the `kueue-` prefix).
MANAGER_ROLE = "kueue-manager-role"
WEBHOOK_NAMES = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                 "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_LABEL = "kueue.x-k8s.io/managed"


def kueue_bin() -> Path | None:
    """The built binary (its manifests lie beside it), or None when scripts/build-kueue has not run."""
    return built_binary(BUILD_SCRIPT)


def managed_namespaces_selector(namespaces: Sequence[str]) -> Body:
    """The one selector of the namespaces Kueue manages: its Configuration's and every webhook's."""
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                  "values": sorted(namespaces)}]}


def webhook_probe_pod(namespace: str) -> Body:
    """A pod of a LocalQueue, valid under Pod Security `restricted`, that Kueue's pod webhook marks managed."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kueue-webhook-probe", "namespace": namespace,
                         "labels": {QUEUE_NAME_LABEL: "kueue-webhook-probe"}},
            "spec": {"containers": [{"name": "probe", "image": "kueue-webhook-probe",
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}],
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}}}}


class Kueue(HostController):
    """Kueue for a bed: see the module docstring. A context manager."""

    name = "kueue"

    def __init__(self, plane: ControlPlane, admin: Objects, work: Path, namespaces: Sequence[str]):
        if not namespaces:
            raise ValueError("Kueue needs at least one namespace to manage (namespaces is empty)")
        found = kueue_bin()
        if found is None:
            raise RuntimeError("Kueue is not built: run ./scripts/build-kueue (./scripts/test does)")
        super().__init__(found, plane, admin, work, "kueue.log")
        self.namespaces = tuple(namespaces)
        self.selector = managed_namespaces_selector(self.namespaces)

    # ---- start and stop ----------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port = free_port(), free_port()
        self._certificate()
        self._service_account()
        self._crds()
        self._spawn()
        wait_until(self.ready, timeout, 0.2, f"Kueue ready (/readyz; its log: {self.log})")
        self.plane.apply(self._webhook_configurations())
        wait_until(lambda: self._webhook_mutates(True), 60, 0.2,
                   "the API server calling Kueue's pod webhook (a dry-run pod labelled kueue.x-k8s.io/managed)")

    def stop(self) -> None:
        """Webhook configurations first, until the API server no longer calls them; then the process."""
        if self.process is None:
            return
        # Even when the process died: a configuration left behind would refuse every pod of the namespaces.
        for kind, name in WEBHOOK_NAMES.items():
            self.plane.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
        wait_until(lambda: self._webhook_mutates(False), 60, 0.2,
                   "the API server no longer calling Kueue's pod webhook")
        self.end_process()

    # ---- what it runs with -------------------------------------------------------------------------

    def _certificate(self) -> None:
        """A self-signed serving certificate for 127.0.0.1, the CA of the webhook configurations."""
        self.certs = self.work / "certs"
        cert, _ = self_signed_certificate(self.certs, "tls", "kueue-webhook", ["IP:127.0.0.1"])
        self.ca_bundle = base64.b64encode(cert.read_bytes()).decode()

    def _service_account(self) -> None:
        """Kueue's ServiceAccount bound to the release's roles, and a kubeconfig with its token."""
        # Its MultiKueue controller watches Secrets in its own namespace, which the release grants there only.
        secrets_role = yaml.safe_load((self.manifests / "manager-secrets-role.yaml").read_text())
        secrets_role["metadata"] = {"name": MANAGER_ROLE, "namespace": NAMESPACE}
        self.kubeconfig = self.bind_service_account(NAMESPACE, SERVICE_ACCOUNT, MANAGER_ROLE, secrets_role, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": MANAGER_ROLE, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": MANAGER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]})

    def _url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.webhook_port}{path}"

    def _crds(self) -> None:
        """The release's CRDs, with the conversion webhook its manifests give some of them, server-side."""
        crds = self.release_crds()
        conversions = {doc["metadata"]["name"]: doc["spec"]["conversion"] for doc in
                       yaml.safe_load_all((self.manifests / "crd-conversion.yaml").read_text()) if doc}
        for crd in crds:
            conversion = conversions.get(crd["metadata"]["name"])
            if conversion is not None:
                conversion = copy.deepcopy(conversion)
                client = conversion["webhook"]["clientConfig"]
                client["url"] = self._url(client.pop("service")["path"])
                client["caBundle"] = self.ca_bundle
                crd["spec"]["conversion"] = conversion
        self.apply_crds(crds)

    def _configuration(self) -> Body:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": self.selector,
            # Its own certificate management makes certificates for an in-cluster Service's DNS name;
            # the API server calls this process at 127.0.0.1.
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "leaderElection": {"leaderElect": False},
            "integrations": {"frameworks": ["pod"]},
            # The on-demand visibility API is an aggregated API server: nothing here asks it, and it
            # would listen on every address at a fixed port.
            "featureGates": {"VisibilityOnDemand": False},
        }

    def _spawn(self) -> None:
        config = self.work / "configuration.yaml"
        config.write_text(yaml.safe_dump(self._configuration()))
        # With its certificate management off, Kueue reads its metrics certificate from the fixed path
        # /etc/kueue/metrics/certs, metrics served or not. A mount namespace of its own lays a copy of
        # /etc with that directory over /etc for this process only; nothing on the machine changes.
        upper, scratch = self.work / "etc-upper", self.work / "etc-work"
        shutil.rmtree(upper, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        (upper / "kueue" / "metrics").mkdir(parents=True)
        scratch.mkdir()
        shutil.copytree(self.certs, upper / "kueue" / "metrics" / "certs")
        script = ('mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"')
        self.process = start_process(
            ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
             "sh", "-c", script, "kueue", upper, scratch, self.bin, f"--config={config}", "--zap-log-level=info"],
            self.log, cwd=self.work, env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})

    def _webhook_configurations(self) -> list[Body]:
        """The release's two configurations, each webhook called at this process's URL, for the managed
        namespaces only."""
        configurations = []
        for doc in yaml.safe_load_all((self.manifests / "webhooks.yaml").read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] = WEBHOOK_NAMES[doc["kind"]]
            for hook in doc["webhooks"]:
                hook["clientConfig"] = {"url": self._url(hook["clientConfig"]["service"]["path"]),
                                        "caBundle": self.ca_bundle}
                hook["namespaceSelector"] = self.selector
            configurations.append(doc)
        return configurations

    def _webhook_mutates(self, expected: bool) -> bool:
        """Whether a server-side dry run of a queued pod comes back as Kueue's pod webhook marks it: the
        API server's answer, not the process's, tells whether it calls the webhook."""
        namespace = self.namespaces[0]
        try:
            created = self.admin.create(webhook_probe_pod(namespace), namespace, dryRun="All")
        except ApiError as error:
            # A webhook configuration the API server knows of before the process answers it: not yet.
            if error.status == 500 and "failed calling webhook" in str(error):
                return False
            raise
        return (MANAGED_LABEL in (created["metadata"].get("labels") or {})) == expected


__all__ = ["VERSION", "Kueue", "kueue_bin", "managed_namespaces_selector"]

"""Pod labels and annotations that ask a cluster's identity webhook or agent for cloud credentials: the one
list of them. A job's template may set one only where the platform team allowed it (kuberl.api.tenancy).
"""

from __future__ import annotations

from collections.abc import Iterable

#: Key (or prefix, when it ends in "/": every key under it) -> the system that reads it. A key on a pod
#: that one of these systems watches gets the pod cloud credentials, with no Kubernetes RBAC in the way.
#: The projects add keys under their prefixes, so a prefix is refused whole. Keys that belong on a
#: ServiceAccount are refused on pods too: some versions read them there, and no job needs them.
IDENTITY_KEYS: dict[str, str] = {
    # The pod label `use` makes the webhook inject a federated token and client id; pod annotations
    # (service-account-token-expiration, skip-containers, inject-proxy-sidecar, proxy-sidecar-port) and the
    # ServiceAccount's (client-id, tenant-id) shape it. Source:
    # https://azure.github.io/azure-workload-identity/docs/topics/service-account-labels-and-annotations.html
    "azure.workload.identity/": "Azure Workload Identity",
    # The pod label binds the pod to an AzureIdentity, whose token NMI serves at the metadata endpoint.
    # Source: https://azure.github.io/aad-pod-identity/docs/concepts/azureidentitybinding/
    "aadpodidbinding": "AAD Pod Identity",
    # The pod annotation `role` (and kube2iam's `external-id`) names the IAM role the node's metadata proxy
    # assumes for the pod. Sources: https://github.com/jtblin/kube2iam#readme,
    # https://github.com/uswitch/kiam/blob/master/docs/README.md
    "iam.amazonaws.com/": "kube2iam or kiam",
    # `role-arn` (on the ServiceAccount), audience, sts-regional-endpoints, token-expiration and the pod's
    # `skip-containers` drive the EKS pod identity webhook (IAM roles for service accounts). Source:
    # https://github.com/aws/amazon-eks-pod-identity-webhook#readme
    "eks.amazonaws.com/": "EKS IAM roles for service accounts",
    # `gcp-service-account` on the Kubernetes ServiceAccount names the Google service account it acts as.
    # Source: https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity
    "iam.gke.io/": "GKE Workload Identity",
}


def covering(key: str, entries: Iterable[str]) -> str | None:
    """The entry of `entries` that names `key`: the key itself or a prefix ending in "/" that it starts
    with. Compared in lower case, to stay on the safe side of a webhook that matches keys loosely."""
    key = key.lower()
    for entry in entries:
        entry_lower = entry.lower()
        if key == entry_lower or (entry_lower.endswith("/") and key.startswith(entry_lower)):
            return entry
    return None


def grants(key: str) -> str | None:
    """The system that would give a pod with this label or annotation cloud credentials; None: none known."""
    entry = covering(key, IDENTITY_KEYS)
    return IDENTITY_KEYS[entry] if entry is not None else None

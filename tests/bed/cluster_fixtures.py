"""
pytest fixtures over the real control plane (`real_cluster`): started once per test session, a
namespace of its own for each test. Tests load them with `pytest_plugins = ["bed.cluster_fixtures"]`.

- `cluster_session`: the session's `ClusterSession` (control plane, CRD, the chart's RBAC, a node);
- `kube`: this test's `ClusterNamespace`; $KUBECONFIG points at the operator's ServiceAccount token in
  that namespace, so kopf (in-process) and `kuberl-operator` (a subprocess) act with exactly the
  rights the chart grants, never the admin's.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest

from .real_cluster import ClusterNamespace, ClusterSession
from .real_cluster import cluster_session as _cluster_session

__all__ = ["cluster_session", "kube"]


@pytest.fixture(scope="session")
def cluster_session(tmp_path_factory) -> Iterator[ClusterSession]:
    with _cluster_session(tmp_path_factory.mktemp("control-plane")) as session:
        yield session


@pytest.fixture()
def kube(cluster_session: ClusterSession, request, tmp_path, monkeypatch) -> Iterator[ClusterNamespace]:
    namespace = ClusterNamespace(cluster_session, cluster_session.namespace_name(request.node.name), tmp_path)
    namespace.create_namespace()
    monkeypatch.setenv("KUBECONFIG", str(namespace.operator_kubeconfig))
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    # The client reads $KUBECONFIG once, at import: its default path must be replaced too.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(namespace.operator_kubeconfig))
    try:
        yield namespace
    finally:
        namespace.tear_down()

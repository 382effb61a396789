"""The operator under API server faults the real server does not produce on demand (a 500 on create).

These run on the emulated API server (tests/bed/k8s_emulator.py), whose request rules inject the fault;
every other operator test runs on the real control plane (test_operator_integration.py). They move to a
fault proxy in front of the real server when the emulator is retired.
"""

from __future__ import annotations

from collections.abc import Iterator

import kmock
import pytest
from bed.k8s_emulator import ALL_VERBS, EmulatedCluster, KubernetesApiEmulator, load_crds
from bed.k8s_fixtures import run_kopf_in_thread
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kuberl.operator.builders import BuildOptions
from kuberl.operator.handlers import build_registry, memo_for
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import OperatorConfig, Runtime

NS, JOB = "kuberl-test", "cartpole-ppo"
WAIT = 30


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Iterator[EmulatedCluster]:
    import kubernetes

    network_policies = kmock.resource("networking.k8s.io", "v1", "networkpolicies")
    emulator = KubernetesApiEmulator(
        crds=load_crds(), namespaces=["default", NS],
        extra_resources={network_policies: kmock.ResourceInfo(
            kind="NetworkPolicy", singular="networkpolicy", namespaced=True, verbs=ALL_VERBS,
            shortnames={"netpol"}, categories=set(), subresources=set())})
    with EmulatedCluster(emulator, tmp_path / "k8s", namespace=NS) as running:
        monkeypatch.setenv("KUBECONFIG", str(running.kubeconfig))
        monkeypatch.setenv("KUBECACHEDIR", str(running.kubecache_dir))
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(running.kubeconfig))
        yield running
    assert not emulator.internal_errors, emulator.internal_errors


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_api_errors_are_counted_and_retried(cluster, job_dict):
    cluster.emulator[f"post /api/v1/namespaces/{NS}/pods"][:3] << 500  # the first three pod creations fail
    metrics = OperatorMetrics()
    config = OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                            build=BuildOptions(trainer_image="kuberl-trainer:test"))
    runtime = Runtime(config, api_client=cluster.api_client(), metrics=metrics)
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    with run_kopf_in_thread(build_registry(login=False), namespaces=[NS], memo=memo_for(runtime)):
        cluster.create(job_dict, namespace=NS)
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            cluster.wait_for("pods", name, timeout=WAIT)
        assert sample(metrics, "kuberl_operator_errors_total", handler="reconcile", kind="http_500") >= 1
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            cluster.set_pod_phase(NS, name, "Running")
        cluster.wait_for("rltj", JOB, lambda job: (job.get("status") or {}).get("phase") == "Running", timeout=WAIT)

"""The operator under API server faults the real server does not produce on demand: a 500 on create, a
slow answer, a watch cut mid-stream, a watch
whose resourceVersion expired (410 Gone). The operator talks to the session's real control plane through a
fault proxy (tests/bed/fault_proxy.py) that injects them; everything else is the real server's answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest
from bed.fault_proxy import FaultProxy
from bed.kopf_thread import run_kopf_in_thread
from bed.real_cluster import ClusterNamespace
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kuberl.operator.builders import BuildOptions
from kuberl.operator.controllers import build_registry, memo_for
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.runtime import OperatorConfig, Runtime

JOB = "cartpole-ppo"
WAIT = 30


@pytest.fixture
def proxy(kube: ClusterNamespace, monkeypatch) -> Iterator[FaultProxy]:
    """The fault proxy, and the operator's kubeconfig (its ServiceAccount token) leading through it."""
    with FaultProxy(kube.plane) as running:
        kubeconfig = running.kubeconfig(kube.operator_kubeconfig)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        running.operator_kubeconfig = kubeconfig
        yield running


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def run_operator(kube: ClusterNamespace, proxy: FaultProxy, metrics: OperatorMetrics):
    config = OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                            build=BuildOptions(trainer_image="kuberl-trainer:test"))
    client = kubernetes.config.new_client_from_config(config_file=str(proxy.operator_kubeconfig))
    runtime = Runtime(config, api_client=client, metrics=metrics)
    return run_kopf_in_thread(build_registry(login=False), namespaces=[kube.namespace], memo=memo_for(runtime))


def test_api_errors_are_counted_and_retried(kube, proxy, job_dict):
    # The first three pod creations (server-side dry runs included) fail as an overloaded server's would.
    rule = proxy.fail("POST", rf"/api/v1/namespaces/{kube.namespace}/pods", status=500, times=3)
    metrics = OperatorMetrics()
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    with run_operator(kube, proxy, metrics):
        kube.create(job_dict)
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            kube.wait_for("pods", name, timeout=WAIT)
        assert rule.hits == 3
        assert sample(metrics, "kuberl_operator_errors_total", handler="reconcile", kind="http_500") >= 1
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            kube.set_pod_phase(None, name, "Running")
        kube.wait_for("rltj", JOB, lambda job: (job.get("status") or {}).get("phase") == "Running", timeout=WAIT)


def test_a_watch_cut_mid_stream_and_a_slow_answer_lose_no_job(kube, proxy, job_dict):
    """kopf's watch of the jobs is cut twice and the operator's pod listing answers late: the job is
    still seen, built and reported Running."""
    cut = proxy.drop("GET", r"/apis/kuberl\.dev/v1alpha1/namespaces/[^/]+/rltrainingjobs", times=2)
    slow = proxy.slow("GET", rf"/api/v1/namespaces/{kube.namespace}/pods", seconds=2, times=2)
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    with run_operator(kube, proxy, OperatorMetrics()):
        kube.create(job_dict)
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            kube.set_pod_phase(None, name, "Running")
        kube.wait_for("rltj", JOB, lambda job: (job.get("status") or {}).get("phase") == "Running", timeout=WAIT)
    assert cut.hits == 2 and slow.hits >= 1


def test_an_expired_watch_is_listed_again_and_misses_no_job(kube, proxy, job_dict):
    """The operator's watch of the jobs answers 410 Expired (etcd compacted the resourceVersion it resumes
    from), and while that watch hung a job was created: the operator lists again and builds the job."""
    release = threading.Event()
    expired = proxy.expire("GET", r"/apis/kuberl\.dev/v1alpha1/namespaces/[^/]+/rltrainingjobs", release=release)
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    with run_operator(kube, proxy, OperatorMetrics()):
        deadline = time.monotonic() + WAIT
        while expired.hits == 0:  # the operator's first watch is held by the proxy
            assert time.monotonic() < deadline, "the operator never watched the jobs"
            time.sleep(0.05)
        kube.create(job_dict)
        release.set()
        for name in (f"{JOB}-head", f"{JOB}-learner", f"{JOB}-worker-0"):
            kube.set_pod_phase(None, name, "Running")
        kube.wait_for("rltj", JOB, lambda job: (job.get("status") or {}).get("phase") == "Running", timeout=WAIT)
    assert expired.hits == 1

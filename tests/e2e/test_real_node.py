"""
Jobs on a real node: the kubelet and kube-proxy built with the control plane, containerd with runc and the
CNI bridge, CoreDNS as the cluster DNS and kube-router enforcing NetworkPolicies (tests/bed/real_node.py),
under the same control plane, chart and operator as every other cluster test. What the node agent never
did is checked here as a user meets it on a real cluster: a job's Ray pods finding each other by the
names CoreDNS serves and through the job's own NetworkPolicies, the operator (a pod on the node, reaching
the API server through the `kubernetes` Service) and Prometheus reading the learner's metrics, a Service
whose port differs from its pods', the search domains the kubelet writes into a pod's resolv.conf, and a
pod of another namespace, or of no job, refused at the Ray ports; and the probes the operator gives a
served policy, as the kubelet runs them.

Mode: containers under containerd, driven by a real kubelet.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml
from bed.cluster_bed import ROLLOUT_IMAGE, OneNodeCluster, bed_for_tests
from bed.common import wait_until

REPO = Path(__file__).resolve().parents[2]
NS, OTHER_NS = "ml-jobs", "other-team"

pytestmark = [pytest.mark.slow]

#: Requests that fit this machine's node (2 CPUs, as the kubelet measures them): the defaults (a CPU
#: each for the learner and every worker) leave a job Pending here, as they would on a small node.
SMALL = {"rolloutWorkers": {"replicas": 1, "envsPerWorker": 4,
                            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}},
         "learner": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}}}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with bed_for_tests(tmp_path_factory.mktemp("bed"), namespaces=(NS, OTHER_NS), prometheus=True) as running:
        yield running


def cartpole(name: str, max_env_steps: int) -> dict:
    job = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": NS}
    job["spec"].update(SMALL, stopping={"maxEnvSteps": max_env_steps, "maxWallClockSeconds": 900},
                       evaluation={"episodes": 5})
    return job


def apply(bed: OneNodeCluster, *docs: dict) -> None:
    bed.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(doc) for doc in docs))


#: What a probe pod runs: for each target (name, host, port, expected), connect until the result is the
#: expected one or 60 s went by, and print every result per target as JSON. A refusal by kube-router is
#: a REJECT (ECONNREFUSED at once), so a refused target is decided on its first try.
PROBE = r"""
import json, socket, sys, time
results = {}
for name, host, port, expected in json.loads(sys.argv[1]):
    tries, deadline = [], time.monotonic() + 60
    while True:
        try:
            socket.create_connection((host, port), timeout=5).close()
            tries.append("connected")
        except OSError as exc:
            tries.append(f"{type(exc).__name__}: {exc}")
        if (tries[-1] == "connected") == (expected == "connected") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    results[name] = tries
print(json.dumps(results))
"""


def probe_pod(name: str, namespace: str, targets: list[tuple[str, str, int, str]], labels: dict[str, str]) -> dict:
    """A pod that tries `targets`, as Pod Security `restricted` admits it (and, labelled as a KubeRL pod,
    the chart's admission policy: no ServiceAccount token)."""
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "probe", "image": ROLLOUT_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", PROBE, json.dumps(targets)],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}}]}}


def probe(bed: OneNodeCluster, name: str, namespace: str, targets: list[tuple[str, str, int, str]],
          labels: dict[str, str]) -> dict:
    apply(bed, probe_pod(name, namespace, targets, labels))
    pod = bed.cluster.wait_for("pods", name, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                               namespace=namespace, timeout=180)
    logs = bed.kubectl("logs", "-n", namespace, name).stdout
    assert pod["status"]["phase"] == "Succeeded", logs
    return json.loads(logs.strip().splitlines()[-1])


def port_forwarded(bed: OneNodeCluster, pod: str, port: int, path: str) -> str:
    """GET `path` from `pod`'s `port` through `kubectl port-forward` to a local port kubectl picks."""
    forward = subprocess.Popen(["kubectl", "port-forward", "-n", NS, f"pod/{pod}", f":{port}"], env=bed.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # kubectl says where it listens on its first line, or why it cannot; a hang is cut at 60 s
    killer = threading.Timer(60, forward.kill)
    killer.start()
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        local = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
        assert local, line + forward.stdout.read() if forward.poll() is not None else line
        with urllib.request.urlopen(f"http://127.0.0.1:{local[1]}{path}", timeout=30) as answer:
            return answer.read().decode()
    finally:
        killer.cancel()
        forward.terminate()
        forward.wait(10)


def exec_python(bed: OneNodeCluster, pod: str, code: str) -> str:
    """`kubectl exec` into a pod of the job (through the API server to the kubelet, to containerd)."""
    return bed.kubectl("exec", "-n", NS, pod, "--", "python3", "-c", code, timeout=60).stdout.strip()


def test_a_job_trains_to_complete_on_a_real_kubelet_through_cluster_dns(bed):
    bed.kubectl("apply", "-f", "-", input=json.dumps(cartpole("dns-job", 20_000)))
    bed.wait_complete(NS, "dns-job", 300)
    status = bed.cluster.get("rltj", "dns-job", NS)["status"]
    # The operator (a pod on the node) read the learner's metrics at its pod address.
    assert status["progress"]["envSteps"] >= 20_000 and status["progress"]["episodesPerSecond"] > 0, status
    # It ran on the real node (the learner's pod stays once the job ends; the head and the worker go), its
    # address from the CNI bridge's range; the operator's pod too, which reached the API server through
    # the `kubernetes` Service and kube-proxy. The workers and the learner joined the head at the name
    # its headless Service has (`<job>-head.<namespace>.svc`), which only CoreDNS answers here.
    learner = bed.cluster.get("pods", "dns-job-learner", NS)
    assert learner["spec"]["nodeName"] == bed.node.node_name
    assert ipaddress.ip_address(learner["status"]["podIP"]) in ipaddress.ip_network(bed.node.pod_subnet), \
        learner["status"]
    operator = bed.cluster.get("pods", bed.operator_pod_name, "kuberl-system")
    assert operator["spec"]["nodeName"] == bed.node.node_name and operator["status"]["podIP"] != bed.node.address


def test_the_jobs_network_policies_admit_its_own_pods_and_refuse_the_rest(bed):
    job = "policy-job"
    apply(bed, cartpole(job, 50_000_000))
    bed.cluster.wait_for("rltj", job, lambda j: (j.get("status") or {}).get("phase") == "Running", timeout=300)
    head_ip = bed.cluster.get("pods", f"{job}-head", NS)["status"]["podIP"]
    learner_ip = bed.cluster.get("pods", f"{job}-learner", NS)["status"]["podIP"]
    metrics = 8080
    # A Service whose port is not its pods' (80 -> the learner's named metrics port): kube-proxy's rewrite.
    apply(bed, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "learner-web", "namespace": NS},
                "spec": {"selector": {"kuberl.dev/job-name": job, "kuberl.dev/component": "learner"},
                         "ports": [{"port": 80, "targetPort": "metrics"}]}})

    # The kubelet wrote the pod's resolv.conf: CoreDNS at the node, the namespace's search domains.
    resolv = exec_python(bed, f"{job}-worker-0", "print(open('/etc/resolv.conf').read())")
    assert f"nameserver {bed.node.address}" in resolv, resolv
    assert f"search {NS}.svc.cluster.local svc.cluster.local cluster.local" in resolv, resolv
    # The job's own pods reach the head's GCS and raylet ports, by the name its headless Service has: the
    # ports the probes below are refused at are open, to the job.
    for port in (6379, 6380):
        assert exec_python(bed, f"{job}-worker-0", "import socket; socket.create_connection(("
                           f"'{job}-head', {port}), timeout=5).close(); print('connected')") == "connected"

    targets = [("gcs", head_ip, 6379, "refused"), ("gcs-by-name", f"{job}-head.{NS}.svc", 6379, "refused"),
               ("raylet", head_ip, 6380, "refused"),
               ("metrics", learner_ip, metrics, "connected"),
               ("metrics-service", f"{job}-metrics.{NS}.svc.cluster.local", metrics, "connected"),
               ("remapped-service", f"learner-web.{NS}.svc", 80, "connected")]
    # A pod of another namespace, and one of the job's namespace that says it is a worker of another job.
    another_job = {"kuberl.dev/job-name": "another-job", "kuberl.dev/component": "rollout-worker"}
    for name, namespace, labels in (("probe-other-team", OTHER_NS, {}), ("probe-another-job", NS, another_job)):
        results = probe(bed, name, namespace, targets, labels)
        for target, _, _, expected in targets:
            tries = results[target]
            if expected == "refused":
                assert all("ConnectionRefusedError" in t for t in tries), (name, target, tries)
            else:
                assert tries[-1] == "connected", (name, target, tries)

    # `kubectl port-forward`, as a user reads the learner's metrics: through the API server, the kubelet and
    # containerd's streaming server into the pod's network namespace.
    assert "kuberl_env_steps_total" in port_forwarded(bed, f"{job}-learner", metrics, "/metrics")
    # Prometheus on the host scraped the learner through its pod annotations.
    wait_until(lambda: bed.prometheus_query(f'kuberl_env_steps_total{{kubernetes_pod_name="{job}-learner"}} > 0'),
               120, 1, "Prometheus's scrape of the learner")
    bed.kubectl("delete", "rltj", job, "-n", NS, "--wait=true", "--timeout=120s")
    wait_until(lambda: not bed.cluster.list("pods", NS, label_selector=f"kuberl.dev/job-name={job}"), 120, 0.5,
               f"the pods of {job} gone")


def pod_events(bed: OneNodeCluster, pod: str) -> list[dict]:
    return bed.cluster.events(NS, involved_name=pod)


def run_pod(bed: OneNodeCluster, name: str, image: str, policy: str) -> dict:
    """A pod of `image` that prints and exits, pulled under `policy`; returns it once it ended."""
    body = probe_pod(name, NS, [], {})
    body["spec"]["containers"][0].update(image=image, imagePullPolicy=policy, command=["python3", "-c", "print('ran')"])
    apply(bed, body)
    return bed.cluster.wait_for("pods", name, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                                namespace=NS, timeout=300)


def test_images_are_pulled_from_the_registry_by_reference(bed):
    """The node's containerd mirrors ghcr.io to the bed's registry, where scripts/build-images pushed the
    images: a pod names ghcr.io/kuberl/kuberl-rollout:<tag>, as the chart does, and the kubelet pulls it."""
    # IfNotPresent, with the image gone from the node's store: the kubelet pulls it.
    bed.node.ctr("images", "rm", ROLLOUT_IMAGE)
    assert run_pod(bed, "pull-if-not-present", ROLLOUT_IMAGE, "IfNotPresent")["status"]["phase"] == "Succeeded"
    # Always: pulled on every start, the image being present or not (the registry answers for its digest).
    assert run_pod(bed, "pull-always", ROLLOUT_IMAGE, "Always")["status"]["phase"] == "Succeeded"
    for pod in ("pull-if-not-present", "pull-always"):
        # kubelet's events are posted apart from the status it writes: wait for them
        pulled = wait_until(lambda pod=pod: [e["message"] for e in pod_events(bed, pod) if e["reason"] == "Pulled"],
                            60, 0.5, f"the Pulled event of {pod}")
        assert pulled[0].startswith(f'Successfully pulled image "{ROLLOUT_IMAGE}"'), pulled
        assert "Pulling" in {e["reason"] for e in pod_events(bed, pod)}
    assert bed.kubectl("logs", "-n", NS, "pull-always").stdout.strip() == "ran"

    # A reference the registry does not hold: the kubelet's own ErrImagePull, then ImagePullBackOff.
    missing = "ghcr.io/kuberl/kuberl-missing:0.0.0"
    body = probe_pod("pull-missing", NS, [], {})
    body["spec"]["containers"][0].update(image=missing, command=["python3"])
    apply(bed, body)

    def waiting_reason(pod: dict) -> bool:
        state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {}
        return (state.get("waiting") or {}).get("reason") == "ImagePullBackOff"

    bed.cluster.wait_for("pods", "pull-missing", waiting_reason, namespace=NS, timeout=120)
    # the kubelet's Failed events: the pull's error from the registry, then the container's reason
    def failures() -> list[str]:
        return [e["message"] for e in pod_events(bed, "pull-missing") if e["reason"] == "Failed"]

    failed = wait_until(lambda: (m := failures()) and "Error: ErrImagePull" in m and m, 60, 0.5,
                        "the kubelet's ErrImagePull event")
    assert any(missing in m and "not found" in m for m in failed), failed
    for pod in ("pull-if-not-present", "pull-always", "pull-missing"):
        bed.kubectl("delete", "pod", "-n", NS, pod, "--wait=false")


def test_a_job_whose_image_the_registry_lacks_fails_at_its_startup_deadline(bed):
    job = cartpole("no-image", 20_000)
    job["spec"].update(image="ghcr.io/kuberl/kuberl-missing:0.0.0", startupDeadlineSeconds=30)
    apply(bed, job)
    starting = bed.cluster.wait_for("rltj", "no-image", lambda j: "ImagePullBackOff" in (
        (j.get("status") or {}).get("message") or ""), namespace=NS, timeout=120)["status"]
    assert starting["phase"] == "Starting" and "ghcr.io/kuberl/kuberl-missing:0.0.0" in starting["message"], starting
    status = bed.cluster.wait_for("rltj", "no-image", lambda j: (j.get("status") or {}).get("phase") == "Failed",
                                  namespace=NS, timeout=120)["status"]
    assert status["reason"] == "StartupDeadlineExceeded" and "ImagePull" in status["message"], status
    bed.kubectl("delete", "rltj", "no-image", "-n", NS, "--wait=true", "--timeout=120s")


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def serving_container(bed: OneNodeCluster, pod: str) -> dict:
    return ((bed.cluster.get("pods", pod, NS) or {}).get("status") or {}).get("containerStatuses", [{}])[0]


def test_serving_starts_behind_its_startup_probe_and_a_hung_server_is_restarted_by_its_liveness_probe(bed):
    """spec.serving's Deployment with the probes the operator gives it: its pod is started once the startup
    probe (/v2/health/live, every 2 s) passes, then Ready (/v2/health/ready). Its server stopped (SIGSTOP: a
    hung process), the liveness probe fails three times 10 s apart; the kubelet kills the container once its
    grace period is over and starts it again, behind the startup probe, and the policy answers again."""
    job = cartpole("served", 20_000)
    job["spec"]["checkpointing"] = {"intervalSeconds": 30, "keepLast": 2, "volume": {"claimName": "served-checkpoints"}}
    job["spec"]["serving"] = {"replicas": 1, "resources": {"requests": {"cpu": "250m", "memory": "512Mi"},
                                                           "limits": {"memory": "2Gi"}}}
    apply(bed, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "served-checkpoints", "namespace": NS},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}, job)
    bed.wait_complete(NS, "served", 300)
    (pod,) = bed.deployment_pods(NS, "served-serving", timeout=120)
    ip = bed.wait_pod_ready(NS, pod, 180)["status"]["podIP"]
    first = serving_container(bed, pod)
    assert first["started"] and first["restartCount"] == 0, first
    observation = {"observation": [0.0, 0.0, 0.15, 1.0]}
    assert post_json(f"http://{ip}:8000/act", observation)["action"] in (0, 1)

    os.kill(bed.node.containers.pid(first["containerID"].split("://", 1)[1]), signal.SIGSTOP)
    again = wait_until(lambda: (c := serving_container(bed, pod)).get("restartCount", 0) >= 1 and c.get("ready")
                       and c, 240, 0.5, "the hung server restarted and Ready again")
    # Once: the new server was not killed again while it started (the startup probe holds liveness off).
    assert again["restartCount"] == 1 and again["started"], again
    said = [(e["reason"], e.get("message", "")) for e in pod_events(bed, pod)]
    assert any(r == "Unhealthy" and "Liveness probe failed" in m for r, m in said), said
    assert any(r == "Killing" and "failed liveness probe" in m for r, m in said), said
    assert post_json(f"http://{ip}:8000/act", observation)["action"] in (0, 1)
    bed.kubectl("delete", "rltj", "served", "-n", NS, "--wait=true", "--timeout=120s")
    wait_until(lambda: not bed.cluster.get("deployments", "served-serving", NS), 120, 0.5,
               "the serving Deployment gone")

"""
The test bed's node agent (tests/bed/node_agent.py) does what a kubelet does, checked on real containers
and the real control plane: the scheduler binds each pod to the agent's Node, the agent runs it and
writes its status as that node, and `kubectl logs` reaches it through the API server.

Every pod here runs as a podman container of the operator image (it has a Python and a shell). These
are the behaviours the end-to-end tests rely on; if one breaks, those tests would test the bed, not the
product. Mode: podman containers.
"""

from __future__ import annotations

import json
import time

import pytest
from bed.cluster_bed import OPERATOR_IMAGE, BedApi, OneNodeCluster, require_podman_and_images
from bed.common import wait_until
from bed.podman import Podman

IMAGE = OPERATOR_IMAGE
NS = "node-test"
RESTRICTED = {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": True,
              "seccompProfile": {"type": "RuntimeDefault"}}
LOCKED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """The control plane and the node agent, without the operator."""
    require_podman_and_images()
    with OneNodeCluster(tmp_path_factory.mktemp("node"), namespaces=(NS,), operator=False,
                        restart_backoff=(1,)) as bed:
        yield bed.cluster, bed.agent
        assert not bed.agent.errors, bed.agent.errors
        assert not bed.provisioner.errors, bed.provisioner.errors


def claim(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def pod(name: str, script: str, *, restart: str = "Never", volumes=(), mounts=(), init: str | None = None,
        grace: int | None = None, labels: dict | None = None, **container) -> dict:
    spec = {"restartPolicy": restart, "securityContext": RESTRICTED,
            "containers": [{"name": "main", "image": IMAGE, "command": ["python3", "-u", "-c", script],
                            "securityContext": LOCKED, "volumeMounts": list(mounts), **container}],
            "volumes": list(volumes)}
    if init:
        spec["initContainers"] = [{"name": "init", "image": IMAGE, "command": ["sh", "-c", init],
                                   "securityContext": LOCKED, "volumeMounts": list(mounts)}]
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def ended(cluster: BedApi, name: str, timeout: float = 90) -> dict:
    return cluster.wait_for("pods", name, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                            timeout=timeout)


def ready(cluster: BedApi, name: str, timeout: float = 90) -> dict:
    def is_ready(p: dict) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", []))
    return cluster.wait_for("pods", name, is_ready, timeout=timeout)


def test_a_pod_runs_with_its_security_context_volumes_env_and_init_container(node):
    cluster, agent = node
    cluster.create(claim("data"))
    script = """
import json, os
status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)
try:
    open('/root-write-test', 'w'); root_writable = True
except OSError:
    root_writable = False
open('/scratch/x', 'w').write('ok')
st = os.statvfs('/dev/shm')
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'groups': sorted(os.getgroups()),
                  'cap_eff': status['CapEff'].strip(), 'no_new_privs': status['NoNewPrivs'].strip(),
                  'root_writable': root_writable, 'init': open('/data/init.txt').read().strip(),
                  'pod_name': os.environ['POD_NAME'], 'pod_ip': os.environ['POD_IP'], 'plain': os.environ['PLAIN'],
                  'shm_bytes': st.f_blocks * st.f_frsize}))
"""
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
               {"name": "scratch", "emptyDir": {}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}]
    mounts = [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"},
              {"name": "shm", "mountPath": "/dev/shm"}]
    cluster.create(pod("secure", script, volumes=volumes, mounts=mounts, init="echo from-init > /data/init.txt",
                       env=[{"name": "PLAIN", "value": "v"},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                       resources={"limits": {"cpu": "500m", "memory": "256Mi"}}))
    done = ended(cluster, "secure")
    status = done["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert done["spec"]["nodeName"] == agent.node_name and status["podIP"].startswith(agent.host_ip.rsplit(".", 2)[0])
    seen = json.loads(cluster.kubectl("logs", "secure").stdout.strip().splitlines()[-1])
    assert seen["uid"] == 1000 and seen["gid"] == 1000 and 1000 in seen["groups"]
    assert int(seen["cap_eff"], 16) == 0 and seen["no_new_privs"] == "1" and not seen["root_writable"]
    assert seen["init"] == "from-init" and seen["plain"] == "v"
    assert seen["pod_name"] == "secure" and seen["pod_ip"] == status["podIP"]
    assert seen["shm_bytes"] == 256 * 2**20
    # The claim is a host directory that outlives the pod, group-owned by fsGroup.
    assert (agent.claim_dir(NS, "data") / "init.txt").read_text().strip() == "from-init"
    cluster.kubectl("delete", "pod", "secure")
    wait_until(lambda: not Podman(agent.workdir).__call__("ps", "-a", "--filter", "label=io.kubernetes.pod.name=secure",
                                                         "--format", "{{.Names}}").stdout.strip(), 60, 0.2,
               "the pod's containers removed")


def test_service_names_resolve_to_their_pods_and_readiness_follows_the_probe(node):
    cluster, _ = node
    cluster.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 8000}]}})
    server = "import http.server; http.server.HTTPServer(('0.0.0.0', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()"
    cluster.create(pod("web", server, labels={"app": "web"}, ports=[{"name": "http", "containerPort": 8000}],
                       readinessProbe={"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                       workingDir="/tmp", grace=5))
    up = ready(cluster, "web")
    assert up["status"]["containerStatuses"][0]["ready"] is True
    client = f"import urllib.request; print(urllib.request.urlopen('http://web.{NS}.svc:8000/').status)"
    cluster.create(pod("client", client))
    assert ended(cluster, "client")["status"]["phase"] == "Succeeded"
    assert cluster.kubectl("logs", "client").stdout.strip() == "200"
    cluster.kubectl("delete", "pod", "web", "client")


def test_restart_policy_on_failure_restarts_and_keeps_the_previous_log(node):
    cluster, _ = node
    cluster.create(claim("flaky"))
    script = """
import os, sys
marker = '/data/first-run-done'
if not os.path.exists(marker):
    open(marker, 'w').close(); print('first run fails'); sys.exit(3)
print('second run succeeds')
"""
    cluster.create(pod("flaky", script, restart="OnFailure",
                       volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "flaky"}}],
                       mounts=[{"name": "data", "mountPath": "/data"}]))
    status = ended(cluster, "flaky")["status"]
    assert status["phase"] == "Succeeded"
    container = status["containerStatuses"][0]
    assert container["restartCount"] == 1
    assert container["lastState"]["terminated"]["exitCode"] == 3
    assert "first run fails" in cluster.kubectl("logs", "flaky", "--previous").stdout
    assert "second run succeeds" in cluster.kubectl("logs", "flaky").stdout
    cluster.kubectl("delete", "pod", "flaky")


def test_deletion_sends_sigterm_and_kills_after_the_grace_period(node):
    cluster, agent = node
    polite = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM: leaving', flush=True), sys.exit(0)))\n"
              "print('up', flush=True)\ntime.sleep(3600)")
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('SIGTERM ignored', flush=True))\n"
                "print('up', flush=True)\ntime.sleep(3600)")
    cluster.create(pod("polite", polite, grace=30))
    cluster.create(pod("stubborn", stubborn, grace=2))
    for name in ("polite", "stubborn"):
        wait_until(lambda n=name: "up" in cluster.kubectl("logs", n, check=False).stdout, 90, 0.2, f"{name} up")

    started = time.monotonic()
    cluster.kubectl("delete", "pod", "polite", "--wait=false")
    # Terminating, as on a real server, until the kubelet has stopped the containers.
    assert cluster.get("pods", "polite")["metadata"]["deletionTimestamp"]
    cluster.wait_for_absent("pods", "polite", timeout=30)
    polite_seconds = time.monotonic() - started

    started = time.monotonic()
    cluster.kubectl("delete", "pod", "stubborn")
    stubborn_seconds = time.monotonic() - started
    assert polite_seconds < 25, "a process that exits on SIGTERM must not wait out its 30 s grace period"
    assert stubborn_seconds >= 2, "SIGKILL must wait for the grace period"
    names = agent.podman("ps", "-a", "--format", "{{.Names}}").stdout
    assert "_polite_" not in names and "_stubborn_" not in names


def test_a_pod_of_a_missing_claim_is_not_scheduled_and_says_why(node):
    cluster, agent = node
    cluster.create(pod("orphan", "print(1)", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}],
                       mounts=[{"name": "d", "mountPath": "/d"}]))
    held = cluster.wait_for("pods", "orphan", lambda p: scheduled(p).get("reason") == "Unschedulable", timeout=30)
    assert 'persistentvolumeclaim "nope" not found' in scheduled(held)["message"]
    assert agent.runner(NS, "orphan") is None
    cluster.kubectl("delete", "pod", "orphan")


def test_a_service_account_pod_reaches_the_api_server_with_its_bound_token(node):
    """The projected `kube-api-access` volume admission adds: a token bound to the pod, the cluster's CA,
    the namespace; and KUBERNETES_SERVICE_HOST/PORT leading to the API server."""
    cluster, _ = node
    script = """
import json, os, ssl, urllib.request
base = '/var/run/secrets/kubernetes.io/serviceaccount'
token, ns = open(base + '/token').read(), open(base + '/namespace').read()
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
request = urllib.request.Request(url + '/apis/authentication.k8s.io/v1/selfsubjectreviews', method='POST',
    data=json.dumps({'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'}).encode(),
    headers={'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'})
context = ssl.create_default_context(cafile=base + '/ca.crt')
review = json.load(urllib.request.urlopen(request, context=context))
print(json.dumps({'namespace': ns, 'user': review['status']['userInfo']}))
"""
    cluster.create(pod("talker", script))
    done = ended(cluster, "talker")
    assert done["status"]["phase"] == "Succeeded", cluster.kubectl("logs", "talker", check=False).stdout
    assert any(v["name"].startswith("kube-api-access-") for v in done["spec"]["volumes"])
    seen = json.loads(cluster.kubectl("logs", "talker").stdout.strip().splitlines()[-1])
    assert seen["namespace"] == NS
    assert seen["user"]["username"] == f"system:serviceaccount:{NS}:default"
    # Bound to the pod: the server says which one.
    assert seen["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["talker"]
    cluster.kubectl("delete", "pod", "talker")


def test_kubectl_logs_follows_tails_and_refuses_as_a_kubelet_does(node):
    """`kubectl logs` goes to the API server, which asks the Node's kubelet port for the container's log."""
    import subprocess

    cluster, _ = node
    cluster.create(pod("counter", "import time\nfor i in range(5): print(i, flush=True)\ntime.sleep(4)\nprint('done')"))
    wait_until(lambda: "0" in cluster.kubectl("logs", "counter", check=False).stdout, 90, 0.2, "counter printing")
    follow = subprocess.run(["kubectl", "logs", "counter", "--follow"], env=cluster.env, capture_output=True,
                            text=True, timeout=90, check=True)
    assert follow.stdout.split() == ["0", "1", "2", "3", "4", "done"]  # until the container ended
    assert ended(cluster, "counter")["status"]["phase"] == "Succeeded"
    assert cluster.kubectl("logs", "counter", "--tail=2").stdout.split() == ["4", "done"]
    assert cluster.kubectl("logs", "counter", "--limit-bytes=4").stdout == "0\n1\n"
    previous = cluster.kubectl("logs", "counter", "--previous", check=False)
    assert previous.returncode != 0 and 'previous terminated container "main"' in previous.stderr
    missing = cluster.kubectl("logs", "counter", "-c", "nope", check=False)
    assert missing.returncode != 0 and "container nope is not valid for pod counter" in missing.stderr
    cluster.kubectl("delete", "pod", "counter")


def scheduled(p: dict) -> dict:
    return next((c for c in (p.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})


def waiting(p: dict) -> str | None:
    states = [cs["state"] for cs in (p.get("status") or {}).get("containerStatuses") or []]
    return next((s["waiting"].get("reason") for s in states if "waiting" in s), None)


def test_scheduling_gates_hold_a_pod_until_removed_and_cannot_be_added(node):
    cluster, agent = node
    gated = pod("gated", "print('admitted', flush=True)")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    cluster.create(gated)
    held = cluster.wait_for("pods", "gated", lambda p: scheduled(p).get("reason") == "SchedulingGated", timeout=30)
    assert held["status"]["phase"] == "Pending" and not held["spec"].get("nodeName")
    assert agent.runner(NS, "gated") is None
    with pytest.raises(Exception, match=r"spec.schedulingGates\[1\].name: Forbidden: only deletion is allowed, "
                                          r"but found new scheduling gate 'other'"):
        cluster.patch("pods", "gated", {"spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"},
                                                                     {"name": "other"}]}})
    cluster.kubectl("patch", "pod", "gated", "--type=json", "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')
    assert ended(cluster, "gated")["status"]["phase"] == "Succeeded"
    assert "admitted" in cluster.kubectl("logs", "gated").stdout
    cluster.kubectl("delete", "pod", "gated")


def test_pods_that_cannot_start_say_why_as_a_kubelet_and_scheduler_do(node):
    cluster, agent = node
    cluster.create(pod("no-image", "print(1)", image="localhost/kuberl/does-not-exist:0"))
    no_node = pod("no-node", "print(1)")
    no_node["spec"]["nodeSelector"] = {"kubernetes.io/arch": "s390x"}
    cluster.create(no_node)
    cluster.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "half"}, "data": {}})
    cluster.create(pod("no-key", "print(1)", env=[{"name": "TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "half", "key": "token"}}}]))
    seen = set()
    wait_until(lambda: seen.add(waiting(cluster.get("pods", "no-image"))) or {"ErrImagePull", "ImagePullBackOff"} <= seen,
               60, 0.1, "ErrImagePull then ImagePullBackOff")
    status = cluster.get("pods", "no-image")["status"]
    assert status["phase"] == "Pending"
    assert "localhost/kuberl/does-not-exist:0" in status["containerStatuses"][0]["state"]["waiting"]["message"]
    unschedulable = cluster.wait_for("pods", "no-node", lambda p: scheduled(p).get("reason") == "Unschedulable",
                                     timeout=30)
    assert "didn't match Pod's node affinity/selector" in scheduled(unschedulable)["message"]
    no_key = cluster.wait_for("pods", "no-key", lambda p: waiting(p) == "CreateContainerConfigError", timeout=30)
    assert "'token' not found" in no_key["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    for name in ("no-image", "no-node", "no-key"):
        cluster.kubectl("delete", "pod", name)


def test_http_sd_targets_carry_the_labels_kubernetes_sd_gives_a_pod():
    from bed.prometheus import pod_targets

    pods = [{"metadata": {"name": "j-learner", "namespace": "ml", "uid": "u1",
                          "labels": {"kuberl.dev/job-name": "j"},
                          "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}},
             "spec": {"nodeName": "n", "containers": [{"name": "learner", "ports": [
                 {"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]}]},
             "status": {"phase": "Running", "podIP": "10.1.0.7",
                        "conditions": [{"type": "Ready", "status": "True"}]}},
            {"metadata": {"name": "pending", "namespace": "ml"}, "spec": {"containers": [{"name": "c"}]},
             "status": {"phase": "Pending"}}]
    (group,) = pod_targets(pods)  # a pod without an address is no target yet
    assert group["targets"] == ["10.1.0.7:8080"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8080"
    assert labels["__meta_kubernetes_pod_label_kuberl_dev_job_name"] == "j"
    assert labels["__meta_kubernetes_namespace"] == "ml" and labels["__meta_kubernetes_pod_ready"] == "true"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics"

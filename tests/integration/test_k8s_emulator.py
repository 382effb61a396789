"""
The emulated API server works with the real clients the operator and its users rely on: the
`kubernetes` package, kopf running in a thread, and the kubectl binary.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import urllib.request

import kopf
import kubernetes
import pytest
import yaml
from bed.k8s_emulator import default_crd, load_crds
from kubernetes.client.exceptions import ApiException

pytest_plugins = ["bed.k8s_fixtures"]  # k8s_cluster, k8s_api, run_kopf

GROUP, VERSION, PLURAL = "kuberl.dev", "v1alpha1", "rltrainingjobs"
NS = "kuberl-test"  # the k8s_namespace fixture's default


def pod_manifest(name: str, labels: dict[str, str] | None = None, owners: list[dict] | None = None) -> dict:
    metadata: dict = {"name": name, "labels": labels or {}}
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}]},
    }


def job_manifest(name: str, **spec) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RLTrainingJob",
        "metadata": {"name": name},
        "spec": spec or {"algorithm": "ppo"},
    }


def owner_ref(obj: dict) -> dict:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


# ---- the python client --------------------------------------------------------------------------


def test_discovery_and_namespaces(k8s_cluster, k8s_api):
    core = get_json(f"{k8s_cluster.url}/api/v1")
    assert core["groupVersion"] == "v1"
    assert {
        "pods",
        "pods/status",
        "services",
        "configmaps",
        "persistentvolumeclaims",
        "events",
        "namespaces",
    } <= {r["name"] for r in core["resources"]}

    custom = get_json(f"{k8s_cluster.url}/apis/{GROUP}/{VERSION}")
    jobs = next(r for r in custom["resources"] if r["name"] == PLURAL)
    assert jobs["kind"] == "RLTrainingJob" and jobs["namespaced"] and "rltj" in jobs["shortNames"]
    assert {"list", "watch", "patch"} <= set(jobs["verbs"])
    assert f"{PLURAL}/status" in {r["name"] for r in custom["resources"]}
    assert GROUP in {g["name"] for g in get_json(f"{k8s_cluster.url}/apis")["groups"]}

    v1 = kubernetes.client.CoreV1Api(k8s_api)
    assert {"default", NS} <= {ns.metadata.name for ns in v1.list_namespace().items}
    assert v1.read_namespace(NS).status.phase == "Active"
    with pytest.raises(ApiException) as missing:
        v1.create_namespaced_config_map("no-such-namespace", {"metadata": {"name": "cm"}})
    assert missing.value.status == 404


def test_pod_crud_with_the_python_client(k8s_cluster, k8s_api):
    v1 = kubernetes.client.CoreV1Api(k8s_api)
    manifest = pod_manifest("learner", {"app": "kuberl"})
    del manifest["apiVersion"], manifest["kind"]  # the client may omit them; the server fills them in

    pod, status, _ = v1.create_namespaced_pod_with_http_info(NS, manifest)
    assert status == 201
    assert pod.metadata.namespace == NS  # from the URL: the body had none
    assert pod.metadata.uid and pod.metadata.resource_version and pod.metadata.creation_timestamp
    assert pod.status.phase == "Pending"  # no kubelet here
    with pytest.raises(ApiException) as duplicate:
        v1.create_namespaced_pod(NS, manifest)
    assert duplicate.value.status == 409

    # A strategic patch merges containers by name instead of replacing the list.
    patched = v1.patch_namespaced_pod(
        "learner",
        NS,
        {
            "metadata": {"labels": {"role": "learner"}},
            "spec": {"containers": [{"name": "main", "image": "kuberl:2"}]},
        },
    )
    assert patched.metadata.labels == {"app": "kuberl", "role": "learner"}
    assert patched.spec.containers[0].image == "kuberl:2" and patched.spec.containers[0].command == [
        "sleep",
        "1",
    ]
    assert int(patched.metadata.resource_version) > int(pod.metadata.resource_version)

    stale = pod  # its resourceVersion is older than the patch
    stale.metadata.labels = {"app": "stale"}
    with pytest.raises(ApiException) as conflict:
        v1.replace_namespaced_pod("learner", NS, stale)
    assert conflict.value.status == 409
    fresh = v1.read_namespaced_pod("learner", NS)
    fresh.metadata.labels["replaced"] = "yes"
    assert v1.replace_namespaced_pod("learner", NS, fresh).metadata.labels["replaced"] == "yes"

    # The status subresource is how a kubelet reports; set_pod_phase does the same.
    k8s_cluster.set_pod_phase(NS, "learner", "Failed", exit_code=3)
    failed = v1.read_namespaced_pod_status("learner", NS)
    assert failed.status.phase == "Failed"
    assert failed.status.container_statuses[0].state.terminated.exit_code == 3

    v1.delete_namespaced_pod("learner", NS)
    with pytest.raises(ApiException) as gone:
        v1.read_namespaced_pod("learner", NS)
    assert gone.value.status == 404


def test_custom_resource_crud_generation_and_status_subresource(k8s_cluster, k8s_api):
    api = kubernetes.client.CustomObjectsApi(k8s_api)
    job, status, _ = api.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, NS, PLURAL, {**job_manifest("j1"), "status": {"phase": "Forged"}}
    )
    assert status == 201 and job["metadata"]["generation"] == 1
    assert "status" not in job  # status is written through /status only

    spec_changed = api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "j1", {"spec": {"algorithm": "dqn"}}
    )
    assert spec_changed["metadata"]["generation"] == 2

    # /status changes status only and leaves the generation; the main resource ignores status.
    with_status = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "j1", {"status": {"phase": "Running"}, "spec": {"algorithm": "ignored"}}
    )
    assert with_status["status"] == {"phase": "Running"} and with_status["spec"] == {"algorithm": "dqn"}
    assert with_status["metadata"]["generation"] == 2
    ignored = api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "j1", {"status": {"phase": "Hacked"}, "metadata": {"labels": {"a": "b"}}}
    )
    assert ignored["status"] == {"phase": "Running"} and ignored["metadata"]["generation"] == 2

    # Optimistic concurrency on replace.
    stale = dict(spec_changed, spec={"algorithm": "bdq"})
    with pytest.raises(ApiException) as conflict:
        api.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "j1", stale)
    assert conflict.value.status == 409

    generated = api.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, {**job_manifest(""), "metadata": {"generateName": "sweep-"}}
    )
    assert generated["metadata"]["name"].startswith("sweep-") and len(generated["metadata"]["name"]) == 11
    listed = api.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert listed["kind"] == "RLTrainingJobList" and listed["apiVersion"] == f"{GROUP}/{VERSION}"
    assert {item["metadata"]["name"] for item in listed["items"]} == {"j1", generated["metadata"]["name"]}
    assert int(listed["metadata"]["resourceVersion"]) >= int(generated["metadata"]["resourceVersion"])

    with pytest.raises(ApiException) as invalid:
        api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job_manifest("Not_A_Name"))
    assert invalid.value.status == 422


def test_label_and_field_selectors(k8s_cluster, k8s_api):
    v1 = kubernetes.client.CoreV1Api(k8s_api)
    for name, labels in [
        ("w0", {"role": "worker", "tier": "a"}),
        ("w1", {"role": "worker", "tier": "b"}),
        ("learner", {"role": "learner"}),
        ("plain", {}),
    ]:
        k8s_cluster.create(pod_manifest(name, labels))
    k8s_cluster.set_pod_phase(NS, "w1", "Running")

    def names(**kwargs) -> set[str]:
        return {pod.metadata.name for pod in v1.list_namespaced_pod(NS, **kwargs).items}

    assert names(label_selector="role=worker") == {"w0", "w1"}
    assert names(label_selector="role==worker,tier!=a") == {"w1"}
    assert names(label_selector="role in (learner, worker)") == {"w0", "w1", "learner"}
    assert names(label_selector="role notin (worker)") == {"learner", "plain"}
    assert names(label_selector="tier") == {"w0", "w1"}
    assert names(label_selector="!role") == {"plain"}
    assert names(field_selector="metadata.name=learner") == {"learner"}
    assert names(field_selector="status.phase=Running") == {"w1"}
    assert names(field_selector="status.phase!=Running", label_selector="role=worker") == {"w0"}
    assert k8s_cluster.list("pods", label_selector="tier=b") == [k8s_cluster.get("pods", "w1")]
    with pytest.raises(ApiException) as unsupported:  # as on a cluster: only the fields it indexes
        v1.list_namespaced_pod(NS, field_selector="spec.containers=x")
    assert unsupported.value.status == 400


def test_watch_resumes_from_the_list_resource_version(k8s_cluster, k8s_api):
    v1 = kubernetes.client.CoreV1Api(k8s_api)
    k8s_cluster.create(pod_manifest("before"))
    listed_rv = v1.list_namespaced_pod(NS).metadata.resource_version

    # Changes between the list and the watch must reach the watch, in order.
    k8s_cluster.create(pod_manifest("after", {"role": "worker"}))
    k8s_cluster.patch("pods", "after", {"metadata": {"labels": {"role": "learner"}}})
    k8s_cluster.delete("pods", "before")

    stream = kubernetes.watch.Watch().stream(
        v1.list_namespaced_pod, NS, resource_version=listed_rv, timeout_seconds=1
    )
    assert [(event["type"], event["object"].metadata.name) for event in stream] == [
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("DELETED", "before"),
    ]

    # With a selector, objects entering and leaving it show up as ADDED and DELETED.
    stream = kubernetes.watch.Watch().stream(
        v1.list_namespaced_pod,
        NS,
        resource_version=listed_rv,
        label_selector="role=worker",
        timeout_seconds=1,
    )
    assert [(event["type"], event["object"].metadata.name) for event in stream] == [
        ("ADDED", "after"),
        ("DELETED", "after"),
    ]


def test_garbage_collection_through_owner_references(k8s_cluster, k8s_api):
    v1 = kubernetes.client.CoreV1Api(k8s_api)
    job = k8s_cluster.create(job_manifest("j1"))
    config = k8s_cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}})
    k8s_cluster.create(pod_manifest("worker", owners=[owner_ref(job)]))
    k8s_cluster.create(pod_manifest("both", owners=[owner_ref(job), owner_ref(config)]))
    k8s_cluster.create(pod_manifest("unowned"))

    kubernetes.client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "j1"
    )
    assert {pod["metadata"]["name"] for pod in k8s_cluster.list("pods")} == {"both", "unowned"}
    assert [ref["name"] for ref in k8s_cluster.get("pods", "both")["metadata"]["ownerReferences"]] == [
        "shared"
    ]

    v1.delete_namespaced_config_map("shared", NS, propagation_policy="Orphan")
    orphan = k8s_cluster.get("pods", "both")
    assert orphan is not None and "ownerReferences" not in orphan["metadata"]


def test_finalizers_hold_deletion_and_json_patch_tests_the_resource_version(k8s_cluster, k8s_api):
    api = kubernetes.client.CustomObjectsApi(k8s_api)
    created = api.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        {**job_manifest("j1"), "metadata": {"name": "j1", "finalizers": ["test/hold"]}},
    )
    api.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "j1")
    held = api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "j1")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == ["test/hold"]

    def remove_finalizer(resource_version: str) -> dict:
        # A JSON patch, as kopf sends it (the generated client only speaks merge patch for custom objects).
        data, _status, _headers = k8s_api.call_api(
            f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/j1",
            "PATCH",
            header_params={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
            body=[
                {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ],
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=False,
        )
        return data

    with pytest.raises(ApiException) as stale:  # kopf relies on 422 to retry with a fresh body
        remove_finalizer(created["metadata"]["resourceVersion"])
    assert stale.value.status == 422
    remove_finalizer(held["metadata"]["resourceVersion"])
    assert k8s_cluster.get("rltj", "j1") is None
    assert [version is None for version in k8s_cluster.history("rltj", "j1")] == [False, False, False, True]


def test_kmock_reactions_take_precedence_over_the_emulation(k8s_cluster, k8s_api):
    v1 = kubernetes.client.CoreV1Api(k8s_api)
    k8s_cluster.call(lambda: k8s_cluster.emulator[f"post /api/v1/namespaces/{NS}/pods"] << 503)
    with pytest.raises(ApiException) as unavailable:
        v1.create_namespaced_pod(NS, pod_manifest("p1"))
    assert unavailable.value.status == 503 and k8s_cluster.get("pods", "p1") is None
    assert v1.list_namespaced_pod(NS).items == []  # other requests are still emulated


# ---- kopf ---------------------------------------------------------------------------------------


def test_kopf_operator_runs_handlers_against_the_emulator(k8s_cluster, k8s_api, run_kopf):
    registry = kopf.OperatorRegistry()
    deleted: list[str] = []

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, backoff=0.5)
    def create_job(body, name, namespace, patch, **_):
        pod = pod_manifest(f"{name}-learner", {"kuberl.dev/job": name})
        kopf.adopt(pod, owner=body)
        kubernetes.client.CoreV1Api(k8s_api).create_namespaced_pod(namespace, pod)
        kopf.info(body, reason="Created", message=f"Created pod {pod['metadata']['name']}")
        patch.status["phase"] = "Starting"

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, backoff=0.5)
    def delete_job(name, **_):
        deleted.append(name)

    with run_kopf(registry):
        job = k8s_cluster.create(job_manifest("j1"))
        pod = k8s_cluster.wait_for("pods", "j1-learner")
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        started = k8s_cluster.wait_for(
            "rltj", "j1", lambda obj: obj.get("status", {}).get("phase") == "Starting"
        )
        assert started["metadata"]["finalizers"]  # kopf's, for its on.delete handler
        deadline = time.monotonic() + 30  # kopf posts Events from a queue, a moment later (generous: busy CI)
        while not any(event["reason"] == "Created" for event in k8s_cluster.events(involved_name="j1")):
            assert time.monotonic() < deadline, k8s_cluster.events()
            time.sleep(0.05)

        k8s_cluster.delete("rltj", "j1")
        k8s_cluster.wait_for_absent("rltj", "j1")
        assert deleted == ["j1"]
        assert any(
            version and version["metadata"].get("deletionTimestamp")
            for version in k8s_cluster.history("rltj", "j1")
        )  # it waited for the finalizer
        k8s_cluster.wait_for_absent("pods", "j1-learner", timeout=30)  # garbage-collected


# ---- kubectl ------------------------------------------------------------------------------------


def test_kubectl_apply_get_patch_wait_delete(k8s_cluster, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        yaml.safe_dump_all([job_manifest("j1", algorithm="ppo"), pod_manifest("p1", {"app": "kuberl"})])
    )
    applied = k8s_cluster.kubectl("apply", "--validate=false", "-f", str(manifest)).stdout
    assert "rltrainingjob.kuberl.dev/j1 created" in applied and "pod/p1 created" in applied
    assert "unchanged" in k8s_cluster.kubectl("apply", "--validate=false", "-f", str(manifest)).stdout

    job = json.loads(k8s_cluster.kubectl("get", "rltj", "j1", "-o", "json").stdout)
    assert job["spec"] == {"algorithm": "ppo"}
    assert k8s_cluster.kubectl("get", "pods", "-l", "app=kuberl", "-o", "name").stdout.split() == ["pod/p1"]
    assert k8s_cluster.kubectl("get", "pods", "-l", "app=other", "-o", "name").stdout.split() == []

    assert (
        "patched"
        in k8s_cluster.kubectl(
            "patch", "rltj", "j1", "--type=merge", "-p", '{"spec": {"algorithm": "dqn"}}'
        ).stdout
    )
    assert k8s_cluster.get("rltj", "j1")["spec"] == {"algorithm": "dqn"}

    # kubectl wait lists, then watches by metadata.name until the condition appears.
    def become_ready() -> None:
        time.sleep(0.3)
        k8s_cluster.patch_status("rltj", "j1", {"conditions": [{"type": "Ready", "status": "True"}]})

    threading.Thread(target=become_ready).start()
    waited = k8s_cluster.kubectl("wait", "--for=condition=Ready", "rltj/j1", "--timeout=25s").stdout
    assert "condition met" in waited

    deleted = k8s_cluster.kubectl("delete", "-f", str(manifest)).stdout
    assert 'rltrainingjob.kuberl.dev "j1" deleted' in deleted and 'pod "p1" deleted' in deleted
    assert k8s_cluster.list("rltj") == [] and k8s_cluster.list("pods") == []


def test_kubectl_get_watch_streams_changes(k8s_cluster):
    k8s_cluster.create(pod_manifest("p1"))
    process = subprocess.Popen(
        ["kubectl", "get", "pods", "-w"],
        env=k8s_cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=30).split()[:3] == ["NAME", "READY", "STATUS"]
        assert lines.get(timeout=30).split()[:3] == ["p1", "0/1", "Pending"]
        k8s_cluster.set_pod_phase(NS, "p1", "Running")
        assert lines.get(timeout=30).split()[:3] == ["p1", "1/1", "Running"]
    finally:
        process.terminate()
        process.wait(5)
    assert process.stderr.read() == ""


def test_kubectl_get_prints_the_crd_printer_columns(k8s_cluster):
    # The committed CRD's columns (or the stand-in's until crds/rltrainingjob.yaml exists).
    columns = load_crds()[0]["spec"]["versions"][0].get("additionalPrinterColumns") or [{"name": "Age"}]
    k8s_cluster.create(job_manifest("j1"))
    header = k8s_cluster.kubectl("get", "rltj").stdout.splitlines()[0].split()
    assert header == ["NAME"] + [
        word for column in columns if not column.get("priority") for word in column["name"].upper().split()
    ]

    # Any CRD's columns, incl. condition filters, from a CRD created after the server started.
    k8s_cluster.register_crd(
        default_crd(
            group="example.com",
            kind="Widget",
            plural="widgets",
            short_names=["wdg"],
            printer_columns=[
                {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                {
                    "name": "Ready",
                    "type": "string",
                    "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                },
                {"name": "Workers", "type": "integer", "jsonPath": ".spec.workers"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            ],
        )
    )
    k8s_cluster.create(
        {
            "apiVersion": "example.com/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"workers": 4},
        }
    )
    k8s_cluster.patch_status(
        "widgets",
        "w1",
        {
            "phase": "Running",
            "conditions": [{"type": "Scheduled", "status": "False"}, {"type": "Ready", "status": "True"}],
        },
    )
    output = k8s_cluster.kubectl("get", "wdg").stdout.splitlines()
    assert output[0].split() == ["NAME", "PHASE", "READY", "WORKERS", "AGE"]
    assert output[1].split()[:4] == ["w1", "Running", "True", "4"]

"""spec.serving: the model's checks, the pure builders (dict asserts), and the operator for real on a real API
server creating the serving Deployment and Service once the job succeeds."""

from __future__ import annotations

import kubernetes_validate
import pytest
from bed.real_cluster import volume_claim
from pod_security import assert_restricted

from kuberl.api.load import InvalidJob, parse_job
from kuberl.operator import builders, names
from kuberl.operator.builders import BuildOptions

OPTIONS = BuildOptions(trainer_image="registry.local/kuberl-trainer:test")
NS = "kuberl-test"
JOB = "cartpole-ppo"


def serving_job(job_dict: dict, **serving) -> dict:
    job_dict["metadata"]["namespace"] = NS
    job_dict["spec"]["checkpointing"] = {"volume": {"claimName": "cartpole-checkpoints"}}
    job_dict["spec"]["serving"] = serving
    return job_dict


# ---- the model --------------------------------------------------------------------------------------


def test_serving_defaults_and_bounds(job_dict):
    spec = parse_job(serving_job(job_dict)).spec.serving
    assert (spec.replicas, spec.port, spec.metrics_port, spec.max_batch) == (1, 8000, 9090, 256)
    assert spec.resources.requests == {"cpu": "500m", "memory": "1Gi"}
    for bad, path in (({"replicas": 0}, "spec.serving.replicas"), ({"port": 80}, "spec.serving.port"),
                      ({"port": 9090}, "spec.serving"), ({"replica": 2}, "spec.serving.replica")):
        with pytest.raises(InvalidJob) as err:
            parse_job(serving_job(dict(job_dict, spec=dict(job_dict["spec"])), **bad))
        assert [p.path for p in err.value.problems] == [path], err.value.problems


def test_serving_needs_a_checkpoint_claim(job_dict):
    job_dict["spec"]["serving"] = {}
    with pytest.raises(InvalidJob) as err:
        parse_job(job_dict)
    (problem,) = err.value.problems
    assert problem.path == "spec" and "serving needs checkpointing.volume.claimName" in problem.message


# ---- the builders ------------------------------------------------------------------------------------


def test_serving_deployment_runs_kuberl_serve_on_the_claim_read_only(job_dict):
    job = parse_job(serving_job(job_dict, replicas=2, port=8100, metricsPort=9100, maxBatch=64,
                                resources={"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}))
    deployment = builders.build_serving_deployment(job, OPTIONS)
    assert deployment["apiVersion"] == "apps/v1" and deployment["kind"] == "Deployment"
    assert deployment["metadata"]["name"] == "cartpole-ppo-serving"
    assert deployment["metadata"]["namespace"] == NS
    selector = {"kuberl.dev/job-name": JOB, "kuberl.dev/component": "serving"}
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": selector}
    template = deployment["spec"]["template"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    assert template["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9100",
                                                   "prometheus.io/path": "/metrics"}
    pod = template["spec"]
    assert pod["restartPolicy"] == "Always"
    assert pod["volumes"] == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "cartpole-checkpoints"}},
                              {"name": "tmp", "emptyDir": {}}]  # scratch: the root filesystem is read-only
    (container,) = pod["containers"]
    assert container["image"] == "registry.local/kuberl-trainer:test"
    assert container["command"] == ["kuberl", "serve", "/checkpoints", "--host", "0.0.0.0", "--port=8100",
                                    "--metrics-port=9100", f"--model-name={JOB}", "--max-batch=64"]
    assert container["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True},
                                         {"name": "tmp", "mountPath": "/tmp"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["resources"] == {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}
    assert_restricted(deployment)


def test_serving_service_and_endpoint(job_dict):
    job = parse_job(serving_job(job_dict, port=8100, metricsPort=9100))
    service = builders.build_serving_service(job)
    assert service["metadata"]["name"] == "cartpole-ppo-serving"
    assert service["spec"]["selector"] == {"kuberl.dev/job-name": JOB, "kuberl.dev/component": "serving"}
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP"},
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}]
    assert builders.serving_endpoint(job) == f"http://cartpole-ppo-serving.{NS}.svc:8100"


def test_serving_children_validate_against_the_kubernetes_schemas_and_are_owned(job_dict):
    job = parse_job(serving_job(job_dict))
    owner = {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
             "metadata": {"name": JOB, "namespace": NS, "uid": "1234-uid"}}
    children = builders.adopt(builders.build_serving(job, OPTIONS), owner)
    assert [c["kind"] for c in children] == ["Service", "Deployment"]
    for child in children:
        kubernetes_validate.validate(child, "1.31", strict=True)
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == "1234-uid" and ref["kind"] == "RLTrainingJob"


def test_no_serving_builds_nothing(job_dict):
    job = parse_job(job_dict)
    assert builders.build_serving(job, OPTIONS) == [] and builders.serving_endpoint(job) is None


# ---- the operator for real, on the real API server ----------------------------------------------------------


@pytest.fixture
def cluster(kube):
    return kube


def test_operator_creates_the_serving_deployment_and_service_once_the_job_succeeds(cluster, job_dict):
    from bed.kopf_thread import run_kopf_in_thread

    from kuberl.operator import rbac
    from kuberl.operator.controllers import build_registry, memo_for
    from kuberl.operator.runtime import OperatorConfig, Runtime

    config = OperatorConfig(reconcile_interval=0.5, idle_interval=0.5, progress_interval=0.2,
                            build=BuildOptions(trainer_image="kuberl-trainer:test"))
    runtime = Runtime(config, api_client=cluster.operator_api_client())
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 1
    with run_kopf_in_thread(build_registry(login=False), namespaces=[cluster.namespace], memo=memo_for(runtime)):
        body = serving_job(job_dict)
        body["metadata"]["namespace"] = cluster.namespace
        for manifest in volume_claim("cartpole-checkpoints", cluster.namespace):
            cluster.create(manifest)
        job = cluster.create(body, namespace=cluster.namespace)
        learner = names.learner_pod(JOB)
        for pod in (names.head_pod(JOB), learner, names.worker_pod(JOB, 0)):
            cluster.wait_for("pods", pod)
            cluster.set_pod_phase(cluster.namespace, pod, "Running")
        cluster.wait_for("rltj", JOB, lambda o: (o.get("status") or {}).get("phase") == "Running")
        assert cluster.get("deployments", f"{JOB}-serving") is None  # nothing to serve while training

        cluster.set_pod_phase(cluster.namespace, learner, "Succeeded")
        done = cluster.wait_for("rltj", JOB, lambda o: (o.get("status") or {}).get("servingEndpoint"))
        assert done["status"]["phase"] == "Succeeded"
        assert done["status"]["servingEndpoint"] == f"http://{JOB}-serving.{cluster.namespace}.svc:8000"
        deployment = cluster.wait_for("deployments", f"{JOB}-serving")
        service = cluster.wait_for("services", f"{JOB}-serving")
        for child in (deployment, service):
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"]) == ("RLTrainingJob", JOB, job["metadata"]["uid"])
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "kuberl-trainer:test"

        # Create-if-absent each pass: a deleted serving Deployment comes back.
        cluster.delete("deployments", f"{JOB}-serving")
        cluster.wait_for("deployments", f"{JOB}-serving")

    allowed = {(g, r, v) for rule in rbac.RULES for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert ("apps", "deployments", "create") in allowed
    posted = {(e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"]) for e in cluster.requests()
              if e["verb"] == "create" and e["responseStatus"]["code"] == 201}
    assert ("apps", "deployments") in posted

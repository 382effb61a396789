"""The pure builders: a job in, its children's manifests out (names, labels, commands, ports, security)."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from conftest import job_pods
from kuberl.api.job import RLTrainingJob
from kuberl.api.load import parse_job
from kuberl.operator import builders, names
from kuberl.operator.builders import BuildOptions
from kuberl.operator.names import Component
from pod_security import assert_restricted, restricted_violations

OPTIONS = BuildOptions(trainer_image="registry.local/kuberl-trainer:test", rollout_image="registry.local/kuberl-rollout:test")


@pytest.fixture
def job(job_dict) -> RLTrainingJob:
    job_dict["metadata"]["namespace"] = "rl"
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 3
    return parse_job(job_dict)


def owner(job: RLTrainingJob) -> dict:
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
            "metadata": {"name": job.metadata.name, "namespace": "rl", "uid": "1234-uid", "labels": {"team": "a"}}}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] if "value" in e else e["valueFrom"] for e in container["env"]}


def test_every_ray_process_authenticates_with_the_jobs_own_token_secret(job):
    import base64

    secret = builders.build_ray_token_secret(job, "t0ken")
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "cartpole-ppo-ray-token"
    assert base64.b64decode(secret["data"]["token"]) == b"t0ken"
    pods = [builders.build_head_pod(job, OPTIONS), builders.build_learner_pod(job, OPTIONS),
            builders.build_worker_pod(job, OPTIONS, 0)]
    for pod in pods:
        (container,) = [c for c in pod["spec"]["containers"]]
        env = env_of(container)
        assert env["RAY_AUTH_MODE"] == "token", pod["metadata"]["name"]
        assert env["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"name": "cartpole-ppo-ray-token", "key": "token"}}
    # The token is never in a manifest the operator builds, only in the Secret.
    assert "t0ken" not in json.dumps(pods) and "t0ken" not in json.dumps(builders.build_services(job, OPTIONS))


def test_children_names_labels_and_kinds(job):
    pods = job_pods(job, OPTIONS)
    assert [p["metadata"]["name"] for p in pods] == [
        "cartpole-ppo-head", "cartpole-ppo-learner",
        "cartpole-ppo-worker-0", "cartpole-ppo-worker-1", "cartpole-ppo-worker-2"]
    for pod, component in zip(pods, [Component.HEAD, Component.LEARNER] + [Component.ROLLOUT_WORKER] * 3):
        labels = pod["metadata"]["labels"]
        assert pod["metadata"]["namespace"] == "rl"
        assert labels["app.kubernetes.io/name"] == "kuberl"
        assert labels["app.kubernetes.io/instance"] == "cartpole-ppo"
        assert labels["app.kubernetes.io/component"] == component.value
        assert labels["app.kubernetes.io/managed-by"] == "kuberl-operator"
        assert labels["app.kubernetes.io/part-of"] == "kuberl"
        assert labels["kuberl.dev/job-name"] == "cartpole-ppo"
        assert labels["kuberl.dev/component"] == component.value
        assert labels["kuberl.dev/ray-epoch"] == "0"
    assert [p["metadata"]["labels"].get("kuberl.dev/worker-index") for p in pods[2:]] == ["0", "1", "2"]
    others = builders.build_services(job, OPTIONS)
    assert [(m["kind"], m["metadata"]["name"]) for m in others] == [
        ("Service", "cartpole-ppo-head"), ("PodDisruptionBudget", "cartpole-ppo-disruptions"),
        ("Service", "cartpole-ppo-metrics"),
        ("NetworkPolicy", "cartpole-ppo-ray"), ("NetworkPolicy", "cartpole-ppo-learner")]
    assert [m["kind"] for m in builders.build_services(job, BuildOptions(network_policies=False))] == [
        "Service", "PodDisruptionBudget", "Service"]
    budget = others[1]["spec"]
    # Every pod of the job (head, learner, workers) under one budget: a drain takes one at a time.
    # head + learner + 3 workers, all but one.
    assert budget == {"minAvailable": 4, "selector": {"matchLabels": {"kuberl.dev/job-name": "cartpole-ppo"}},
                      "unhealthyPodEvictionPolicy": "AlwaysAllow"}


def test_adopt_sets_owner_reference_and_keeps_our_labels(job):
    children = builders.adopt(job_pods(job, OPTIONS) + builders.build_services(job, OPTIONS), owner(job))
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob", "name": "cartpole-ppo",
                       "uid": "1234-uid", "controller": True, "blockOwnerDeletion": True}
        assert child["metadata"]["labels"]["team"] == "a"  # the job's own labels are inherited
        assert child["metadata"]["labels"]["kuberl.dev/job-name"] == "cartpole-ppo"


def test_head_pod_runs_ray_head_without_cpus_and_names_its_ports(job):
    pod = builders.build_head_pod(job, OPTIONS, epoch=2)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.local/kuberl-rollout:test"  # Ray only: the image without torch
    assert container["command"][:4] == ["python3", "-m", "kuberl.trainer.ray_node", "--head"]
    assert "--port=6379" in container["command"] and "--block" in container["command"]
    assert "--num-cpus=0" in container["command"]  # no rollout work on the head
    assert "--include-dashboard=false" in container["command"]  # its agents are minimal (ray_node)
    assert "--no-monitor" in container["command"]  # the operator sizes the cluster, not Ray's autoscaler
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "gcs": 6379, "raylet": 6380, "client": 10001}
    assert "--node-manager-port=6380" in container["command"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "raylet"}
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert pod["metadata"]["labels"]["kuberl.dev/ray-epoch"] == "2"
    assert pod["spec"]["restartPolicy"] == "Never"


def test_head_service_is_headless_and_selects_only_the_head(job):
    svc = builders.build_head_service(job)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"kuberl.dev/job-name": "cartpole-ppo", "kuberl.dev/component": "head"}
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("gcs", 6379, "gcs"), ("raylet", 6380, "raylet"), ("client", 10001, "client")]


def test_worker_pod_joins_the_head_with_one_rollout_slot(job_dict):
    job_dict["spec"]["rolloutWorkers"]["resources"] = {"requests": {"cpu": "1500m"}, "limits": {"memory": "1Gi"}}
    job_dict["spec"]["rolloutWorkers"]["nodeSelector"] = {"pool": "cpu"}
    job = parse_job(job_dict)
    pod = builders.build_worker_pod(job, OPTIONS, 4)
    (container,) = pod["spec"]["containers"]
    assert container["command"] == [
        "python3", "-m", "kuberl.trainer.ray_node", "--wait-for=cartpole-ppo-head.default.svc:6379",
        "--wait-for=cartpole-ppo-head.default.svc:6380", "--address=cartpole-ppo-head.default.svc:6379", "--block",
        "--num-cpus=2", '--resources={"rollout_slot": 1}', "--disable-usage-stats"]
    assert json.loads(container["command"][8].split("=", 1)[1]) == {"rollout_slot": 1}
    assert container["resources"] == {"requests": {"cpu": "1500m"}, "limits": {"memory": "1Gi"}}
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert "initContainers" not in pod["spec"]  # the node waits for its head itself: one container start
    assert pod["metadata"]["name"] == "cartpole-ppo-worker-4"


def test_a_node_starts_only_once_the_heads_gcs_and_its_raylet_both_answer(job):
    """The worker's `--wait-for` addresses, waited on for real against sockets on a loopback address of its
    own: with only the GCS up it keeps waiting (a worker started then would give up on the head's
    unregistered node), and it returns once the head's raylet port answers too. `ray start` never sees
    KubeRL's option."""
    import socket
    import threading

    from kuberl.trainer import ray_node

    command = builders.build_worker_pod(job, OPTIONS, 0)["spec"]["containers"][0]["command"]
    waits, rest = ray_node.split_wait_for(command[3:])
    head = "cartpole-ppo-head.rl.svc"
    assert waits == [(head, 6379), (head, names.HEAD_RAYLET_PORT)]
    assert rest[0] == f"--address={head}:6379" and not [a for a in rest if "wait-for" in a]
    host = "127.0.0.77"
    gcs = socket.create_server((host, 0))
    on_raylet = threading.Event()
    lines: list[str] = []

    def report(line: str) -> None:
        lines.append(line)
        if f":{names.HEAD_RAYLET_PORT} " in line:
            on_raylet.set()

    waiter = threading.Thread(target=ray_node.wait_for, daemon=True,
                              args=([(host, gcs.getsockname()[1]), (host, names.HEAD_RAYLET_PORT)], 0.05, report))
    try:
        waiter.start()
        assert on_raylet.wait(timeout=60), lines  # past the GCS, now waiting on the raylet
        assert waiter.is_alive()
        with socket.create_server((host, names.HEAD_RAYLET_PORT)):
            waiter.join(timeout=60)
            assert not waiter.is_alive()
    finally:
        gcs.close()
    assert len(lines) == 1, lines  # said once what it waits for, not every probe


def test_a_wait_for_that_is_not_host_and_port_is_refused():
    from kuberl.trainer import ray_node

    with pytest.raises(SystemExit, match="--wait-for=HOST:PORT"):
        ray_node.split_wait_for(["--wait-for=head-only"])


@pytest.mark.parametrize(("resources", "cpus"), [
    ({}, 1), ({"requests": {"cpu": "500m"}}, 1), ({"requests": {"cpu": "2"}}, 2),
    ({"requests": {"cpu": "1"}, "limits": {"cpu": "2.5"}}, 3), ({"limits": {"cpu": "4000m"}}, 4),
])
def test_ray_cpus_come_from_the_limit_else_the_request(resources, cpus):
    from kuberl.api.job import Resources

    assert builders.cpu_count(Resources.model_validate(resources)) == cpus


def test_unreadable_cpu_quantity_is_an_error_naming_it():
    from kuberl.api.job import Resources

    with pytest.raises(ValueError, match="'two'"):
        # Built without validation: the model itself refuses it (tests/data/malformed/).
        builders.cpu_count(Resources.model_construct(requests={"cpu": "two"}, limits={}))


def test_learner_pod_hands_over_the_resolved_job_and_mounts_checkpoints(job):
    pod = builders.build_learner_pod(job, OPTIONS)
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["sh", "-c"]
    script = container["command"][2]
    assert script.startswith("python3 -m kuberl.trainer.ray_node --wait-for=cartpole-ppo-head.rl.svc:6379 "
                             '--wait-for=cartpole-ppo-head.rl.svc:6380 --address="$KUBERL_RAY_ADDRESS" --num-cpus=0')
    assert script.endswith("& exec kuberl learner"), "the raylet starts while the learner imports"
    env = env_of(container)
    assert env["KUBERL_RAY_ADDRESS"] == "cartpole-ppo-head.rl.svc:6379"
    assert env["KUBERL_RUN_DIR"] == "/checkpoints"
    # The job travels as a file of a ConfigMap the learner mounts (an env var stops at 128 KiB).
    config_map = builders.build_job_spec_config_map(job)
    assert env["KUBERL_JOB_SPEC_FILE"] == "/etc/kuberl/job/job.json" and config_map["immutable"] is True
    assert {"name": "job-spec", "mountPath": "/etc/kuberl/job", "readOnly": True} in container["volumeMounts"]
    handed_text = config_map["data"]["job.json"]
    handed = parse_job(json.loads(handed_text))  # the learner parses it with the same model
    assert handed.spec == job.spec
    assert json.loads(handed_text)["metadata"] == {"name": "cartpole-ppo", "namespace": "rl"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    probe = container["readinessProbe"]
    # Often enough for a short job to be Ready while it trains; as long as the period for a busy process.
    assert probe["periodSeconds"] == 3 and probe["timeoutSeconds"] == probe["periodSeconds"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "8080",
                                              "prometheus.io/path": "/metrics", "kuberl.dev/learner-replicas": "1"}
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in container["volumeMounts"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["job-spec"] == {"name": "job-spec", "configMap": {"name": config_map["metadata"]["name"]}}
    # Named by its content: an edited job gets a new file, a learner already running keeps its own.
    assert config_map["metadata"]["name"].startswith("cartpole-ppo-spec-")
    edited = parse_job({**json.loads(handed_text), "spec": {**json.loads(handed_text)["spec"], "seed": 7}})
    assert builders.build_job_spec_config_map(edited)["metadata"]["name"] != config_map["metadata"]["name"]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_learner_uses_the_claim_the_spec_names_and_spec_image(job_dict):
    job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "rl-checkpoints"}
    job_dict["spec"]["image"] = "my/trainer:1"
    job_dict["spec"]["metrics"] = {"port": 0}
    pod = builders.build_learner_pod(parse_job(job_dict), OPTIONS)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "rl-checkpoints"}}
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "my/trainer:1"
    # Port 0 ("pick one") means the default on a cluster, in the pod and in the job the learner reads.
    assert container["ports"][0]["containerPort"] == 8080
    handed = json.loads(builders.build_job_spec_config_map(parse_job(job_dict))["data"]["job.json"])
    assert handed["spec"]["metrics"]["port"] == 8080


def test_learner_without_metrics_has_no_port_probe_or_scrape_annotation(job_dict):
    job_dict["spec"]["metrics"] = {"enabled": False}
    job = parse_job(job_dict)
    pod = builders.build_learner_pod(job, OPTIONS)
    (container,) = pod["spec"]["containers"]
    assert "ports" not in container and "readinessProbe" not in container
    assert not any(k.startswith("prometheus.io/") for k in pod["metadata"].get("annotations", {}))
    assert [m["metadata"]["name"] for m in builders.build_services(job, OPTIONS)] == [
        "cartpole-ppo-head", "cartpole-ppo-disruptions", "cartpole-ppo-ray", "cartpole-ppo-learner"]


def test_every_pod_meets_pod_security_restricted(job):
    for pod in job_pods(job, OPTIONS):
        assert restricted_violations(pod["spec"]) == []
        assert_restricted(pod)
        assert pod["spec"]["automountServiceAccountToken"] is False
        for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_every_container_has_a_read_only_root_and_writes_only_to_volumes(job_dict):
    # A checkpoint claim and serving: the serving Deployment's pod is checked with the job's pods.
    job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "rl-checkpoints"}
    job_dict["spec"]["serving"] = {}
    job = parse_job(job_dict)
    serving = builders.build_serving_deployment(job, OPTIONS)["spec"]["template"]
    for pod in [*job_pods(job, OPTIONS), serving]:
        spec = pod["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        # /tmp on disk: Ray's session directory (/tmp/ray) and its logs must not count as memory.
        assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
        for container in spec["containers"] + spec.get("initContainers", []):
            where = f"{pod['metadata'].get('name', 'serving')}/{container['name']}"
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/tmp"] == "tmp", where
            assert set(mounts.values()) <= set(volumes), f"{where} mounts a volume its pod lacks"
    learner = builders.build_learner_pod(job, OPTIONS)["spec"]["containers"][0]
    writable = {m["mountPath"] for m in learner["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/checkpoints", "/dev/shm", "/tmp"}
    assert {m["mountPath"] for m in learner["volumeMounts"] if m.get("readOnly")} == {"/etc/kuberl/job"}


def test_network_policies_keep_ray_ports_inside_the_job(job):
    ray_policy, learner_policy = builders.build_network_policies(job)
    same_job = [{"podSelector": {"matchLabels": {"kuberl.dev/job-name": "cartpole-ppo"}}}]
    assert ray_policy["spec"]["policyTypes"] == ["Ingress"]
    assert ray_policy["spec"]["ingress"] == [{"from": same_job}]
    selector = {e["key"]: e["values"] for e in ray_policy["spec"]["podSelector"]["matchExpressions"]}
    assert selector == {"kuberl.dev/job-name": ["cartpole-ppo"], "kuberl.dev/component": ["head", "rollout-worker", "learner-replica"]}
    assert learner_policy["spec"]["podSelector"]["matchLabels"] == {
        "kuberl.dev/job-name": "cartpole-ppo", "kuberl.dev/component": "learner"}
    # Ray ports from the job's pods; only the metrics port from anywhere (Prometheus, the operator).
    assert learner_policy["spec"]["ingress"] == [{"from": same_job}, {"ports": [{"protocol": "TCP", "port": 8080}]}]


def test_metrics_service_targets_the_learner_metrics_port(job):
    svc = builders.build_metrics_service(job)
    assert svc["spec"]["selector"] == {"kuberl.dev/job-name": "cartpole-ppo", "kuberl.dev/component": "learner"}
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert "clusterIP" not in svc["spec"]


def test_all_children_validate_against_the_kubernetes_schemas(job):
    children = builders.adopt(job_pods(job, OPTIONS) + builders.build_services(job, OPTIONS), owner(job))
    for child in children:
        kubernetes_validate.validate(child, "1.31", strict=True)


def test_builders_are_pure(job):
    assert job_pods(job, OPTIONS) == job_pods(job, OPTIONS)
    before = job.model_dump()
    job_pods(job, OPTIONS)
    builders.build_services(job, OPTIONS)
    assert job.model_dump() == before


def test_names_fit_kubernetes_limits():
    longest = "a" * 40  # the model caps job names at 40 characters
    assert len(names.worker_pod(longest, 511)) <= 63
    assert len(names.learner_network_policy(longest)) <= 63
    assert len(names.metrics_service(longest)) <= 63


def test_learner_mounts_the_preference_config_map_read_only_and_optional(job_dict):
    job_dict["spec"]["algorithm"] = {"name": "BDQ", "bdq": {"preference": {"configMap": "ranked-pairs"}}}
    pod = builders.build_learner_pod(parse_job(job_dict), OPTIONS)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["preferences"] == {"name": "preferences", "configMap": {"name": "ranked-pairs", "optional": True}}
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["preferences"] == {"name": "preferences", "mountPath": "/etc/kuberl/preferences", "readOnly": True}
    assert_restricted(pod)
    kubernetes_validate.validate(pod, "1.31", strict=True)
    job_dict["spec"]["algorithm"] = {"name": "BDQ", "bdq": {"preference": {}}}
    plain = builders.build_learner_pod(parse_job(job_dict), OPTIONS)
    assert "preferences" not in {v["name"] for v in plain["spec"]["volumes"]}


def test_each_role_sizes_its_thread_pools_to_its_own_cpus_not_the_nodes(job_dict):
    from kuberl.api.threads import CPUS_ENV, THREAD_ENV

    job_dict["spec"]["rolloutWorkers"]["resources"] = {"requests": {"cpu": "500m"}, "limits": {"cpu": "3"}}
    job_dict["spec"]["learner"] = {"resources": {"requests": {"cpu": "2"}}, "threads": 1}
    job = parse_job(job_dict)
    head, learner, worker, *_ = job_pods(job, BuildOptions(trainer_image="kuberl-trainer:test"))

    def env(pod: dict) -> dict:
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}

    assert env(worker)[CPUS_ENV] == "3" and {env(worker)[v] for v in THREAD_ENV} == {"3"}  # the limit
    assert env(learner)[CPUS_ENV] == "2" and {env(learner)[v] for v in THREAD_ENV} == {"1"}  # learner.threads
    assert env(head)[CPUS_ENV] == "1" and {env(head)[v] for v in THREAD_ENV} == {"1"}  # 500m, rounded up
    # A template's own value replaces the default (env merges by name).
    job_dict["spec"]["rolloutWorkers"]["template"] = {"spec": {"containers": [
        {"name": "rollout-worker", "env": [{"name": "OMP_NUM_THREADS", "value": "2"}]}]}}
    worker = builders.build_worker_pod(parse_job(job_dict), BuildOptions(trainer_image="kuberl-trainer:test"), 0)
    assert env(worker)["OMP_NUM_THREADS"] == "2" and env(worker)["MKL_NUM_THREADS"] == "3"


@pytest.mark.parametrize("spec_image", [None, "my/trainer:1"])
def test_every_container_knows_its_image_to_name_it_when_the_env_module_is_missing(job_dict, spec_image):
    if spec_image:
        job_dict["spec"]["image"] = spec_image
    for pod in job_pods(parse_job(job_dict), OPTIONS):
        role = pod["metadata"]["labels"]["kuberl.dev/component"]
        default = OPTIONS.rollout_image if role in ("head", "rollout-worker") else OPTIONS.trainer_image
        for container in pod["spec"]["containers"]:
            assert env_of(container)["KUBERL_IMAGE"] == container["image"] == (spec_image or default)


def test_the_head_and_workers_run_the_rollout_image_and_every_learner_pod_the_trainer_image(job_dict):
    """torch is in the learner's pods only: rank 0 and the data-parallel ranks (they run the learner actor)."""
    job_dict["spec"]["learner"] = {"replicas": 2}
    job = parse_job(job_dict)
    pods = [*job_pods(job, OPTIONS), builders.build_learner_replica_pod(job, OPTIONS, 1)]
    images = {pod["metadata"]["labels"]["kuberl.dev/component"]: pod["spec"]["containers"][0]["image"] for pod in pods}
    assert images == {"head": OPTIONS.rollout_image, "rollout-worker": OPTIONS.rollout_image,
                      "learner": OPTIONS.trainer_image, "learner-replica": OPTIONS.trainer_image}, images

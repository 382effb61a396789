"""Pure builders: an RLTrainingJob in, the manifests of its children out (dicts, no I/O).

A job becomes a Ray head Pod and its headless Service, k rollout-worker Pods that join the head
with one rollout slot each, a learner Pod that runs `kuberl learner` against the head, a metrics
Service in front of the learner, and NetworkPolicies that keep Ray's ports inside the job.
Names and labels come from `names`; the handlers add ownerReferences with `kopf.adopt`.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import kopf

from kuberl.api import kube, pod_template
from kuberl.api.job import PREFERENCE_CONFIGMAP_MOUNT, AlgorithmName, Resources, RLTrainingJob
from kuberl.api.learner_slots import extra_learners, learner_slots
from kuberl.api.pod_template import CONTAINER_SECURITY_CONTEXT
from kuberl.api.rollout_slots import rollout_slots
from kuberl.api.semantics import IMAGE_ENV
from kuberl.api.threads import CPUS_ENV, THREAD_ENV
from kuberl.operator import names
from kuberl.operator.names import Component

#: Where every container of a job gets writable scratch space (see _scratch_volume).
SCRATCH_PATH = "/tmp"

#: Where the learner writes its final metrics when it exits (Kubernetes' default path).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

#: Environment every Ray process gets: no usage-stats phone-home (clusters are often offline), and no
#: drain on SIGTERM. Ray's `ray start --block` otherwise drains its node for up to 30 s when the pod is
#: deleted (meant for Serve replicas); a rollout actor keeps the node busy the whole time, so a scale-down,
#: a suspend or a finished job's cleanup stalls the learner 30 s. A lost rollout actor
#: costs one batch, and the learner checkpoints on its own SIGTERM. A node's raylet may take 5 minutes to
#: register with the GCS, not Ray's 60 s: on a busy node the learner's own Ray node missed that by seconds,
#: and the learner exited, spending a backoffLimit restart on nothing but the node's load.
RAY_ENV = [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
           {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"},
           {"name": "RAY_raylet_start_wait_time_s", "value": "300"}]



def _ray_env(job: RLTrainingJob) -> list[dict[str, Any]]:
    """RAY_ENV, and Ray's token authentication with the job's own token (`build_ray_token_secret`): without
    it, `ray start` leaves the cluster open to any pod that can reach it, and NetworkPolicies, the other
    guard, are not enforced on many clusters."""
    token = {"secretKeyRef": {"name": names.ray_token_secret(job.metadata.name), "key": names.RAY_TOKEN_KEY}}
    return [*RAY_ENV, {"name": "RAY_AUTH_MODE", "value": "token"}, {"name": "RAY_AUTH_TOKEN", "valueFrom": token}]


# Workers and the learner wait for the head before starting, instead of failing (and, for the learner,
# spending a backoffLimit restart) while the head's image is pulled or its node starts: the GCS port, then
# the head's raylet port (kuberl.trainer.ray_node says why both), probed by the node's own process.
def _wait_for_head(job: RLTrainingJob) -> list[str]:
    gcs = names.ray_address(job.metadata.name, job.metadata.namespace)
    raylet = f"{gcs.rpartition(':')[0]}:{names.HEAD_RAYLET_PORT}"
    return [f"--wait-for={gcs}", f"--wait-for={raylet}"]


#: `ray start` with the node's agents in Ray's minimal mode (the trainer image's kuberl.trainer.ray_node):
#: the full dashboard agent's imports missed the raylet's fixed 15 s wait for them on a busy node and the
#: raylet aborted. So no Ray dashboard: the job's metrics come from the learner.
RAY_START = ["python3", "-m", "kuberl.trainer.ray_node"]


def _learner_script(job: RLTrainingJob) -> str:
    """A Ray driver needs a raylet on its own host: the learner pod joins the cluster as a node with no
    CPUs (so no rollout actor lands on it). The node waits for the head and starts in the background
    while the learner imports torch and builds its networks; the learner's ray.init waits for it."""
    node = [*RAY_START, *_wait_for_head(job), '--address="$KUBERL_RAY_ADDRESS"', "--num-cpus=0",
            "--disable-usage-stats"]
    return f"{' '.join(node)} & exec kuberl learner"


@dataclass(frozen=True)
class BuildOptions:
    """Operator-wide settings the builders need (from the command line)."""

    trainer_image: str = names.DEFAULT_TRAINER_IMAGE
    rollout_image: str = names.DEFAULT_ROLLOUT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    network_policies: bool = True


# --------------------------------------------------------------------------------------------
# Small pure helpers
# --------------------------------------------------------------------------------------------

def cpu_count(resources: Resources, default: int = 1) -> int:
    """Whole CPUs Ray should advertise for a pod: its CPU limit (else request), rounded up, at least 1.

    Ray's --num-cpus takes an integer; "500m" becomes 1, "2.5" becomes 3.
    """
    quantity = resources.limits.get("cpu") or resources.requests.get("cpu")
    if quantity is None:
        return default
    try:
        value = kube.parse_quantity(str(quantity).strip())
    except ValueError:
        raise ValueError(f"cannot read CPU quantity {quantity!r} (expected e.g. 2, 1.5 or 500m)") from None
    return max(1, math.ceil(value))


def threads_env(resources: Resources, threads: int | None = None) -> list[dict[str, Any]]:
    """The pod's CPUs and thread pools sized to them (kuberl.api.threads): without these, torch and the BLAS
    libraries in a pod start a thread per core of the node. A template's own env entry of the same name
    replaces one of these (the merge is by name)."""
    cpus = cpu_count(resources)
    return [{"name": CPUS_ENV, "value": str(cpus)},
            *({"name": name, "value": str(threads or cpus)} for name in THREAD_ENV)]


def container_resources(resources: Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if resources.requests:
        out["requests"] = dict(resources.requests)
    if resources.limits:
        out["limits"] = dict(resources.limits)
    return out


#: The roles whose pods never import torch (numpy inference, Ray's own processes): they run the rollout
#: image, a fifth of the trainer's size, so a node pulls the gigabytes of torch only for a learner.
ROLLOUT_IMAGE_ROLES = ("head", "rolloutWorkers")


def image(job: RLTrainingJob, options: BuildOptions, role: str = "learner") -> str:
    """The image of a role's pods: the job's own (spec.image, every role: its environment must be on the
    workers and the learner alike), else the rollout image for the head and the workers and the trainer
    image for the learner's pods."""
    if job.spec.image:
        return job.spec.image
    return options.rollout_image if role in ROLLOUT_IMAGE_ROLES else options.trainer_image


def metrics_port(job: RLTrainingJob) -> int:
    """The learner's metrics port on a cluster (a spec port of 0 means the default there)."""
    return job.spec.metrics.port or names.DEFAULT_METRICS_PORT


def resolved_manifest(job: RLTrainingJob) -> dict[str, Any]:
    """The job the learner receives: defaults filled in, metrics port fixed, no server metadata."""
    manifest = job.manifest()
    meta = manifest["metadata"]
    manifest["metadata"] = {"name": meta["name"], "namespace": meta["namespace"]}
    if meta.get("labels"):
        manifest["metadata"]["labels"] = meta["labels"]
    if job.spec.metrics.enabled:
        manifest["spec"]["metrics"]["port"] = metrics_port(job)
    return manifest


def _metadata(job: RLTrainingJob, name: str, component: Component, *, epoch: int | None = None,
              worker_index: int | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": names.labels(job.metadata.name, component, epoch=epoch, worker_index=worker_index),
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def _container(name: str, job: RLTrainingJob, options: BuildOptions, command: list[str],
               resources: Resources, env: list[dict[str, Any]], *, role: str, **extra: Any) -> dict[str, Any]:
    ref = image(job, options, role)
    container: dict[str, Any] = {
        "name": name,
        "image": ref,
        "imagePullPolicy": options.image_pull_policy,
        "command": command,
        # The image, for the reason a pod gives when it lacks the environment's module.
        "env": [*env, {"name": IMAGE_ENV, "value": ref}],
        "resources": container_resources(resources),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    container.update(extra)
    container["volumeMounts"] = [*extra.get("volumeMounts", []), _scratch_volume()[1]]
    return container


def _shm_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    # Ray's object store lives in /dev/shm; container runtimes give it 64 MiB unless a memory
    # emptyDir is mounted there.
    return ({"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "shm", "mountPath": "/dev/shm"})


def _scratch_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    # The root filesystem is read-only: Ray's session directory (/tmp/ray: logs, sockets, spilled
    # objects) and Python's tempfile need a writable /tmp. On disk, not in memory, so Ray's logs do not
    # count against the pod's memory; no sizeLimit, which would evict a long run whose logs outgrow it.
    return ({"name": "tmp", "emptyDir": {}}, {"name": "tmp", "mountPath": SCRATCH_PATH})


def _pod(meta: dict[str, Any], *, containers: list[dict[str, Any]], volumes: list[dict[str, Any]],
         node_selector: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        # The operator is the only restarter: it counts learner and head restarts against
        # backoffLimit and replaces failed workers, so a failed container ends its pod.
        "restartPolicy": "Never",
        **copy.deepcopy(pod_template.POD_FIELDS),
        "containers": containers,
        "volumes": [*volumes, _scratch_volume()[0]],  # every container mounts it (_container)
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _ray_address_env(job: RLTrainingJob) -> dict[str, str]:
    return {"name": "KUBERL_RAY_ADDRESS", "value": names.ray_address(job.metadata.name, job.metadata.namespace)}


# --------------------------------------------------------------------------------------------
# Ray head
# --------------------------------------------------------------------------------------------


def build_head_pod(job: RLTrainingJob, options: BuildOptions, *, epoch: int = 0) -> dict[str, Any]:
    """The Ray head: GCS and client server, no dashboard; no CPUs, so no rollout work lands on it."""
    head = job.spec.head
    command = [
        *RAY_START, "--head",
        f"--port={names.GCS_PORT}",
        f"--node-manager-port={names.HEAD_RAYLET_PORT}",
        "--include-dashboard=false",
        # Ray's autoscaler monitor: the operator, not Ray, sizes the job's cluster (a process and a GCS poll
        # every few seconds saved on every head).
        "--no-monitor",
        f"--ray-client-server-port={names.CLIENT_PORT}",
        "--num-cpus=0",
        "--disable-usage-stats",
        "--block",
    ]
    shm, shm_mount = _shm_volume()
    container = _container(
        pod_template.MAIN_CONTAINERS["head"], job, options, command, head.resources,
        [*_ray_env(job), *threads_env(head.resources)], role="head",
        ports=[
            {"name": "gcs", "containerPort": names.GCS_PORT, "protocol": "TCP"},
            {"name": "raylet", "containerPort": names.HEAD_RAYLET_PORT, "protocol": "TCP"},
            {"name": "client", "containerPort": names.CLIENT_PORT, "protocol": "TCP"},
        ],
        # Ready when its own node is up (the raylet), not at the GCS alone: the others wait for that too.
        readinessProbe={"tcpSocket": {"port": "raylet"}, "periodSeconds": 5, "failureThreshold": 3},
        volumeMounts=[shm_mount],
    )
    meta = _metadata(job, names.head_pod(job.metadata.name), Component.HEAD, epoch=epoch)
    pod = _pod(meta, containers=[container], volumes=[shm], node_selector=head.node_selector)
    return pod_template.merge(pod, head.template, "head")


def build_head_service(job: RLTrainingJob) -> dict[str, Any]:
    """Headless Service selecting only the head: `<job>-head.<namespace>.svc:6379` is the Ray address."""
    job_name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.head_service(job_name), Component.HEAD),
        "spec": {
            "clusterIP": "None",
            # Workers resolve the head while it is still starting (they wait for its GCS themselves).
            "publishNotReadyAddresses": True,
            "selector": names.selector(job_name, Component.HEAD),
            "ports": [
                {"name": "gcs", "port": names.GCS_PORT, "targetPort": "gcs", "protocol": "TCP"},
                {"name": "raylet", "port": names.HEAD_RAYLET_PORT, "targetPort": "raylet", "protocol": "TCP"},
                {"name": "client", "port": names.CLIENT_PORT, "targetPort": "client", "protocol": "TCP"},
            ],
        },
    }


# --------------------------------------------------------------------------------------------
# Rollout workers
# --------------------------------------------------------------------------------------------


def build_worker_pod(job: RLTrainingJob, options: BuildOptions, index: int, *, epoch: int = 0) -> dict[str, Any]:
    """Rollout worker `index`: a Ray node offering one `rollout_slot`, so one rollout actor lands here."""
    workers = job.spec.rollout_workers
    meta = _metadata(job, names.worker_pod(job.metadata.name, index), Component.ROLLOUT_WORKER,
                     epoch=epoch, worker_index=index)
    # one worker pod = one rollout slot
    return _ray_node_pod(job, options, meta, "rolloutWorkers", workers, cpu_count(workers.resources), rollout_slots(1))


def _ray_node_pod(job: RLTrainingJob, options: BuildOptions, meta: dict[str, Any], role: str, part: Any,
                  num_cpus: int, slots: dict[str, float], threads: int | None = None) -> dict[str, Any]:
    """A pod that joins the job's Ray cluster as a node offering `num_cpus` and `slots`, with the role's
    resources, node selector and template (rollout workers, data-parallel learner ranks)."""
    command = [
        *RAY_START,
        *_wait_for_head(job),
        f"--address={names.ray_address(job.metadata.name, job.metadata.namespace)}",
        "--block",
        f"--num-cpus={num_cpus}",
        f"--resources={json.dumps(slots)}",
        "--disable-usage-stats",
    ]
    shm, shm_mount = _shm_volume()
    container = _container(pod_template.MAIN_CONTAINERS[role], job, options, command, part.resources,
                           [_ray_address_env(job), *_ray_env(job), *threads_env(part.resources, threads)],
                           role=role, volumeMounts=[shm_mount])
    pod = _pod(meta, containers=[container], volumes=[shm], node_selector=part.node_selector)
    return pod_template.merge(pod, part.template, role)


# --------------------------------------------------------------------------------------------
# Learner
# --------------------------------------------------------------------------------------------


def checkpoint_volume(job: RLTrainingJob) -> dict[str, Any]:
    """The job's PVC when it names one; otherwise an emptyDir, which dies with the learner pod."""
    volume = job.spec.checkpointing.volume
    if volume.claim_name:
        return {"name": "checkpoints", "persistentVolumeClaim": {"claimName": volume.claim_name}}
    empty_dir: dict[str, Any] = {}
    if volume.size_limit:
        empty_dir["sizeLimit"] = volume.size_limit
    return {"name": "checkpoints", "emptyDir": empty_dir}


def preference_config_map(job: RLTrainingJob) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """BDQ's preference.configMap as the learner's (volume, mount): read-only, and optional, so the
    learner starts before anyone has ranked a pair; the kubelet refreshes it when the ConfigMap changes."""
    algorithm = job.spec.algorithm
    pref = algorithm.bdq.preference if algorithm.name == AlgorithmName.BDQ else None
    if pref is None or pref.config_map is None:
        return None
    return ({"name": "preferences", "configMap": {"name": pref.config_map, "optional": True}},
            {"name": "preferences", "mountPath": PREFERENCE_CONFIGMAP_MOUNT, "readOnly": True})


#: Kubernetes' own grace period (a pod's terminationGracePeriodSeconds when unset): what a learner needs
#: on SIGTERM besides its checkpoint (the iteration under way, leaving Ray) fits in it on every bed run.
DEFAULT_GRACE_SECONDS = 30
#: The longest grace period the operator gives a learner from its measured checkpoint time (the figure is
#: the tenant's pod's to report): ten minutes. A job that needs longer says so in its learner template.
MAX_LEARNER_GRACE_SECONDS = 600


def learner_grace_seconds(checkpoint_seconds: float | None) -> int | None:
    """A learner pod's grace period from the longest checkpoint the job has measured (status.checkpointSeconds):
    Kubernetes' default plus twice the checkpoint (a replay buffer still filling, a slower disk or link on
    another node), at most MAX_LEARNER_GRACE_SECONDS; None (Kubernetes' default) before the first."""
    if checkpoint_seconds is None:
        return None
    return min(MAX_LEARNER_GRACE_SECONDS, DEFAULT_GRACE_SECONDS + math.ceil(2 * checkpoint_seconds))


def build_learner_pod(job: RLTrainingJob, options: BuildOptions, *, epoch: int = 0,
                      checkpoint_seconds: float | None = None) -> dict[str, Any]:
    """The learner: joins the head, trains, checkpoints to the volume, serves /metrics, exits 0 when done.
    `checkpoint_seconds`: the longest checkpoint the job has measured, which sizes the pod's grace period
    (SIGTERM's checkpoint must fit in it) unless the learner's template sets one."""
    learner = job.spec.learner
    spec_map = build_job_spec_config_map(job)
    env = [
        {"name": "KUBERL_JOB_SPEC_FILE", "value": f"{names.JOB_SPEC_MOUNT}/{names.JOB_SPEC_KEY}"},
        _ray_address_env(job),
        {"name": "KUBERL_RUN_DIR", "value": names.CHECKPOINT_MOUNT},
        # The learner leaves its final metrics there; the operator reads them from the pod's status.
        {"name": "KUBERL_TERMINATION_MESSAGE_PATH", "value": TERMINATION_MESSAGE_PATH},
        *_ray_env(job),
        *threads_env(learner.resources, learner.threads),
        *tracking_env(job),
        *object_store_env(job),
    ]
    shm, shm_mount = _shm_volume()
    extra: dict[str, Any] = {
        "volumeMounts": [{"name": "checkpoints", "mountPath": names.CHECKPOINT_MOUNT}, shm_mount,
                         {"name": "job-spec", "mountPath": names.JOB_SPEC_MOUNT, "readOnly": True}],
        # A learner that fails without a termination message leaves its last log lines in the pod's
        # status, and the operator quotes them in the job's failure message.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    annotations = None
    if job.spec.metrics.enabled:
        port = metrics_port(job)
        extra["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        # Every 3 s: the learner serves its metrics from its first second, and a job that trains for a few
        # seconds is Ready while it does. The metrics are served by a thread of the training process, which
        # waits for the interpreter lock while an update runs: on a busy node a reply took over the
        # kubelet's default 1 s for minutes on end, so a reply may take the whole period.
        extra["readinessProbe"] = {"httpGet": {"path": "/metrics", "port": "metrics"},
                                   "periodSeconds": 3, "timeoutSeconds": 3, "failureThreshold": 3}
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                       "prometheus.io/path": "/metrics"}
    volumes = [checkpoint_volume(job), shm,
               {"name": "job-spec", "configMap": {"name": spec_map["metadata"]["name"]}}]
    preferences = preference_config_map(job)
    if preferences is not None:
        volumes.append(preferences[0])
        extra["volumeMounts"].append(preferences[1])
    container = _container(pod_template.MAIN_CONTAINERS["learner"], job, options, ["sh", "-c", _learner_script(job)],
                           learner.resources, env, role="learner",
                           **extra)
    annotations = {**(annotations or {}), names.LEARNER_REPLICAS_ANNOTATION: str(job.spec.learner.replicas)}
    meta = _metadata(job, names.learner_pod(job.metadata.name), Component.LEARNER, epoch=epoch,
                     annotations=annotations)
    pod = _pod(meta, containers=[container], volumes=volumes, node_selector=learner.node_selector)
    grace = learner_grace_seconds(checkpoint_seconds)
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    return pod_template.merge(pod, learner.template, "learner")


#: The tracker's credentials: MLflow's own variables, from the keys of spec.tracking.mlflow.credentialsSecret.
TRACKING_SECRET_KEYS = {"MLFLOW_TRACKING_TOKEN": "token", "MLFLOW_TRACKING_USERNAME": "username",
                        "MLFLOW_TRACKING_PASSWORD": "password"}


def tracking_env(job: RLTrainingJob) -> list[dict[str, Any]]:
    """The learner's tracker credentials, straight from the job's Secret to the container: the operator
    names the Secret and never reads it. Each key is optional (a token, or a username and password)."""
    mlflow = job.spec.tracking.mlflow
    if mlflow is None or mlflow.credentials_secret is None:
        return []
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": mlflow.credentials_secret, "key": key,
                                                          "optional": True}}}
            for var, key in TRACKING_SECRET_KEYS.items()]


#: The object store's credentials: AWS's own variables, from the same keys of spec.checkpointing.s3.credentialsSecret.
OBJECT_STORE_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def object_store_env(job: RLTrainingJob) -> list[dict[str, Any]]:
    """The learner's object-store credentials, from the job's Secret straight to the container (the operator
    names the Secret and never reads it). Optional keys: a Secret without them starts a learner that says
    which keys are missing, in the job's status, rather than a pod stuck in CreateContainerConfigError."""
    s3 = job.spec.checkpointing.s3
    if s3 is None or s3.credentials_secret is None:
        return []
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": s3.credentials_secret, "key": key, "optional": True}}}
            for key in OBJECT_STORE_SECRET_KEYS]


def build_job_spec_config_map(job: RLTrainingJob) -> dict[str, Any]:
    """The job as the learner reads it (`resolved_manifest`), in a ConfigMap the job owns: a file has room
    for the largest job, where an environment variable stops at Linux's 128 KiB per string."""
    text = json.dumps(resolved_manifest(job), separators=(",", ":"), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    name = names.job_spec_config_map(job.metadata.name, digest)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(job, name, Component.LEARNER),
            "data": {names.JOB_SPEC_KEY: text}, "immutable": True}


def learner_pods(job: RLTrainingJob) -> int:
    """The job's learner pods: rank 0 (`build_learner_pod`) and one per further data-parallel learner."""
    return 1 + extra_learners(job.spec.learner.replicas)


def build_learner_replica_pod(job: RLTrainingJob, options: BuildOptions, rank: int, *,
                              epoch: int = 0) -> dict[str, Any]:
    """Data-parallel learner `rank` >= 1: a Ray node offering one `learner_slot` and no CPUs to rollout
    actors, with the learner's resources (a GPU when they ask for one). Rank 0 starts the learner actor
    on it; the actor joins rank 0's process group (its ports: the job's NetworkPolicy, like Ray's)."""
    meta = _metadata(job, names.learner_replica_pod(job.metadata.name, rank), Component.LEARNER_REPLICA,
                     epoch=epoch, worker_index=rank)
    # rank 0's template and resources: GPU pools alike
    return _ray_node_pod(job, options, meta, "learner", job.spec.learner, 0, learner_slots(1), job.spec.learner.threads)


def build_metrics_service(job: RLTrainingJob) -> dict[str, Any]:
    """ClusterIP Service on the learner's metrics port, for a ServiceMonitor or `kubectl port-forward`."""
    job_name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.metrics_service(job_name), Component.LEARNER),
        "spec": {
            "selector": names.selector(job_name, Component.LEARNER),
            "ports": [{"name": "metrics", "port": metrics_port(job), "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


# --------------------------------------------------------------------------------------------
# Serving (spec.serving): the trained policy behind a Service, once the job has succeeded
# --------------------------------------------------------------------------------------------


def _serving_metadata(job: RLTrainingJob) -> dict[str, Any]:
    # The recommended labels and the job's selector, as every child has; the component is "serving",
    # which is no Component of the lifecycle's: its pods belong to the Deployment, not to the job loop.
    labels = {**names.labels(job.metadata.name, Component.LEARNER),
              "app.kubernetes.io/component": names.SERVING_COMPONENT, names.COMPONENT_LABEL: names.SERVING_COMPONENT}
    return {"name": names.serving(job.metadata.name), "namespace": job.metadata.namespace, "labels": labels}


def build_serving_deployment(job: RLTrainingJob, options: BuildOptions) -> dict[str, Any]:
    """`kuberl serve` on the checkpoint claim (read-only): the newest loadable checkpoint, exported in
    memory at start; ready when the Open Inference Protocol's ready endpoint answers."""
    serving = job.spec.serving
    assert serving is not None and job.spec.checkpointing.volume.claim_name
    job_name = job.metadata.name
    command = ["kuberl", "serve", names.CHECKPOINT_MOUNT, "--host", "0.0.0.0", f"--port={serving.port}",
               f"--metrics-port={serving.metrics_port}", f"--model-name={job_name}",
               f"--max-batch={serving.max_batch}"]
    container = _container(
        pod_template.MAIN_CONTAINERS["serving"], job, options, command, serving.resources, [], role="serving",
        ports=[{"name": "http", "containerPort": serving.port, "protocol": "TCP"},
               {"name": "metrics", "containerPort": serving.metrics_port, "protocol": "TCP"}],
        volumeMounts=[{"name": "checkpoints", "mountPath": names.CHECKPOINT_MOUNT, "readOnly": True}],
        # Start-up imports torch and exports the checkpoint (seconds); after that, liveness and
        # readiness are the protocol's own health endpoints.
        startupProbe={"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 2,
                      "failureThreshold": 90},
        livenessProbe={"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10},
        readinessProbe={"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5},
    )
    meta = _serving_metadata(job)
    pod = _pod({"labels": meta["labels"], "annotations": {
        "prometheus.io/scrape": "true", "prometheus.io/port": str(serving.metrics_port),
        "prometheus.io/path": "/metrics"}}, containers=[container], volumes=[checkpoint_volume(job)],
        node_selector=serving.node_selector)
    pod["spec"]["restartPolicy"] = "Always"  # a Deployment's pods restart in place
    pod = pod_template.merge(pod, serving.template, "serving")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": serving.replicas,
            "selector": {"matchLabels": names.serving_selector(job_name)},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def build_serving_service(job: RLTrainingJob) -> dict[str, Any]:
    """ClusterIP Service in front of the serving pods: `http` (protocol, /act) and `metrics`."""
    serving = job.spec.serving
    assert serving is not None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _serving_metadata(job),
        "spec": {
            "selector": names.serving_selector(job.metadata.name),
            "ports": [{"name": "http", "port": serving.port, "targetPort": "http", "protocol": "TCP"},
                      {"name": "metrics", "port": serving.metrics_port, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def build_serving(job: RLTrainingJob, options: BuildOptions) -> list[dict[str, Any]]:
    """Service and Deployment for spec.serving (none without it)."""
    if job.spec.serving is None:
        return []
    return [build_serving_service(job), build_serving_deployment(job, options)]


def serving_endpoint(job: RLTrainingJob) -> str | None:
    if job.spec.serving is None:
        return None
    return names.serving_endpoint(job.metadata.name, job.metadata.namespace, job.spec.serving.port)


# --------------------------------------------------------------------------------------------
# Network policies: no Ray port reachable from outside its job
# --------------------------------------------------------------------------------------------


def build_network_policies(job: RLTrainingJob) -> list[dict[str, Any]]:
    """Ingress to every pod of the job only from the job's own pods; the learner's metrics port from anywhere.

    Ray opens many ports (GCS, raylet, object manager, worker ports), so the rule is by peer, not
    by port. `kubectl port-forward` to the dashboard still works: it does not cross the pod network.
    """
    job_name = job.metadata.name
    same_job = [{"podSelector": {"matchLabels": names.selector(job_name)}}]
    policies = [{
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, names.network_policy(job_name), Component.HEAD),
        "spec": {
            "podSelector": {"matchExpressions": [
                {"key": names.JOB_NAME_LABEL, "operator": "In", "values": [job_name]},
                {"key": names.COMPONENT_LABEL, "operator": "In",
                 "values": [Component.HEAD.value, Component.ROLLOUT_WORKER.value, Component.LEARNER_REPLICA.value]},
            ]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": same_job}],
        },
    }]
    learner_rules: list[dict[str, Any]] = [{"from": same_job}]
    if job.spec.metrics.enabled:
        learner_rules.append({"ports": [{"protocol": "TCP", "port": metrics_port(job)}]})
    policies.append({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, names.learner_network_policy(job_name), Component.LEARNER),
        "spec": {
            "podSelector": {"matchLabels": names.selector(job_name, Component.LEARNER)},
            "policyTypes": ["Ingress"],
            "ingress": learner_rules,
        },
    })
    return policies


# --------------------------------------------------------------------------------------------
# Voluntary disruptions: one pod of the job at a time
# --------------------------------------------------------------------------------------------


def build_disruption_budget(job: RLTrainingJob) -> dict[str, Any]:
    """A node drain (or a cluster autoscaler's scale-down) evicts the job's pods one at a time: each evicted
    pod gets SIGTERM and its grace period (a learner checkpoints and leaves; a rollout worker's Ray node
    drains) and the operator replaces it before the eviction API lets the next one go. Without it a drain
    takes the head, the learner and every worker at once. A pod that is not Ready (a worker crash-looping,
    one still starting) never holds a drain up: unhealthyPodEvictionPolicy AlwaysAllow.

    minAvailable, not maxUnavailable: the disruption controller takes maxUnavailable only for pods whose
    controller has a scale subresource giving their count, which a job's pods (head, learners, workers)
    are not; so the operator sets the count, and patches it when the job scales (`disruption_budget_pods`)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(job, names.disruption_budget(job.metadata.name), Component.HEAD),
        "spec": {"minAvailable": disruption_budget_pods(job) - 1,
                 "selector": {"matchLabels": names.selector(job.metadata.name)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def disruption_budget_pods(job: RLTrainingJob, replicas: int | None = None) -> int:
    """The job's training pods at `replicas` rollout workers (default: its spec's): the head, the learners
    and the workers."""
    workers = job.spec.rollout_workers.replicas if replicas is None else replicas
    return 1 + learner_pods(job) + workers


# --------------------------------------------------------------------------------------------
# The job's Ray token
# --------------------------------------------------------------------------------------------


def build_ray_token_secret(job: RLTrainingJob, token: str) -> dict[str, Any]:
    """The Secret every Ray pod of the job reads its token from. The caller draws `token` at random; the
    operator creates the Secret once and never reads it back (it may create and delete Secrets, not get them)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, names.ray_token_secret(job.metadata.name), Component.HEAD),
        "type": "Opaque",
        "data": {names.RAY_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


# --------------------------------------------------------------------------------------------
# Everything at once
# --------------------------------------------------------------------------------------------


def build_services(job: RLTrainingJob, options: BuildOptions) -> list[dict[str, Any]]:
    """The non-pod children: Services, the PodDisruptionBudget and (unless turned off) NetworkPolicies."""
    out = [build_head_service(job), build_disruption_budget(job)]
    if job.spec.metrics.enabled:
        out.append(build_metrics_service(job))
    if options.network_policies:
        out.extend(build_network_policies(job))
    return out


def adopt(manifests: list[dict[str, Any]], owner: kopf.Body | dict[str, Any]) -> list[dict[str, Any]]:
    """Give children an ownerReference to the job (garbage-collected with it); returns them."""
    kopf.adopt(manifests, owner=owner)  # type: ignore[arg-type]  # kopf reads a plain dict as a body
    return manifests


def every_object(job: RLTrainingJob, options: BuildOptions, *, ray_token: str) -> list[dict[str, Any]]:
    """Every object the operator creates for a job over its life, as a fresh job gets them (epoch 0): what
    pods need, the pods, and what serving adds once training succeeded. A check of the whole job before any
    of it exists sends these (`kuberl validate --server`)."""
    pods = [build_head_pod(job, options), build_learner_pod(job, options),
            *(build_learner_replica_pod(job, options, rank) for rank in range(1, learner_pods(job))),
            *(build_worker_pod(job, options, i) for i in range(job.spec.rollout_workers.replicas))]
    return [build_ray_token_secret(job, ray_token), build_job_spec_config_map(job), *build_services(job, options),
            *pods, *build_serving(job, options)]

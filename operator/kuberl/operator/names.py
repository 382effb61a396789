"""Names, labels and ports of a job's children: the one place they are defined.

Builders, handlers, tests and the docs all read them from here, so a pod name or a label key
never drifts between the code that creates a child and the code that finds it.
"""

from __future__ import annotations

import enum

OPERATOR_NAME = "kuberl-operator"
DEFAULT_TRAINER_IMAGE = "ghcr.io/kuberl/kuberl-trainer:0.1.0"
#: The Ray head's and the rollout workers' image: Ray and the environments, no torch (Dockerfile.rollout).
DEFAULT_ROLLOUT_IMAGE = "ghcr.io/kuberl/kuberl-rollout:0.1.0"

# Label keys. The app.kubernetes.io/* ones are the recommended labels; kuberl.dev/* select children.
JOB_NAME_LABEL = "kuberl.dev/job-name"
COMPONENT_LABEL = "kuberl.dev/component"
WORKER_INDEX_LABEL = "kuberl.dev/worker-index"
#: Which Ray cluster a pod belongs to: a new head starts a new epoch; learner and workers of an
#: older epoch are joined to a dead cluster and get recycled.
EPOCH_LABEL = "kuberl.dev/ray-epoch"
#: On the rank-0 learner pod: the spec.learner.replicas it was started with (it reads N once, at start).
LEARNER_REPLICAS_ANNOTATION = "kuberl.dev/learner-replicas"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

FINALIZER = "kuberl.dev/operator"


class Component(str, enum.Enum):
    HEAD = "head"
    ROLLOUT_WORKER = "rollout-worker"
    LEARNER = "learner"
    LEARNER_REPLICA = "learner-replica"  # data-parallel learner ranks 1..N-1 (spec.learner.replicas)


# Ray ports on the head (named in the pod and in the headless Service).
GCS_PORT = 6379
#: The head's raylet: fixed, so that a pod can wait for the head's own node, not only its GCS.
HEAD_RAYLET_PORT = 6380
CLIENT_PORT = 10001
#: Learner metrics port when the spec says 0 ("pick a free one" only makes sense locally).
DEFAULT_METRICS_PORT = 8080

CHECKPOINT_MOUNT = "/checkpoints"
#: Where the learner reads its job: a file of the job's spec ConfigMap (`job_spec_config_map`).
JOB_SPEC_MOUNT = "/etc/kuberl/job"
JOB_SPEC_KEY = "job.json"


def head_pod(job: str) -> str:
    return f"{job}-head"


def head_service(job: str) -> str:
    """Headless Service in front of the head; the Ray address is `<this>:6379`."""
    return f"{job}-head"


def learner_pod(job: str) -> str:
    return f"{job}-learner"


def learner_replica_pod(job: str, rank: int) -> str:
    """Data-parallel learner `rank` (1..N-1); rank 0 is `learner_pod`."""
    return f"{job}-learner-{rank}"


def job_spec_config_map(job: str, digest: str) -> str:
    """The ConfigMap carrying the job as the learner reads it; named by its content, so a learner started
    after an edit reads the edited job while one already running keeps the file it started with."""
    return f"{job}-spec-{digest}"


def metrics_service(job: str) -> str:
    """ClusterIP Service on the learner's metrics port (for a ServiceMonitor or port-forward)."""
    return f"{job}-metrics"


def worker_pod(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


#: Component label of the policy-serving pods (spec.serving): a Deployment's pods, not the lifecycle's.
SERVING_COMPONENT = "serving"


def serving(job: str) -> str:
    """Deployment and Service serving the trained policy (spec.serving)."""
    return f"{job}-serving"


def serving_selector(job: str) -> dict[str, str]:
    return {JOB_NAME_LABEL: job, COMPONENT_LABEL: SERVING_COMPONENT}


def serving_endpoint(job: str, namespace: str, port: int) -> str:
    """The serving Service's in-cluster URL (status.servingEndpoint)."""
    return f"http://{serving(job)}.{namespace}.svc:{port}"


def network_policy(job: str) -> str:
    """Ray ports of every pod of the job: reachable only from the job's own pods."""
    return f"{job}-ray"


def learner_network_policy(job: str) -> str:
    """The learner: Ray ports from the job's pods, the metrics port from anywhere."""
    return f"{job}-learner"


def disruption_budget(job: str) -> str:
    """The PodDisruptionBudget over every pod of the job."""
    return f"{job}-disruptions"


def ray_token_secret(job: str) -> str:
    """The Secret holding the job's Ray token: every Ray process of the job authenticates with it."""
    return f"{job}-ray-token"


#: The key of the token in that Secret.
RAY_TOKEN_KEY = "token"


def ray_address(job: str, namespace: str) -> str:
    """The GCS address workers and the learner join: the head Service's cluster DNS name."""
    return f"{head_service(job)}.{namespace}.svc:{GCS_PORT}"


def selector(job: str, component: Component | None = None) -> dict[str, str]:
    """Labels that find a job's children (all of them, or one component)."""
    labels = {JOB_NAME_LABEL: job}
    if component is not None:
        labels[COMPONENT_LABEL] = component.value
    return labels


def label_selector(job: str, component: Component | None = None) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(job, component).items())


def labels(job: str, component: Component, *, epoch: int | None = None,
           worker_index: int | None = None) -> dict[str, str]:
    """Every label a child carries: the recommended app.kubernetes.io/* set plus the selectors."""
    out = {
        "app.kubernetes.io/name": "kuberl",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": component.value,
        "app.kubernetes.io/part-of": "kuberl",
        MANAGED_BY_LABEL: OPERATOR_NAME,
        JOB_NAME_LABEL: job,
        COMPONENT_LABEL: component.value,
    }
    if epoch is not None:
        out[EPOCH_LABEL] = str(epoch)
    if worker_index is not None:
        out[WORKER_INDEX_LABEL] = str(worker_index)
    return out

"""Kueue gang admission: a queued job's pods are one Kueue pod group, gated until Kueue admits all of them.

Kueue's plain-pod integration (https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/) groups pods by
two labels and one annotation; its webhook adds the `kueue.x-k8s.io/admission` scheduling gate and
its controller removes the gate from every pod of the group at once, when the ClusterQueue behind
the LocalQueue has quota for the whole group. The operator adds that gate itself at creation: a job
that names a queue must never run outside it, and a namespace Kueue does not manage would otherwise
start the pods at once, past every quota. (Kubernetes lets a gate be removed, never added, so it
must be there when the pod is created.) The operator never removes the gate: only Kueue does.

The pod group's size is fixed when it is created, so a rolloutWorkers.replicas change on a queued
job re-queues it: the pods are deleted and a group of the new size (a new pod-group name) is created.
The serving Deployment after training is not part of the group.
"""

from __future__ import annotations

from typing import Any

from kuberl.api.job import QUEUE_NAME_LABEL, RLTrainingJob
from kuberl.operator.builders import learner_pods

POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
#: Kueue keeps its finalizer on a group's pods until the group is over, and by default a group is over
#: only when every pod Succeeded, since a failed pod may yet be replaced. Only the learner of a job
#: succeeds (the operator deletes the head and the workers then), so without this the pods of a
#: finished, suspended or re-queued job would stay Terminating and hold the ClusterQueue's quota for
#: ever. "false": the group is over once none of its pods is left running; a replacement the operator
#: makes while the others run still joins it.
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
ADMISSION_GATE = "kueue.x-k8s.io/admission"

#: Condition type and reasons of a queued job.
ADMITTED = "Admitted"


def gang_size(job: RLTrainingJob) -> int:
    """Pods of the job's gang: the Ray head, every learner (rank 0 and its data-parallel replicas) and
    every rollout worker (the one place the roles are summed)."""
    return 1 + learner_pods(job) + job.spec.rollout_workers.replicas


def pod_group_name(job: RLTrainingJob, epoch: int) -> str:
    """A new group per Ray epoch (a new head recreates every pod) and per size (a resize re-queues)."""
    return f"{job.metadata.name}-g{epoch}-n{gang_size(job)}"


def enroll(pod: dict[str, Any], job: RLTrainingJob, epoch: int) -> dict[str, Any]:
    """The pod, as a member of the job's pod group when the job names a queue (unchanged otherwise)."""
    queue = job.queue_name
    if queue is None:
        return pod
    meta = pod["metadata"]
    meta["labels"] = {**meta.get("labels", {}), QUEUE_NAME_LABEL: queue,
                      POD_GROUP_NAME_LABEL: pod_group_name(job, epoch)}
    meta["annotations"] = {**meta.get("annotations", {}), POD_GROUP_TOTAL_COUNT_ANNOTATION: str(gang_size(job)),
                           RETRIABLE_IN_GROUP_ANNOTATION: "false"}
    gates = pod["spec"].setdefault("schedulingGates", [])
    if {"name": ADMISSION_GATE} not in gates:
        gates.append({"name": ADMISSION_GATE})
    return pod


def is_gated(pod: dict[str, Any]) -> bool:
    """Any scheduling gate holds the pod (Kueue's or another controller's)."""
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def group_of(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(POD_GROUP_NAME_LABEL)


def waiting_message(job: RLTrainingJob, gated: int, total: int) -> str:
    queue = job.queue_name
    ns = job.metadata.namespace
    return (f"waiting for Kueue to admit the pod group ({gated} of {total} pods gated by {ADMISSION_GATE}) "
            f"from LocalQueue {queue} in namespace {ns}; if this lasts, check that the LocalQueue exists "
            f"(kubectl get localqueue {queue} -n {ns}), that its ClusterQueue has quota for all {total} "
            f"pods, and that Kueue manages namespace {ns}")

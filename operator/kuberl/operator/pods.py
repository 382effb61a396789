"""What the reconcile needs to know about one child pod, read from the pod as the API server returns it.

`PodView.from_pod` is the only place a pod dict is parsed; the planner (`lifecycle`) sees views only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kuberl.api import pod_template
from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, is_report
from kuberl.operator import kueue, names, startup
from kuberl.operator.names import Component

#: The only container whose termination message the operator reads as the job's result or refusal: a
#: template may add sidecars to the learner's pod, and a sidecar's last word is no word of the learner's.
LEARNER_CONTAINER = pod_template.MAIN_CONTAINERS["learner"]


@dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one child pod."""

    name: str
    component: Component | None
    uid: str | None = None
    index: int | None = None
    epoch: int | None = None
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    owned: bool = True
    ip: str | None = None
    why: str = ""
    #: The termination message of the LEARNER_CONTAINER that exited 0 (the learner's final metrics).
    final_message: str | None = None
    #: What the LEARNER_CONTAINER said when it exited with INVALID_SPEC_EXIT_CODE (refusing its spec).
    invalid_spec: str | None = None
    #: The rank-0 learner pod's spec.learner.replicas (names.LEARNER_REPLICAS_ANNOTATION).
    learner_replicas: int | None = None
    #: Held by a scheduling gate (Kueue's admission gate); the Kueue pod group it belongs to.
    gated: bool = False
    group: str | None = None
    #: (reason, message) of a problem that keeps the pod from starting (startup.pod_waiting).
    waiting: tuple[str, str] | None = None
    #: The cluster is taking the pod away (Kubernetes' DisruptionTarget condition: evicted by a drain,
    #: preempted, or the node under pressure), as opposed to the pod failing.
    disrupted: bool = False

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @classmethod
    def from_pod(cls, pod: dict[str, Any], owner_uid: str | None = None) -> PodView:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        # A running pod without a Ready condition (nothing probes it yet) counts as ready.
        ready = phase == "Running" and conditions.get("Ready", "True") == "True"
        try:
            component = Component(labels.get(names.COMPONENT_LABEL))
        except ValueError:
            component = None
        owners = [ref.get("uid") for ref in meta.get("ownerReferences") or []]
        return cls(
            name=meta.get("name", ""),
            component=component,
            uid=meta.get("uid"),
            index=_int(labels.get(names.WORKER_INDEX_LABEL)),
            epoch=_int(labels.get(names.EPOCH_LABEL)),
            phase=phase,
            ready=ready,
            terminating=bool(meta.get("deletionTimestamp")),
            owned=owner_uid is None or owner_uid in owners,
            ip=status.get("podIP"),
            why=_why(status),
            final_message=_final_message(status) if phase == "Succeeded" else None,
            invalid_spec=_invalid_spec(status) if phase == "Failed" else None,
            learner_replicas=_int((meta.get("annotations") or {}).get(names.LEARNER_REPLICAS_ANNOTATION)),
            gated=kueue.is_gated(pod),
            group=kueue.group_of(pod),
            waiting=startup.pod_waiting(pod),
            disrupted=conditions.get("DisruptionTarget") == "True",
        )


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _learner_ended(status: dict[str, Any]) -> dict[str, Any]:
    """How the LEARNER_CONTAINER ended ({} while it runs, or in a pod without one)."""
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == LEARNER_CONTAINER:
            return (cs.get("state") or {}).get("terminated") or {}
    return {}


def _final_message(status: dict[str, Any]) -> str | None:
    term = _learner_ended(status)
    return term["message"] if term.get("exitCode") == 0 and term.get("message") else None


def _invalid_spec(status: dict[str, Any]) -> str | None:
    """The learner's report of a spec it refused: exit status 2 and `kuberl validate`'s text as its
    termination message (any other exit is a failure to restart from)."""
    term = _learner_ended(status)
    message = (term.get("message") or "").strip()
    return message if term.get("exitCode") == INVALID_SPEC_EXIT_CODE and is_report(message) else None


def _why(status: dict[str, Any]) -> str:
    """A short account of how a pod ended: exit code and reason, or the pod's own reason."""
    parts = []
    if status.get("reason"):
        parts.append(status["reason"] + (f": {status['message']}" if status.get("message") else ""))
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            text = f"container {cs.get('name')} exited with code {term.get('exitCode')}"
            if term.get("reason"):
                text += f" ({term['reason']})"
            if term.get("message"):
                text += f": {term['message'].strip()[-300:]}"
            parts.append(text)
    return "; ".join(parts)

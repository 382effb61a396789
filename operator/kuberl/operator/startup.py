"""Why a job's pods do not start: their waiting reasons, read from the pods' status as `kubectl describe` shows them.

A kubelet or the scheduler reports each problem on the pod, not on the job: an image it cannot pull
(ErrImagePull, then ImagePullBackOff), a Secret or ConfigMap key a container reads that is missing
(CreateContainerConfigError), a container restarting in a loop (CrashLoopBackOff), no node that fits
(PodScheduled False, Unschedulable). These functions turn that into one line per pod, with what to
check, for the job's status.message, its StartupBlocked condition and an Event.
"""

from __future__ import annotations

from typing import Any

#: Condition type: True while a pod of a Starting job reports a problem; reason = the first pod's reason.
STARTUP_BLOCKED = "StartupBlocked"
#: status.reason of a job that was not Running within spec.startupDeadlineSeconds.
STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"

#: Container waiting reasons that are problems (ContainerCreating and PodInitializing are not).
PROBLEM_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                   "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")

_HINTS = {
    "ErrImagePull": "check spec.image: the image {image} must exist and the node must be able to pull it",
    "ImagePullBackOff": "check spec.image: the image {image} must exist and the node must be able to pull it",
    "InvalidImageName": "check spec.image: {image} is not a valid image reference",
    "ErrImageNeverPull": "the image {image} is not on the node and imagePullPolicy is Never",
    "CreateContainerConfigError": "a Secret or ConfigMap (or a key of it) that the container reads is missing",
    "Unschedulable": "no node fits: check the nodeSelector and resources of this role in the spec, "
                     "and the cluster's free capacity",
}

LOG_TAIL_LINES = 5
LOG_TAIL_CHARS = 400


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last few non-blank lines of a container's log, joined with ' | ' for a one-line message."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-LOG_TAIL_CHARS:]


def pod_waiting(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, one-line message) when the pod is held by a problem a user must fix, else None.

    A scheduling gate is not a problem (Kueue's queue is reported as such); a pod that ended is the
    lifecycle's to count (restarts, backoffLimit).
    """
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("schedulingGates") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            detail = (condition.get("message") or "").strip()
            return "Unschedulable", "; ".join(p for p in (detail, _HINTS["Unschedulable"]) if p)
    specs = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    images = {c.get("name"): c.get("image", "") for c in specs}
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason not in PROBLEM_REASONS:
            continue
        image = cs.get("image") or images.get(cs.get("name"), "")
        parts = [f"container {cs.get('name')}: {(waiting.get('message') or '').strip()}".rstrip(": ")]
        last = (cs.get("lastState") or {}).get("terminated")
        if reason == "CrashLoopBackOff" and last:
            parts.append(f"it exited with code {last.get('exitCode')} after {cs.get('restartCount', 0)} restarts")
            if (last.get("message") or "").strip():
                parts.append(f"last log lines: {log_tail(last['message'])}")
        if reason in _HINTS:
            parts.append(_HINTS[reason].format(image=image or "(none)"))
        return reason, "; ".join(parts)
    return None


def family(reason: str) -> str:
    """Reasons that alternate for one problem (a kubelet retrying a pull) count as one, for Events."""
    return "ImagePull" if reason in ("ErrImagePull", "ImagePullBackOff") else reason


def summarize(waiting: list[tuple[str, tuple[str, str]]]) -> tuple[str, str] | None:
    """(reason of the first, message) for [(pod name, (reason, message))], or None when nothing waits."""
    if not waiting:
        return None
    return waiting[0][1][0], "; ".join(f"{name}: {reason}: {message}" for name, (reason, message) in waiting)

"""What a kubelet writes into a pod's status for a phase: shared by every bed that plays the kubelet."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from .common import Body, utc_now


def kubelet_pod_status(
    pod: Mapping[str, Any],
    phase: str,
    *,
    exit_code: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    ready: bool | None = None,
    restart_count: int | None = None,
) -> Body:
    """
    The status a kubelet reports for a pod in a phase: conditions and per-container states.

    Running: containers running (ready unless ready=False). Succeeded/Failed: containers terminated
    with exit_code (default 0 / 1) and reason (default Completed / Error). Pending: containers
    waiting with reason (default ContainerCreating). restart_count defaults to the current count.
    """
    now = utc_now()
    old_status = pod.get("status") or {}
    old_containers = {status["name"]: status for status in old_status.get("containerStatuses") or []}
    is_ready = False
    if phase == "Running":
        state: Body = {"running": {"startedAt": now}}
        is_ready = ready is not False
    elif phase in ("Succeeded", "Failed"):
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        state = {
            "terminated": {
                "exitCode": code,
                "reason": reason or ("Completed" if code == 0 else "Error"),
                "startedAt": pod["metadata"]["creationTimestamp"],
                "finishedAt": now,
            }
        }
        if message:
            state["terminated"]["message"] = message
    elif phase == "Pending":
        state = {"waiting": {"reason": reason or "ContainerCreating"}}
    else:  # Unknown: the node lost contact; nothing is known about the containers
        state = {}
    container_statuses = [
        {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "ready": is_ready,
            "started": phase == "Running",
            "state": state,
            "restartCount": (
                restart_count
                if restart_count is not None
                else old_containers.get(container["name"], {}).get("restartCount", 0)
            ),
        }
        for container in (pod.get("spec") or {}).get("containers") or []
    ]
    ready_status = "True" if is_ready else "False"
    status: Body = {
        "phase": phase,
        "conditions": [
            {"type": condition, "status": value, "lastTransitionTime": now}
            for condition, value in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", ready_status),
                ("Ready", ready_status),
            )
        ],
        "containerStatuses": container_statuses,
        "hostIP": "127.0.0.1",
        "podIP": old_status.get("podIP") or f"10.0.{random.randint(0, 255)}.{random.randint(1, 254)}",
        "startTime": old_status.get("startTime") or now,
    }
    if message:
        status["message"] = message
    return status

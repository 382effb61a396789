"""
A Kubernetes API server for tests: KMock's emulator with the fixes that kopf, the `kubernetes`
client and kubectl need to work against it (ARCHITECTURE.md, "The test bed on a machine without
a cluster").

`KubernetesApiEmulator` serves objects over real HTTP; `EmulatedCluster` runs it on 127.0.0.1 in a
background thread with its own event loop, writes a kubeconfig and offers synchronous helpers for
tests: create/get/list/patch/delete, `set_pod_phase` (what a kubelet would write), `wait_for`,
`kubectl`.

Emulated like a real API server: discovery (incl. shortNames and subresources), namespaces,
resourceVersion/uid/creationTimestamp/generation, generateName, optimistic concurrency (409 on a
stale resourceVersion, 422 on a failed JSON-patch `test`), PUT/PATCH (JSON, merge, strategic)/
DELETE, status-subresource isolation, label and field selectors, watches that resume from a
resourceVersion without losing events, finalizers, background/orphan garbage collection through
ownerReferences, CRDs served once created, and server-side Tables for kubectl's columns.

Not emulated (a real cluster does these): admission, defaulting and schema validation/pruning
(except name and label syntax), server-side apply, RBAC, scheduling, kubelets (pods stay Pending
until a test calls `set_pod_phase`), graceful pod termination (pods go at once), foreground
deletion (treated as background), periodic watch bookmarks and history compaction (never 410
Gone). As on a real server, objects go into existing namespaces only (`namespaces=` creates some).
Strategic merge patch is JSON merge patch plus merging by key for the common lists (containers,
env, volumes, volumeMounts, conditions...); other lists are replaced wholesale.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import datetime
import json
import logging
import os
import pathlib
import random
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from typing_extensions import Self

from .kubelet_status import kubelet_pod_status

logger = logging.getLogger(__name__)

Body = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]  # (resource, namespace or None, name)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CRD_PATH = REPO_ROOT / "crds" / "rltrainingjob.yaml"

# --------------------------------------------------------------------------------------------------
# Resources served out of the box.
# --------------------------------------------------------------------------------------------------

ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})


def _parse_bool(value: str | None) -> bool:
    """Query booleans as the API server reads them (Go's strconv.ParseBool): older python clients send
    `watch=True`."""
    return value in ("1", "t", "T", "true", "TRUE", "True")
SUBRESOURCE_VERBS = ("get", "patch", "update")

NAMESPACES = kmock.resource("", "v1", "namespaces")
PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
EVENTS = kmock.resource("", "v1", "events")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def _info(
    kind: str,
    *,
    namespaced: bool = True,
    short: Iterable[str] = (),
    categories: Iterable[str] = (),
    subresources: Iterable[str] = (),
) -> kmock.ResourceInfo:
    return kmock.ResourceInfo(
        kind=kind,
        singular=kind.lower(),
        namespaced=namespaced,
        verbs=ALL_VERBS,
        shortnames=set(short),
        categories=set(categories),
        subresources=set(subresources),
    )


BUILTIN_RESOURCES: dict[kmock.resource, kmock.ResourceInfo] = {
    NAMESPACES: _info("Namespace", namespaced=False, short={"ns"}, subresources={"status"}),
    PODS: _info("Pod", short={"po"}, categories={"all"}, subresources={"status", "log"}),
    SERVICES: _info("Service", short={"svc"}, categories={"all"}, subresources={"status"}),
    kmock.resource("", "v1", "configmaps"): _info("ConfigMap", short={"cm"}),
    kmock.resource("", "v1", "secrets"): _info("Secret"),
    kmock.resource("", "v1", "serviceaccounts"): _info("ServiceAccount", short={"sa"}),
    kmock.resource("", "v1", "persistentvolumeclaims"): _info(
        "PersistentVolumeClaim", short={"pvc"}, subresources={"status"}
    ),
    EVENTS: _info("Event", short={"ev"}),
    CRDS: _info("CustomResourceDefinition", namespaced=False, short={"crd", "crds"}, subresources={"status"}),
}

# Field selectors a real API server accepts per resource (others answer 400, as on a cluster, so
# that code which filters on an unsupported field fails here too). CRDs add their selectableFields.
COMMON_FIELD_LABELS = frozenset({"metadata.name", "metadata.namespace"})
BUILTIN_FIELD_LABELS: dict[kmock.resource, frozenset[str]] = {
    PODS: frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    EVENTS: frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    NAMESPACES: frozenset({"status.phase"}),
    kmock.resource("", "v1", "secrets"): frozenset({"type"}),
}


def default_crd(
    *,
    group: str = "kuberl.dev",
    version: str = "v1alpha1",
    kind: str = "RLTrainingJob",
    plural: str = "rltrainingjobs",
    short_names: Sequence[str] = ("rltj",),
    printer_columns: Sequence[Mapping[str, Any]] | None = None,
) -> Body:
    """A minimal namespaced CRD with a status subresource: the stand-in until crds/ holds the real one."""
    if printer_columns is None:
        printer_columns = [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": list(short_names),
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(column) for column in printer_columns],
                }
            ],
        },
    }


def load_crds(path: str | os.PathLike[str] = DEFAULT_CRD_PATH) -> list[Body]:
    """The CRDs in a YAML file (one or many documents); [default_crd()] if the file does not exist yet."""
    path = pathlib.Path(path)
    if not path.exists():
        return [default_crd()]
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc and doc.get("kind") == "CustomResourceDefinition"]


# --------------------------------------------------------------------------------------------------
# Errors in the shape of a Kubernetes `Status`.
# --------------------------------------------------------------------------------------------------


def _error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    # Always give details: KMock renders a traceback in their place otherwise.
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


def _bad_request(message: str) -> kmock.KubernetesError:
    return _error(400, "BadRequest", message)


def _invalid(res: kmock.resource, name: str | None, message: str) -> kmock.KubernetesError:
    return _error(
        422,
        "Invalid",
        f'{res.plural} "{name}" is invalid: {message}',
        name=name,
        kind=res.plural,
        group=res.group,
    )


def _not_found(res: kmock.resource, name: str | None) -> kmock.KubernetesError:
    return _error(
        404, "NotFound", f'{res.plural} "{name}" not found', name=name, kind=res.plural, group=res.group
    )


def _conflict(res: kmock.resource, name: str, message: str) -> kmock.KubernetesError:
    return _error(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.plural} "{name}": {message}',
        name=name,
        kind=res.plural,
        group=res.group,
    )


# --------------------------------------------------------------------------------------------------
# Selectors.
# --------------------------------------------------------------------------------------------------

_LABEL_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\((.*)\)\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses: `a in (x,y),b=c` has two terms."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term.strip() for term in terms if term.strip()]


def parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on a labels dict for `a=b, a==b, a!=b, a in (x,y), a notin (x), a, !a`."""
    requirements: list[tuple[str, str, frozenset[str]]] = []  # (key, operator, values)
    for term in _split_top_level(text):
        if match := _LABEL_SET_TERM.match(term):
            key, op, values_text = match.groups()
            values = frozenset(value.strip() for value in values_text.split(",") if value.strip())
        elif term.startswith("!"):
            key, op, values = term[1:], "!exists", frozenset()
        elif "!=" in term:  # as on a server, `a!=b` also matches objects without the label
            key, value = term.split("!=", 1)
            op, values = "notin", frozenset({value.strip()})
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            op, values = "in", frozenset({value.strip()})
        elif re.fullmatch(r"[A-Za-z0-9_./-]+", term):
            key, op, values = term, "exists", frozenset()
        else:
            raise _bad_request(f"unable to parse requirement: {term!r}")
        requirements.append((key.strip(), op, values))

    def matches(labels: Mapping[str, str]) -> bool:
        for key, op, values in requirements:
            holds = (
                key in labels
                if op == "exists"
                else key not in labels
                if op == "!exists"
                else labels.get(key) in values
                if op == "in"
                else labels.get(key) not in values
            )
            if not holds:
                return False
        return True

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_field_selector(text: str, allowed: Iterable[str]) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate on an object for `path=value, path==value, path!=value` over the allowed paths."""
    allowed = set(allowed)
    requirements: list[tuple[str, bool, str]] = []  # (path, equal or not, value)
    for term in _split_top_level(text):
        match = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", term)
        if not match:
            raise _bad_request(f"invalid field selector: {term!r}")
        path = match.group(1).strip()
        if path not in allowed:
            raise _bad_request(f"field label not supported: {path}")
        requirements.append((path, match.group(2) != "!=", match.group(3).strip()))
    return lambda obj: all((_field_value(obj, path) == value) == equal for path, equal, value in requirements)


# --------------------------------------------------------------------------------------------------
# Patches.
# --------------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# The patchMergeKey of the lists that kubectl's strategic patches touch most (from the API types).
STRATEGIC_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """
    An approximation of Kubernetes' strategic merge patch, enough for kubectl apply/patch on pods.

    It is a JSON merge patch where the lists in STRATEGIC_MERGE_KEYS merge item by item on their
    key (`$patch: delete` removes an item) and directives (`$setElementOrder/...`, `$retainKeys`)
    are dropped. Any other list is replaced wholesale, as a merge patch would do.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {key: copy.deepcopy(value) for key, value in patch.items() if key != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        merge_key = STRATEGIC_MERGE_KEYS.get(key)
        if value is None:
            result.pop(key, None)
        elif merge_key and isinstance(value, list) and all(isinstance(item, Mapping) for item in value):
            result[key] = _merge_list_by_key(result.get(key) or [], value, merge_key)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list_by_key(current: list[Any], patch: list[Mapping[str, Any]], merge_key: str) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        position = next(
            (
                index
                for index, existing in enumerate(merged)
                if isinstance(existing, Mapping) and existing.get(merge_key) == item.get(merge_key)
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
        elif position is None:
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[position] = strategic_merge_patch(merged[position], item)
    return merged


# --------------------------------------------------------------------------------------------------
# Server-side Tables (what kubectl prints as columns).
# --------------------------------------------------------------------------------------------------

_JSONPATH_TOKEN = re.compile(r"""\.([^.\[\]]+)|\[(\d+)\]|\[\?\(@\.([\w.\-/]+)\s*==\s*["']([^"']*)["']\)\]""")


def json_path(obj: Any, path: str) -> Any:
    """Evaluate the JSONPath subset of printer columns: `.a.b`, `[0]`, `[?(@.type=="Ready")]`."""
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    value, position = obj, 0
    while position < len(path) and value is not None:
        token = _JSONPATH_TOKEN.match(path, position)
        if token is None:
            return None
        position = token.end()
        field, index, filter_key, filter_value = token.groups()
        if field is not None:
            value = value.get(field) if isinstance(value, Mapping) else None
        elif index is not None:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        elif isinstance(value, list):
            value = next(
                (item for item in value if str(json_path(item, "." + filter_key)) == filter_value), None
            )
        else:
            value = None
    return value


def human_duration(seconds: float) -> str:
    """Kubernetes' duration.HumanDuration, which kubectl shows in AGE columns."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // 24 // 365}y"


def _age(timestamp: Any) -> str | None:
    if not isinstance(timestamp, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return human_duration((datetime.datetime.now(datetime.timezone.utc) - then).total_seconds())


def _column(
    name: str, type_: str = "string", *, format_: str = "", priority: int = 0, description: str = ""
) -> Body:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


NAME_COLUMN = _column("Name", format_="name", description="Name must be unique within a namespace.")
AGE_COLUMN = _column("Age", description="The time since the object was created.")


def _pod_cells(pod: Mapping[str, Any]) -> list[Any]:
    """NAME READY STATUS RESTARTS AGE IP NODE, computed the way kubectl's pod printer does."""
    spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
    statuses = status.get("containerStatuses") or []
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in statuses:
        state = container.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            terminated = state["terminated"]
            reason = terminated.get("reason") or f"ExitCode:{terminated.get('exitCode', 0)}"
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    ready = sum(1 for container in statuses if container.get("ready"))
    restarts = sum(int(container.get("restartCount") or 0) for container in statuses)
    return [
        meta.get("name"),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts,
        _age(meta.get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


POD_COLUMNS = [
    NAME_COLUMN,
    _column("Ready"),
    _column("Status"),
    _column("Restarts", "integer"),
    AGE_COLUMN,
    _column("IP", priority=1),
    _column("Node", priority=1),
]


# --------------------------------------------------------------------------------------------------
# Object metadata rules.
# --------------------------------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_GENERATED_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as the API server's names.SimpleNameGenerator

# Metadata that only the server sets: clients' values are ignored on create and update.
SERVER_OWNED_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
    "selfLink",
    "managedFields",
)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_version(res: kmock.resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Everything whose change bumps metadata.generation: all but metadata and status."""
    return {
        key: value for key, value in obj.items() if key not in ("metadata", "status", "apiVersion", "kind")
    }


def _check_scheduling_gates(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """As the API server: an update may remove a pod's scheduling gates (Kueue's admission does), never add one."""
    before = [g.get("name") for g in (old.get("spec") or {}).get("schedulingGates") or []]
    after = [g.get("name") for g in (new.get("spec") or {}).get("schedulingGates") or []]
    if any(gate not in before for gate in after):
        raise _invalid(PODS, name, "spec.schedulingGates: Forbidden: only deletion is allowed, but found new "
                       f"scheduling gate {next(g for g in after if g not in before)!r}")


def _validate_metadata(res: kmock.resource, obj: Mapping[str, Any]) -> None:
    """Name and label syntax, which a real API server rejects with 422 (builders' typos show up here)."""
    meta = obj["metadata"]
    name = meta["name"]
    if res == SERVICES:
        valid = len(name) <= 63 and _DNS_1035_LABEL.match(name)
    elif res == NAMESPACES:
        valid = len(name) <= 63 and _DNS_LABEL.match(name)
    else:
        valid = len(name) <= 253 and _DNS_SUBDOMAIN.match(name)
    if not valid:
        raise _invalid(
            res, name, f"metadata.name: Invalid value: {name!r}: must be a lowercase RFC 1123 name"
        )
    for field in ("labels", "annotations"):
        if not isinstance(meta.get(field) or {}, Mapping):
            raise _invalid(res, name, f"metadata.{field}: must be a map of strings")
        for key, value in (meta.get(field) or {}).items():
            if not isinstance(value, str):
                raise _invalid(res, name, f"metadata.{field}.{key}: must be a string, not {value!r}")
    for key, value in (meta.get("labels") or {}).items():
        key_name = key.rsplit("/", 1)[-1]
        if len(key_name) > 63 or not _LABEL_NAME.match(key_name):
            raise _invalid(res, name, f"metadata.labels: Invalid value: {key!r}: not a valid label key")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise _invalid(
                res,
                name,
                f"metadata.labels: Invalid value: {value!r}: a label value must be "
                'at most 63 alphanumerics, "-", "_" or "."',
            )


@attrs.frozen
class WatchEvent:
    """One change in the API's history; watches replay these from any resourceVersion."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: kmock.resource
    namespace: str | None
    name: str
    obj: Body
    old: Body | None = None  # the previous state, to turn selector transitions into ADDED/DELETED


# --------------------------------------------------------------------------------------------------
# The emulator.
# --------------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class KubernetesApiEmulator(kmock.KubernetesEmulator):
    """
    KMock's KubernetesEmulator, reworked into an API server that real clients can drive.

    KMock provides the HTTP server, request recording (`list(emulator['patch'])`), reactions for
    fault injection (`emulator['post /api/v1/namespaces/ns/pods'] << 500` takes precedence over
    the emulation), the resource registry (`emulator.resources`, `kmock.ResourceInfo`) and the
    object store with histories (`emulator.objects[res, ns, name].history`). Its own request
    handling lacks what kopf/kubectl need (see the module docstring), so every API request is
    served here. `extra_resources` serves more kinds: {'apps/v1/deployments': ResourceInfo(...)}.

    Objects and resources are reached through KMock's public API only (`objects`, `resources`,
    `history.append`, `delete`). The request entry point cannot be: KMock 0.8's own parser fails on
    `/api/v1/namespaces`, so `__call__` parses here and then does what KMock's does with its private
    members, which have no public counterpart: records the request in `_requests` (`len(self)` would
    copy the whole list per request), tries the tests' reactions (`_payloads`, `RawHandler._handle`)
    before the emulation, and renders errors as a Status (`_render_error`). Watches, logs and
    Tables answer on the aiohttp request itself (`Request._raw_request`: streaming, Accept header).

    Store methods (`create_object`, `update_object`, ...) are synchronous and must run on the
    server's event loop: being free of awaits, each one is atomic towards watches and other
    requests. From another thread, use `EmulatedCluster`, which schedules them on that loop.
    """

    crds: Sequence[Mapping[str, Any]] = ()
    namespaces: Sequence[str] = ("default",)
    extra_resources: Mapping[str | kmock.resource, kmock.ResourceInfo] = attrs.field(factory=dict)
    #: With a node agent (tests/bed/node_agent.py) attached: a pod bound to a node is deleted gracefully, as
    #: on a real server (deletionTimestamp set, the kubelet stops its containers and then removes it).
    graceful_pod_deletion: bool = False
    #: `GET pods/{name}/log` (kubectl logs): an async callable (namespace, name, query) -> an async
    #: iterator of bytes, given by the node agent that runs the pods; without one, 400 as for a pod
    #: with no node.
    pod_logs: Callable[..., Any] | None = None

    internal_errors: list[BaseException] = attrs.field(factory=list, init=False)
    _printer_columns: dict[kmock.resource, list[Body]] = attrs.field(factory=dict, init=False)
    _field_labels: dict[kmock.resource, frozenset[str]] = attrs.field(factory=dict, init=False)
    _crd_resources: dict[str, list[kmock.resource]] = attrs.field(factory=dict, init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _log: list[WatchEvent] = attrs.field(factory=list, init=False)
    _uids: dict[str, ObjectKey] = attrs.field(factory=dict, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        # Deliberately not KubernetesEmulator's: its fallback reactions would serve the requests
        # with the behaviour this class replaces. Nothing else is set up there.
        for res, info in BUILTIN_RESOURCES.items():
            self.resources[res] = copy.deepcopy(info)
        for key, info in self.extra_resources.items():
            if not info.kind or info.namespaced is None:
                raise ValueError(f"extra resource {key!r} needs kind= and namespaced= in its ResourceInfo")
            self.resources[key] = info
        for name in dict.fromkeys(["default", *self.namespaces]):
            self.create_object(NAMESPACES, None, {"metadata": {"name": name}})
        for crd in self.crds:
            self.create_object(CRDS, None, crd)

    # ---- HTTP ------------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # KMock's own entry point parses `/api/v1/namespaces` into a crash (HTTP 500) and knows no
        # PUT, so requests are parsed here and then handled as KMock would (reactions first).
        try:
            request = await self._parse_request(raw_request)
            self._requests.append(request)
            return await self._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        except Exception as exc:  # a bug in the emulator: keep it for the fixture's teardown check
            logger.exception(
                "The Kubernetes emulator failed on %s %s", raw_request.method, raw_request.path_qs
            )
            self.internal_errors.append(exc)
            return await self._render_error(exc)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self._payloads:  # reactions that tests added take precedence over the emulation
            try:
                return await kmock.RawHandler._handle(self, request)
            except NotImplementedError:  # no reaction matched
                pass
        return await self._serve(request)

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        resource = namespace = name = subresource = None
        parts = [part for part in raw.path.split("/") if part]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            rest = []  # discovery and non-API paths
        if rest:
            # `namespaces/{ns}/{plural}/...` is namespaced; `namespaces/{name}[/status]` is a Namespace.
            if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
                namespace, rest = rest[1], rest[2:]
            resource = kmock.resource(group, version, rest[0])
            name = rest[1] if len(rest) > 1 else None
            subresource = "/".join(rest[2:]) or None
        action = None
        if resource is not None:
            method = raw.method.upper()
            if method == "GET" and _parse_bool(raw.query.get("watch")):
                action = kmock.action.WATCH
            elif method == "GET":
                action = kmock.action.LIST if name is None else kmock.action.FETCH
            elif method == "POST":
                action = kmock.action.CREATE
            elif method in ("PATCH", "PUT"):
                action = kmock.action.UPDATE
            elif method == "DELETE":
                action = kmock.action.DELETE
        return kmock.Request(
            id=len(self._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=body.decode("utf-8", errors="replace"),
            data=data,
            action=action,
            resource=resource,
            namespace=namespace,
            name=name,
            subresource=subresource,
        )

    async def _serve_dry_run_create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A dry-run create: the object back when it does not exist yet, nothing stored (creates only)."""
        raw = request._raw_request
        assert raw is not None and request.resource is not None
        if raw.method.upper() != "POST" or request.name is not None:
            raise _bad_request("the emulator supports dryRun on create only")
        body = await raw.json()
        name = (body.get("metadata") or {}).get("name")
        if name and self.get_object(request.resource, request.namespace, name) is not None:
            raise _error(409, "AlreadyExists", f'{request.resource.plural} "{name}" already exists')
        return aiohttp.web.json_response(body, status=201)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None  # always set for requests that came over HTTP
        if request.resource is None:
            return aiohttp.web.json_response(self._discovery(raw.path))

        res = request.resource
        if res not in self.resources:
            raise _error(404, "NotFound", f"the server could not find the requested resource ({res.plural})")
        info = self.resources[res]
        if request.namespace is not None and not info.namespaced:
            raise _error(404, "NotFound", f"{res.plural} is not namespaced")
        if request.subresource is not None and request.subresource not in info.subresources:
            raise _error(404, "NotFound", f"{res.plural}/{request.subresource} is not served here")
        if "dryRun" in request.params:
            return await self._serve_dry_run_create(request)

        method, name, params = raw.method.upper(), request.name, request.params
        if res == PODS and request.subresource == "log" and name is not None and method == "GET":
            return await self._serve_pod_log(request)
        as_table = "as=Table" in raw.headers.get("Accept", "")
        include_object = params.get("includeObject", "PartialObjectMetadata")
        if request.action == kmock.action.WATCH:
            return await self._serve_watch(request, as_table=as_table, include_object=include_object)
        if name is None and method == "GET":
            items = self.list_objects(
                res, request.namespace, params.get("labelSelector"), params.get("fieldSelector")
            )
            if as_table:
                return aiohttp.web.json_response(self._table(res, items, include_object))
            return aiohttp.web.json_response(
                {
                    "kind": f"{info.kind}List",
                    "apiVersion": _api_version(res),
                    "metadata": {"resourceVersion": str(self._last_rv)},
                    "items": items,
                }
            )
        if name is None and method == "POST":
            created = self.create_object(res, request.namespace, request.data)
            return aiohttp.web.json_response(created, status=201)
        if name is None and method == "DELETE":
            items = self.list_objects(
                res, request.namespace, params.get("labelSelector"), params.get("fieldSelector")
            )
            deleted = [
                self.delete_object(
                    res,
                    item["metadata"].get("namespace"),
                    item["metadata"]["name"],
                    propagation=self._propagation(request),
                )[0]
                for item in items
            ]
            return aiohttp.web.json_response(
                {
                    "kind": f"{info.kind}List",
                    "apiVersion": _api_version(res),
                    "metadata": {"resourceVersion": str(self._last_rv)},
                    "items": deleted,
                }
            )
        if name is not None and method == "GET":
            obj = self.get_object(res, request.namespace, name)
            if obj is None:
                raise _not_found(res, name)
            return aiohttp.web.json_response(self._table(res, [obj], include_object) if as_table else obj)
        if name is not None and method == "PUT":
            return aiohttp.web.json_response(
                self.update_object(
                    res, request.namespace, name, request.data, status_only=request.subresource == "status"
                )
            )
        if name is not None and method == "PATCH":
            return aiohttp.web.json_response(
                self.patch_object(
                    res,
                    request.namespace,
                    name,
                    raw.content_type,
                    request.data,
                    status_only=request.subresource == "status",
                )
            )
        if name is not None and method == "DELETE":
            options = request.data if isinstance(request.data, Mapping) else {}
            grace = options.get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
            obj, removed = self.delete_object(
                res,
                request.namespace,
                name,
                propagation=self._propagation(request),
                preconditions=options.get("preconditions"),
                grace_period_seconds=None if grace is None else int(grace),
            )
            return aiohttp.web.json_response(obj, status=200 if removed else 202)
        raise _error(405, "MethodNotAllowed", f"{method} is not supported on this URL")

    async def _serve_pod_log(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        pod = self.get_object(PODS, request.namespace, request.name)
        if pod is None:
            raise _not_found(PODS, request.name)
        if self.pod_logs is None or not (pod.get("spec") or {}).get("nodeName"):
            raise _bad_request(f"pod {request.name} does not have a host assigned")
        chunks = await self.pod_logs(request.namespace, request.name, dict(request.params), pod)
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        async for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    @staticmethod
    def _propagation(request: kmock.Request) -> str:
        options = request.data if isinstance(request.data, Mapping) else {}
        if options.get("orphanDependents") is True:
            return "Orphan"
        return options.get("propagationPolicy") or request.params.get("propagationPolicy") or "Background"

    async def _serve_watch(
        self, request: kmock.Request, *, as_table: bool, include_object: str
    ) -> aiohttp.web.StreamResponse:
        res, namespace, name, params = request.resource, request.namespace, request.name, request.params
        assert res is not None and request._raw_request is not None
        matches = self._selector(res, params.get("labelSelector"), params.get("fieldSelector"))
        since = params.get("resourceVersion") or ""
        if since not in ("", "0") and not since.isdigit():
            raise _bad_request(f"invalid resourceVersion: {since!r}")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        initial_events = _parse_bool(params.get("sendInitialEvents"))

        # The starting point is chosen without an await in between, so nothing slips through:
        # either a snapshot of the current objects and the log's end, or the log after `since`.
        if since in ("", "0") or initial_events:
            snapshot = [obj for obj in self._live_objects(res, namespace, name) if matches(obj)]
            snapshot_rv = self._last_rv
            position = len(self._log)
        else:
            snapshot, snapshot_rv = [], int(since)
            position = bisect.bisect_right(self._log, int(since), key=lambda event: event.rv)

        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        first = True

        def encode(event_type: str, obj: Body) -> bytes:
            nonlocal first
            if as_table and event_type != "BOOKMARK":
                obj = self._table(res, [obj], include_object, with_columns=first)
                first = False
            return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            for obj in snapshot:
                await response.write(encode("ADDED", obj))
            if initial_events:
                await response.write(
                    encode(
                        "BOOKMARK",
                        {
                            "kind": self.resources[res].kind,
                            "apiVersion": _api_version(res),
                            "metadata": {
                                "resourceVersion": str(snapshot_rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    )
                )
            while not self._closing:
                while position < len(self._log):
                    event = self._log[position]
                    position += 1
                    visible = self._visible_event(event, res, namespace, name, matches)
                    if visible is not None:
                        await response.write(encode(*visible))
                changed = self._changed
                if position < len(self._log):  # more came in while writing
                    continue
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            await response.write_eof()
        except ConnectionError:  # the client went away; nothing to tell it
            pass
        return response

    @staticmethod
    def _visible_event(
        event: WatchEvent,
        res: kmock.resource,
        namespace: str | None,
        name: str | None,
        matches: Callable[[Mapping[str, Any]], bool],
    ) -> tuple[str, Body] | None:
        """How a watch with these filters sees the event: objects entering or leaving a selector
        appear as ADDED or DELETED, as on a real server."""
        if event.resource != res or (namespace is not None and event.namespace != namespace):
            return None
        if name is not None and event.name != name:
            return None
        now_matches = matches(event.obj)
        if event.type != "MODIFIED":
            return (event.type, event.obj) if now_matches else None
        matched_before = event.old is not None and matches(event.old)
        if now_matches:
            return ("MODIFIED" if matched_before else "ADDED", event.obj)
        return ("DELETED", event.obj) if matched_before else None

    def close_watches(self) -> None:
        """End all watch streams (before the server stops, so that it need not wait for them)."""
        self._closing = True
        self._notify()

    # ---- discovery -------------------------------------------------------------------------------

    def _discovery(self, path: str) -> Body:
        parts = [part for part in path.split("/") if part]
        groups: dict[str, list[str]] = {}
        for res in self.resources:
            versions = groups.setdefault(res.group, [])
            if res.version not in versions:
                versions.append(res.version)
        if not parts:
            paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/readyz", "/livez"}
            paths |= {f"/apis/{group}" for group in groups if group}
            paths |= {
                f"/apis/{group}/{version}"
                for group, versions in groups.items()
                if group
                for version in versions
            }
            return {"paths": sorted(paths)}
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return {"status": "ok"}  # only the status code matters to probes
        if parts == ["version"]:
            return {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-kuberl-emulator",
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.23",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if parts == ["api"]:
            return {
                "kind": "APIVersions",
                "apiVersion": "v1",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "localhost"}],
            }
        if parts == ["api", "v1"]:
            return self._resource_list("", "v1")
        if parts == ["apis"]:
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    self._group(group, versions) for group, versions in sorted(groups.items()) if group
                ],
            }
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1], groups[parts[1]])}
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in groups.get(parts[1], []):
            return self._resource_list(parts[1], parts[2])
        raise _error(404, "NotFound", f"the server could not find the requested resource ({path})")

    @staticmethod
    def _group(group: str, versions: list[str]) -> Body:
        entries = [{"groupVersion": f"{group}/{version}", "version": version} for version in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _resource_list(self, group: str, version: str) -> Body:
        resources = []
        for res in sorted(self.resources, key=lambda r: str(r.plural)):
            if res.group != group or res.version != version:
                continue
            info = self.resources[res]
            kind = info.kind or str(res.plural).capitalize()
            resources.append(
                {
                    "name": res.plural,
                    "singularName": info.singular or kind.lower(),
                    "namespaced": bool(info.namespaced),
                    "kind": kind,
                    "verbs": sorted(info.verbs or ALL_VERBS),
                    "shortNames": sorted(info.shortnames),
                    "categories": sorted(info.categories),
                }
            )
            for sub in sorted(info.subresources):
                resources.append(
                    {
                        "name": f"{res.plural}/{sub}",
                        "singularName": "",
                        "kind": kind,
                        "namespaced": bool(info.namespaced),
                        "verbs": list(SUBRESOURCE_VERBS),
                    }
                )
        # The core group version is "v1", not "/v1" (kubectl matches kinds by it).
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ---- tables ----------------------------------------------------------------------------------

    def _table(
        self, res: kmock.resource, objs: Sequence[Body], include_object: str, with_columns: bool = True
    ) -> Body:
        if res == PODS:
            columns, cells = POD_COLUMNS, _pod_cells
        elif res == NAMESPACES:
            columns = [NAME_COLUMN, _column("Status"), AGE_COLUMN]

            def cells(obj: Body) -> list[Any]:
                return [
                    obj["metadata"]["name"],
                    (obj.get("status") or {}).get("phase"),
                    _age(obj["metadata"].get("creationTimestamp")),
                ]
        elif res in self._printer_columns:
            definitions = self._printer_columns[res]
            columns = [NAME_COLUMN] + [
                _column(
                    d["name"],
                    d.get("type", "string"),
                    format_=d.get("format", ""),
                    priority=int(d.get("priority", 0)),
                    description=d.get("description", ""),
                )
                for d in definitions
            ]

            def cells(obj: Body) -> list[Any]:
                values = [obj["metadata"]["name"]]
                for d in definitions:
                    value = json_path(obj, d["jsonPath"])
                    if d.get("type") == "date":
                        value = _age(value)
                    elif isinstance(value, (dict, list)):
                        value = json.dumps(value)
                    values.append(value)
                return values
        else:
            columns = [NAME_COLUMN, AGE_COLUMN]

            def cells(obj: Body) -> list[Any]:
                return [obj["metadata"]["name"], _age(obj["metadata"].get("creationTimestamp"))]

        rows = []
        for obj in objs:
            row: Body = {"cells": cells(obj)}
            if include_object == "Object":
                row["object"] = obj
            elif include_object != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                }
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self._last_rv)},
            "columnDefinitions": columns if with_columns else [],
            "rows": rows,
        }

    # ---- the store -------------------------------------------------------------------------------
    # All of these are synchronous on purpose (see the class docstring).

    def resolve(self, ref: str | kmock.resource) -> kmock.resource:
        """A served resource from a plural, kind, singular or short name ('rltj', 'Pod'), or a full
        reference ('v1/pods', 'rltrainingjobs.kuberl.dev', kmock.resource(...))."""
        if isinstance(ref, kmock.resource) or "/" in ref:
            parsed = ref if isinstance(ref, kmock.resource) else kmock.resource(ref)
            candidates = [res for res in self.resources if parsed.check(res)]
        else:
            lowered = ref.lower()
            candidates = [
                res
                for res in self.resources
                if lowered
                in {
                    str(res.plural),
                    f"{res.plural}.{res.group}",
                    f"{res.plural}.{res.version}.{res.group}",
                    (self.resources[res].kind or "").lower(),
                    (self.resources[res].singular or "").lower(),
                }
                | set(self.resources[res].shortnames)
            ]
        if len(candidates) != 1:
            raise LookupError(f"{ref!r} names {len(candidates)} served resources: {candidates!r}")
        return candidates[0]

    def get_object(self, res: kmock.resource, namespace: str | None, name: str) -> Body | None:
        key = self.object_key(res, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def list_objects(
        self,
        res: kmock.resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Body]:
        matches = self._selector(res, label_selector, field_selector)
        return [copy.deepcopy(obj) for obj in self._live_objects(res, namespace) if matches(obj)]

    def create_object(self, res: kmock.resource, namespace: str | None, body: Any) -> Body:
        info = self.resources[res]
        if not isinstance(body, Mapping):
            raise _bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(dict(body))
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        self._check_type(res, obj)
        if info.namespaced:
            if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise _bad_request(f"{res.plural} are namespaced: a namespace is required")
            if self.get_object(NAMESPACES, None, namespace) is None:
                raise _not_found(NAMESPACES, namespace)
            meta["namespace"] = namespace  # the python client never sends it: the URL has it
        else:
            namespace = None
            meta.pop("namespace", None)
        for field in SERVER_OWNED_METADATA:
            meta.pop(field, None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _invalid(res, None, "metadata.name: Required value: name or generateName is required")
            meta["name"] = self._generate_name(res, namespace, meta["generateName"])
        name = meta["name"]
        obj = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": meta,
            **{key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")},
        }
        _validate_metadata(res, obj)
        key = self.object_key(res, namespace, name)
        if self.get_object(res, namespace, name) is not None:
            raise _error(
                409,
                "AlreadyExists",
                f'{res.plural} "{name}" already exists',
                name=name,
                kind=res.plural,
                group=res.group,
            )

        if "status" in info.subresources:  # status is written through /status only
            obj.pop("status", None)
            if res == PODS:
                obj["status"] = {"phase": "Pending"}
            elif res == NAMESPACES:
                obj["status"] = {"phase": "Active"}
        if res == CRDS:
            self._register_crd(obj)
        meta.update(
            uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1, resourceVersion=self._next_rv()
        )
        if key in self.objects:  # KMock keeps the history of a deleted object: continue it
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        self._uids[meta["uid"]] = key
        self._record("ADDED", key, obj)
        return copy.deepcopy(obj)

    def update_object(
        self, res: kmock.resource, namespace: str | None, name: str, body: Any, *, status_only: bool = False
    ) -> Body:
        """Replace an object (PUT), or its status only; patches end here too."""
        info = self.resources[res]
        key = self.object_key(res, namespace, name)
        old = self.get_object(res, namespace, name)
        if old is None:
            raise _not_found(res, name)
        if not isinstance(body, Mapping):
            raise _bad_request("the request body must be a JSON object")
        new = copy.deepcopy(dict(body))
        meta = new["metadata"] = dict(new.get("metadata") or {})
        old_meta = old["metadata"]
        given_rv = meta.get("resourceVersion")
        if given_rv not in (None, "") and str(given_rv) != old_meta["resourceVersion"]:
            raise _conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )

        if status_only:
            candidate = copy.deepcopy(old)
            candidate.pop("status", None)
            if "status" in new:
                candidate["status"] = new["status"]
            new = candidate
        else:
            if "status" in info.subresources:  # the main resource ignores status changes
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            for field in SERVER_OWNED_METADATA + ("name", "namespace"):
                meta.pop(field, None)
                if field in old_meta:
                    meta[field] = copy.deepcopy(old_meta[field])
            new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
            _validate_metadata(res, new)
            if res == PODS:
                _check_scheduling_gates(name, old, new)
            added_finalizers = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if old_meta.get("deletionTimestamp") and added_finalizers:
                raise _invalid(
                    res,
                    name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added "
                    "if the object is being deleted",
                )

        if new == old:  # a no-op update changes nothing, not even the resourceVersion
            return old
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = int(old_meta.get("generation") or 0) + 1
        if res == CRDS and not status_only:
            self._register_crd(new)
        return self._commit(key, old, new)

    def patch_object(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        status_only: bool = False,
    ) -> Body:
        old = self.get_object(res, namespace, name)
        if old is None:
            raise _not_found(res, name)
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise _bad_request("a JSON patch must be a list of operations")
            try:
                patched = jsonpatch.JsonPatch(patch).apply(old)
            except jsonpatch.JsonPatchTestFailed as exc:  # kopf's optimistic concurrency expects 422
                raise _invalid(res, name, f"the test operation failed: {exc}")
            except (jsonpatch.JsonPatchConflict, jsonpointer.JsonPointerException) as exc:
                raise _invalid(res, name, f"the JSON patch cannot be applied: {exc}")
            except jsonpatch.InvalidJsonPatch as exc:
                raise _bad_request(f"invalid JSON patch: {exc}")
        elif content_type == "application/merge-patch+json":
            if not isinstance(patch, Mapping):
                raise _bad_request("a merge patch must be a JSON object")
            patched = merge_patch(old, patch)
        elif content_type == "application/strategic-merge-patch+json" and not self._is_custom(res):
            if not isinstance(patch, Mapping):
                raise _bad_request("a strategic merge patch must be a JSON object")
            patched = strategic_merge_patch(old, patch)
        else:  # as on a cluster: no strategic patches for custom resources, no server-side apply
            raise _error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - "
                f"{content_type!r} is not supported for {res.plural}",
            )
        # A resourceVersion left unchanged by the patch makes no precondition; a changed one does.
        if patched.get("metadata", {}).get("resourceVersion") == old["metadata"]["resourceVersion"]:
            patched["metadata"].pop("resourceVersion")
        return self.update_object(res, namespace, name, patched, status_only=status_only)

    def delete_object(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        preconditions: Mapping[str, Any] | None = None,
        grace_period_seconds: int | None = None,
    ) -> tuple[Body, bool]:
        """Delete an object or mark it for deletion; returns its last state and whether it is gone."""
        key = self.object_key(res, namespace, name)
        obj = self.get_object(res, namespace, name)
        if obj is None:
            raise _not_found(res, name)
        meta = obj["metadata"]
        for field in ("uid", "resourceVersion"):
            if (preconditions or {}).get(field) not in (None, meta[field]):
                raise _conflict(
                    res,
                    name,
                    f"Precondition failed: {field} in precondition: "
                    f"{preconditions[field]}, {field} in object meta: {meta[field]}",
                )
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        if res == PODS and self.graceful_pod_deletion:
            grace = self._pod_grace(obj, grace_period_seconds)
            if grace > 0:  # the kubelet stops the containers, then deletes the pod with grace 0
                if meta.get("deletionTimestamp"):
                    return obj, False
                new = copy.deepcopy(obj)
                new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=grace)
                return self._commit(key, obj, new), False
        if meta.get("finalizers"):  # wait for the finalizers' owners to remove them
            if meta.get("deletionTimestamp"):
                return obj, False
            new = copy.deepcopy(obj)
            new["metadata"].update(
                deletionTimestamp=_now(),
                deletionGracePeriodSeconds=0,
                generation=int(meta.get("generation") or 0) + 1,
            )
            return self._commit(key, obj, new), False
        return self._remove(key, obj), True

    @staticmethod
    def _pod_grace(pod: Body, requested: int | None) -> int:
        """The grace period a real server gives a pod's deletion: none for a pod on no node or one that
        has finished; else the request's, else the pod's terminationGracePeriodSeconds (default 30)."""
        spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        if requested is not None:
            return max(0, requested)
        return int(spec.get("terminationGracePeriodSeconds", 30))

    def register_crd(self, crd: Mapping[str, Any]) -> Body:
        """Serve a custom resource as `kubectl apply -f crd.yaml` would (creates or replaces the CRD)."""
        existing = self.get_object(CRDS, None, crd["metadata"]["name"])
        if existing is None:
            return self.create_object(CRDS, None, crd)
        replacement = copy.deepcopy(dict(crd))
        replacement.setdefault("metadata", {})["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.update_object(CRDS, None, crd["metadata"]["name"], replacement)

    # ---- internals of the store ------------------------------------------------------------------

    def object_key(self, res: kmock.resource, namespace: str | None, name: str) -> ObjectKey:
        return (res, namespace if self.resources[res].namespaced else None, name)

    def _live_objects(
        self, res: kmock.resource, namespace: str | None = None, name: str | None = None
    ) -> list[Body]:
        """Current objects in etcd's order (namespace, name); namespace None means all namespaces."""
        found = [
            (key, obj)
            for key, obj in self.objects.items()
            if key[0] == res
            and not obj.deleted
            and (namespace is None or key[1] == namespace)
            and (name is None or key[2] == name)
        ]
        return [obj.raw for _, obj in sorted(found, key=lambda item: (item[0][1] or "", item[0][2]))]

    def _selector(
        self, res: kmock.resource, label_selector: str | None, field_selector: str | None
    ) -> Callable[[Mapping[str, Any]], bool]:
        labels = parse_label_selector(label_selector or "")
        allowed = (
            COMMON_FIELD_LABELS
            | BUILTIN_FIELD_LABELS.get(res, frozenset())
            | self._field_labels.get(res, frozenset())
        )
        fields = parse_field_selector(field_selector or "", allowed)
        return lambda obj: labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)

    def _check_type(self, res: kmock.resource, obj: Body) -> None:
        api_version, kind = _api_version(res), self.resources[res].kind
        if obj.setdefault("apiVersion", api_version) != api_version or obj.setdefault("kind", kind) != kind:
            raise _bad_request(
                f"the object's {obj['apiVersion']}/{obj['kind']} does not match "
                f"the URL's {api_version}/{kind}"
            )

    def _is_custom(self, res: kmock.resource) -> bool:
        return any(res in resources for resources in self._crd_resources.values())

    def _generate_name(self, res: kmock.resource, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + "".join(random.choices(_GENERATED_NAME_CHARS, k=5))
            if self.get_object(res, namespace, name) is None:
                return name

    def _next_rv(self) -> str:
        self._last_rv += 1
        return str(self._last_rv)

    def _notify(self) -> None:
        # A fresh Event per change: a watcher takes the current one, then checks the log; a change
        # after the check sets the Event it holds. No lock is needed on a single event loop.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _record(self, event_type: str, key: ObjectKey, obj: Body, old: Body | None = None) -> None:
        self._log.append(
            WatchEvent(
                rv=int(obj["metadata"]["resourceVersion"]),
                type=event_type,
                resource=key[0],
                namespace=key[1],
                name=key[2],
                obj=copy.deepcopy(obj),
                old=copy.deepcopy(old),
            )
        )
        self._notify()

    def _commit(self, key: ObjectKey, old: Body, new: Body) -> Body:
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(new)
        self._record("MODIFIED", key, new, old)
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")  # else a kubelet removes it when its containers stop
        ):  # the last finalizer is gone
            return self._remove(key, new)
        return copy.deepcopy(new)

    def _remove(self, key: ObjectKey, obj: Body) -> Body:
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].delete()
        self._uids.pop(final["metadata"]["uid"], None)
        self._record("DELETED", key, final)
        res = key[0]
        self._collect_garbage(final["metadata"]["uid"])
        if res == NAMESPACES:  # the namespace's content goes with it
            for dependent_key, dependent in list(self.objects.items()):
                if dependent_key[1] == key[2] and not dependent.deleted and self.get_object(*dependent_key):
                    self.delete_object(*dependent_key)
        if res == CRDS:  # so do the custom resources
            for custom in self._crd_resources.pop(key[2], []):
                for dependent_key, dependent in list(self.objects.items()):
                    if dependent_key[0] == custom and not dependent.deleted:
                        self._remove(dependent_key, copy.deepcopy(dependent.raw))
                del self.resources[custom]
        return final

    def _dependents(self, owner_uid: str) -> list[tuple[ObjectKey, Body]]:
        return [
            (key, copy.deepcopy(obj.raw))
            for key, obj in list(self.objects.items())
            if not obj.deleted
            and any(
                ref.get("uid") == owner_uid
                for ref in obj.raw.get("metadata", {}).get("ownerReferences") or []
            )
        ]

    def _collect_garbage(self, owner_uid: str) -> None:
        """The garbage collector, done at once: a dependent whose owners are all gone is deleted
        (finalizers honoured), one with an owner left loses the dangling reference."""
        for key, dependent in self._dependents(owner_uid):
            if self.get_object(*key) is None:  # gone meanwhile, by an earlier cascade
                continue
            remaining = [
                ref
                for ref in dependent["metadata"]["ownerReferences"]
                if ref.get("uid") != owner_uid and ref.get("uid") in self._uids
            ]
            if remaining:
                new = copy.deepcopy(dependent)
                new["metadata"]["ownerReferences"] = remaining
                self._commit(key, dependent, new)
            else:
                self.delete_object(*key)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key, dependent in self._dependents(owner_uid):
            new = copy.deepcopy(dependent)
            new["metadata"]["ownerReferences"] = [
                ref for ref in dependent["metadata"]["ownerReferences"] if ref.get("uid") != owner_uid
            ]
            if not new["metadata"]["ownerReferences"]:
                del new["metadata"]["ownerReferences"]
            self._commit(key, dependent, new)

    def _register_crd(self, crd: Mapping[str, Any]) -> None:
        spec, name = crd.get("spec") or {}, (crd.get("metadata") or {}).get("name")
        names = spec.get("names") or {}
        group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
        if not (group and plural and kind and spec.get("versions")):
            raise _invalid(
                CRDS, name, "spec.group, spec.names.plural, spec.names.kind and spec.versions are required"
            )
        if name != f"{plural}.{group}":
            raise _invalid(
                CRDS, name, f'metadata.name: must be spec.names.plural+"."+spec.group: {plural}.{group}'
            )
        for old in self._crd_resources.pop(name, []):
            del self.resources[old]
        served = []
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(group, version["name"], plural)
            self.resources[res] = kmock.ResourceInfo(
                kind=kind,
                singular=names.get("singular") or kind.lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=ALL_VERBS,
                shortnames=set(names.get("shortNames") or []),
                categories=set(names.get("categories") or []),
                subresources={sub for sub in (version.get("subresources") or {})},
            )
            # With no printer columns, a CRD's table has an Age column (as the API server does).
            self._printer_columns[res] = list(
                version.get("additionalPrinterColumns")
                or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
            )
            self._field_labels[res] = frozenset(
                field["jsonPath"].lstrip(".") for field in version.get("selectableFields") or []
            )
            served.append(res)
        self._crd_resources[name] = served
        if isinstance(crd, dict):  # the stored CRD says it is served, as the API server would
            crd["status"] = {
                "acceptedNames": copy.deepcopy(names),
                "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
                "conditions": [
                    {
                        "type": cond,
                        "status": "True",
                        "reason": reason,
                        "message": "",
                        "lastTransitionTime": _now(),
                    }
                    for cond, reason in (
                        ("NamesAccepted", "NoConflicts"),
                        ("Established", "InitialNamesAccepted"),
                    )
                ],
            }


# --------------------------------------------------------------------------------------------------
# Running it: a thread with its own event loop, a kubeconfig, synchronous helpers.
# --------------------------------------------------------------------------------------------------


def write_kubeconfig(path: pathlib.Path, server: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig whose only context points at `server` (plain HTTP, no credentials needed)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


class EmulatedCluster:
    """
    A running `KubernetesApiEmulator` on 127.0.0.1 plus what tests need around it.

    The server runs in a daemon thread with its own event loop, so synchronous clients (the
    `kubernetes` package, kubectl, kopf in its own thread) can all talk to it. Helper methods run
    the emulator's store operations on that loop and return plain dicts; `namespace=None` in them
    means the cluster's default namespace (`.namespace`).
    """

    def __init__(
        self,
        emulator: KubernetesApiEmulator,
        workdir: pathlib.Path,
        namespace: str = "default",
        host: str = "127.0.0.1",
    ) -> None:
        self.emulator = emulator
        self.host = host
        self.namespace = namespace
        self.workdir = pathlib.Path(workdir)
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubecache_dir = self.workdir / "kubecache"
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 10) -> Self:
        self._thread = threading.Thread(target=self._thread_main, name="k8s-emulator", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the Kubernetes emulator did not start in time")
        if self._thread_error is not None:
            raise RuntimeError("the Kubernetes emulator failed to start") from self._thread_error
        write_kubeconfig(self.kubeconfig, self.url, self.namespace)
        self.kubecache_dir.mkdir(parents=True, exist_ok=True)
        return self

    def stop(self, timeout: float = 10) -> None:
        if self._loop is not None and self._stop_event is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("the Kubernetes emulator did not stop in time")
        if self._thread_error is not None:
            raise RuntimeError("the Kubernetes emulator crashed") from self._thread_error

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 (reported to the test's thread by start()/stop())
            self._thread_error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        async with self.emulator, kmock.Server(self.emulator, host=self.host) as server:
            self.url = f"http://{self.host}:{server.port}"
            self._started.set()
            await self._stop_event.wait()
            self.emulator.close_watches()  # else the server's shutdown waits for open watches

    # ---- clients ---------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment for a subprocess (kubectl, helm, kopf run) that talks to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.kubecache_dir)}

    def api_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` for this cluster (close it when done)."""
        import kubernetes  # the emulator itself does not need the client package

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 30, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster; raises with its stderr if it fails and `check`."""
        result = subprocess.run(
            ["kubectl", *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    # ---- the store, from the test's thread --------------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a synchronous emulator method on the server's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("the Kubernetes emulator is not running")

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def _ns(self, res: kmock.resource, namespace: str | None) -> str | None:
        return (namespace or self.namespace) if self.emulator.resources[res].namespaced else None

    def resolve(self, resource: str | kmock.resource) -> kmock.resource:
        return self.call(self.emulator.resolve, resource)

    def create(self, body: Mapping[str, Any], namespace: str | None = None) -> Body:
        """Create an object from a manifest; the resource comes from its apiVersion and kind."""
        group_version, kind = body["apiVersion"], body["kind"]
        res = self._by_kind(group_version, kind)
        ns = self._ns(res, namespace or (body.get("metadata") or {}).get("namespace"))
        return self.call(self.emulator.create_object, res, ns, body)

    def _by_kind(self, group_version: str, kind: str) -> kmock.resource:
        group, _, version = group_version.rpartition("/")

        def find() -> kmock.resource:
            for res in self.emulator.resources:
                if (res.group, res.version) == (group, version) and self.emulator.resources[res].kind == kind:
                    return res
            raise LookupError(f"no served resource for {group_version} {kind}")

        return self.call(find)

    def get(self, resource: str | kmock.resource, name: str, namespace: str | None = None) -> Body | None:
        """The object, or None if it does not exist."""
        res = self.resolve(resource)
        return self.call(self.emulator.get_object, res, self._ns(res, namespace), name)

    def list(
        self,
        resource: str | kmock.resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        all_namespaces: bool = False,
    ) -> list[Body]:
        res = self.resolve(resource)
        ns = None if all_namespaces else self._ns(res, namespace)
        return self.call(self.emulator.list_objects, res, ns, label_selector, field_selector)

    def patch(
        self,
        resource: str | kmock.resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> Body:
        """Patch as a client would: patch_type 'merge', 'strategic' or 'json'; subresource 'status'."""
        content_types = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }
        res = self.resolve(resource)
        return self.call(
            self.emulator.patch_object,
            res,
            self._ns(res, namespace),
            name,
            content_types[patch_type],
            patch,
            status_only=subresource == "status",
        )

    def patch_status(
        self,
        resource: str | kmock.resource,
        name: str,
        status: Mapping[str, Any],
        namespace: str | None = None,
    ) -> Body:
        return self.patch(resource, name, {"status": status}, namespace, subresource="status")

    def delete(
        self,
        resource: str | kmock.resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str = "Background",
    ) -> Body | None:
        """Delete (or mark for deletion, with finalizers); returns the last state, None if it was absent."""
        res = self.resolve(resource)
        try:
            obj, _ = self.call(
                self.emulator.delete_object,
                res,
                self._ns(res, namespace),
                name,
                propagation=propagation_policy,
            )
        except kmock.KubernetesError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def create_namespace(self, name: str) -> Body:
        return self.call(self.emulator.create_object, NAMESPACES, None, {"metadata": {"name": name}})

    def register_crd(self, crd: Mapping[str, Any]) -> Body:
        return self.call(self.emulator.register_crd, crd)

    def history(
        self, resource: str | kmock.resource, name: str, namespace: str | None = None
    ) -> list[Body | None]:
        """Every state the object went through (None where it was deleted), oldest first."""
        res = self.resolve(resource)

        def read() -> list[Body | None]:
            key = self.emulator.object_key(res, self._ns(res, namespace), name)
            if key not in self.emulator.objects:
                return []
            return [
                None if version is None else copy.deepcopy(version.raw)
                for version in self.emulator.objects[key].history
            ]

        return self.call(read)

    def events(self, namespace: str | None = None, involved_name: str | None = None) -> list[Body]:
        """Kubernetes Events (as kopf posts them), optionally about one object."""
        selector = f"involvedObject.name={involved_name}" if involved_name else None
        return self.list("v1/events", namespace, field_selector=selector)

    def set_pod_phase(
        self,
        namespace: str | None,
        name: str,
        phase: str,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
        message: str | None = None,
        ready: bool | None = None,
        restart_count: int | None = None,
    ) -> Body:
        """Write a pod's status as its kubelet would (see `kubelet_pod_status`); returns the pod."""

        def write() -> Body:
            pod = self.emulator.get_object(PODS, namespace or self.namespace, name)
            if pod is None:
                raise _not_found(PODS, name)
            status = kubelet_pod_status(
                pod,
                phase,
                exit_code=exit_code,
                reason=reason,
                message=message,
                ready=ready,
                restart_count=restart_count,
            )
            # Read and written in one step on the server's loop: no resourceVersion race with others.
            return self.emulator.update_object(
                PODS, pod["metadata"]["namespace"], name, {"status": status}, status_only=True
            )

        return self.call(write)

    def wait_for(
        self,
        resource: str | kmock.resource,
        name: str,
        predicate: Callable[[Body], bool] | None = None,
        namespace: str | None = None,
        timeout: float = 10,
        interval: float = 0.05,
    ) -> Body:
        """Poll until the object exists (and the predicate holds); returns it. Fails with its last state."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(resource, name, namespace)
            if obj is not None and (predicate is None or predicate(obj)):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{resource} {name!r} did not reach the expected state in {timeout}s; "
                    f"last state: {json.dumps(obj, indent=1)}"
                )
            time.sleep(interval)

    def wait_for_absent(
        self,
        resource: str | kmock.resource,
        name: str,
        namespace: str | None = None,
        timeout: float = 10,
        interval: float = 0.05,
    ) -> None:
        deadline = time.monotonic() + timeout
        while (obj := self.get(resource, name, namespace)) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{resource} {name!r} still exists after {timeout}s: {json.dumps(obj, indent=1)}"
                )
            time.sleep(interval)

"""Pod templates per role (`spec.<role>.template`): which fields the operator owns, and how a template is
merged onto the pod the operator builds. Pure data: the job model checks a template with `check()`, the
builders merge it with `merge()`, so `kuberl validate`, the operator and the learner agree.

Merge rules (strategic merge as `kubectl patch` does it, keyed as Kubernetes keys these lists):
- maps (labels, annotations, nodeSelector, securityContext, affinity, ...) merge key by key, recursively;
  the template's value wins for a key both have; scalars are replaced;
- lists keyed by a field merge item by item on that key: containers, initContainers, env, volumes,
  imagePullSecrets by name, volumeMounts by mountPath, topologySpreadConstraints by topologyKey; an
  item with a new key is appended (a container with a new name is a sidecar);
- tolerations and envFrom are appended (Kubernetes' own strategic merge replaces tolerations; here
  the operator sets none, so appending and replacing give the same pod);
- any other list is replaced by the template's;
- a sidecar starts from the securityContext of the role's own container (Pod Security "restricted",
  read-only root filesystem), merged field by field with its own.
"""

from __future__ import annotations

import copy
import json
import posixpath
from typing import Any

from kuberl.api import pod_schema
from kuberl.api.threads import THREAD_ENV

#: The container the operator builds for each role (spec field -> container name). A template container
#: of that name merges into it.
MAIN_CONTAINERS = {"head": "ray-head", "rolloutWorkers": "rollout-worker", "learner": "learner",
                   "serving": "serving"}

# ---- what the operator owns ---------------------------------------------------------------------

#: Every pod the operator builds meets Pod Security "restricted": non-root, no privilege escalation, no
#: capabilities, RuntimeDefault seccomp. The trainer image runs as uid 1000; fsGroup makes a checkpoint PVC
#: writable by it.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    # Nothing in the image changes at run time: what Ray and the trainer write goes to volumes
    # (the scratch /tmp every pod gets, /dev/shm, the checkpoint volume).
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: Pod-level fields of every pod the operator builds. No ServiceAccount token (a template may mount one only
#: where the namespace's allowance names the account: kuberl.api.tenancy); no Service environment variables.
POD_FIELDS: dict[str, Any] = {
    "automountServiceAccountToken": False,
    "enableServiceLinks": False,
    "securityContext": POD_SECURITY_CONTEXT,
}


#: Fields of the role's own container that the operator sets: how it runs, where Ray listens, what it
#: reads back. `image` and `resources` have their own spec fields (spec.image, spec.<role>.resources).
OWNED_CONTAINER_FIELDS = ("command", "args", "image", "ports", "resources", "readinessProbe", "livenessProbe",
                          "startupProbe", "terminationMessagePath", "terminationMessagePolicy")
#: Volumes the operator adds (scratch /tmp, Ray's /dev/shm, the checkpoint volume) and where it mounts them.
#: `preferences` is BDQ's preference.configMap (job.PREFERENCE_CONFIGMAP_MOUNT); `job-spec` the learner's job.
#: A mount of the role's own container is compared as the path it resolves to (`mount_point`), and refused
#: at, inside or above one of these: inside would cover part of it, above would hide all of it.
OWNED_VOLUMES = ("tmp", "shm", "checkpoints", "preferences", "job-spec")
OWNED_MOUNT_PATHS = ("/tmp", "/dev/shm", "/checkpoints", "/etc/kuberl/preferences", "/etc/kuberl/job")
#: Environment of the role's own container: the job, the Ray address and the job's Ray token.
OWNED_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "RAY_raylet_start_wait_time_s",
             "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
OWNED_ENV_PREFIX = "KUBERL_"
#: Environment the operator sets as a default a template may replace (env merges by name): the thread
#: pools, sized to the role's CPUs.
DEFAULTED_ENV = THREAD_ENV
#: Labels the operator selects its pods by (and the recommended set it writes), and the scrape annotations.
OWNED_LABEL_PREFIX = "kuberl.dev/"
OWNED_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by")
#: Annotations under kuberl.dev/ are the operator's too (kuberl.dev/learner-replicas: the N rank 0 runs with).
OWNED_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
#: Kueue's labels, annotations and gate: the operator writes them for spec.queueName (kuberl.operator.kueue).
KUEUE_PREFIX = "kueue.x-k8s.io/"
KUEUE_OWNED = ("is the operator's: it makes the job's pods one Kueue pod group, gated until admission; "
               "name the queue with spec.queueName")
#: The operator is the only restarter of a job's pods (it counts restarts against backoffLimit).
OWNED_POD_FIELDS = ("restartPolicy",)

_MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
               "imagePullSecrets": "name", "volumeMounts": "mountPath", "topologySpreadConstraints": "topologyKey"}
_APPENDED = ("tolerations", "envFrom")


# ---- bounds -------------------------------------------------------------------------------------
# A template is merged onto every pod of its role on every pass that builds them: its size times the pods
# it shapes is what a job costs the operator in time and memory. Real templates (tolerations, affinity,
# env from Secrets, a sidecar or two) are 1-10 KiB.

#: Bytes of one template as compact JSON.
MAX_TEMPLATE_BYTES = 32 * 1024
#: Bytes of every template times the pods it is merged onto, summed over the job's roles.
MAX_JOB_TEMPLATE_BYTES = 2 * 1024 * 1024
BOUNDS_TEXT = (f"A template is at most {MAX_TEMPLATE_BYTES // 1024} KiB as JSON, and a job's templates times the "
               f"pods each shapes at most {MAX_JOB_TEMPLATE_BYTES // (1024 * 1024)} MiB.")


def template_bytes(template: dict[str, Any] | None) -> int:
    return len(json.dumps(template, separators=(",", ":"))) if template else 0


class TemplateProblems(ValueError):
    """A template the job cannot use: (path inside the template, message) for each problem. The job's
    loader turns each into a Problem at `spec.<role>.template.<path>`."""

    def __init__(self, problems: list[tuple[tuple, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{pod_schema.format_path(path)}: {message}" for path, message in problems))


def check(template: dict[str, Any], role: str) -> dict[str, Any]:
    """The template, or TemplateProblems: its size, the schema's (typos, types), then the owned fields."""
    size = template_bytes(template)
    if size > MAX_TEMPLATE_BYTES:
        raise TemplateProblems([((), f"is {size:,} bytes as JSON; a template is at most {MAX_TEMPLATE_BYTES:,} "
                                     "(move large data into a ConfigMap or Secret the template mounts)")])
    found = pod_schema.problems(template)
    if not found:
        found = owned_problems(template, role)
    if found:
        raise TemplateProblems(found)
    return template


def owned_problems(template: dict[str, Any], role: str) -> list[tuple[tuple, str]]:
    """Every field of a (schema-valid) template that would override what the operator owns."""
    out: list[tuple[tuple, str]] = []
    meta = template.get("metadata") or {}
    for key in meta.get("labels") or {}:
        if key.startswith(OWNED_LABEL_PREFIX) or key in OWNED_LABELS:
            out.append((("metadata", "labels", key), "is the operator's: it selects and describes the job's pods"))
        elif key.startswith(KUEUE_PREFIX):
            out.append((("metadata", "labels", key), KUEUE_OWNED))
    for key in meta.get("annotations") or {}:
        if key in OWNED_ANNOTATIONS:
            out.append((("metadata", "annotations", key),
                        "is the operator's: it tells Prometheus where the metrics are"))
        elif key.startswith(OWNED_LABEL_PREFIX):
            out.append((("metadata", "annotations", key), "is the operator's: it records how it runs the pod"))
        elif key.startswith(KUEUE_PREFIX):
            out.append((("metadata", "annotations", key), KUEUE_OWNED))
    spec = template.get("spec") or {}
    out += [(("spec", field), "is the operator's: it restarts the job's pods itself (backoffLimit)")
            for field in OWNED_POD_FIELDS if field in spec]
    if "schedulingGates" in spec:
        out.append((("spec", "schedulingGates"), KUEUE_OWNED))
    for i, volume in enumerate(spec.get("volumes") or []):
        if volume["name"] in OWNED_VOLUMES:
            out.append((("spec", "volumes", i, "name"), (f"{volume['name']!r} is a volume of the operator's "
                                                         f"({', '.join(OWNED_VOLUMES)}); name yours differently")))
    main = MAIN_CONTAINERS[role]
    for i, container in enumerate(spec.get("initContainers") or []):
        if container["name"] == main:
            out.append((("spec", "initContainers", i, "name"),
                        f"{container['name']!r} is a container of the operator's"))
    for i, container in enumerate(spec.get("containers") or []):
        where = ("spec", "containers", i)
        if container["name"] == main:
            out += _owned_in_main(container, where, role)
        elif "image" not in container:
            out.append(((*where, "image"), "required field is missing (a sidecar needs its own image)"))
    return out


def _owned_in_main(container: dict[str, Any], where: tuple, role: str) -> list[tuple[tuple, str]]:
    out = []
    for field in OWNED_CONTAINER_FIELDS:
        if field in container:
            hint = {"image": " (set spec.image)", "resources": f" (set spec.{role}.resources)"}.get(field, "")
            out.append(((*where, field), f"is the operator's in its {container['name']!r} container{hint}"))
    for i, env in enumerate(container.get("env") or []):
        if env["name"] in OWNED_ENV or env["name"].startswith(OWNED_ENV_PREFIX):
            out.append(((*where, "env", i, "name"), (f"{env['name']!r} is set by the operator (KUBERL_* and "
                                                     f"{', '.join(OWNED_ENV)} are its own)")))
    # A raw block device takes its path in the container's filesystem as a mount does.
    for field, path_field in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for i, mount in enumerate(container.get(field) or []):
            clash = _owned_mount_clash(mount[path_field])
            if clash:
                out.append(((*where, field, i, path_field), clash))
    return out


def mount_point(path: str) -> str:
    """Where a mount at `path` lands in the container: `/tmp/`, `//tmp`, `/tmp/.`, `/x/../tmp` and `tmp` are
    all `/tmp` to the runtime. normpath alone would keep a leading `//` (POSIX leaves its meaning to the
    system; Linux reads it as `/`), so the slashes are stripped and one put back."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _owned_mount_clash(path: str) -> str | None:
    """Why a mount of the role's own container at `path` would take an owned mount's place; None if not."""
    point = mount_point(path)
    for owned in OWNED_MOUNT_PATHS:
        if point == owned:
            where = f"is {owned}"
        elif point.startswith(owned + "/"):
            where = f"is inside {owned}"
        elif owned.startswith(point.rstrip("/") + "/"):
            where = f"is above {owned} and would hide it"
        else:
            continue
        return (f"{path!r} {where}, mounted by the operator; mount yours at a path that is neither at, inside "
                f"nor above any of {', '.join(OWNED_MOUNT_PATHS)}")
    return None


# ---- merging ------------------------------------------------------------------------------------

def merge(pod: dict[str, Any], template: dict[str, Any] | None, role: str) -> dict[str, Any]:
    """`pod` (a Pod, or a pod template's {metadata, spec}) with `template` merged onto it; neither changes.
    The template must have passed `check()`."""
    if not template:
        return pod
    out = copy.deepcopy(pod)
    meta = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        if meta.get(key):
            out["metadata"][key] = {**out["metadata"].get(key, {}), **meta[key]}
    spec = copy.deepcopy(template.get("spec") or {})
    main = next(c for c in pod["spec"]["containers"] if c["name"] == MAIN_CONTAINERS[role])
    default_context = main.get("securityContext") or {}
    built = {c["name"] for c in [*pod["spec"]["containers"], *pod["spec"].get("initContainers", [])]}
    for key in ("containers", "initContainers"):
        for sidecar in spec.get(key) or []:
            if sidecar["name"] not in built:
                sidecar["securityContext"] = _merged(default_context, sidecar.get("securityContext") or {})
    out["spec"] = _merged(out["spec"], spec)
    return out


def _merged(base: Any, over: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merged(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(over, list):
        if field in _APPENDED:
            return [*base, *copy.deepcopy(over)]
        key = _MERGE_KEYS.get(field)
        if key is not None:
            out_list = list(base)
            index = {item.get(key): i for i, item in enumerate(out_list)}
            for item in over:
                if item.get(key) in index:
                    out_list[index[item[key]]] = _merged(out_list[index[item[key]]], item)
                else:
                    out_list.append(copy.deepcopy(item))
            return out_list
    return copy.deepcopy(over)

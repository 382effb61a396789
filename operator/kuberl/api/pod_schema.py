"""The pod template's schema: Kubernetes' own PodTemplateSpec as a CRD structural schema, and its checker.

`generate()` builds it from the Kubernetes JSON schemas that `kubernetes-validate` ships (generated from
the Kubernetes OpenAPI, a dev dependency); `pod_template_schema.json` is its output, committed and
packaged, so the operator image needs no schema package. `python -m kuberl.api.pod_schema` rewrites it
(a test fails when it is stale). `problems()` checks a template against the same schema the CRD carries:
unknown fields (typos) and wrong types are refused with the field's path, as a real API server refuses
them under kubectl's default `--validate=strict`.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import sys
from typing import Any

#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion): its PodSpec has no field a 1.27
#: API server would drop.
KUBERNETES_VERSION = "v1.27.0"
SCHEMA_FILE = pathlib.Path(__file__).with_name("pod_template_schema.json")
#: The template's metadata: only these; name, namespace, ownerReferences... are the operator's.
METADATA_FIELDS = ("labels", "annotations")
#: Descriptions (their first sentence) are kept down to this depth below the template: `kubectl explain`
#: shows them for the pod spec's own fields (tolerations, affinity, ...). Deeper ones are cut: the CRD
#: carries four templates and must stay under the 256 KiB that kubectl's client-side apply can annotate
#: (tests/unit/test_pod_templates.py measures it; Kubernetes' full descriptions would make it ~1 MiB).
DESCRIPTION_DEPTH = 2
#: The pod spec's field a template may not have (see generate()).
EPHEMERAL_CONTAINERS = "ephemeralContainers"
_INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
_KEPT = ("description", "type", "format", "enum", "required")


def generate() -> dict[str, Any]:
    """PodTemplateSpec of KUBERNETES_VERSION as a structural schema: $refs inlined, IntOrString and
    Quantity as int-or-string, no nulls, no list-type markers (plain lists, merged by KubeRL's rules),
    free-form objects marked to keep their fields."""
    import kubernetes_validate  # dev dependency: only the generator needs it

    root = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"{KUBERNETES_VERSION}-local"
    defs = json.loads((root / "_definitions.json").read_text())["$defs"]
    template = _structural(defs["io.k8s.api.core.v1.PodTemplateSpec"], defs, 0, ())
    meta = template["properties"]["metadata"]
    meta["properties"] = {k: meta["properties"][k] for k in METADATA_FIELDS}
    meta["description"] = "Labels and annotations added to the pod's (the kuberl.dev/* labels are the operator's)."
    template["properties"]["spec"].pop("required", None)  # a template may give only tolerations
    # The API server refuses a pod created with ephemeral containers (they are added to a running pod through
    # its ephemeralcontainers subresource): a template giving them could only fail at the pod's creation, so it
    # fails at kubectl apply instead, as an unknown field. Four templates' worth of its schema is also 36 KB
    # of the CRD, whose room under client-side apply's limit the status needs.
    template["properties"]["spec"]["properties"].pop(EPHEMERAL_CONTAINERS)
    return template


def _structural(schema: dict[str, Any], defs: dict[str, Any], depth: int, seen: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any]
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            raise ValueError(f"recursive schema at {name}: a structural schema cannot express it")
        if name in ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity"):
            out = dict(_INT_OR_STRING)
        else:
            out = _structural(defs[name], defs, depth, (*seen, name))
        if "description" in schema and depth <= DESCRIPTION_DEPTH:
            out["description"] = _first_sentence(schema["description"])
        return out
    out = {k: schema[k] for k in _KEPT if k in schema}
    if depth > DESCRIPTION_DEPTH:
        out.pop("description", None)
    elif "description" in out:
        out["description"] = _first_sentence(out["description"])
    kind = out.get("type")
    if isinstance(kind, list):
        out["type"] = next(t for t in kind if t != "null")
    if "properties" in schema:
        out["properties"] = {k: _structural(v, defs, depth + 1, seen) for k, v in schema["properties"].items()}
        out["type"] = "object"
    if "items" in schema:
        out["items"] = _structural(schema["items"], defs, depth + 1, seen)
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(schema["additionalProperties"], defs, depth + 1, seen)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True  # free-form JSON (managedFields' fieldsV1)
    return out


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?\.)(\s|$)", text, re.DOTALL)
    return match.group(1) if match else text


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The committed schema (what the CRD carries for every role's template)."""
    return json.loads(SCHEMA_FILE.read_text())


# --------------------------------------------------------------------------------------------
# Checking a template against it
# --------------------------------------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                       "integer": (int,), "number": (int, float), "boolean": (bool,)}


def problems(value: Any, path: tuple = (), node: dict[str, Any] | None = None) -> list[tuple[tuple, str]]:
    """(path, message) for every place `value` breaks the schema: an unknown field, a wrong type, a
    missing required field, a value outside an enum. Objects with properties are closed, as the API
    server's strict field validation treats them. A path is a tuple of keys and indexes."""
    node = schema() if node is None else node
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [(path, f"must be an integer or a string, got {_kind(value)}")]
        return []
    kind = node.get("type")
    if kind and (not isinstance(value, _TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))):
        return [(path, f"must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, got {_kind(value)}")]
    out: list[tuple[tuple, str]] = []
    if "enum" in node and value not in node["enum"]:
        out.append((path, f"must be one of {node['enum']}"))
    if isinstance(value, dict):
        props = node.get("properties")
        for key, item in value.items():
            if props is not None and key in props:
                out += problems(item, (*path, key), props[key])
            elif props is not None:
                out.append(((*path, key), "unknown field"))
            elif "additionalProperties" in node:
                out += problems(item, (*path, key), node["additionalProperties"])
        out += [((*path, key), "required field is missing") for key in node.get("required", ()) if key not in value]
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            out += problems(item, (*path, i), node["items"])
    return out


def format_path(path: tuple) -> str:
    """spec.tolerations[0].effect, as the job's other problems name their fields."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


if __name__ == "__main__":
    SCHEMA_FILE.write_text(json.dumps(generate(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA_FILE} ({SCHEMA_FILE.stat().st_size} bytes)", file=sys.stderr)

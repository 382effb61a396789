"""Generate the RLTrainingJob CustomResourceDefinition from the pydantic model.

`kuberl crd` prints it; `crds/rltrainingjob.yaml` and the chart's copy are this output, and a test
fails when either differs.
"""

from __future__ import annotations

from typing import Any

import yaml

from kuberl.api import job as m
from kuberl.api.rules import schema_entries

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workers",
     "description": "Rollout workers ready/desired."},
    {"name": "Episodes", "type": "integer", "jsonPath": ".status.progress.episodes",
     "description": "Training episodes finished."},
    {"name": "Episodes/s", "type": "number", "jsonPath": ".status.progress.episodesPerSecond",
     "description": "Recent episode rate."},
    {"name": "Return", "type": "number", "jsonPath": ".status.progress.meanReturn",
     "description": "Mean return over the stopping window."},
    {"name": "Algorithm", "type": "string", "jsonPath": ".spec.algorithm.name", "priority": 1,
     "description": "Algorithm."},
    {"name": "Env", "type": "string", "jsonPath": ".spec.environment.id", "priority": 1, "description": "Environment."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn pydantic's JSON schema into a Kubernetes structural schema (no $ref, anyOf null, titles)."""
    if schema.get("x-kubernetes-int-or-string"):
        return dict(schema)  # already structural (a pod template's IntOrString or Quantity)
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        merged = {**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs)
    out: dict[str, Any] = {}
    any_of = schema.get("anyOf")
    if any_of:
        non_null = [s for s in any_of if s.get("type") != "null"]
        nullable = len(non_null) != len(any_of)
        if len(non_null) == 1:
            inner = _structural(non_null[0], defs)
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            out = {**inner, **_structural(rest, defs)} if rest else inner
            if nullable:
                out["nullable"] = True
            return out
        raise ValueError(f"cannot express a union of {len(non_null)} types structurally: {schema}")
    for key, value in schema.items():
        if key in ("title", "$defs", "additionalProperties") and key != "additionalProperties":
            continue
        if key == "properties":
            out["properties"] = {k: _structural(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties":
            if value is False:
                continue  # structural schemas prune unknown fields already
            if value is True or value == {}:
                continue
            out["additionalProperties"] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("default",) and value is None:
            continue
        elif key == "format" and value == "date-time":
            out["format"] = "date-time"
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        else:
            out[key] = value
    if schema.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def open_api_schema() -> dict[str, Any]:
    spec_schema = m.RLTrainingJobSpec.model_json_schema(by_alias=True, mode="validation")
    status_schema = m.RLTrainingJobStatus.model_json_schema(by_alias=True, mode="serialization")
    spec = _structural(spec_schema, spec_schema.get("$defs", {}))
    status = _structural(status_schema, status_schema.get("$defs", {}))
    spec["description"] = "What to train and how: one file for local runs and the cluster."
    status["description"] = "Observed state, written by the operator."
    return {
        "type": "object",
        "required": ["spec"],
        # Rules at the root may read metadata.name: the job's own name rule lives here.
        "x-kubernetes-validations": schema_entries(m.RLTrainingJob.RULES),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{m.PLURAL}.{m.GROUP}",
            "labels": {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/part-of": "kuberl"},
        },
        "spec": {
            "group": m.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": m.KIND,
                "listKind": f"{m.KIND}List",
                "plural": m.PLURAL,
                "singular": m.SINGULAR,
                "shortNames": list(m.SHORT_NAMES),
                "categories": ["kuberl", "all"],
            },
            "versions": [
                {
                    "name": m.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `kuberl crd` from kuberl.api.job. Do not edit by hand.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=110)


class _NoAliases(yaml.SafeDumper):
    """Rules shared by several fields are written out at each one (kubectl and readers need no anchors)."""

    def ignore_aliases(self, data: object) -> bool:
        return True

"""Generate the RLTrainingJob and RLSweep CustomResourceDefinitions from the pydantic models.

`kuberl crd` prints them; `crds/rltrainingjob.yaml`, `crds/rlsweep.yaml` and the chart's copies are this
output, and a test fails when one differs.
"""

from __future__ import annotations

from typing import Any

import yaml

from kuberl.api import job as m
from kuberl.api import sweep as sw
from kuberl.api.rules import Rule, schema_entries

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
    {"name": "Policy-Returns", "type": "string", "jsonPath": ".status.progress.returnsByPolicy", "priority": 1,
     "description": "Each policy group's mean return."},
    {"name": "Algorithm", "type": "string", "jsonPath": ".spec.algorithm.name", "priority": 1,
     "description": "Algorithm."},
    {"name": "Env", "type": "string", "jsonPath": ".spec.environment.id", "priority": 1, "description": "Environment."},
    {"name": "First-Step", "type": "number", "jsonPath": ".status.timeToFirstStepSeconds", "priority": 1,
     "description": "Seconds from kubectl apply to the learner's first env steps."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn pydantic's JSON schema into a Kubernetes structural schema (no $ref, anyOf null, titles)."""
    if schema.get("x-kubernetes-int-or-string"):
        return dict(schema)  # already structural (a pod template's IntOrString or Quantity)
    if schema.get("x-kuberl-any-value"):
        # Any JSON value (a sweep's values: numbers, bools or names): a node that keeps unknown fields may
        # leave out its type, and only such a node may.
        return {"x-kubernetes-preserve-unknown-fields": True}
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
    return _crd(m.KIND, m.PLURAL, m.SINGULAR, m.SHORT_NAMES, PRINTER_COLUMNS, open_api_schema())


SWEEP_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Running, Succeeded or Failed."},
    {"name": "Trials", "type": "string", "jsonPath": ".status.progress", "description": "Trials finished/budget."},
    {"name": "Running", "type": "integer", "jsonPath": ".status.trialsByState.running",
     "description": "Trials running."},
    {"name": "Stopped", "type": "integer", "jsonPath": ".status.trialsByState.stopped",
     "description": "Trials the pruner stopped."},
    {"name": "Best", "type": "string", "jsonPath": ".status.best.summary",
     "description": "The best configuration so far, its IQM and 95% interval."},
    {"name": "Sampler", "type": "string", "jsonPath": ".spec.search.sampler", "priority": 1,
     "description": "How configurations are chosen."},
    {"name": "Seeds", "type": "integer", "jsonPath": ".spec.seeds", "priority": 1,
     "description": "Trials per configuration."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

SWEEP_RULES = (Rule(f"self.metadata.name.size() <= {sw.SWEEP_NAME_MAX_LENGTH}",
                    f"metadata.name must be at most {sw.SWEEP_NAME_MAX_LENGTH} characters: each trial is a job "
                    "named <sweep>-t<number>",
                    lambda s: len(s.metadata.name) <= sw.SWEEP_NAME_MAX_LENGTH),)


def sweep_open_api_schema() -> dict[str, Any]:
    spec_schema = sw.RLSweepSpec.model_json_schema(by_alias=True, mode="validation")
    spec = _structural(spec_schema, spec_schema.get("$defs", {}))
    spec["description"] = "A job template, the parameters to vary, seeds per configuration, search and budget."
    status_schema = sw.RLSweepStatus.model_json_schema(by_alias=True, mode="serialization")
    status = _structural(status_schema, status_schema.get("$defs", {}))
    status["description"] = "Observed state, written by the operator."
    return {
        "type": "object",
        "required": ["spec"],
        "x-kubernetes-validations": schema_entries(SWEEP_RULES),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def sweep_crd() -> dict[str, Any]:
    return _crd(sw.KIND, sw.PLURAL, sw.SINGULAR, sw.SHORT_NAMES, SWEEP_PRINTER_COLUMNS, sweep_open_api_schema())


def _crd(kind: str, plural: str, singular: str, short_names: list[str], columns: list[Any],
         schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{m.GROUP}",
            "labels": {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/part-of": "kuberl"},
        },
        "spec": {
            "group": m.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["kuberl", "all"],
            },
            "versions": [
                {
                    "name": m.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `kuberl crd` from kuberl.api.job. Do not edit by hand.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=110)


def sweep_crd_yaml() -> str:
    header = "# Generated by `kuberl crd --kind RLSweep` from kuberl.api.sweep. Do not edit by hand.\n"
    return header + yaml.dump(sweep_crd(), Dumper=_NoAliases, sort_keys=False, width=110)


class _NoAliases(yaml.SafeDumper):
    """Rules shared by several fields are written out at each one (kubectl and readers need no anchors)."""

    def ignore_aliases(self, data: object) -> bool:
        return True

"""Cross-field rules, each declared once: the CRD's CEL rule, the model's check and the message.

A `Rule` is written next to the fields it relates, in the model class's `RULES`. The class's JSON schema
carries it as an `x-kubernetes-validations` entry (so a real API server refuses a bad job at `kubectl
apply`), and the model runs its `holds` predicate after the fields are parsed (so `kuberl validate`, the
operator and the learner refuse the same job), both with the one message (the model's adds the values).
tests/unit/test_cel_rules.py evaluates every CEL rule of the CRD with cel-python and holds the two to the same
answer.

CEL here is base CEL with regexes: the chart supports Kubernetes 1.27, whose CRD rules lack the quantity
library and `fieldPath`, so each message names its fields itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import AfterValidator, Field


@dataclass(frozen=True)
class Rule:
    #: CEL over the object as the API server holds it (`self`; optional fields tested with has()).
    cel: str
    #: What is wrong and what is allowed: the API server's refusal and the model's, word for word.
    message: str
    #: The same predicate over the parsed model (defaults filled in): True when the object is valid.
    holds: Callable[[Any], bool]
    #: The values that broke it, for the model's message (CEL on Kubernetes 1.27 cannot name them).
    detail: Callable[[Any], str] | None = None

    def refusal(self, model: Any) -> str:
        return f"{self.detail(model)}: {self.message}" if self.detail is not None else self.message


def schema_entries(rules: Iterable[Rule]) -> list[dict[str, str]]:
    """The `x-kubernetes-validations` entries of `rules`."""
    return [{"rule": rule.cel, "message": rule.message} for rule in rules]


def broken(model: Any, rules: Iterable[Rule]) -> list[str]:
    """The refusals of the rules `model` breaks: each rule's message, with the values when it names them."""
    return [rule.refusal(model) for rule in rules if not rule.holds(model)]


def on_field(*rules: Rule) -> tuple[Any, Any]:
    """Annotated metadata for a rule over one field's value (`self` is the value in CEL): the model refuses
    it at that field's path, and the field's schema carries the CEL."""
    def check(value: Any) -> Any:
        problems = broken(value, rules)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    extra: dict[str, Any] = {"x-kubernetes-validations": schema_entries(rules)}
    return AfterValidator(check), Field(json_schema_extra=extra)

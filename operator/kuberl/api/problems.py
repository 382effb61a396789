"""A problem with a job (field path, message, the value given) and the error that carries all of them."""

from __future__ import annotations

import dataclasses
from typing import Any

#: The exit status of `kuberl validate`, `kuberl train` and the learner for a job that cannot run. In a
#: pod, the learner also leaves its problems as the termination message; the operator reads the two
#: together as the job's `InvalidSpec`.
INVALID_SPEC_EXIT_CODE = 2
REPORT_HEADER = "is not a valid RLTrainingJob"


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str
    value: Any = None
    line: int | None = None
    has_value: bool = True

    def __str__(self) -> str:
        where = f"{self.path}" + (f" (line {self.line})" if self.line else "")
        given = f" [given: {_shown(self.value)}]" if self.has_value else ""
        return f"{where}: {self.message}{given}"


#: A quoted value is cut after this many characters: a 1 MiB string or a whole kwargs mapping would drown
#: the message, and the operator puts it in the job's status.
SHOWN_MAX = 300


def _shown(value: Any) -> str:
    try:
        text = repr(_sorted(value))
    except ValueError:  # an int of more digits than Python prints
        text = "an integer too long to print"
    return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}... ({len(text)} characters)"


def _sorted(value: Any) -> Any:
    """Mappings with sorted keys: a job read from YAML and the same job from the API (JSON, keys sorted by
    the operator) print the same text."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


class InvalidJob(ValueError):
    """A job file that cannot run; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str = "job"):
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems))

    def report(self) -> str:
        """What `kuberl validate` prints, and a learner pod leaves as its termination message."""
        return "\n".join([f"error: {self.source} {REPORT_HEADER} ({len(self.problems)} problem(s)):",
                          *(f"  - {problem}" for problem in self.problems)])


def is_report(text: str) -> bool:
    """Whether a container's termination message is an `InvalidJob.report()`."""
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith("error: ") and REPORT_HEADER in first

"""Read an RLTrainingJob from YAML and report every problem with its field path, value and what is allowed.

Used by `kuberl validate`, `kuberl train`, the learner pod and the operator, so a job is judged the
same way everywhere.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kuberl.api.job import API_VERSION, KIND, RLTrainingJob


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str
    value: Any = None
    line: int | None = None
    has_value: bool = True

    def __str__(self) -> str:
        where = f"{self.path}" + (f" (line {self.line})" if self.line else "")
        given = f" [given: {_sorted(self.value)!r}]" if self.has_value else ""
        return f"{where}: {self.message}{given}"


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


def _line_index(text: str) -> dict[tuple, int]:
    """Map field paths (tuples of keys/indices) to 1-based line numbers of their values."""
    index: dict[tuple, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return index

    def walk(node: yaml.Node, path: tuple) -> None:
        index[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, path + (key.value,))
                index.setdefault(path + (key.value,), key.start_mark.line + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                walk(value, path + (i,))

    if root is not None:
        walk(root, ())
    return index


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


def _lookup(data: Any, loc: tuple) -> tuple[bool, Any]:
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        else:
            return False, None
    return True, cur


def problems_from_validation_error(err: ValidationError, data: Any, lines: dict[tuple, int]) -> list[Problem]:
    problems = []
    for e in err.errors(include_url=False):
        # pydantic puts union/enum branch names into loc; keep only real keys for the path.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        bad_key = bool(loc) and loc[-1] == "[key]"  # a mapping key (resource name, label key) is wrong
        if bad_key:
            loc = loc[:-1]
        if bad_key and e["type"] == "string_type":
            msg = "keys must be strings (quote the key)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `kubectl explain rltj.spec` lists the fields)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        found, value = (True, loc[-1]) if bad_key else _lookup(data, loc)
        loc = loc[:-1] + (str(loc[-1]),) if bad_key else loc
        line = None
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in lines:
                line = lines[loc[:cut]]
                break
        # A rule over the whole spec names the values it compared; the spec itself is too long to quote.
        quoted = found and e["type"] != "missing" and loc != ("spec",)
        problems.append(
            Problem(path=_format_loc(loc), message=msg, value=value, line=line, has_value=quoted)
        )
    return problems


def parse_job(data: Any, *, text: str | None = None, source: str = "job", semantic: bool = True,
              strict_imports: bool = True) -> RLTrainingJob:
    """Validate a job dict: schema first, then semantics (env exists, algorithm fits its spaces)."""
    lines = _line_index(text) if text else {}
    if not isinstance(data, dict):
        raise InvalidJob([Problem("<document>", "a job file must be a YAML mapping (an RLTrainingJob manifest)",
                                  value=type(data).__name__)], source)
    problems: list[Problem] = []
    if data.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION}", data.get("apiVersion"),
                                lines.get(("apiVersion",))))
    if data.get("kind") != KIND:
        problems.append(Problem("kind", f"must be {KIND}", data.get("kind"), lines.get(("kind",))))
    try:
        job = RLTrainingJob.model_validate(data)
    except ValidationError as err:
        problems += [p for p in problems_from_validation_error(err, data, lines)
                     if p.path not in ("apiVersion", "kind")]
        raise InvalidJob(problems, source) from None
    if problems:
        raise InvalidJob(problems, source)
    if semantic:
        from kuberl.api.semantics import check

        problems = check(job.spec, strict_imports=strict_imports)
        if problems:
            problems = [dataclasses.replace(p, line=p.line or lines.get(_path_tuple(p.path))) for p in problems]
            raise InvalidJob(problems, source)
    return job


def _path_tuple(path: str) -> tuple:
    out: list[Any] = []
    for part in path.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]"):
            out.append(int(part[1:-1]))
        elif part:
            out.append(part)
    return tuple(out)


def load_job_text(text: str, source: str = "job", **kwargs: Any) -> RLTrainingJob:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        line = mark.line + 1 if mark else None
        raise InvalidJob([Problem("<yaml>", f"YAML syntax error: {err.problem or err}"
                                  + (f" (line {line}, column {mark.column + 1})" if mark else ""),
                                  line=line, has_value=False)], source) from None
    except yaml.YAMLError as err:
        raise InvalidJob([Problem("<yaml>", f"YAML error: {err}", has_value=False)], source) from None
    if len(docs) != 1:
        raise InvalidJob([Problem("<document>", f"expected exactly one YAML document, found {len(docs)}",
                                  has_value=False)], source)
    return parse_job(docs[0], text=text, source=source, **kwargs)


def load_job_file(path: str | Path, **kwargs: Any) -> RLTrainingJob:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise InvalidJob([Problem("<file>", f"cannot read {p}: {err.strerror}", has_value=False)], str(p)) from None
    return load_job_text(text, source=str(p), **kwargs)

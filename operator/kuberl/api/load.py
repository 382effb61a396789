"""Read an RLTrainingJob from YAML and report every problem with its field path, value and what is allowed.

Used by `kuberl validate`, `kuberl train`, the learner pod and the operator, so a job is judged the
same way everywhere.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kuberl.api.job import API_VERSION, KIND, RLTrainingJob, RLTrainingJobSpec
from kuberl.api.pod_template import TemplateProblems
from kuberl.api.problems import InvalidJob, Problem
from kuberl.api.tenancy import Tenancy
from kuberl.api.tenancy import problems as tenancy_problems

__all__ = ["InvalidJob", "Override", "Problem", "check_limits", "load_job_bytes", "load_job_file", "load_job_text",
           "parse_job", "parse_with_overrides", "read_job_json"]

#: A check that needs more than the schema: the environment exists and the algorithm can act in it.
#: The trainer passes one that builds the environment; the operator one that never runs spec-named code.
SpecCheck = Callable[[RLTrainingJobSpec], list[Problem]]


# ---- limits: how big a job may be, whatever it comes from ------------------------------------------------
# A real job is a few KiB. These bound the time and memory a mistaken or hostile job costs the CLI and the
# operator: a YAML "alias bomb" (nine levels of nine aliases) is 1 KiB of text that expands to 387 million
# values, and every walk over it (the JSON checks, pydantic, the line index) would expand it again.

#: A job's text (file, stdin, a learner's $KUBERL_JOB_SPEC_FILE); etcd keeps an object to about 1.5 MiB.
MAX_JOB_BYTES = 1 << 20
#: Mappings, lists, keys and scalars, once YAML aliases are expanded (each use counts what it repeats).
MAX_NODES = 100_000
#: Characters of keys and scalars once aliases are expanded: what a 1 MiB file could hold at most.
MAX_TEXT = MAX_JOB_BYTES
#: Mappings and lists inside each other, the document's own mapping included (environment.kwargs is the
#: fourth level); PyYAML builds a document recursively and would crash in a few hundred.
MAX_DEPTH = 32
#: The API server stores integers as int64.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Python refuses to turn longer decimal strings into ints (sys.get_int_max_str_digits()).
_INT_DIGITS_READABLE = 4300
#: The YAML loader for every job: libyaml, when PyYAML has it, parses 15-30 times faster than PyYAML's own
#: (a 1 MiB file in about a second instead of half a minute); both accept the same YAML 1.1.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_RESOLVER = yaml.resolver.Resolver()


def _too_big(nodes: int, text: int, depth: int, how: str = "") -> str | None:
    """The first limit a document passes with this many nodes, characters and levels; `how` says why."""
    if depth > MAX_DEPTH:
        return f"mappings and lists are nested {depth} levels deep here{how}; a job may nest at most {MAX_DEPTH}"
    if nodes > MAX_NODES:
        return (f"the job holds more than {MAX_NODES} values{how} (mappings, lists, keys and scalars, an alias "
                f"counting as what it repeats); a job may hold at most {MAX_NODES}")
    if text > MAX_TEXT:
        return (f"the job holds more than {MAX_TEXT} characters of keys and values{how}; a job may hold at most "
                f"{MAX_TEXT} (1 MiB)")
    return None


def _int64_message(given: str = "") -> str:
    return (f"integers must be between {INT64_MIN} and {INT64_MAX} (the API server stores them as 64-bit "
            f"numbers){given and f' [given: {given}]'}")


def _size_problem() -> Problem:
    return Problem("<document>", f"a job may be at most {MAX_JOB_BYTES} bytes (1 MiB) of text; this one is "
                   "larger", has_value=False)


@dataclasses.dataclass(slots=True)
class _Open:
    """A mapping or list the YAML scan is inside of."""

    anchor: str | None
    depth: int
    nodes_before: int
    text_before: int
    deepest: int
    is_mapping: bool
    expect_key: bool = True
    key: Any = None
    index: int = 0


#: Plain scalars kubectl (sigs.k8s.io/yaml, YAML 1.1) reads as booleans and PyYAML as strings: a kwarg `N: 3`
#: would reach a cluster's job as the key false.
YAML11_BOOLEANS = {"y": True, "Y": True, "n": False, "N": False}


class _QuotingDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting the strings kubectl would read as booleans (YAML11_BOOLEANS)."""


def _quoted_if_kubectl_reads_a_boolean(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if value in YAML11_BOOLEANS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_QuotingDumper.add_representer(str, _quoted_if_kubectl_reads_a_boolean)


def dump_yaml(data: Any) -> str:
    """`data` as YAML that this loader and kubectl read alike (a key N comes out "N")."""
    return yaml.dump(data, Dumper=_QuotingDumper, sort_keys=False)


class _YamlScan:
    """Measures YAML from the parser's events, before any document is built: an alias counts as the node
    it repeats (anchors remember their expanded size), so a bomb is refused after a pass over its few
    lines, and nesting is measured before PyYAML's recursive composer meets it."""

    def __init__(self, source: str):
        self.source = source
        self.nodes = self.text = 0
        self.anchors: dict[str, tuple[int, int, int]] = {}  # anchor -> nodes, characters, levels it adds
        self.open: list[_Open] = []

    def run(self, text: str) -> None:
        try:
            for event in yaml.parse(text, Loader=_LOADER):
                kind = type(event)
                if kind is yaml.ScalarEvent:
                    self._scalar(event)
                elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                    self._start(event, kind is yaml.MappingStartEvent)
                elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                    self._close()
                elif kind is yaml.AliasEvent:
                    self._alias(event)
                elif kind is yaml.DocumentStartEvent:
                    self.anchors.clear()  # anchors belong to their document
        except yaml.YAMLError as err:
            # libyaml's scanner reads a run of flow brackets ahead of the parser and stops at its own
            # nesting limit (1000 levels) before the first of them becomes an event: that is the limit
            # here too, told as the job's. Any other error the loader reports with its line; everything
            # before it was within the limits.
            mark = getattr(err, "problem_mark", None)
            if "maximum nesting depth" in str(err) and mark is not None:
                self._refuse_at(mark.line, f"mappings and lists are nested deeper than the YAML parser reads "
                                f"here (1000 levels); a job may nest at most {MAX_DEPTH}")

    def _refuse(self, event: yaml.Event, message: str) -> None:
        self._refuse_at(event.start_mark.line, message)

    def _refuse_at(self, line: int, message: str) -> None:
        path = _format_loc(tuple(entry.key if entry.is_mapping else entry.index for entry in self.open))
        raise InvalidJob([Problem(path, message, line=line + 1, has_value=False)], self.source)

    def _count(self, event: yaml.Event, nodes: int, text: int, depth: int, how: str = "") -> None:
        self.nodes += nodes
        self.text += text
        too_big = _too_big(self.nodes, self.text, depth, how)
        if too_big is not None:
            self._refuse(event, too_big)
        if self.open and depth > self.open[-1].deepest:
            self.open[-1].deepest = depth

    def _item_done(self) -> None:
        if self.open:
            parent = self.open[-1]
            if parent.is_mapping:
                parent.expect_key = not parent.expect_key
            else:
                parent.index += 1

    def _key(self, key: Any) -> None:
        if self.open and self.open[-1].is_mapping and self.open[-1].expect_key:
            self.open[-1].key = key

    def _scalar(self, event: yaml.ScalarEvent) -> None:
        value = event.value
        self._key(value)
        self._count(event, 1, len(value), len(self.open))
        if value in YAML11_BOOLEANS and not event.style:  # plain: libyaml says "", PyYAML None
            self._refuse(event, f"a plain {value} is the string {value!r} here but a boolean "
                         f"({str(YAML11_BOOLEANS[value]).lower()}) to kubectl, whose YAML is 1.1: quote it "
                         f"(\"{value}\") so the job is the same on the cluster")
        if len(value) > _INT_DIGITS_READABLE and \
                _RESOLVER.resolve(yaml.ScalarNode, value, event.implicit) == "tag:yaml.org,2002:int":
            # Python refuses to read it (ValueError from the loader); a shorter one past int64 is refused
            # by `check_limits` once loaded.
            self._refuse(event, _int64_message(f"{value[:20]}... ({len(value)} digits)"))
        if event.anchor:
            self.anchors[event.anchor] = (1, len(value), 0)
        self._item_done()

    def _alias(self, event: yaml.AliasEvent) -> None:
        self._key("?")
        if any(entry.anchor == event.anchor for entry in self.open):
            self._refuse(event, f"the alias *{event.anchor} repeats a mapping or list that contains it: a job "
                         "cannot be a recursive document")
        if event.anchor in self.anchors:  # (an undefined one: the loader reports it with its line)
            nodes, text, levels = self.anchors[event.anchor]
            self._count(event, nodes, text, len(self.open) + levels, f" once the alias *{event.anchor} is expanded")
        self._item_done()

    def _start(self, event: yaml.CollectionStartEvent, is_mapping: bool) -> None:
        self._key("?")
        depth = len(self.open) + 1
        self._count(event, 1, 0, depth)
        self.open.append(_Open(event.anchor, depth, self.nodes - 1, self.text, depth, is_mapping))

    def _close(self) -> None:
        entry = self.open.pop()
        if entry.anchor:
            self.anchors[entry.anchor] = (self.nodes - entry.nodes_before, self.text - entry.text_before,
                                          entry.deepest - entry.depth + 1)
        if self.open and entry.deepest > self.open[-1].deepest:
            self.open[-1].deepest = entry.deepest
        self._item_done()


def check_limits(data: Any, source: str = "job", text: str | None = None) -> None:
    """Refuse a job past the limits above before anything walks it whole: it may come from the API or
    $KUBERL_JOB_SPEC_FILE as well as from YAML. A mapping or list reached twice counts twice and the walk stops
    at the first limit, so a bomb-like or cyclic dict costs at most about MAX_NODES steps."""
    nodes, chars, out_of_range = 1, 0, []  # (the root counts as a node)
    todo: list[tuple[tuple, Any, int]] = [((), data, 1)]

    def check(loc: tuple, depth: int) -> None:
        too_big = _too_big(nodes, chars, depth)
        if too_big is not None:
            raise InvalidJob([Problem(_format_loc(loc), too_big, has_value=False)], source)

    while todo:
        loc, value, depth = todo.pop()
        if isinstance(value, dict):
            nodes += 2 * len(value)  # its keys and values
            check(loc, depth)  # before touching the items of a huge one
            chars += sum(len(key) for key in value if isinstance(key, str))
            todo.extend((loc + (key,), item, depth + 1) for key, item in value.items())
        elif isinstance(value, list):
            nodes += len(value)
            check(loc, depth)
            todo.extend((loc + (i,), item, depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            chars += len(value)
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            out_of_range.append((loc, value))
        check(loc, 0)
    if out_of_range:
        lines = _line_index(text) if text else {}
        raise InvalidJob([Problem(_format_loc(loc), _int64_message(), value, lines.get(loc))
                          for loc, value in sorted(out_of_range, key=lambda found: _format_loc(found[0]))], source)


class _Lines(Mapping):
    """1-based line numbers of the values at field paths (tuples of keys and indices), worked out when
    first asked for: a valid job never needs them, and a big one takes seconds to index."""

    def __init__(self, text: str):
        self._text = text
        self._index: dict[tuple, int] | None = None

    def _lines(self) -> dict[tuple, int]:
        if self._index is None:
            self._index = _index_lines(self._text)
        return self._index

    def __getitem__(self, path: tuple) -> int:
        return self._lines()[path]

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._lines())

    def __len__(self) -> int:
        return len(self._lines())


def _line_index(text: str) -> Mapping[tuple, int]:
    return _Lines(text)


def _index_lines(text: str) -> dict[tuple, int]:
    index: dict[tuple, int] = {}
    try:
        root = yaml.compose(text, Loader=_LOADER)
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


def problems_from_validation_error(err: ValidationError, data: Any, lines: Mapping[tuple, int]) -> list[Problem]:
    problems = []
    for e in err.errors(include_url=False):
        # pydantic puts union/enum branch names into loc; keep only real keys for the path.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, TemplateProblems):  # one problem per field of a pod template, at its own path
            problems += [_problem_at(loc + inner, message, data, lines) for inner, message in error.problems]
            continue
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


def _problem_at(loc: tuple, message: str, data: Any, lines: Mapping[tuple, int]) -> Problem:
    found, value = _lookup(data, loc)
    line = next((lines[loc[:cut]] for cut in range(len(loc), -1, -1) if loc[:cut] in lines), None)
    quoted = found and not message.startswith("required")
    return Problem(path=_format_loc(loc), message=message, value=value, line=line, has_value=quoted)


def parse_job(data: Any, *, text: str | None = None, source: str = "job",
              check: SpecCheck | None = None, tenancy: Tenancy | None = None) -> RLTrainingJob:
    """Validate a job dict: the schema first, then what its templates may do in its namespace (`tenancy`,
    if given: `kuberl validate` and the operator give it), then `check` (the environment and its spaces).

    Any exception `check` raises is a problem of the job, never a crash: a check runs on data a
    tenant wrote."""
    check_limits(data, source, text)
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
    if tenancy is not None:
        problems += tenancy_problems(job, tenancy)
    if problems:
        problems = [dataclasses.replace(p, line=p.line or _nearest_line(p.path, lines)) for p in problems]
        raise InvalidJob(problems, source)
    if check is not None:
        try:
            problems = check(job.spec)
        except Exception as err:  # noqa: BLE001 - whatever a check meets in a spec is the spec's problem
            problems = [Problem("spec.environment", f"cannot check the environment: {type(err).__name__}: {err}",
                                has_value=False)]
        if problems:
            problems = [dataclasses.replace(p, line=p.line or lines.get(_path_tuple(p.path))) for p in problems]
            raise InvalidJob(problems, source)
    return job


def _nearest_line(path: str, lines: Mapping[tuple, int]) -> int | None:
    loc = _path_tuple(path)
    return next((lines[loc[:cut]] for cut in range(len(loc), -1, -1) if loc[:cut] in lines), None)


def _path_tuple(path: str) -> tuple:
    out: list[Any] = []
    for part in path.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]"):
            out.append(int(part[1:-1]))
        elif part:
            out.append(part)
    return tuple(out)


# ---- reading a job: a file, bytes, YAML or JSON text, with command-line overrides ----------------------


@dataclasses.dataclass(frozen=True)
class Override:
    """A command-line flag that sets one field: the job is validated with it in place, as if the file said
    it, and a problem with that field names the flag."""

    flag: str
    path: tuple[str, ...]
    value: Any


def _set(data: Any, path: tuple[str, ...], value: Any) -> Any:
    """A copy of `data` with `value` at `path` (mappings copied along the path, the caller's left alone)."""
    if not path:
        return value
    if not isinstance(data, dict):
        return data  # `spec: 5` or `stopping: null`: the schema refuses what is there
    return {**data, path[0]: _set(data.get(path[0], {}), path[1:], value)}


def _check_size(text: str, source: str) -> None:
    if len(text) > MAX_JOB_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_JOB_BYTES:
        raise InvalidJob([_size_problem()], source)


def parse_with_overrides(data: Any, overrides: tuple[Override, ...], *, source: str = "job",
                         text: str | None = None, **kwargs: Any) -> RLTrainingJob:
    """`parse_job` of `data` with the command line's overrides in place."""
    for override in overrides:
        data = _set(data, override.path, override.value)
    try:
        return parse_job(data, text=text, source=source, **kwargs)
    except InvalidJob as err:
        flags = {_format_loc(o.path): o.flag for o in overrides}
        if not flags.keys() & {p.path for p in err.problems}:
            raise
        # The file's line holds the value the flag replaced: name the flag instead.
        raise InvalidJob([dataclasses.replace(p, path=f"{flags[p.path]} ({p.path})", line=None)
                          if p.path in flags else p for p in err.problems], source) from None


def load_job_text(text: str, source: str = "job", overrides: tuple[Override, ...] = (),
                  **kwargs: Any) -> RLTrainingJob:
    _check_size(text, source)
    _YamlScan(source).run(text)
    try:
        docs = [d for d in yaml.load_all(text, Loader=_LOADER) if d is not None]
    except yaml.reader.ReaderError as err:  # a character YAML does not allow
        # Its first occurrence is the one refused (err.position counts bytes in libyaml, characters in PyYAML).
        code = err.character if isinstance(err.character, int) else ord(err.character)
        at = text.find(chr(code))
        line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
        binary = " (is this a binary file?)" if code == 0 else ""
        raise InvalidJob([Problem("<yaml>", f"{err.reason}: character {code:#06x} at column {column}{binary}",
                                  line=line, has_value=False)], source) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at_line = mark.line + 1 if mark else None
        raise InvalidJob([Problem("<yaml>", f"YAML syntax error: {err.problem or err}"
                                  + (f" (line {at_line}, column {mark.column + 1})" if mark else ""),
                                  line=at_line, has_value=False)], source) from None
    except yaml.YAMLError as err:
        raise InvalidJob([Problem("<yaml>", f"YAML error: {err}", has_value=False)], source) from None
    if len(docs) != 1:
        raise InvalidJob([Problem("<document>", f"expected exactly one YAML document, found {len(docs)}",
                                  has_value=False)], source)
    return parse_with_overrides(docs[0], overrides, source=source, text=text, **kwargs)


def load_job_bytes(data: bytes, source: str = "job", **kwargs: Any) -> RLTrainingJob:
    """A job file's bytes: at most MAX_JOB_BYTES of UTF-8 (kubectl's encoding too; a byte-order mark is
    allowed), then YAML."""
    if len(data) > MAX_JOB_BYTES:
        raise InvalidJob([_size_problem()], source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            hint = "saved as UTF-16? save it as UTF-8"
        elif b"\0" in data:
            hint = "is this a binary file?"
        else:
            hint = "saved in another encoding? save it as UTF-8"
        raise InvalidJob([Problem("<document>", f"not UTF-8 text: byte {data[err.start]:#04x} at offset {err.start} "
                                  f"cannot be decoded; a job is YAML text in UTF-8 ({hint})", line=line,
                                  has_value=False)], source) from None
    return load_job_text(text, source=source, **kwargs)


def load_job_file(path: str | Path, **kwargs: Any) -> RLTrainingJob:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_JOB_BYTES + 1)  # enough to refuse a 100 MB file (or /dev/zero) unread
    except OSError as err:
        raise InvalidJob([Problem("<file>", f"cannot read {p}: {err.strerror}", has_value=False)], str(p)) from None
    return load_job_bytes(data, source=str(p), **kwargs)


def read_job_json(text: str, source: str = "job") -> Any:
    """A job's JSON text (a learner pod's $KUBERL_JOB_SPEC_FILE) as data, within the same limits as a file;
    `parse_with_overrides` or `parse_job` validates it."""
    _check_size(text, source)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidJob([Problem("<json>", f"JSON syntax error: {err.msg} (line {err.lineno}, column "
                                  f"{err.colno})", line=err.lineno, has_value=False)], source) from None
    except ValueError:  # an integer of more digits than Python reads
        raise InvalidJob([Problem("<json>", _int64_message(f"more than {_INT_DIGITS_READABLE} digits"),
                                  has_value=False)], source) from None
    except RecursionError:
        raise InvalidJob([Problem("<json>", f"mappings and lists are nested deeper than Python reads; a job "
                                  f"may nest at most {MAX_DEPTH}", has_value=False)], source) from None

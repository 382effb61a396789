"""Every figure the docs quote as a measurement is one that a results file under bench/results/ holds.

A figure is a number with a unit of time, size, rate or ratio (`4.7 s`, `0.15 ms`, `4.6x`, `51%`,
`11,729 episodes/s`, `71k env steps`, `138.6 MB`, both ends of `4.0-6.2 s`), and any decimal number in a
table of the Benchmarks page (efficiencies, returns, ratios). Each names where it comes from: the results
files (`bench/results/NAME.json`, or `results/NAME.json` as the Benchmarks page writes it) cited by its
sentence or table row, else by its paragraph (a table's rows: the paragraph that leads into it), else by its
section (the text under its heading). It must be a number one of those files holds (a JSON file's numbers
and the numbers in its strings, a text file's numbers), rounded as printed, in the printed unit or a
neighbour of it (a fraction printed as a percentage, seconds as minutes or milliseconds, bytes as MB); or a
ratio or percentage of two such figures quoted before it in the same passage. A figure that cites no
results file fails: a reader cannot tell it from a figure anyone could type.

Not figures: code (fenced blocks, `spans`), bounds and estimates written as such (`target 3x`, `<= 2 ms`,
`~2 min`, `at most 35 minutes`), and the few numbers in ALLOWED, each a setting, a limit or a fact of the
repository rather than a measurement. A figure with no results file behind it is removed from its page or
replaced by the one its results file holds; results files are never edited to fit a page.

The pages: README.md, bench/README.md and docs/*.md (docs/reference/ is generated from the job model).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]
#: The one page where bare decimal numbers in tables are figures too (ratios, efficiencies, returns).
BENCHMARKS = DOCS / "benchmarks.md"

#: Numbers that carry a unit but were not measured, by page and as printed: each says what it is instead.
ALLOWED: dict[tuple[str, str], str] = {
    ("docs/testing.md", "90 minutes"): "CI's own limit on `.ci/run`",
    ("docs/getting-started.md", "5 s"): "the timeout scripts/setup-venv probes PyTorch's index with",
    ("docs/job-file.md", "1 MiB"): "the loader's limit on a job's keys and strings",
    ("docs/install.md", "256 KiB"): "the limit of kubectl's last-applied annotation",
    ("docs/pod-templates.md", "256 KiB"): "the limit of kubectl's last-applied annotation",
    ("docs/security.md", "128 KiB"): "Linux's limit on one environment variable",
    ("docs/serving.md", "16 MiB"): "the largest request body `kuberl serve` reads",
    ("docs/sweeps.md", "30 s"): "the time limit of one pass of a sweep's loop (sweeps.PASS_TIMEOUT_S)",
    ("docs/observability.md", "0.1 s"): "the timer the event-loop lag metric sleeps on",
    ("docs/operator.md", "15 s"): "how long a raylet waits for its agents, fixed in Ray",
    ("docs/checkpoints.md", "30 s"): "Kubernetes' default terminationGracePeriodSeconds",
}

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
#: unit -> factors that turn a stored value into the printed unit: stored as printed, or in a neighbouring
#: unit (a fraction printed as a percentage, milliseconds or minutes printed as seconds, bytes as MB).
UNITS: dict[str, tuple[float, ...]] = {
    "x": (1,),
    "%": (1, 100),
    "µs": (1, 1e3, 1e6),
    "ms": (1, 1e3),
    "s": (1, 1e-3, 60),
    "seconds": (1, 1e-3, 60),
    "min": (1, 1 / 60),
    "minutes": (1, 1 / 60),
    "h": (1, 1 / 3600, 1 / 60),
    "hours": (1, 1 / 3600, 1 / 60),
    "KiB": (1, 2 ** -10),
    "KB": (1, 1e-3),
    "MiB": (1, 2 ** -20),
    "MB": (1, 1e-6, 2 ** -20, 1e3),
    "GiB": (1, 2 ** -30),
    "GB": (1, 1e-9, 2 ** -30, 1e-3),
    "env steps": (1,),
    "steps/s": (1,),
    "env steps/s": (1,),
    "episodes/s": (1,),
    "updates/s": (1,),
    "samples/s": (1,),
    "decisions/s": (1,),
}
#: `x` and `%` only attached (`4.6x`, `51%`): `2 x 512` is a shape, not a ratio.
_UNIT = "|".join(sorted((re.escape(unit) for unit in UNITS if unit not in ("x", "%")), key=len, reverse=True))
_VALUE = rf"(?P<neg>[-−])?(?P<num>{NUMBER})(?P<mult>[kM])?(?!\.?\d)"
FIGURE = re.compile(
    rf"(?<![\w.,/:=+-])(?:(?P<low>{NUMBER})(?P<low_mult>[kM])?\s?[-–]\s?)?{_VALUE}"
    rf"(?:(?P<attached>x|%)|\s?(?P<unit>{_UNIT}))(?![\w/])")
BARE = re.compile(r"(?<![\w.,/:=+*-])(?P<neg>[-−])?(?P<num>\d+\.\d+)(?![\w.%])")
#: Bounds and estimates (what a run is held to, or about how long something takes), not measurements: a
#: figure right after one of these, or right before `target`, `CI` or `interval` (a 95% CI).
BOUND_BEFORE = re.compile(r"(?:target(?: of| was| is)?|at most|up to|<=|>=|≤|≥|<|(?<![-=])>|~)\s*\**$",
                          re.IGNORECASE)
BOUND_AFTER = re.compile(r"^\**\s*(?:target|CI|confidence|bootstrap|interval)\b", re.IGNORECASE)
CITATION = re.compile(r"(?<![\w/])(?:bench/)?results/([\w.-]+\.(?:json|txt|md))\b")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*`\[])")


@dataclass(frozen=True)
class Figure:
    text: str
    value: float
    half_step: float  # half the last printed digit: what the rounding to print hides
    unit: str  # "" for a bare number in a benchmark table
    at: int  # where it starts in its passage
    low_end: bool = False  # the first number of a range


@dataclass(frozen=True)
class Passage:
    text: str
    lines: tuple[tuple[int, int], ...]  # (offset in text, line number on the page) where each line starts
    cited: frozenset[str]  # the results files its figures are looked up in
    by: str  # what cites them: "sentence", "table" (the row or its leading paragraph), "paragraph", "section"

    def line(self, at: int) -> int:
        return max((number for offset, number in self.lines if offset <= at), default=self.lines[0][1])


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def _blocks(text: str) -> list[tuple[str, str, tuple[tuple[int, int], ...]]]:
    """(kind, text, where each of its lines starts: (offset, line number)) of each paragraph, list item,
    table row and heading; code blocks and HTML comments left out. The lines of a block join with a space."""
    out: list[tuple[str, str, tuple[tuple[int, int], ...]]] = []
    current: list[tuple[str, int]] = []
    kind, in_fence = "paragraph", False

    def flush() -> None:
        if current:
            starts, offset = [], 0
            for line, number in current:
                starts.append((offset, number))
                offset += len(line) + 1
            out.append((kind, " ".join(line for line, _ in current), tuple(starts)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            in_fence = not in_fence
            continue
        if in_fence or stripped.startswith("<!--"):
            continue
        if not stripped or stripped.startswith(("#", "|")):
            flush()
            if stripped:
                out.append(("heading" if stripped.startswith("#") else "row", stripped, ((0, number),)))
            continue
        if re.match(r"(?:[-*]|\d+\.)\s", stripped):
            flush()
            kind = "item"
        elif not current:
            kind = "paragraph"
        current.append((stripped, number))
    flush()
    return out


def passages(text: str) -> list[Passage]:
    """A sentence of prose, a table row or a heading, each with the results files that cite its figures:
    its own citations, else its paragraph's (a row: its table's leading paragraph's), else its section's."""
    sections: list[list[tuple[str, str, tuple[tuple[int, int], ...], frozenset[str]]]] = [[]]
    lead = before = frozenset[str]()  # a table's leading paragraph's citations; the block just above's
    previous = "heading"
    for kind, block, starts in _blocks(text):
        cited = frozenset(CITATION.findall(block))
        if kind == "heading":
            sections.append([])
        if kind == "row" and previous != "row":
            lead = before
        sections[-1].append((kind, block, starts, cited | lead if kind == "row" else cited))
        before = cited if kind != "heading" else frozenset()
        previous = kind
    out: list[Passage] = []
    for section in sections:
        in_section = frozenset().union(*(cited for *_, cited in section))
        for kind, block, starts, cited in section:
            fallback = (in_section, "section")
            if kind in ("row", "heading"):
                own = (cited, "table" if kind == "row" else "sentence")
                out.append(Passage(block, starts, *(own if cited else fallback)))
                continue
            if cited:
                fallback = (cited, "paragraph")
            begin = 0
            for end in [m.start() for m in SENTENCE_END.finditer(block)] + [len(block)]:
                sentence = block[begin:end].strip()
                shift = begin + len(block[begin:end]) - len(block[begin:end].lstrip())
                lines = tuple((offset - shift, number) for offset, number in starts)
                own = frozenset(CITATION.findall(sentence))
                out.append(Passage(sentence, lines, *((own, "sentence") if own else fallback)))
                begin = end
    return out


def _number(digits: str, mult: str | None) -> tuple[float, float]:
    plain = digits.replace(",", "")
    decimals = len(plain.partition(".")[2])
    scale = {"k": 1e3, "M": 1e6}.get(mult or "", 1)
    return float(plain) * scale, 0.5 * 10 ** -decimals * scale


def _is_bound(prose: str, start: int, end: int) -> bool:
    return bool(BOUND_BEFORE.search(prose[max(0, start - 12):start]) or BOUND_AFTER.match(prose[end:]))


def figures(passage: str, bare: bool = False) -> list[Figure]:
    """The figures of a passage, outside code and link targets, bounds and estimates left out; `bare`:
    decimal numbers without a unit count too (a benchmark table's row)."""
    prose = re.sub(r"`[^`]*`|\]\([^)]*\)", _blank, passage)
    found: list[Figure] = []
    taken: list[tuple[int, int]] = []
    for match in FIGURE.finditer(prose):
        taken.append(match.span())
        if _is_bound(prose, match.start(), match.end()):
            continue
        unit = match["attached"] or match["unit"]
        value, half = _number(match["num"], match["mult"])
        found.append(Figure(match.group(0).strip(), -value if match["neg"] else value, half, unit, match.start()))
        if match["low"]:
            low, low_half = _number(match["low"], match["low_mult"] or match["mult"])
            found.append(Figure(match.group(0).strip(), low, low_half, unit, match.start(), low_end=True))
    if bare:
        for match in BARE.finditer(prose):
            if any(a <= match.start() < b for a, b in taken) or _is_bound(prose, match.start(), match.end()):
                continue
            value, half = _number(match["num"], None)
            found.append(Figure(match.group(0), -value if match["neg"] else value, half, "", match.start()))
    return sorted(found, key=lambda figure: figure.at)


def _numbers_in(data: object) -> list[float]:
    if isinstance(data, bool):
        return []
    if isinstance(data, (int, float)):
        return [float(data)]
    if isinstance(data, dict):
        return [n for value in data.values() for n in _numbers_in(value)]
    if isinstance(data, list):
        return [n for value in data for n in _numbers_in(value)]
    if isinstance(data, str):  # a number kept in text: "246 passed in 914.92s", "ray 2.60.0"
        return [float(n.replace(",", "")) for n in re.findall(NUMBER, data)]
    return []


def results_numbers(results: Path = RESULTS) -> dict[str, list[float]]:
    """Every number each results file holds, by file name."""
    out = {}
    for path in sorted(results.iterdir()):
        if path.suffix in (".json", ".txt", ".md"):
            text = path.read_text()
            out[path.name] = _numbers_in(json.loads(text) if path.suffix == ".json" else text)
    return out


def held(figure: Figure, values: list[float]) -> bool:
    tolerance = figure.half_step * (1 + 1e-9) + 1e-12
    return any(abs(value * factor - figure.value) <= tolerance
               for value in values for factor in UNITS.get(figure.unit, (1,)))


def derived(figure: Figure, quoted: list[Figure]) -> bool:
    """A ratio (`x`, or bare in a benchmark table) or a percentage of two held figures quoted before it in one
    unit: the nearest one over any earlier one or the other way round, as printed (`17,601 ... 14,826
    samples/s: 1.19x`)."""
    if figure.unit not in ("x", "%", ""):
        return False
    operands = [f for f in quoted if f.at < figure.at and f.unit not in ("x", "%", "") and not f.low_end]
    if not operands:
        return False
    last = max(operands, key=lambda f: f.at)
    for other in operands:
        if other is last or other.unit != last.unit or 0 in (other.value, last.value):
            continue
        for ratio in (last.value / other.value, other.value / last.value):
            candidates = [100 * ratio, 100 * (ratio - 1), 100 * (1 - ratio)] if figure.unit == "%" else [ratio]
            if any(abs(c - figure.value) <= figure.half_step * (1 + 1e-9) for c in candidates):
                return True
    return False


def unheld(page: Path, numbers: dict[str, list[float]], name: str | None = None) -> list[str]:
    """`page:line: 'figure' ...: passage` for each figure of the page that cites no results file, or is
    neither in the files it cites nor worked out from two figures that are."""
    name = name or page.relative_to(REPO).as_posix()
    out = []
    for passage in passages(page.read_text()):
        values = [n for file in sorted(passage.cited) for n in numbers.get(file, [])]
        found = figures(passage.text, bare=page.name == BENCHMARKS.name and passage.text.startswith("|"))
        backed = [figure for figure in found if held(figure, values)]
        for figure in found:
            if figure in backed or derived(figure, backed) or (name, figure.text) in ALLOWED:
                continue
            if passage.cited:
                why = f"not in {', '.join(sorted(passage.cited))}, which its {passage.by} cites"
            else:
                why = "cites no results file"
            out.append(f"{name}:{passage.line(figure.at)}: {figure.text!r} {why}: {passage.text[:140]}")
    return out


def test_every_figure_the_docs_quote_is_in_a_results_file():
    numbers = results_numbers()
    problems = [problem for page in PAGES for problem in unheld(page, numbers)]
    print("\n".join(problems))
    assert not problems, (f"{len(problems)} figure(s) with no results file behind them: cite the results file "
                          "the figure comes from and quote its value, or remove the figure:\n" + "\n".join(problems))


def test_every_allowed_number_is_still_on_its_page():
    """An entry whose page no longer prints it is an exception nobody needs: remove it."""
    stale = [f"{page}: {text!r}" for page, text in ALLOWED if text not in (REPO / page).read_text()]
    assert not stale, stale


def test_a_planted_figure_is_caught(tmp_path):
    """The checker reports a made-up figure, a figure that is in a file its sentence does not cite, a ratio
    of nothing quoted and a figure that cites no file, each with its line; it passes held figures, a derived
    ratio, bounds and code."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps({"s": [4.716, 9.43], "rate": "11729 episodes/s",
                                                "bytes": 138_600_000}))
    (results / "b.json").write_text(json.dumps({"fraction": 0.513, "steps": 70656}))
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n"
        "\n"
        "It trains in 4.7 s at 11,729 episodes/s (`results/a.json`), a 138.6 MB process.\n"
        "It took 8.3 s, target 3x, p99 <= 2 ms, ~2 min, `--budget 9.9 s`.\n"
        "From 9.4 s to 4.7 s: 2.0x, 2.5x.\n"
        "\n"
        "Cited elsewhere (`results/b.json`): 4.7 s. It saved 51% in 71k env steps.\n"
        "\n"
        "A paragraph that cites nothing, in a section that does: 9.4 s.\n"
        "\n"
        "## A section that cites nothing\n"
        "\n"
        "It took 12.5 s.\n"
        "\n"
        "```\n"
        "7.77 s\n"
        "```\n")
    assert [problem.split(": ")[:2] for problem in unheld(page, results_numbers(results), name="page.md")] == [
        ["page.md:4", "'8.3 s' not in a.json, which its paragraph cites"],
        ["page.md:5", "'2.5x' not in a.json, which its paragraph cites"],
        ["page.md:7", "'4.7 s' not in b.json, which its sentence cites"],
        ["page.md:13", "'12.5 s' cites no results file"]]


def test_the_figure_reader_reads_what_pages_print():
    row = ("| CartPole | `bench/bench_cartpole.py --seeds 0 1` | **4.7 s** (4.0-6.2 s), 71k env steps, 4.6x SB3, "
           "target 3x, p99 <= 2 ms, 51% saved, -175.8 s, v1.5.0, 0.95 |")
    assert [(f.value, f.unit) for f in figures(row, bare=True)] == [
        (4.7, "s"), (6.2, "s"), (4.0, "s"), (71000.0, "env steps"), (4.6, "x"), (51.0, "%"), (-175.8, "s"),
        (0.95, "")]
    page = "Run 1. See (`results/a.json`):\n\n| k | 4 s |\n\nNext 6 s.\n# B\n\nC."
    assert [(p.cited, p.by) for p in passages(page)] == [
        ({"a.json"}, "paragraph"), ({"a.json"}, "sentence"), ({"a.json"}, "table"), ({"a.json"}, "section"),
        (frozenset(), "section"), (frozenset(), "section")]
    values = [4.716, 0.513, 1208320.0, 0.0231, 1265.0]
    assert all(held(f, values)
               for f in figures("4.7 s, 51%, 1,208,320 env steps, 1.2M env steps, 23.1 ms, 21 min"))
    assert not any(held(f, values) for f in figures("4.8 s, 52%, 1,208,321 env steps, 4.71 s, 22 min"))

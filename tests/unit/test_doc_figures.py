"""Every measured figure a page quotes beside a results file is in that file.

A passage that cites a results file (`bench/results/NAME.json`, or `results/NAME.json` as the Benchmarks page
writes it; `.txt` and `.md` results count too) is held to it. A passage is a sentence of prose, or a table
row, which also takes the citations of the paragraph that leads into its table. Each figure in it, a number
with a unit (`4.7 s`, `0.15 ms`, `4.6x`, `51%`, `11,729 episodes/s`, `70,656 env steps`, `71k env steps`,
`138.6 MB`; both ends of a range, `4.0-6.2 s`), must be one of the numbers the cited files hold (their JSON
numbers, and numbers in their strings), rounded as printed: a percentage may be stored as a fraction,
seconds as milliseconds, sizes in bytes. A ratio or a percentage may instead be worked out from two figures
the passage quotes before it, the nearest one and an earlier one, both in the files (`17,601 ... 14,826
samples/s: 1.19x`). Not figures: numbers in code (commands, flags), estimates written `~2 min`, and what a
run is held to rather than what it measured (`target 3x`, `<= 2 ms`, `95% CI`). A figure that no results
file holds is quoted without a citation, and the page says where it comes from.

It is a tripwire, not a proof: a figure is accepted if any number of its files matches it, and a large
file holds many numbers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

RESULTS = REPO / "bench" / "results"
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

CITATION = re.compile(r"(?<![\w/])(?:bench/)?results/([\w.-]+\.(?:json|txt|md))\b")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
#: unit -> the factors that turn a stored value into the printed unit (stored as printed, or in a smaller or
#: larger unit: a fraction printed as a percentage, seconds stored as milliseconds, sizes stored in bytes).
UNITS = {
    "x": (1,),
    "%": (1, 100),
    "s": (1, 1e-3),
    "seconds": (1, 1e-3),
    "ms": (1, 1e3),
    "µs": (1, 1e3, 1e6),
    "min": (1, 1 / 60),
    "minutes": (1, 1 / 60),
    "KiB": (1, 2 ** -10),
    "MB": (1, 1e-6, 2 ** -20, 1e3),
    "MiB": (1, 2 ** -20),
    "GB": (1, 1e-9, 2 ** -30, 1e-3),
    "GiB": (1, 2 ** -30),
    "env steps": (1,),
    "steps/s": (1,),
    "env steps/s": (1,),
    "episodes/s": (1,),
    "updates/s": (1,),
    "samples/s": (1,),
    "decisions/s": (1,),
}
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
FIGURE = re.compile(
    rf"(?<![\w.,])(?:(?P<low>{NUMBER})(?P<low_mult>[kM])?\s?[-–]\s?)?(?P<neg>[-−])?(?P<num>{NUMBER})(?P<mult>[kM])?"
    rf"(?:(?P<attached>x|%)|\s?(?P<unit>{_UNIT}))(?![\w/])")
#: What a run is held to, an estimate (`~2 min`) or a label (`95% CI`), not what a run measured: a figure right
#: after or before one of these.
BOUND_BEFORE = re.compile(r"(?:target(?: of| was| is)?|<=|>=|≤|≥|<|(?<!-)>|~)\s*$", re.IGNORECASE)
BOUND_AFTER = re.compile(r"^\s*(?:target|CI|confidence|bootstrap)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Figure:
    text: str
    value: float
    half_step: float  # half the last printed digit: the rounding a printed figure hides
    unit: str
    at: int = 0  # where it starts in its passage
    low_end: bool = False  # the first number of a range


def blocks(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each paragraph, list item, table row and heading, fenced code blocks left out."""
    out: list[tuple[str, str]] = []
    current: list[str] = []
    kind = "paragraph"
    in_fence = False

    def flush() -> None:
        if current:
            out.append((kind, " ".join(current)))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if not stripped or stripped.startswith("#") or stripped.startswith("|"):
            flush()
            if stripped:
                out.append(("heading" if stripped.startswith("#") else "row", stripped))
            continue
        if re.match(r"(?:[-*]|\d+\.)\s", stripped):
            flush()
            kind = "item"
        elif not current:
            kind = "paragraph"
        current.append(stripped)
    flush()
    return out


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*`\[])")


def passages(text: str) -> list[tuple[str, set[str]]]:
    """The passages a citation covers, each with the results files it cites: a sentence of prose; a table
    row, which also takes the citations of the paragraph that leads into its table."""
    out: list[tuple[str, set[str]]] = []
    lead: set[str] = set()
    before: set[str] = set()  # the citations of the block just above
    previous = "heading"
    for kind, block in blocks(text):
        cited = set(CITATION.findall(block))
        if kind == "row":
            if previous != "row":
                lead = before
            out.append((block, lead | cited))
        elif kind != "heading":
            out += [(sentence, set(CITATION.findall(sentence))) for sentence in SENTENCE_END.split(block)]
        before = cited if kind != "heading" else set()
        previous = kind
    return out


def _number(text: str, mult: str | None) -> tuple[float, float]:
    digits = text.replace(",", "")
    decimals = len(digits.partition(".")[2])
    scale = {"k": 1e3, "M": 1e6}.get(mult or "", 1)
    return float(digits) * scale, 0.5 * 10 ** -decimals * scale


def figures(passage: str) -> list[Figure]:
    """The figures of a passage: numbers with a unit, outside code spans, bounds left out."""
    prose = re.sub(r"`[^`]*`", " ", passage).replace("**", "")
    found = []
    for match in FIGURE.finditer(prose):
        if BOUND_BEFORE.search(prose[max(0, match.start() - 12):match.start()]):
            continue
        if BOUND_AFTER.match(prose[match.end():]):
            continue
        unit = match["attached"] or match["unit"]
        value, half = _number(match["num"], match["mult"])
        if match["neg"]:
            value = -value
        found.append(Figure(match.group(0).strip(), value, half, unit, match.start()))
        if match["low"]:
            low, low_half = _number(match["low"], match["low_mult"] or match["mult"])
            found.append(Figure(match.group(0).strip(), low, low_half, unit, match.start(), low_end=True))
    return found


def _numbers_in(data: object) -> list[float]:
    if isinstance(data, bool):
        return []
    if isinstance(data, (int, float)):
        return [float(data)]
    if isinstance(data, dict):
        return [n for value in data.values() for n in _numbers_in(value)]
    if isinstance(data, list):
        return [n for value in data for n in _numbers_in(value)]
    if isinstance(data, str):  # a number kept in text: "246 passed in 914.92s", "1.2.2"
        return [float(n.replace(",", "")) for n in re.findall(NUMBER, data)]
    return []


_CACHE: dict[str, list[float]] = {}


def numbers_of(name: str) -> list[float]:
    """Every number a results file holds: a JSON file's numbers (and those in its strings), a text file's."""
    if name not in _CACHE:
        text = (RESULTS / name).read_text()
        _CACHE[name] = _numbers_in(json.loads(text) if name.endswith(".json") else text)
    return _CACHE[name]


def backed(figure: Figure, values: list[float]) -> bool:
    tolerance = figure.half_step * (1 + 1e-9) + 1e-12
    return any(abs(value * factor - figure.value) <= tolerance
               for value in values for factor in UNITS[figure.unit])


def derived(figure: Figure, quoted: list[Figure]) -> bool:
    """A ratio (`x`) or a percentage of two figures the passage quotes before it, in one unit: the one right
    before it over any earlier one, or the other way round, as printed (`17,601 samples/s ... 14,826
    samples/s: 1.19x`). The ends of ranges are no operands."""
    if figure.unit not in ("x", "%"):
        return False
    operands = [f for f in quoted if f.at < figure.at and f.unit not in ("x", "%") and not f.low_end]
    if not operands:
        return False
    last = max(operands, key=lambda f: f.at)
    for other in operands:
        if other is last or other.unit != last.unit or 0 in (other.value, last.value):
            continue
        for ratio in (last.value / other.value, other.value / last.value):
            candidates = [ratio] if figure.unit == "x" else [100 * ratio, 100 * (ratio - 1), 100 * (1 - ratio)]
            if any(abs(c - figure.value) <= figure.half_step for c in candidates):
                return True
    return False


def unbacked(page: Path) -> list[str]:
    """Each figure of the page not found in the results files its passage cites, nor derived from two of its
    figures that are."""
    out = []
    for passage, cited in passages(page.read_text()):
        present = [name for name in sorted(cited) if (RESULTS / name).exists()]
        if not present:  # a file that is not there is test_readme's to report
            continue
        values = [n for name in present for n in numbers_of(name)]
        found = figures(passage)
        held = [figure for figure in found if backed(figure, values)]
        for figure in found:
            if figure not in held and not derived(figure, held):
                out.append(f"{page.relative_to(REPO)}: {figure.text!r} not in {', '.join(present)}: "
                           f"{passage[:160]}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_figure_beside_a_results_file_is_in_it(page):
    assert unbacked(page) == []


def test_the_figure_reader_reads_what_pages_print():
    row = ("| CartPole | `bench/bench_cartpole.py --seeds 0 1` (`results/x.json`) | **4.7 s** (4.0-6.2), 71k env "
           "steps, 4.6x SB3, target 3x, p99 <= 2 ms, 51% saved, -175.8 s |")
    found = [(f.value, f.unit) for f in figures(row)]
    assert found == [(4.7, "s"), (71000.0, "env steps"), (4.6, "x"), (51.0, "%"), (-175.8, "s")]
    assert blocks("a\nb\n\n- c\n  d\n| e |\n```\n1 s\n```\nf") == [
        ("paragraph", "a b"), ("item", "- c d"), ("row", "| e |"), ("paragraph", "f")]
    assert passages("Run 1. See (`results/a.json`):\n\n| k | 4 s |\n| n | 5 s |\n\nNext 6 s.") == [
        ("Run 1.", set()), ("See (`results/a.json`):", {"a.json"}), ("| k | 4 s |", {"a.json"}),
        ("| n | 5 s |", {"a.json"}), ("Next 6 s.", set())]
    assert figures("4.0-6.2 s")[1].value == 4.0
    values = [4.716, 0.513, 1208320.0, 0.0231]
    assert all(backed(f, values) for f in figures("4.7 s, 51%, 1,208,320 env steps, 1.2M env steps, 23.1 ms"))
    assert not any(backed(f, values) for f in figures("4.8 s, 52%, 1,208,321 env steps, 4.71 s"))
    assert figures("~2 min, 95% CI, <= 2 ms, target 3x") == []
    ddp = figures("14,826 samples/s (2 threads: 17,173 samples/s); N=2 17,601 samples/s: 1.19x, 1.02x, 1.25x")
    assert [derived(f, ddp) for f in ddp if f.unit == "x"] == [True, True, False]
    sweep = figures("1,208,320 env steps -> 588,288 env steps: 51% fewer, 55% fewer")
    assert [derived(f, sweep) for f in sweep if f.unit == "%"] == [True, False]
    assert not derived(figures("19.9-32.5 s, 4.0-6.2 s: 4.9x")[-1], figures("19.9-32.5 s, 4.0-6.2 s: 4.9x"))

"""`kuberl preferences RUN_DIR`: show a run's candidate segment pairs side by side and append a
person's ranking to the pairs file the learner re-reads (pairs_file.py has the formats).

    kuberl preferences RUN_DIR                        the newest unranked pairs (interactive on a TTY)
    kuberl preferences RUN_DIR --pair ID --prefer a   append one ranking (a, b or equal)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kuberl.trainer.preferences.pairs_file import (
    CANDIDATES_FILE,
    PAIRS_FILE,
    PREFER_VALUES,
    PREFERENCES_DIR,
    append_jsonl,
    parse_ranking,
    ranking_record,
    read_candidates,
)

#: Per-step columns of an autoscaling segment: (measure, header, format).
_COLUMNS = (("arrivals", "load", "{:6.0f}"), ("instances", "inst", "{:4.0f}"), ("utilisation", "util", "{:4.2f}"),
            ("latency_ms", "lat ms", "{:6.0f}"), ("slo_violation", "SLO", "{:>3}"), ("dropped", "drop", "{:5.0f}"),
            ("dropped_low_priority", "lowdrop", "{:7.0f}"))


class RankingError(ValueError):
    """Bad input to `kuberl preferences`: the message says what and what is allowed."""


def pairs_path(run_dir: Path, override: str | None) -> Path:
    """The pairs file: --pairs-file, else the job's preference.pairsFile (relative to the run directory),
    else RUN_DIR/preferences/pairs.jsonl. A job whose pairs come from a ConfigMap needs --pairs-file."""
    if override:
        return Path(override)
    pref = _job_preference(run_dir)
    if pref.get("configMap"):
        raise RankingError(f"the job reads its pairs from ConfigMap {pref['configMap']!r}: pass --pairs-file FILE, "
                           "then put FILE in it under the key pairs.jsonl (kubectl create configmap ... "
                           "--from-file=pairs.jsonl=FILE --dry-run=client -o yaml | kubectl apply -f -)")
    return run_dir / pref["pairsFile"] if pref.get("pairsFile") else run_dir / PREFERENCES_DIR / PAIRS_FILE


def _job_preference(run_dir: Path) -> dict[str, Any]:
    import yaml

    try:
        job = yaml.safe_load((run_dir / "job.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    bdq = ((job.get("spec") or {}).get("algorithm") or {}).get("bdq") or {}
    return bdq.get("preference") or {}


def ranked_pairs(path: Path) -> set[str]:
    """Pair ids already ranked in `path` (segment a's id without its side letter)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return set()
    out = set()
    for line in lines:
        try:
            a, _b, _ = parse_ranking(line)
        except ValueError:
            continue
        out.add(a[:-1])
    return out


def unranked(run_dir: Path, pairs: Path) -> list[dict[str, Any]]:
    """The run's candidate pairs not ranked yet, newest first."""
    path = run_dir / PREFERENCES_DIR / CANDIDATES_FILE
    candidates = read_candidates(path)
    if not candidates and not path.exists():
        raise RankingError(f"{path} does not exist: the run has no candidates (is spec.algorithm.bdq.preference "
                           "set, with candidatesPerIteration > 0?)")
    done = ranked_pairs(pairs)
    return [c for c in reversed(candidates) if c["pair"] not in done]


def render_pair(candidate: dict[str, Any]) -> str:
    """Both segments side by side, a line per step, then their totals."""
    a, b = candidate["segments"]["a"], candidate["segments"]["b"]
    lines = [f"pair {candidate['pair']}  ({len(a['rewards'])} steps each)"]
    readable = any(v is not None for v in a["measures"].get("arrivals", [None]))
    if readable:
        cols = [c for c in _COLUMNS if any(v is not None for v in a["measures"].get(c[0], [None]))]
        head = " ".join(f"{h:>{len(f.format(0))}}" for _, h, f in cols) + f" {'action':>9} {'reward':>7}"
        lines.append(f"{'step':>4} | {'A':^{len(head)}} | {'B':^{len(head)}}")
        lines.append(f"{'':>4} | {head} | {head}")
        for t in range(len(a["rewards"])):
            lines.append(f"{t:>4} | {_step(a, t, cols)} | {_step(b, t, cols)}")
    else:
        lines.append(f"{'step':>4} | {'A: action, reward, obs[:4]':<40} | B")
        for t in range(len(a["rewards"])):
            lines.append(f"{t:>4} | {_plain(a, t):<40} | {_plain(b, t)}")
    lines.append(f"{'':>4} | A: {_totals(a)}")
    lines.append(f"{'':>4} | B: {_totals(b)}")
    return "\n".join(lines)


def _step(seg: dict[str, Any], t: int, cols) -> str:
    cells = []
    for key, _h, fmt in cols:
        v = seg["measures"][key][t]
        if key == "slo_violation":
            cells.append(fmt.format("!" if v else "."))
        else:
            cells.append(fmt.format(v) if v is not None else fmt.format(float("nan")))
    return " ".join(cells) + f" {seg['actions'][t]!s:>9} {seg['rewards'][t]:7.2f}"


def _plain(seg: dict[str, Any], t: int) -> str:
    obs = ", ".join(f"{x:.2f}" for x in seg["obs"][t][:4])
    return f"{seg['actions'][t]} {seg['rewards'][t]:.2f} [{obs}]"


def _totals(seg: dict[str, Any]) -> str:
    m = seg["measures"]
    parts = [f"return {sum(seg['rewards']):.1f}"]
    if any(v is not None for v in m.get("slo_violation", [])):
        parts.append(f"SLO-violation steps {int(np.nansum([v or 0 for v in m['slo_violation']]))}")
    for key, label in (("dropped", "dropped"), ("dropped_low_priority", "low-priority dropped")):
        if any(v is not None for v in m.get(key, [])):
            parts.append(f"{label} {np.nansum([v or 0 for v in m[key]]):.0f}")
    if any(v is not None for v in m.get("utilisation", [])):
        parts.append(f"max utilisation {max(v for v in m['utilisation'] if v is not None):.2f}")
    return ", ".join(parts)


def rank(run_dir: Path, pairs: Path, pair: str, prefer: str) -> str:
    """Appends one ranking; returns what it did, in words."""
    if prefer not in PREFER_VALUES:
        raise RankingError(f"--prefer {prefer!r}; allowed values: a, b, equal")
    candidates = {c["pair"] for c in read_candidates(run_dir / PREFERENCES_DIR / CANDIDATES_FILE)}
    if pair not in candidates:
        newest = ", ".join(sorted(candidates, reverse=True)[:5]) or "none"
        raise RankingError(f"--pair {pair!r} is not a candidate of {run_dir} (`kuberl preferences {run_dir}` lists "
                           f"them; some ids: {newest})")
    if pair in ranked_pairs(pairs):
        raise RankingError(f"pair {pair} is ranked already in {pairs}")
    append_jsonl(pairs, [ranking_record(pair, prefer)])
    return f"pair {pair}: prefer {prefer} -> {pairs}"


def show(run_dir: Path, pairs: Path, limit: int, out: TextIO = sys.stdout, interactive: bool = False,
         answers: TextIO = sys.stdin) -> int:
    """Prints up to `limit` unranked pairs; on a TTY asks for each one's ranking. Returns pairs ranked."""
    todo = unranked(run_dir, pairs)
    if not todo:
        print(f"no unranked candidate pairs in {run_dir / PREFERENCES_DIR / CANDIDATES_FILE}", file=out)
        return 0
    print(f"{len(todo)} unranked candidate pairs; the newest {min(limit, len(todo))}:", file=out)
    done = 0
    for candidate in todo[:limit]:
        print("\n" + render_pair(candidate), file=out)
        if not interactive:
            print(f"rank it: kuberl preferences {run_dir} --pair {candidate['pair']} --prefer a|b|equal", file=out)
            continue
        while True:
            print("prefer [a / b / e(qual) / s(kip) / q(uit)]: ", end="", file=out, flush=True)
            answer = answers.readline().strip().lower()
            if answer in ("", "q"):
                return done
            if answer in ("a", "b", "e", "equal", "s"):
                break
        if answer != "s":
            print(rank(run_dir, pairs, candidate["pair"], "equal" if answer.startswith("e") else answer), file=out)
            done += 1
    return done

"""The ledger replay's verdict as the index page shows it (report of :mod:`pipeline.privacy.replay`).

The report is read by key, defensively: ``dpgen-replay/1`` lists transcripts as paths and
counts claims per transcript only through ``claims[*].transcript``; ``dpgen-replay/2`` adds a
per-transcript summary (name, n_claims, expected_claims, ok). A report whose flags disagree
(``all_ok`` true while a claim or transcript says not ok) is shown as FAILED: the page must
never read as a pass that the report itself contradicts.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.stage import PipelineError

REPLAY_FORMAT_PREFIX = "dpgen-replay/"


@dataclass(frozen=True)
class TranscriptVerdict:
    name: str
    path: str
    n_claims: int
    expected_claims: int | None
    ok: bool


@dataclass(frozen=True)
class ReplayVerdict:
    """What the page says about the replay: passed or not, and what was replayed."""

    passed: bool
    n_claims: int
    transcripts: tuple[TranscriptVerdict, ...]
    failures: tuple[str, ...] = ()
    fmt: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)


def is_replay_report(report: Any) -> bool:
    return isinstance(report, Mapping) and str(report.get("format", "")).startswith(REPLAY_FORMAT_PREFIX)


def _transcripts(report: Mapping[str, Any], claims: list[Mapping[str, Any]]) -> tuple[TranscriptVerdict, ...]:
    per_path = Counter(str(c.get("transcript")) for c in claims)
    bad_paths = {str(c.get("transcript")) for c in claims if c.get("ok") is not True}
    out = []
    for t in report.get("transcripts") or []:
        if isinstance(t, Mapping):  # dpgen-replay/2 summary
            path = str(t.get("transcript", t.get("name", "?")))
            n = int(t["n_claims"]) if isinstance(t.get("n_claims"), int) else per_path.get(path, 0)
            expected = t.get("expected_claims") if isinstance(t.get("expected_claims"), int) else None
            ok = t.get("ok") is True and path not in bad_paths
            out.append(TranscriptVerdict(str(t.get("name", Path(path).stem)), path, n, expected, ok))
        else:  # dpgen-replay/1: a path
            path = str(t)
            out.append(TranscriptVerdict(Path(path).stem, path, per_path.get(path, 0), None,
                                         path not in bad_paths and per_path.get(path, 0) > 0))
    return tuple(out)


def _claim_failure(c: Mapping[str, Any]) -> str:
    where = f"{c.get('transcript', '?')}:{c.get('line', '?')}"
    recomputed = c.get("recomputed_epsilon")
    why = "cannot be certified" if recomputed is None else f"recomputed certified ε = {recomputed:.6g}"
    if c.get("event_rebuilt") is False:
        why += "; its event differs from the rebuild of its parameters"
    return f"{where} ({c.get('stage', '?')}): claimed ε = {c.get('claimed_epsilon', '?')}, {why}"


def replay_verdict(report: Any, source: Path | str = "replay report") -> ReplayVerdict:
    """The verdict of one replay report (the parsed JSON); one-line error if it is not one."""
    if not is_replay_report(report):
        got = report.get("format") if isinstance(report, Mapping) else type(report).__name__
        raise PipelineError(f"{source}: expected a ledger replay report (format {REPLAY_FORMAT_PREFIX}N), got {got!r}")
    claims = [c for c in report.get("claims") or [] if isinstance(c, Mapping)]
    transcripts = _transcripts(report, claims)
    failures = [_claim_failure(c) for c in claims if c.get("ok") is not True]
    failures += [f"{t.path}: transcript not ok ({t.n_claims} claim(s)"
                 + (f", expected {t.expected_claims})" if t.expected_claims is not None else ")")
                 for t in transcripts if not t.ok and not any(f.startswith(f"{t.path}:") for f in failures)]
    n_claims = report["n_claims"] if isinstance(report.get("n_claims"), int) else len(claims)
    passed = report.get("all_ok") is True and not failures and n_claims == len(claims)
    if report.get("all_ok") is True and n_claims != len(claims):
        failures.append(f"the report says {n_claims} claims but lists {len(claims)}")
    versions = report.get("versions") if isinstance(report.get("versions"), Mapping) else {}
    return ReplayVerdict(passed, n_claims, transcripts, tuple(failures), str(report["format"]),
                         {str(k): str(v) for k, v in versions.items()})


def verdict_html(verdict: ReplayVerdict, href: str) -> str:
    """The page's replay section: a coloured PASSED/FAILED banner, the per-transcript counts (folded), any failures."""
    esc = html.escape
    word, colour = ("PASSED", "#1a7f37") if verdict.passed else ("FAILED", "#cf222e")
    summary = (f"{verdict.n_claims} ε claim(s) in {len(verdict.transcripts)} ledger transcript(s) recomputed from "
               f"the transcripts alone")
    outcome = "every claimed ε is at least the recomputed certified ε" if verdict.passed else "see the failures below"
    parts = [f"<section id='replay' style='border:3px solid {colour};padding:4px 12px;margin:12px 0'>",
             f"<h2 style='color:{colour}'>Privacy ledger replay: {word}</h2>",
             f"<p>{esc(summary)}; {outcome}. Report: <a href='{esc(href)}'>{esc(href)}</a></p>"]
    if verdict.transcripts:
        rows = "".join(
            f"<tr><td>{esc(t.name)}</td><td>{t.n_claims}</td>"
            f"<td>{'–' if t.expected_claims is None else t.expected_claims}</td>"
            f"<td>{'ok' if t.ok else '<b>FAILED</b>'}</td></tr>" for t in verdict.transcripts)
        # folded: the verdict stays one short box above the figure; the failures (below) are never folded
        parts.append(f"<details><summary>claims per transcript ({len(verdict.transcripts)})</summary>"
                     "<table><tr><th>transcript</th><th>claims replayed</th><th>expected</th><th>verdict</th></tr>"
                     f"{rows}</table></details>")
    if verdict.failures:
        parts.append("<h3>Failures</h3><ul>" + "".join(f"<li>{esc(f)}</li>" for f in verdict.failures) + "</ul>")
    if verdict.versions:
        parts.append("<p style='font-size:11px'>" + esc(", ".join(f"{k} {v}" for k, v in verdict.versions.items()))
                     + f" ({esc(verdict.fmt)})</p>")
    parts.append("</section>")
    return "\n".join(parts)


MISSING_HTML = ("<section id='replay' style='border:3px solid #9a6700;padding:4px 12px;margin:12px 0'>"
                "<h2 style='color:#9a6700'>Privacy ledger replay: no report given to this page</h2>"
                "<p>Pass the replay report as <code>--in replay=results/&lt;experiment&gt;/ledger/replay.json</code>."
                "</p></section>")

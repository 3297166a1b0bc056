"""Replay: recompute every claimed eps from the ledger transcripts alone (SPEC, Accounting).

For each line the serialised ``dp_accounting`` event is fed to a fresh accountant of the
kind the line names, with the settings it records (PLD discretisation and truncation, RDP
orders), and the recomputed certified eps is compared with the claim. A claim smaller than
the recomputed value (beyond floating-point noise) fails the stage loudly: the rule
``replay`` is part of ``all``, so a ledger that overstates privacy stops the workflow.
Lines whose fields disagree with their own event (e.g. a noise multiplier edited without
the event) are refused when read (:class:`pipeline.privacy.ledger.LedgerError`).

Before its eps is recomputed, every line's event is rebuilt from the mechanism parameters on
the same line (:mod:`pipeline.privacy.rebuild`): an event edited to claim less (mu_bar_B and
q halved while the line still says B and n) or a mechanism nobody can rebuild fails. And the
transcripts themselves must be whole: each private stage that ran must hand in its transcript
(``expected_claims``), and an empty, truncated or short transcript fails, since a missing
claim is not an audit pass.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.io import write_json
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger, rebuild
# moments and tha register their rebuilders on import: the replay must know every mechanism
from pipeline.privacy import dp_merf, moments, private_evolution, text_moments, tha  # noqa: F401
from pipeline.privacy.certify import recompute  # one certified eps per line, shared with the result tables
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

#: relative slack for floating-point differences between library versions; any real
#: understatement of eps is many orders of magnitude larger.
REL_TOL = 1e-6


class ReplayError(PipelineError):
    """A claim the transcripts cannot back: understated, rebuilt differently, missing or cut off."""


def _expected_claims(value: Any) -> dict[str, int] | None:
    """``params.expected_claims`` checked: transcript name -> number of claims it must hold (>= 1)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PipelineError(f"replay: params.expected_claims must be a mapping of transcript name to claim "
                            f"count, got {value!r}")
    for name, count in value.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            # a private stage that ran made at least one claim: zero expected is a config error
            raise PipelineError(f"replay: params.expected_claims.{name} must be an integer >= 1, got {count!r}")
    return dict(value)


def replay_line(path: Path, lineno: int, entry: ledger.LedgerEntry, failures: list[str]) -> dict[str, Any]:
    """Rebuild the line's event from its parameters and recompute its eps; append each problem to ``failures``."""
    where = f"{path}:{lineno}"
    try:
        rebuild.check(entry)
        rebuilt = True
    except rebuild.RebuildError as exc:
        failures.append(f"{where}: {exc}")
        rebuilt = False
    try:
        eps = recompute(entry)
    except acc.AccountingError as exc:
        # e.g. noise switched off: nothing certifies such a line
        failures.append(f"{where}: cannot certify ({exc})")
        eps = math.inf
    covered = entry.claimed_epsilon >= eps * (1 - REL_TOL)
    if not covered and math.isfinite(eps):
        failures.append(f"{where}: claimed eps {entry.claimed_epsilon:.6g} < recomputed certified "
                        f"eps {eps:.6g} ({entry.accountant['name']}, delta={entry.delta:g})")
    return {"transcript": str(path), "line": lineno, "stage": entry.stage, "mechanism": entry.mechanism,
            "accountant": entry.accountant["name"], "delta": entry.delta, "claimed_epsilon": entry.claimed_epsilon,
            "recomputed_epsilon": eps if math.isfinite(eps) else None, "event_rebuilt": rebuilt,
            "ok": covered and rebuilt}


def _replay_transcript(name: str, path: Path, expected: int | None,
                       failures: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The claims of one transcript and its summary; a missing, cut, empty or short one is a failure."""
    try:
        lines = list(ledger.read_ledger(path))
    except FileNotFoundError:
        failures.append(f"{path}: transcript {name!r} not found (the private stage that writes it did not run)")
        lines = None
    except ledger.LedgerError as exc:
        failures.append(str(exc))
        lines = None
    claims = [replay_line(path, n, e, failures) for n, e in lines or []]
    whole = lines is not None
    if whole and not claims:
        failures.append(f"{path}: empty transcript (0 claims): a private stage without its claims is not an audit pass")
        whole = False
    elif whole and expected is not None and len(claims) != expected:
        failures.append(f"{path}: {len(claims)} claim(s), expected {expected} (a claim is missing or extra)")
        whole = False
    summary = {"name": name, "transcript": str(path), "n_claims": len(claims), "expected_claims": expected,
               "ok": whole and all(c["ok"] for c in claims)}
    return claims, summary


def audit(transcripts: Mapping[str, Path], expected_claims: Mapping[str, int] | None = None
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay every line of every named transcript; raise :class:`ReplayError` on any failure.

    ``expected_claims`` (name -> count) names the private stages that ran and how many claims
    each wrote: a listed transcript not handed in, or one handed in but not listed, fails.
    Whatever is given, a transcript that is missing, truncated, empty or short of its count
    fails, as does a line whose event differs from its parameters' rebuild or whose claim is
    below the recomputed eps. Returns (one result per claim, one summary per transcript).
    """
    failures: list[str] = []
    if expected_claims is not None:
        for name in sorted(set(expected_claims) - set(transcripts)):
            failures.append(f"transcript {name!r} of a private stage that ran was not handed in "
                            f"(expected {expected_claims[name]} claim(s))")
        for name in sorted(set(transcripts) - set(expected_claims)):
            failures.append(f"transcript {name!r} ({transcripts[name]}) is not in expected_claims")
    elif not transcripts:
        failures.append("no ledger transcripts given: pass --in NAME=PATH for every private stage that ran, or "
                        "params.expected_claims = {} to state that none did")
    results, summaries = [], []
    for name, path in transcripts.items():
        expected = None if expected_claims is None else expected_claims.get(name)
        claims, summary = _replay_transcript(name, Path(path), expected, failures)
        results += claims
        summaries.append(summary)
    if failures:
        for f in failures:
            log.error(f)
        more = f" (+{len(failures) - 1} more, see the log)" if len(failures) > 1 else ""
        raise ReplayError(f"replay FAILED: {failures[0]}{more}")
    return results, summaries


def replay_transcripts(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """:func:`audit` of ``paths`` (each must hold at least one claim); the per-claim results."""
    return audit({str(p): Path(p) for p in paths})[0]


@stage("replay", outputs=("report",), any_inputs=True,
       params={"config_id": "id of the configuration (recorded in the report)",
               "expected_claims": "transcript name -> number of claims its private stage writes; every "
                                  "--in must be listed and every listed name given (omit: each needs >= 1)"})
def replay(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Recompute every ledger claim (--in NAME=transcript.jsonl ...); fail on any understated, rebuilt-differently,
    missing, empty or truncated claim."""
    expected = _expected_claims(params.get("expected_claims"))
    results, transcripts = audit({k: Path(p) for k, p in inputs.items()}, expected)
    write_json(outputs["report"], {"format": "dpgen-replay/2", "config_id": params.get("config_id"),
                                   "transcripts": transcripts, "n_transcripts": len(transcripts),
                                   "n_claims": len(results), "all_ok": all(t["ok"] for t in transcripts),
                                   "versions": ledger.package_versions(), "claims": results})

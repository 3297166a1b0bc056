"""Replay: recompute every claimed eps from the ledger transcripts alone (SPEC, Accounting).

For each line the serialised ``dp_accounting`` event is fed to a fresh accountant of the
kind the line names, with the settings it records (PLD discretisation and truncation, RDP
orders), and the recomputed certified eps is compared with the claim. A claim smaller than
the recomputed value (beyond floating-point noise) fails the stage loudly: the rule
``replay`` is part of ``all``, so a ledger that overstates privacy stops the workflow.
Lines whose fields disagree with their own event (e.g. a noise multiplier edited without
the event) are refused when read (:class:`pipeline.privacy.ledger.LedgerError`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.io import write_json
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

#: relative slack for floating-point differences between library versions; any real
#: understatement of eps is many orders of magnitude larger.
REL_TOL = 1e-6


class ReplayError(PipelineError):
    """A ledger claim is smaller than the eps recomputed from its transcript."""


def recompute(entry: ledger.LedgerEntry) -> float:
    """Certified eps of ``entry``'s event at its delta, by the accountant the entry names."""
    event = entry.dp_event()
    name = entry.accountant["name"]
    if name == "pld_pessimistic":
        settings = acc.PLDSettings(
            float(entry.accountant.get("value_discretization_interval", acc.PAPER_DISCRETISATION)),
            float(entry.accountant.get("log_mass_truncation_bound", acc.PAPER_LOG_MASS_TRUNCATION)))
        # dp_accounting's own construction, not our faster one: the audit stays independent
        return acc.pld_epsilon(event, entry.delta, settings=settings, reference=True)
    if name == "rdp":
        orders = entry.accountant.get("orders")
        replace_one = entry.accountant.get("neighboring_relation") == "replace_one"
        return acc.rdp_epsilon(event, entry.delta, orders=orders, replace_one=replace_one)
    if name == "gdp":
        return acc.gdp_epsilon(entry.delta, acc.gdp_mu_of_event(event))
    raise PipelineError(f"replay: accountant {name!r} is not certified")  # validate() already refuses it


def replay_transcripts(paths: list[Path]) -> list[dict[str, Any]]:
    """Recompute every line of every transcript; raise :class:`ReplayError` on any understatement."""
    results, failures = [], []
    for path in paths:
        try:
            lines = list(ledger.read_ledger(path))
        except ledger.LedgerError as exc:
            raise ReplayError(f"replay: {exc}") from None
        for lineno, entry in lines:
            where = f"{path}:{lineno}"
            try:
                eps = recompute(entry)
            except acc.AccountingError as exc:
                # e.g. noise switched off: nothing certifies such a line
                failures.append(f"{where}: cannot certify ({exc})")
                eps = math.inf
            ok = entry.claimed_epsilon >= eps * (1 - REL_TOL)
            results.append({"transcript": str(path), "line": lineno, "stage": entry.stage,
                            "mechanism": entry.mechanism, "accountant": entry.accountant["name"],
                            "delta": entry.delta, "claimed_epsilon": entry.claimed_epsilon,
                            "recomputed_epsilon": eps if math.isfinite(eps) else None, "ok": ok})
            if not ok and math.isfinite(eps):
                failures.append(f"{where}: claimed eps {entry.claimed_epsilon:.6g} < recomputed certified "
                                f"eps {eps:.6g} ({entry.accountant['name']}, delta={entry.delta:g})")
    if failures:
        for f in failures:
            log.error(f)
        more = f" (+{len(failures) - 1} more, see the log)" if len(failures) > 1 else ""
        raise ReplayError(f"replay FAILED: {failures[0]}{more}")
    return results


@stage("replay", outputs=("report",), any_inputs=True,
       params={"config_id": "id of the configuration (recorded in the report)"})
def replay(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Recompute every ledger claim (--in NAME=transcript.jsonl ...); fail if any eps is understated."""
    paths = [Path(p) for p in inputs.values()]
    results = replay_transcripts(paths)
    write_json(outputs["report"], {"format": "dpgen-replay/1", "config_id": params.get("config_id"),
                                   "transcripts": [str(p) for p in paths], "n_claims": len(results),
                                   "all_ok": True, "versions": ledger.package_versions(), "claims": results})

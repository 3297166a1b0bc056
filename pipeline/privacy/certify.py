"""The certified eps of one ledger line, recomputed by the accountant the line names (SPEC, Accounting).

The line's serialised ``dp_accounting`` event is fed to a fresh accountant of the recorded kind
with the recorded settings (PLD discretisation and truncation, RDP orders and neighbouring
relation). Every consumer that must not trust a stage's own claim -- the replay audit
(:mod:`pipeline.privacy.replay`) and the result tables (:mod:`pipeline.results.dpdm`) --
asks this one function, so a table's eps and the audit's cannot disagree.
"""

from __future__ import annotations

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.stage import PipelineError


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

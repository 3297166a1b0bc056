"""The certified eps of one ledger line, recomputed by the accountant the line names (SPEC, Accounting).

The line's serialised ``dp_accounting`` event is fed to a fresh accountant of the recorded kind
with the recorded settings (PLD discretisation and truncation, RDP orders and neighbouring
relation). Every consumer that must not trust a stage's own claim -- the replay audit
(:mod:`pipeline.privacy.replay`) and the result tables (:mod:`pipeline.methods.dpdm.table`) --
asks this one function, so a table's eps and the audit's cannot disagree.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attr
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.stage import PipelineError


def recompute(entry: ledger.LedgerEntry) -> float:
    """Certified eps of ``entry``'s event at its delta, by the accountant the entry names."""
    return epsilon_of(entry.dp_event(), entry.accountant, entry.delta)


def epsilon_of(event: dp_event.DpEvent, accountant: Mapping[str, Any], delta: float, *,
               reference: bool = True) -> float:
    """Certified eps of ``event`` at ``delta`` by ``accountant`` (a line's ``accountant`` field: its name and
    settings). ``reference``: the PLD by dp_accounting's own construction (the audit's, independent of ours);
    ``False``: the project's faster PLD, the one every noise calibration bisects with."""
    name = accountant["name"]
    if name == "pld_pessimistic":
        settings = acc.PLDSettings(
            float(accountant.get("value_discretization_interval", acc.PAPER_DISCRETISATION)),
            float(accountant.get("log_mass_truncation_bound", acc.PAPER_LOG_MASS_TRUNCATION)))
        return acc.pld_epsilon(event, delta, settings=settings, reference=reference)
    if name == "rdp":
        orders = accountant.get("orders")
        replace_one = accountant.get("neighboring_relation") == "replace_one"
        return acc.rdp_epsilon(event, delta, orders=orders, replace_one=replace_one)
    if name == "gdp":
        return acc.gdp_epsilon(delta, acc.gdp_mu_of_event(event))
    raise PipelineError(f"replay: accountant {name!r} is not certified")  # validate() already refuses it


def scale_noise(event: dp_event.DpEvent, factor: float) -> dp_event.DpEvent:
    """``event`` with the noise multiplier of every Gaussian in it multiplied by ``factor`` (sampling, counts and
    composition unchanged): the replay's probe of a calibrated line (is a little less noise over budget?)."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier * factor)
    changes: dict[str, Any] = {}
    for a in attr.fields(type(event)):
        value = getattr(event, a.name)
        if isinstance(value, dp_event.DpEvent):
            changes[a.name] = scale_noise(value, factor)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, dp_event.DpEvent) for v in value):
            changes[a.name] = [scale_noise(v, factor) if isinstance(v, dp_event.DpEvent) else v for v in value]
    return attr.evolve(event, **changes) if changes else event


def has_gaussian(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` holds a Gaussian whose noise :func:`scale_noise` can scale."""
    return bool(ledger.core_noise_multipliers(event))


_CERTIFIED: dict[str, float] = {}


def recompute_cached(entry: ledger.LedgerEntry) -> float:
    """:func:`recompute`, memoised on what the eps depends on (event, accountant, delta): the seeds of a
    grid often release the same event, and a reference PLD at h = 1e-4 takes seconds, so each distinct
    event is certified once per process (the result tables, the replay and the bundles use it: a run's lines
    replayed, then composed, cost one PLD each)."""
    key = json.dumps([entry.event, entry.accountant, entry.delta], sort_keys=True)
    if key not in _CERTIFIED:
        _CERTIFIED[key] = recompute(entry)
    return _CERTIFIED[key]


def composed_entry(entries: Sequence[ledger.LedgerEntry], *, mechanism: str = "composed") -> ledger.LedgerEntry:
    """One line holding the composition of ``entries``' events (:func:`merged_composition`) under the LAST line's
    accountant.

    Built as a line so that :func:`recompute` -- the replay's one function -- chooses the PLD
    settings and the reference construction: a run's composed eps (STRAIGHTDP's release + THA,
    a run of all_runs.parquet) cannot drift from how every single line is certified. The lines
    must share delta and accountant (one PLD grid); the last line's noise multiplier and sampling
    rate are Gaussians / sampled events of the composition, so the line validates. One line is
    returned as it is.
    """
    if not entries:
        raise PipelineError("composed_entry: no ledger lines to compose")
    if len(entries) == 1:
        return entries[0]
    last = entries[-1]
    for e in entries[:-1]:
        if e.delta != last.delta:
            raise PipelineError(f"lines {e.mechanism} and {last.mechanism}: delta {e.delta:g} != {last.delta:g} "
                                f"(one run composes at one delta)")
        if e.accountant != last.accountant:
            raise PipelineError(f"lines {e.mechanism} and {last.mechanism}: accountant settings differ "
                                f"({e.accountant} vs {last.accountant}); the composition needs one PLD grid")
    composed = merged_composition([e.dp_event() for e in entries])
    count = composed.count if isinstance(composed, dp_event.SelfComposedDpEvent) else last.count
    return dataclasses.replace(last, stage=mechanism, mechanism=mechanism, event=ledger.event_to_dict(composed),
                               count=count, extra={})


def merged_composition(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    """The composition of ``events``, where releases of one mechanism are one self-composition of their summed
    count: ``SelfComposed(M, a)`` and ``SelfComposed(M, b)`` are ``SelfComposed(M, a + b)`` (composition is
    associative and commutative, so the privacy loss is the same).

    Why merge rather than nest: a sharded EMPDEN cell's S lines (pipeline.shards) release the same
    block for parts of its outputs, and merged they are exactly the event the unsharded line accounts, so both
    certify the same eps to the last bit (a PLD of a chain of compositions discretises differently from one
    self-composition). Distinct mechanisms keep their order of first appearance.
    """
    groups: dict[str, list] = {}
    for e in events:
        inner, count = (e.event, e.count) if isinstance(e, dp_event.SelfComposedDpEvent) else (e, 1)
        groups.setdefault(ledger.event_to_json(inner), [inner, 0])[1] += count
    merged = [inner if count == 1 else dp_event.SelfComposedDpEvent(inner, count) for inner, count in groups.values()]
    return merged[0] if len(merged) == 1 else dp_event.ComposedDpEvent(merged)

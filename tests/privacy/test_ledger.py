"""Ledger lines: serialised dp_accounting events plus their claims (SPEC, Accounting)."""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger


def entry(**overrides) -> ledger.LedgerEntry:
    event = acc.outputwise_event(2.0, 0.01, 100)
    fields = dict(stage="sample_hybrid", mechanism="empden_outputwise_block", event=ledger.event_to_dict(event),
                  sensitivity=1.0, noise_std=0.5, sampling={"scheme": "fixed_size_per_output", "probability": 0.01},
                  adjacency="add_or_remove_one", count=100, delta=1e-5, claimed_epsilon=3.0,
                  accountant={"name": "pld_pessimistic", "value_discretization_interval": 1e-3,
                              "log_mass_truncation_bound": -50.0}, config_id="abc", seed=0)
    fields.update(overrides)
    return ledger.LedgerEntry(**fields)


@pytest.mark.parametrize("event", [
    dp_event.GaussianDpEvent(1.5),
    acc.outputwise_event(0.7, 5e-4, 50000),
    acc.per_step_event([0.1, 0.2], [0.01, 0.02], 3),
    acc.full_batch_event([0.3, 0.4], 2),
    dp_event.SampledWithoutReplacementDpEvent(100, 10, dp_event.GaussianDpEvent(2.0)),
])
def test_events_round_trip_through_json(event):
    assert ledger.event_from_json(ledger.event_to_json(event)) == event


def test_unknown_event_classes_are_refused():
    with pytest.raises(ledger.LedgerError, match="unknown dp_accounting event class"):
        ledger.event_from_dict({"class_name": "PrivacyAccountant"})


def test_append_writes_one_line_per_execution_and_reads_back(tmp_path):
    path = tmp_path / "ledger" / "stage.jsonl"
    first, second = entry(), entry(claimed_epsilon=4.0)
    ledger.append_entry(path, first)
    ledger.append_entry(path, second)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["claimed_epsilon"] == 4.0
    read = list(ledger.read_ledger(path))
    assert [n for n, _ in read] == [1, 2]
    assert read[0][1].dp_event() == acc.outputwise_event(2.0, 0.01, 100)
    assert read[0][1].versions["dp-accounting"] != "unknown"


def test_estimates_cannot_be_claimed():
    with pytest.raises(ledger.LedgerError, match="not a certified accountant"):
        entry(accountant={"name": "edgeworth"})


@pytest.mark.parametrize("overrides, match", [
    (dict(noise_std=0.25), "matches no Gaussian"),
    (dict(sampling={"scheme": "fixed_size_per_output", "probability": 0.02}), "sampling probability"),
    (dict(count=99), "composition count"),
    (dict(delta=0.0), "delta"),
    (dict(adjacency="swap_everything"), "adjacency"),
])
def test_lines_that_contradict_their_event_are_refused(overrides, match):
    with pytest.raises(ledger.LedgerError, match=match):
        entry(**overrides)


def test_a_bad_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    ledger.append_entry(path, entry())
    with path.open("a") as fh:
        fh.write('{"stage": "oops"\n')
    with pytest.raises(ledger.LedgerError, match=r"x\.jsonl:2"):
        list(ledger.read_ledger(path))


def test_a_transcript_cut_mid_line_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "x.jsonl"
    ledger.append_entry(path, entry())
    ledger.append_entry(path, entry(claimed_epsilon=4.0))
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(ledger.LedgerError, match=r"x\.jsonl:2: truncated transcript"):
        list(ledger.read_ledger(path))


def test_a_last_line_without_its_newline_is_refused_even_if_it_parses(tmp_path):
    # append_entry writes whole lines only: a missing newline means the write was cut off
    path = tmp_path / "x.jsonl"
    ledger.append_entry(path, entry())
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    json.loads(path.read_text())
    with pytest.raises(ledger.LedgerError, match=r"x\.jsonl:1: truncated transcript"):
        list(ledger.read_ledger(path))


def test_a_blank_line_is_refused_not_skipped(tmp_path):
    path = tmp_path / "x.jsonl"
    ledger.append_entry(path, entry())
    with path.open("a") as fh:
        fh.write("\n")
    ledger.append_entry(path, entry())
    with pytest.raises(ledger.LedgerError, match=r"x\.jsonl:2: blank line"):
        list(ledger.read_ledger(path))

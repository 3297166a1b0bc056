"""Replay: every ledger claim recomputed from the transcript; tampering fails loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.accounting.replay import ReplayError, replay
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger

SETTINGS = acc.PLDSettings(1e-3)


def honest_entry(mu: float = 1.5, q: float = 0.02, n_out: int = 100, **overrides) -> ledger.LedgerEntry:
    event = acc.outputwise_event(mu, q, n_out)
    fields = dict(stage="sample_hybrid", mechanism="empden_outputwise_block", event=ledger.event_to_dict(event),
                  sensitivity=1.0, noise_std=1 / mu, sampling={"scheme": "fixed_size_per_output", "probability": q},
                  adjacency="add_or_remove_one", count=n_out, delta=1e-5,
                  claimed_epsilon=acc.pld_epsilon(event, 1e-5, settings=SETTINGS),
                  accountant={"name": "pld_pessimistic", **acc.describe(SETTINGS)}, config_id="c", seed=0)
    fields.update(overrides)
    return ledger.LedgerEntry(**fields)


def write(path: Path, *entries: ledger.LedgerEntry) -> Path:
    for e in entries:
        ledger.append_entry(path, e)
    return path


def tamper(path: Path, line: int, edit) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    edit(record)
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def test_honest_transcripts_replay(tmp_path):
    gdp_event = acc.full_batch_event([0.5, 0.5])
    gdp = ledger.LedgerEntry(stage="full_batch", mechanism="gaussian", event=ledger.event_to_dict(gdp_event),
                             sensitivity=2.0, noise_std=4.0, sampling={"scheme": "none"}, adjacency="add_or_remove_one",
                             count=1, delta=1e-5, claimed_epsilon=acc.gdp_epsilon(1e-5, acc.gdp_compose([0.5, 0.5])),
                             accountant={"name": "gdp"}, config_id="c", seed=0)
    rdp_event = acc.outputwise_event(1.0, 0.01, 50)
    rdp = honest_entry(1.0, 0.01, 50, accountant={"name": "rdp", "orders": None},
                       claimed_epsilon=acc.rdp_epsilon(rdp_event, 1e-5))
    a = write(tmp_path / "a.jsonl", honest_entry(), honest_entry(mu=0.8))
    b = write(tmp_path / "b.jsonl", gdp, rdp)
    replay({"a": a, "b": b}, {"report": tmp_path / "replay.json"}, {"config_id": "c"})
    report = json.loads((tmp_path / "replay.json").read_text())
    assert report["n_claims"] == 4 and all(c["ok"] for c in report["claims"])


def test_an_understated_claim_fails(tmp_path):
    path = write(tmp_path / "a.jsonl", honest_entry(), honest_entry(mu=0.8))
    tamper(path, 1, lambda r: r.update(claimed_epsilon=r["claimed_epsilon"] * 0.9))
    with pytest.raises(ReplayError, match=r"a\.jsonl:2: claimed eps .* < recomputed certified eps"):
        replay({"a": path}, {"report": tmp_path / "replay.json"}, {})
    assert not (tmp_path / "replay.json").exists()


def test_a_weakened_noise_in_the_transcript_fails(tmp_path):
    # Claim stays, event and fields say less noise: the recomputed eps is larger than the claim.
    path = write(tmp_path / "a.jsonl", honest_entry())

    def less_noise(r):
        r["event"]["event"]["event"]["noise_multiplier"] /= 2
        r["noise_std"] /= 2
        r["noise_multiplier"] /= 2

    tamper(path, 0, less_noise)
    with pytest.raises(ReplayError, match="claimed eps"):
        replay({"a": path}, {"report": tmp_path / "r.json"}, {})


def test_noise_switched_off_fails(tmp_path):
    path = write(tmp_path / "a.jsonl", honest_entry())

    def no_noise(r):
        r["event"]["event"]["event"]["noise_multiplier"] = 0.0
        r["noise_std"] = r["noise_multiplier"] = 0.0

    tamper(path, 0, no_noise)
    with pytest.raises(ReplayError, match="cannot certify"):
        replay({"a": path}, {"report": tmp_path / "r.json"}, {})


def test_halved_sensitivity_claim_fails(tmp_path):
    # A mechanism that accounted with half its true sensitivity claims the eps of mu/2.
    mu = 1.5
    understated = acc.pld_epsilon(acc.outputwise_event(mu / 2, 0.02, 100), 1e-5, settings=SETTINGS)
    path = write(tmp_path / "a.jsonl", honest_entry(mu, claimed_epsilon=understated))
    with pytest.raises(ReplayError, match="claimed eps"):
        replay({"a": path}, {"report": tmp_path / "r.json"}, {})


def test_a_field_edited_without_the_event_is_refused(tmp_path):
    path = write(tmp_path / "a.jsonl", honest_entry())
    tamper(path, 0, lambda r: r.update(noise_std=r["noise_std"] * 3, noise_multiplier=r["noise_multiplier"] * 3))
    with pytest.raises(ReplayError, match="matches no Gaussian"):
        replay({"a": path}, {"report": tmp_path / "r.json"}, {})


def test_no_transcripts_is_an_empty_report(tmp_path):
    replay({}, {"report": tmp_path / "r.json"}, {})
    assert json.loads((tmp_path / "r.json").read_text())["n_claims"] == 0

"""Stage audit_one_run: every DP-SGD line of the transcripts audited, one row each; a refuted claim fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.audit.stage import audit_one_run
from pipeline.privacy import dpsgd, ledger, moments, tha
from pipeline.reporting.tables import read_table
from pipeline.stage import PipelineError

DELTA = 1e-5
PARAMS = {"audit": {"canaries": 400, "significance": 0.05}, "seed": 0, "config_id": "test"}


def dpdm_line(noise_multiplier: float = 1.5) -> ledger.LedgerEntry:
    plan = dpsgd.DPSGDPlan(noise_multiplier=noise_multiplier, max_grad_norm=1.0, sampling_rate=64 / 2500,
                           dataset_size=2500, steps=40, delta=DELTA)
    return dpsgd.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0)


def tha_line() -> ledger.LedgerEntry:
    plan = tha.THAPlan(edges=(0.3, 0.65, 1.0), clips=(0.8, 1.2), noise_std=1.5, sampling_rate=64 / 2500,
                       dataset_size=2500, steps=40, delta=DELTA)
    return tha.ledger_entry(plan, stage="train_straightdp", config_id="c", seed=1, extra={"run": "uniform_eps1_seed1"})


def fixed_size_line() -> ledger.LedgerEntry:
    plan = dpsgd.DPSGDPlan(noise_multiplier=1.5, max_grad_norm=1.0, sampling_rate=0.1, dataset_size=500, steps=10,
                           delta=DELTA, sampling="fixed_size")
    return dpsgd.ledger_entry(plan, stage="train_dpdm", config_id="c", seed=0)


def release_line() -> ledger.LedgerEntry:
    plan = moments.calibrate_release(target_epsilon=0.5, delta=DELTA, R=1.0, N=2500, n_classes=10, p=4)
    return moments.ledger_entry(plan, stage="release_moments", config_id="c", seed=0)


def write(path: Path, *entries: ledger.LedgerEntry) -> Path:
    for e in entries:
        ledger.append_entry(path, e)
    return path


def test_every_dpsgd_line_gets_one_row_and_other_mechanisms_none(tmp_path):
    ins = {"train_dpdm_eps1": write(tmp_path / "a.jsonl", dpdm_line()),
           "straightdp_train_uniform_eps1_seed1": write(tmp_path / "b.jsonl", tha_line()),
           "straightdp_release_x": write(tmp_path / "c.jsonl", release_line()),
           # replace-one batches: a canary cannot be simply in or out, so the audit leaves it out
           "train_dpdm_fixed": write(tmp_path / "d.jsonl", fixed_size_line())}
    audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)
    df = read_table(tmp_path / "audit.parquet")
    assert sorted(df["mechanism"]) == ["dpsgd", "tha_dpsgd"]
    assert set(df["run"]) == {"train_dpdm_eps1", "uniform_eps1_seed1"}
    assert df["passed"].all() and (df["epsilon_lb"] <= df["certified_epsilon"]).all()
    assert (df["canaries"] == 400).all() and (df["confidence"] == 0.95).all()


def test_a_line_that_claims_less_than_its_mechanism_gives_fails_the_stage(tmp_path):
    honest = dpdm_line(noise_multiplier=0.3)  # eps in the tens: the audit sees a strong signal
    understated = dataclasses.replace(honest, claimed_epsilon=0.05)
    ins = {"train_dpdm_bad": write(tmp_path / "a.jsonl", understated)}
    with pytest.raises(PipelineError, match="refutes a certified eps.*train_dpdm_bad"):
        audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)
    assert not (tmp_path / "audit.parquet").exists()

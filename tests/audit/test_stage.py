"""Stage audit_one_run: every DP-SGD and moment-release line audited, one row each; a refuted claim fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.audit.stage import audit_one_run
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.privacy import accountants as acc
from pipeline.privacy import dp_merf, dpsgd, ledger, moments, tha
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy import private_evolution as pe
from pipeline.privacy.empden_block import EmpdenBlock
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


def release_line(eps: float = 0.5) -> ledger.LedgerEntry:
    plan = moments.calibrate_release(target_epsilon=eps, delta=DELTA, R=1.0, N=2500, n_classes=10, p=4)
    return moments.ledger_entry(plan, stage="release_moments", config_id="c", seed=0,
                                extra={"run": "uniform_moments_eps1_seed0"})


def merf_line() -> ledger.LedgerEntry:
    plan = dp_merf.calibrate_release(target_epsilon=1.0, delta=DELTA, m=2500, n_features=50, n_classes=10)
    return dp_merf.ledger_entry(plan, stage="dp_merf", config_id="c", seed=0)


def pe_line() -> ledger.LedgerEntry:
    return pe.ledger_entry(pe.calibrate(target_epsilon=1.0, delta=DELTA, T=4), stage="private_evolution",
                           config_id="c", seed=0)


def empden_line(path: Path, C: float = 5.0) -> Path:
    """A hybrid sampler's line (Algorithm 1), written as the sampler writes it: n 500, B 40, 50 outputs."""
    block = EmpdenBlock(schedule=EDMSchedule(N=39), k=24, C=C, beta=1.0, B=40, n=500, N_out=50)
    sink = emp.LedgerSink(path=path, stage="empden_sample", config_id="c", seed=0, delta=DELTA,
                          pld=acc.PLDSettings(value_discretization_interval=1e-4))
    emp.record_block(sink, block)
    return path


def write(path: Path, *entries: ledger.LedgerEntry) -> Path:
    for e in entries:
        ledger.append_entry(path, e)
    return path


def test_every_auditable_line_gets_one_row_and_fixed_size_dpsgd_none(tmp_path):
    ins = {"train_dpdm_eps1": write(tmp_path / "a.jsonl", dpdm_line()),
           "straightdp_train_uniform_eps1_seed1": write(tmp_path / "b.jsonl", tha_line()),
           "straightdp_release_x": write(tmp_path / "c.jsonl", release_line()),
           # replace-one batches: a canary cannot be simply in or out, so the audit leaves it out
           "train_dpdm_fixed": write(tmp_path / "d.jsonl", fixed_size_line()),
           "baselines_dp_merf": write(tmp_path / "e.jsonl", merf_line()),
           "empden_sample_hybrid": empden_line(tmp_path / "f.jsonl"),
           "baselines_pe": write(tmp_path / "g.jsonl", pe_line())}
    audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)
    df = read_table(tmp_path / "audit.parquet")
    assert sorted(df["mechanism"]) == ["dp_merf_embedding", "dpsgd", "empden_outputwise_block", "moment_release",
                                       "pe_nn_histogram", "tha_dpsgd"]
    assert set(df["run"]) == {"train_dpdm_eps1", "uniform_eps1_seed1", "uniform_moments_eps1_seed0",
                              "empden_sample_hybrid", "baselines_dp_merf", "baselines_pe"}
    assert df["passed"].all() and (df["epsilon_lb"] <= df["certified_epsilon"]).all()
    assert (df["canaries"] == 400).all() and (df["confidence"] == 0.95).all()
    assert "replace-one" in df.loc[df["mechanism"] == "dp_merf_embedding", "attack"].iloc[0]
    release = df[df["mechanism"] == "moment_release"].iloc[0]
    assert release["steps"] == 1 and release["sampling_rate"] == 1.0 and "feature canaries" in release["attack"]
    block = df[df["mechanism"] == "empden_outputwise_block"].iloc[0]
    assert block["steps"] == 24 and block["sampling_rate"] == 40 / 500 and "denoiser" in block["attack"]


def test_a_line_that_claims_less_than_its_mechanism_gives_fails_the_stage(tmp_path):
    honest = dpdm_line(noise_multiplier=0.3)  # eps in the tens: the audit sees a strong signal
    understated = dataclasses.replace(honest, claimed_epsilon=0.05)
    ins = {"train_dpdm_bad": write(tmp_path / "a.jsonl", understated)}
    with pytest.raises(PipelineError, match="refutes a certified eps.*train_dpdm_bad"):
        audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)
    assert not (tmp_path / "audit.parquet").exists()


def test_a_release_line_that_claims_less_than_its_noise_gives_fails_the_stage(tmp_path):
    honest = release_line(eps=10.0)  # sigma ~ 0.7: the feature canaries stand out
    understated = dataclasses.replace(honest, claimed_epsilon=0.05)
    ins = {"straightdp_release_bad": write(tmp_path / "a.jsonl", understated)}
    with pytest.raises(PipelineError, match="refutes a certified eps.*straightdp_release_bad"):
        audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)


def test_an_empden_line_that_claims_less_than_its_noise_gives_fails_the_stage(tmp_path):
    path = empden_line(tmp_path / "honest.jsonl", C=80.0)  # eps in the hundreds: the canaries stand out
    (entry_line,) = [e for _, e in ledger.read_ledger(path)]
    ins = {"empden_sample_bad": write(tmp_path / "a.jsonl", dataclasses.replace(entry_line, claimed_epsilon=0.05))}
    with pytest.raises(PipelineError, match="refutes a certified eps.*empden_sample_bad"):
        audit_one_run(ins, {"table": tmp_path / "audit.parquet"}, PARAMS)


def test_a_sampler_line_relabelled_given_is_refused_not_skipped(tmp_path):
    """Issue #35: extra.source = 'given' skipped the audit of a sampler's block; only configuration claims may carry
    it (they are skipped: no sampler ran)."""
    (entry,) = [e for _, e in ledger.read_ledger(empden_line(tmp_path / "honest.jsonl"))]
    forged = dataclasses.replace(entry, extra={**entry.extra, "source": "given"})
    with pytest.raises(PipelineError, match=r"^stage audit_one_run: empden_sample line \(empden_outputwise_block\) "
                                            r"carries a mu_bar_B given directly"):
        audit_one_run({"a": write(tmp_path / "a.jsonl", forged)}, {"table": tmp_path / "audit.parquet"}, PARAMS)
    claim = dataclasses.replace(forged, extra={**forged.extra, "kind": "configuration_claim"})
    audit_one_run({"a": write(tmp_path / "b.jsonl", claim)}, {"table": tmp_path / "audit.parquet"}, PARAMS)
    assert len(read_table(tmp_path / "audit.parquet")) == 0


def test_every_mechanism_with_a_rebuilder_has_an_audit_hook_found_without_a_list():
    # the replay's rebuilders and the audit's hooks are both discovered from their packages' modules: a new
    # mechanism adds its files and edits no list (issue #36)
    from pipeline.audit.hooks import audit_hook, audited_mechanisms
    from pipeline.privacy import rebuild

    rebuild.load_rebuilders()
    assert set(rebuild.REBUILDERS) == set(audited_mechanisms())
    assert {"dpsgd", "tha_dpsgd", "moment_release", "text_moment_release", "dp_merf_embedding", "pe_nn_histogram",
            "empden_outputwise_block"} <= set(audited_mechanisms())
    assert audit_hook("no_such_mechanism") is None


def test_a_mechanism_is_audited_by_one_hook_only():
    from pipeline.audit import hooks

    hooks.load_audits()
    with pytest.raises(RuntimeError, match="already has an audit hook"):
        hooks.register_audit("dpsgd")(lambda entry, *, m, significance, seed: "x")

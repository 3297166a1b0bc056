"""EmpdenBlock: one EMPDEN private block, the one value its clip, mu_t, mu_bar_B, event and ledger line derive from."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.methods.accounting.blocks import AccountingConfig, block_plan
from pipeline.config import validate_config
from pipeline.privacy import accountants as acc
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy import ledger, rebuild
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.privacy.schedule import EDMSchedule
from pipeline.methods.empden.grid import Cell
from pipeline.methods.empden.sample_stage import cell_block

SCHEDULE = EDMSchedule(N=12)
ACCOUNTING = {**validate_config({})["accounting"], "N": 12, "C": 0.5, "beta": 1.0}


def block(**kw) -> EmpdenBlock:
    args = {"schedule": SCHEDULE, "k": 7, "C": 0.5, "beta": 2.0, "B": 10, "n": 40, "N_out": 6}
    return EmpdenBlock(**{**args, **kw})


def test_the_effective_clip_scales_with_the_subset_only_when_asked():
    assert block(C_scales_with_subset=True).C_eff == 0.5 * 10
    assert block(C_scales_with_subset=False).C_eff == 0.5
    assert block(scheme="full_batch", B=40, C_scales_with_subset=True).C_eff == 0.5 * 40


def test_mu_bar_B_composes_the_first_k_steps_of_eq_39_exactly():
    """mu_t = (2 C_eff / (beta |S|)) sqrt(2 dt / t^3) (eq. 39); mu_bar_B = sqrt(sum_{i<k} mu_t^2) (eq. 9)."""
    b = block()
    t = SCHEDULE.times()
    want_mu_t = [(2 * 0.5 / (2.0 * 10)) * math.sqrt(2 * (t[i] - t[i + 1]) / t[i] ** 3) for i in range(7)]
    np.testing.assert_allclose(b.mu_t, want_mu_t, rtol=1e-12)
    assert b.mu_bar_B == pytest.approx(math.sqrt(sum(m * m for m in want_mu_t)), rel=1e-12)
    assert b.q_B == 10 / 40 and b.t0 == t[7] and b.sensitivity == 2 * 0.5 / (2.0 * 10)


def test_with_a_scaled_clip_mu_bar_B_does_not_depend_on_B_and_without_it_falls_as_1_over_B():
    scaled = [block(B=B, C_scales_with_subset=True).mu_bar_B for B in (5, 10, 20)]
    assert scaled == pytest.approx([scaled[0]] * 3, rel=1e-12)
    fixed = [block(B=B).mu_bar_B for B in (5, 10, 20)]
    assert fixed == pytest.approx([fixed[0], fixed[0] / 2, fixed[0] / 4], rel=1e-12)


def test_each_scheme_is_accounted_by_its_own_proposition():
    b = block()
    assert b.event == acc.outputwise_event(b.mu_bar_B, 0.25, 6)  # Prop. 4.1: one subset reused
    per_step = block(scheme="per_step")
    assert per_step.event == acc.per_step_event(per_step.mu_t, 0.25, 6)  # Prop. C.1
    full = block(scheme="full_batch", B=40)
    assert full.event == acc.full_batch_event(full.mu_t, 6)  # Sec. 3.2, exact GDP
    assert full.mu_total == pytest.approx(acc.gdp_mu_of_event(full.event), rel=1e-12)
    assert b.mechanism().mu_core == b.mu_bar_B and per_step.mechanism().mu_core == max(per_step.mu_t)


@pytest.mark.parametrize("bad", [{"B": 41}, {"k": 13}, {"scheme": "full_batch"}, {"N_out": 0}, {"C": 0.0},
                                 {"scheme": "per_output_typo"}])
def test_a_block_that_cannot_run_is_refused(bad):
    with pytest.raises(ValueError):
        block(**bad)


@pytest.mark.parametrize("scheme", ["per_output", "per_step", "full_batch"])
def test_the_ledger_line_is_the_block_and_the_replay_rebuilds_it(tmp_path, scheme):
    b = block(scheme=scheme, B=40 if scheme == "full_batch" else 10, C_scales_with_subset=True)
    sink = emp.LedgerSink(path=tmp_path / "l.jsonl", stage="test", config_id="t", seed=0, delta=1e-5,
                          pld=acc.PLDSettings(1e-2, -20.0))
    entry = emp.record_block(sink, b)
    assert entry.event == ledger.event_to_dict(b.event) and entry.count == 6
    assert entry.extra["C"] == b.C_eff and entry.extra["k_steps"] == 7 and entry.sensitivity == b.sensitivity
    (_, read), = list(ledger.read_ledger(sink.path))
    rebuild.check(read)  # the replay's rebuild derives the same event from the line's parameters


def test_the_sampled_cell_and_the_accounting_table_share_one_block():
    """A hybrid cell's block (sampler, ledger line, Table 8) is the accounting grid's block for its (p, B)."""
    cfg = AccountingConfig.from_params({"accounting": {**ACCOUNTING, "p": [55], "B": [10], "N_out": 6}, "n": 40})
    (row,) = block_plan(cfg)
    cell = cell_block(Cell("hybrid", 0, 1.0, 55, 10, 2), ACCOUNTING, n=40, n_out=6)
    assert (row["k_steps"], row["q_B"], row["t0"]) == (cell.k, cell.q_B, cell.t0)
    assert row["mu_bar_B"] == cell.mu_bar_B  # the same code on the same symbols: bit for bit


@pytest.mark.parametrize("cell", [Cell("hybrid", 0, 2.0, 55, 10, 2), Cell("per_step", 0, 1.0, 65, 5, 2),
                                  Cell("full_batch", 0, 1.0, sigma_min=0.5)])
def test_the_manifest_facts_rebuild_the_block_bit_for_bit(cell):
    b = cell_block(cell, ACCOUNTING, n=40, n_out=6)
    s = b.schedule
    facts = {**cell.as_dict(), "n_out": 6, "N": s.N, "sigma_max": s.sigma_max, "rho": s.rho,
             "sigma_min_schedule": s.sigma_min, **b.facts()}
    again = EmpdenBlock.from_facts(facts)
    assert again.mu_bar_B == b.mu_bar_B and again.event == b.event and again.C_eff == b.C_eff

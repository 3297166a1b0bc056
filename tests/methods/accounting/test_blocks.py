"""EMPDEN accounting stages: blocks, Tables 7, 8/9, 11, 12, 13, and their ledger claims."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.methods.accounting import blocks as empden
from pipeline.config import validate_config
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.stage import PipelineError


def params(**accounting) -> dict:
    section = validate_config({"accounting": {"N_out": 200, "discretisation": 1e-3, "B": [25, 50], "p": [55, 62],
                                              **accounting}}, source="params")["accounting"]
    return {"accounting": section, "n": 3000, "config_id": "cfg123", "seed": 7,
            "ledger_binding": {"run": "empden_blocks", "experiment": "exp"}}


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    out = tmp_path_factory.mktemp("acc")
    paths = {"blocks": out / "blocks.json", "ledger": out / "ledger" / "empden_blocks.jsonl"}
    empden.empden_blocks({}, paths, params(mu_bar_B=[0.5, 1.0]))
    return paths


def test_blocks_follow_the_schedule_and_q_is_b_over_n(blocks):
    meta, df = empden.read_blocks(blocks["blocks"])
    grid = df[df["source"] == "schedule"]
    assert len(grid) == 4 and set(grid["B"]) == {25, 50}
    assert grid["q_B"].tolist() == pytest.approx([b / 3000 for b in grid["B"]])
    # C_scales_with_subset (default): mu_bar_B does not depend on B; a longer block leaks more
    by_p = grid.groupby("p_percent")["mu_bar_B"]
    assert (by_p.nunique() == 1).all() and by_p.first().is_monotonic_increasing


def test_certified_eps_orders_the_accountants(blocks):
    _, df = empden.read_blocks(blocks["blocks"])
    assert (df["eps_lower_estimate"] <= df["eps_upper_bound"]).all()
    assert (df["eps_upper_bound"] <= df["eps_rdp_bound"]).all()
    assert (df["eps_rdp_bound"] <= df["eps_rdp_bound_strict_delta"]).all()
    grid = df[df["source"] == "schedule"].sort_values(["p_percent", "B"])
    # more private steps or a larger subsample cost more
    for _, rows in grid.groupby("p_percent"):
        assert rows["eps_upper_bound"].is_monotonic_increasing
    for _, rows in grid.groupby("B"):
        assert rows["eps_upper_bound"].is_monotonic_increasing


def test_every_block_is_claimed_in_the_ledger(blocks):
    _, df = empden.read_blocks(blocks["blocks"])
    entries = [e for _, e in ledger.read_ledger(blocks["ledger"])]
    assert len(entries) == len(df)
    assert [e.claimed_epsilon for e in entries] == df["eps_upper_bound"].tolist()
    first = entries[0]
    assert first.accountant["name"] == "pld_pessimistic" and first.config_id == "cfg123" and first.seed == 7
    assert first.dp_event() == acc.outputwise_event(df["mu_bar_B"][0], df["q_B"][0], 200)


@pytest.mark.parametrize("stage_fn, columns", [
    (empden.empden_table7_accountants, ["eps_edgeworth_estimate", "eps_lower_estimate", "eps_upper_bound",
                                        "eps_rdp_bound"]),
    (empden.empden_table8_9_eps, ["p_percent", "B", "eps_lower_estimate", "eps_upper_bound", "edgeworth_valid"]),
    (empden.empden_table11_edgeworth_clt_pld, ["eps_edgeworth_estimate", "eps_clt_estimate", "eps_upper_bound"]),
    (empden.empden_table12_rdp, ["eps_rdp_bound", "delta_strict", "eps_rdp_bound_strict_delta"]),
])
def test_tables_carry_their_columns_and_provenance(blocks, tmp_path, stage_fn, columns):
    out = tmp_path / f"{stage_fn.name}.parquet"
    stage_fn({"blocks": blocks["blocks"]}, {"table": out}, {})
    df = pd.read_parquet(out)
    assert set(columns) <= set(df.columns)
    assert (df["config_id"] == "cfg123").all() and (df["seed"] == 7).all()
    assert (df["discretisation"] == 1e-3).all()


def test_mu_bar_given_directly_feeds_tables_7_11_12(blocks, tmp_path):
    out = tmp_path / "t7.parquet"
    empden.empden_table7_accountants({"blocks": blocks["blocks"]}, {"table": out}, {})
    df = pd.read_parquet(out)
    assert df["source"].tolist() == ["given", "given"] and df["mu_bar_B"].tolist() == [0.5, 1.0]
    assert df["p_percent"].tolist() == [55.0, 62.0]  # paired with p: same length
    assert df["q_B"].tolist() == pytest.approx([25 / 3000] * 2)
    assert (df["grid"] == "paper: accounting.mu_bar_B given directly").all()  # says which grid it is


def test_table8_9_holds_the_grid_only(blocks, tmp_path):
    out = tmp_path / "t8.parquet"
    empden.empden_table8_9_eps({"blocks": blocks["blocks"]}, {"table": out}, {})
    df = pd.read_parquet(out)
    assert set(df["source"]) == {"schedule"}
    # the paper's p x B grid, not the sampled cells (those are Table 8's join): the table says so
    assert (df["grid"] == "paper: accounting.p x accounting.B").all()


def test_a_grid_row_is_the_block_the_sampler_would_run(blocks):
    """mu_bar_B, q_B and t0 of every grid row are those of AccountingConfig.block(B, p): one value."""
    cfg = empden.AccountingConfig.from_params(params())
    _, df = empden.read_blocks(blocks["blocks"])
    for _, row in df[df["source"] == "schedule"].iterrows():
        block = cfg.block(int(row["B"]), p_percent=row["p_percent"])
        assert (row["mu_bar_B"], row["q_B"], row["t0"], row["k_steps"]) == (block.mu_bar_B, block.q_B, block.t0,
                                                                            block.k)


def test_subsample_larger_than_the_data_is_one_line_error(tmp_path):
    p = params(B=[5000])
    with pytest.raises(PipelineError, match="exceeds the private set size n=3000"):
        empden.empden_blocks({}, {"blocks": tmp_path / "b.json", "ledger": tmp_path / "l.jsonl"}, p)


def test_table13_asr_grows_with_the_private_block_and_q(tmp_path):
    out = tmp_path / "t13.parquet"
    empden.empden_table13_theoretical_asr({}, {"table": out}, params(asr_N=40, asr_q=[0.01, 0.1], N_out=50))
    df = pd.read_parquet(out)
    assert len(df) == 8 and list(df["stopping_point"][:4]) == ["T", "3T/4", "T/2", "T/4"]
    for _, rows in df.groupby("q"):
        assert rows["asr_upper_bound"].is_monotonic_increasing
        assert (rows["asr_upper_bound"] >= 0.5).all() and (rows["asr_upper_bound"] <= 1).all()
    low, high = (df[df["q"] == q]["eps_upper_bound"].to_numpy() for q in (0.01, 0.1))
    assert (low < high).all()


def test_paper_table7_input_through_the_stage(tmp_path):
    """EMPDEN Table 7's 55% row fed as mu_bar_B at the paper's settings: eps_u within 2% of 0.2988."""
    p = params(mu_bar_B=[0.69], B=[25], p=[55], N_out=50000, discretisation=1e-5)
    p["n"] = 50000
    empden.empden_blocks({}, {"blocks": tmp_path / "b.json", "ledger": tmp_path / "l.jsonl"}, p)
    empden.empden_table7_accountants({"blocks": tmp_path / "b.json"}, {"table": tmp_path / "t7.parquet"}, {})
    row = pd.read_parquet(tmp_path / "t7.parquet").iloc[0]
    assert row["eps_upper_bound"] == pytest.approx(0.2988, rel=0.02)
    assert row["eps_edgeworth_estimate"] == pytest.approx(row["eps_upper_bound"], rel=0.01)
    claims = [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert claims[-1]["claimed_epsilon"] == row["eps_upper_bound"] and claims[-1]["extra"]["source"] == "given"

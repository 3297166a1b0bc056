"""The accounting method's wiring (pipeline/methods/accounting/wiring.py): EMPDEN's sampling-time accounting tables
and figures, the block ledger, and the ledger replay's inputs and params."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.config import ConfigError
from pipeline.methods.accounting.wiring import EPS_KEYS, GRID_KEYS, Wiring, mechanism
from pipeline.registry import TranscriptSpec
from pipeline.wiring import House
from tests.methods import house


def test_accounting_reports_tables_7_to_13_and_figures_4_5_7(tmp_path):
    t, f = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    assert Wiring(house(tmp_path)).targets() == [
        t / "empden_table7_accountants.parquet", t / "empden_table8_9_eps.parquet",
        t / "empden_table11_edgeworth_clt_pld.parquet", t / "empden_table12_rdp.parquet",
        t / "empden_table13_theoretical_asr.parquet", f / "empden_figure4_full_batch.png",
        f / "empden_figure5_mu_vs_logsnr.png", f / "empden_figure7_stopping_traces.png"]


def test_the_mechanism_is_the_section_without_its_table_grids(tmp_path):
    h = house(tmp_path)
    acc = Wiring(h)
    assert acc.section is h.config["accounting"]
    assert acc.mechanism == mechanism(h.config["accounting"])
    assert set(acc.mechanism) == set(h.config["accounting"]) - set(GRID_KEYS)
    assert {"sigma_min", "sigma_max", "rho", "N", "C", "beta", "delta", "discretisation"} <= set(acc.mechanism)
    assert not {"p", "B", "asr_q", "rdp_orders"} & set(acc.mechanism)
    assert acc.eps_settings() == {"delta": 1e-5, "discretisation": 0.001, "log_mass_truncation": -50.0,
                                  "rdp_orders": "dp_accounting"}
    assert set(EPS_KEYS) == set(acc.eps_settings())


def test_n_is_accounting_n_else_the_private_set_size(tmp_path):
    assert Wiring(house(tmp_path)).n == 2500

    def n(cfg):
        cfg["accounting"] = {"n": 60000}
    assert Wiring(house(tmp_path, n)).n == 60000


def test_a_method_that_needs_n_without_one_is_a_config_error(tmp_path):
    h = house(tmp_path)
    cfg = copy.deepcopy(dict(h.config))
    cfg["data"]["private"]["n_private_train"] = None
    with pytest.raises(ConfigError, match="config error at accounting.n: set it when data.private.n_private_train "
                                          "is null"):
        Wiring(House(cfg, h.layout, 1))
    cfg["methods"] = ["dpdm", "sensgeo"]
    assert Wiring(House(cfg, h.layout, 1)).n is None


def test_the_blocks_and_their_ledger(tmp_path):
    h = house(tmp_path)
    acc = Wiring(h)
    assert acc.blocks == tmp_path / "r" / "digits" / "accounting" / "empden_blocks.json"
    assert acc.ledger == tmp_path / "r" / "digits" / "ledger" / "empden_blocks.jsonl"
    assert acc.n_blocks == 5 * 4  # p x B, no mu_bar_B
    cfg = copy.deepcopy(dict(h.config))
    cfg["accounting"]["mu_bar_B"] = [1.0, 2.0]
    assert Wiring(House(cfg, h.layout, 1)).n_blocks == 22
    assert acc.transcripts() == {acc.ledger: TranscriptSpec(claims=20, run="empden_blocks", stage="empden_blocks",
                                                            delta=1e-5, configuration=True)}
    assert acc.runtime_min >= 1 and acc.mem_mb >= 500


def test_the_accounting_params_carry_the_whole_section_n_and_the_seed(tmp_path):
    h = house(tmp_path)
    acc = Wiring(h)
    p = json.loads(acc.params())
    assert p["accounting"] == h.config["accounting"] and p["n"] == 2500 and p["seed"] == 0
    b = json.loads(acc.blocks_params())
    assert b["ledger_binding"] == {"run": "empden_blocks", "experiment": "digits"}
    # the binding is runtime: the blocks compute what the tables do
    assert b["config_id"] == p["config_id"]


def test_the_replay_reads_every_transcript_by_stem_and_checks_it_against_its_spec(tmp_path):
    acc = Wiring(house(tmp_path))
    spec = TranscriptSpec(claims=1, run="r", stage="s", delta=1e-5, data="d.npz")
    paths = [tmp_path / "ledger" / "a_b.jsonl", str(tmp_path / "ledger" / "c.jsonl")]
    assert acc.replay_inputs(paths) == {"a_b": paths[0], "c": paths[1]}
    p = json.loads(acc.replay_params({paths[0]: spec}))
    assert p["expected"] == {"a_b": spec.as_dict()} and p["experiment"] == "digits" and "config_id" in p

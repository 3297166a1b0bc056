"""The accounting method's wiring (pipeline/methods/accounting/wiring.py): EMPDEN's sampling-time accounting tables
and figures, the block ledger, and the ledger replay's inputs and params."""

from __future__ import annotations

import copy
import json
import math

import pytest

from pipeline.config import ConfigError
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.methods.accounting import costs
from pipeline.methods.accounting.wiring import EPS_KEYS, GRID_KEYS, Wiring, line_params, mechanism
from pipeline.registry import TranscriptSpec
from pipeline.wiring import House
from tests.methods import check_requests, house


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
    (spec,) = acc.transcripts().values()
    assert list(acc.transcripts()) == [acc.ledger]
    assert (spec.claims, spec.run, spec.stage, spec.delta, spec.data, spec.configuration) == (
        20, "empden_blocks", "empden_blocks", 1e-5, None, True)
    # configuration claims: their noise is the configuration's, nothing is calibrated
    assert spec.epsilon_target == (None,) * 20 and len(spec.params) == 20
    requests = check_requests(acc, "account.smk", costs.REQUESTS)
    # every job that accounts every block asks for their count; the tables that read the block file are light
    assert acc.resources("empden_blocks") == requests["replay"] == {"mem_mb": 4000, "runtime": 30 + 20}
    assert requests["empden_table7_accountants"] == {"mem_mb": 1000, "runtime": 5}


def block_claims(tmp_path, edit=None) -> list[dict]:
    """The registered parameters of each line of the block ledger under config.yaml edited by ``edit``."""
    (spec,) = Wiring(house(tmp_path, edit)).transcripts().values()
    return [dict(p) for p in spec.params]


def test_each_grid_blocks_claim_is_registered_with_the_block_the_configuration_accounts(tmp_path):
    """config.yaml's accounting: p x B = [55, 62, 65, 67, 70] x [25, 50, 100, 200] on the 39-step EDM grid, C = 0.5
    scaled with the subset, beta = 1, N_out = 1000 outputs, n = the 2,500 private records."""
    claims = block_claims(tmp_path)
    first = claims[0]  # p = 55%, B = 25
    assert first == {
        "mechanism": "empden_outputwise_block", "count": 1000,
        "sampling.scheme": "fixed_size_per_output", "sampling.B": 25, "sampling.n": 2500,
        "sampling.probability": 25 / 2500,
        "extra.kind": "configuration_claim", "extra.proposition": "EMPDEN Prop. 4.1", "extra.source": "schedule",
        "extra.p_percent": 55, "extra.k_steps": math.ceil(0.55 * 39), "extra.sigma_min": 0.002,
        "extra.sigma_max": 80.0, "extra.rho": 7.0, "extra.N": 39, "extra.C": 0.5 * 25, "extra.beta": 1.0,
        "extra.mu_bar_B": first["extra.mu_bar_B"]}
    # the grid is p-major; every block a schedule's, none given
    assert [(c["extra.p_percent"], c["sampling.B"]) for c in claims] == [
        (p, B) for p in (55, 62, 65, 67, 70) for B in (25, 50, 100, 200)]
    assert {c["extra.source"] for c in claims} == {"schedule"}
    assert [c["extra.k_steps"] for c in claims[::4]] == [22, 25, 26, 27, 28]  # ceil(p N / 100)
    # with C scaled by the subset mu_bar_B does not depend on B: EMPDEN Table 7's 0.69, 1.56, 2.09, 2.84
    assert [round(c["extra.mu_bar_B"], 2) for c in claims[:16:4]] == [0.69, 1.56, 2.09, 2.84]
    assert all(c["extra.mu_bar_B"] == claims[i - i % 4]["extra.mu_bar_B"] for i, c in enumerate(claims))


def test_the_registered_block_claims_follow_the_configuration(tmp_path):
    def edit(cfg):
        cfg["accounting"] = {"p": [50], "B": [40, 80], "beta": 2.0, "C": 0.25, "C_scales_with_subset": False,
                             "N": 20, "sigma_max": 40.0, "N_out": 300, "n": 4000}

    claims = block_claims(tmp_path, edit)
    assert [(c["sampling.B"], c["sampling.n"], c["sampling.probability"], c["count"]) for c in claims] == [
        (40, 4000, 40 / 4000, 300), (80, 4000, 80 / 4000, 300)]
    assert all((c["extra.k_steps"], c["extra.N"], c["extra.sigma_max"], c["extra.C"], c["extra.beta"]) ==
               (10, 20, 40.0, 0.25, 2.0) for c in claims)
    # a fixed C: mu_t = 2C/(beta B) sqrt(2 dt / t^3), so doubling B halves mu_bar_B
    t = EDMSchedule(sigma_max=40.0, N=20).times()
    mu = [math.sqrt(sum((2 * 0.25 / (2.0 * B)) ** 2 * 2 * (t[i] - t[i + 1]) / t[i] ** 3 for i in range(10)))
          for B in (40, 80)]
    assert [c["extra.mu_bar_B"] for c in claims] == pytest.approx(mu, rel=1e-12)


def test_only_the_blocks_the_configuration_gives_directly_are_registered_as_given(tmp_path):
    def given(values):
        def edit(cfg):
            cfg["accounting"] = {"mu_bar_B": values}
        return edit

    claims = block_claims(tmp_path, given([0.69, 1.56]))
    assert len(claims) == 22 and {c["extra.source"] for c in claims[:20]} == {"schedule"}
    # unpaired with p (2 values, 5 p): no p; at the grid's smallest B; no schedule behind them
    assert claims[20:] == [{"mechanism": "empden_outputwise_block", "count": 1000,
                            "sampling.scheme": "fixed_size_per_output", "sampling.B": 25, "sampling.n": 2500,
                            "sampling.probability": 0.01, "extra.kind": "configuration_claim",
                            "extra.proposition": "EMPDEN Prop. 4.1", "extra.source": "given", "extra.mu_bar_B": mu,
                            "extra.p_percent": None, "extra.k_steps": -1} for mu in (0.69, 1.56)]
    paired = block_claims(tmp_path, given([0.5, 1.0, 1.5, 2.0, 2.5]))
    assert [c["extra.p_percent"] for c in paired[20:]] == [55, 62, 65, 67, 70]


def test_line_params_are_a_lines_fields_as_dotted_paths():
    assert line_params({"mechanism": "m", "count": 3, "sampling": {"n": 10, "B": 2}, "extra": {"C": 1.0}}) == {
        "mechanism": "m", "count": 3, "sampling.n": 10, "sampling.B": 2, "extra.C": 1.0}


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
    spec = TranscriptSpec(claims=1, run="r", stage="s", delta=1e-5, data="d.npz", params={"count": 1})
    paths = [tmp_path / "ledger" / "a_b.jsonl", str(tmp_path / "ledger" / "c.jsonl")]
    assert acc.replay_inputs(paths) == {"a_b": paths[0], "c": paths[1]}
    p = json.loads(acc.replay_params({paths[0]: spec}))
    assert p["expected"] == {"a_b": spec.as_dict()} and p["experiment"] == "digits" and "config_id" in p

"""EMPDEN's wiring (pipeline/methods/empden/wiring.py): its cells' paths and params, the tables' inputs, its targets
per switch of the empden section, its transcripts and all_runs records."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path


from pipeline.methods.accounting.wiring import GRID_KEYS
from pipeline.methods.empden.wiring import FIGURE2, LABELS, Wiring
from pipeline.sampling.empden_grid import grid_cells
from pipeline.wiring import House
from tests.methods import house


def edited(h: House, **empden) -> House:
    """The same house with config ``empden`` keys replaced (the wiring reads them, it does not validate)."""
    cfg = copy.deepcopy(dict(h.config))
    cfg["empden"].update(empden)
    return House(cfg, h.layout, h.torch_threads)


HYBRID = {"p": "50", "B": "100", "T": "3", "beta": "1", "seed": "0"}


def test_the_cells_are_the_grids(tmp_path):
    h = house(tmp_path)
    assert Wiring(h).section is h.config["empden"]
    cells = Wiring(h).cells()
    assert cells == grid_cells(h.config["empden"], h.config["accounting"])
    names = [c.name for c in cells]
    assert "hybrid/p50_B100_T3_beta1_s0" in names and "per_step/p50_B100_T3_beta1_s0" in names
    assert "hybrid/p50_B100_T3_beta0p5_s0" in names  # the beta ablation
    assert "full_batch/smin0p002_beta1_s0" in names and names[-1] == "public_only/s0"


def test_a_cells_files(tmp_path):
    em, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    cell = next(c for c in em.cells() if c.name == "hybrid/p50_B100_T3_beta1_s0")
    assert em.samples == exp / "samples" / "empden"
    assert em.sample_path(cell) == exp / "samples" / "empden" / "hybrid" / "p50_B100_T3_beta1_s0.npz"
    assert em.metrics_path(cell) == exp / "eval" / "empden" / "hybrid" / "p50_B100_T3_beta1_s0" / "metrics.json"
    assert em.ledger_path(cell) == exp / "ledger" / "empden_sample_hybrid_p50_B100_T3_beta1_s0.jsonl"
    assert em.table8 == tmp_path / "r" / "tables" / "empden_table8_grid.parquet"
    assert em.figure2_ledger == exp / "ledger" / "empden_figure2_trajectories.jsonl"


def test_the_public_marginal_normaliser_reads_the_public_split(tmp_path):
    h = house(tmp_path)
    em = Wiring(h)
    assert em.normaliser_input == {"public_data": tmp_path / "r" / "digits" / "data" / "public.npz"}
    assert em.normaliser_params == {"normaliser": "public_marginal", "normaliser_n": None}
    args = em.normaliser_args(None, {"public_data": "a b.npz", "private": "p.npz"})
    assert shlex.split(args) == ["public_data=a b.npz"]
    const = Wiring(edited(h, normaliser="constant"))
    assert const.normaliser_input == {} and const.normaliser_args(None, {"private": "p.npz"}) == " "


def test_a_cells_params_hold_the_mechanism_not_the_accounting_grids(tmp_path):
    h = house(tmp_path)
    em = Wiring(h)
    p = json.loads(em.sample_params("hybrid", HYBRID))
    assert p["cell"] == {"method": "hybrid", "seed": 0, "beta": 1.0, "p_percent": 50.0, "B": 100, "T": 3,
                         "sigma_min": None, "cell": "hybrid/p50_B100_T3_beta1_s0"}
    assert not set(GRID_KEYS) & set(p["accounting"]) and p["accounting"]["C"] == 0.5
    assert p["ledger_binding"] == {"run": "empden_sample_hybrid_p50_B100_T3_beta1_s0", "experiment": "digits"}
    assert p["batch_size"] == 256 and p["normaliser"] == "public_marginal" and "normaliser_n" in p
    assert p["n_out"] >= 1 and p["threads"] == h.torch_threads
    # a wider accounting table grid reruns no cell
    cfg = copy.deepcopy(dict(h.config))
    cfg["accounting"]["p"] = [*cfg["accounting"]["p"], 80]
    assert Wiring(House(cfg, h.layout, h.torch_threads)).sample_params("hybrid", HYBRID) == em.sample_params(
        "hybrid", HYBRID)
    fb = json.loads(em.sample_params("full_batch", {"smin": "0p002", "beta": "1", "seed": "0"}))
    assert fb["cell"]["sigma_min"] == 0.002 and fb["cell"]["method"] == "full_batch"
    assert em.sample_mem_mb >= 1 and em.sample_runtime_min >= 1


def test_the_tables_and_figures_params(tmp_path):
    h = house(tmp_path)
    em = Wiring(h)
    assert json.loads(em.table8_params())["accounting"] == {"delta": 1e-5, "discretisation": 0.001,
                                                            "log_mass_truncation": -50.0,
                                                            "rdp_orders": "dp_accounting"}
    assert {k: v for k, v in json.loads(em.table2_params()).items() if k != "config_id"} == {"beta": 1.0}
    t3 = json.loads(em.table3_params())
    assert t3["beta_ablation"] == {"p": 50, "B": 100, "T": 3, "beta": [0.5, 1, 2]} and t3["seed"] == 0
    t10 = json.loads(em.table10_params())
    assert t10["repeated_seeds"]["seeds"] == [0, 1] and t10["beta"] == 1.0
    assert {k: v for k, v in json.loads(em.figure3_params()).items() if k != "config_id"} == {"beta": 1.0, "seed": 0}
    assert json.loads(em.figure4_params())["n_images"] == 8
    f2 = json.loads(em.figure2_params())
    assert f2["figure2"] == {"p": 50, "B": 100, "T": 3} and f2["ledger_binding"]["run"] == FIGURE2
    assert not set(GRID_KEYS) & set(f2["accounting"]) and f2["normaliser"] == "public_marginal"


def test_the_tables_inputs(tmp_path):
    em = Wiring(house(tmp_path))
    cells = em.cells()
    ins = em.table8_inputs()
    assert len(ins) == 2 * len(cells)
    assert ins["samples_0"] == em.sample_path(cells[0]) and ins[f"metrics_{len(cells) - 1}"] == em.metrics_path(
        cells[-1])
    f4 = em.figure4_inputs()
    assert [Path(p).name for p in f4.values()] == ["smin0p002_beta1_s0.npz", "smin0p1_beta1_s0.npz",
                                                   "smin0p5_beta1_s0.npz", "smin5_beta1_s0.npz"]


def test_table2_reads_the_prior_methods_tables_only_when_they_are_chosen(tmp_path):
    t = tmp_path / "r" / "tables"
    assert Wiring(house(tmp_path)).table2_prior_inputs() == {"baselines": t / "baselines.parquet",
                                                             "dpdm": t / "dpdm_table_main.parquet"}

    def only_empden(cfg):
        cfg["methods"] = ["accounting", "empden"]
    assert Wiring(house(tmp_path, only_empden)).table2_prior_inputs() == {}
    args = Wiring.table2_prior_args(None, {"grid": "g.parquet", "dpdm": "d d.parquet"})
    assert shlex.split(args) == ["dpdm=d d.parquet"]
    assert Wiring.table2_prior_args(None, {"grid": "g.parquet"}) == ""


def test_the_targets_follow_the_empden_switches(tmp_path):
    h = house(tmp_path)
    t, f = tmp_path / "r" / "tables", tmp_path / "r" / "figures"
    always = [t / "empden_table8_grid.parquet", t / "empden_table2_comparison.parquet",
              f / "empden_figure3_tradeoffs.png"]
    assert Wiring(h).targets() == [*always, t / "empden_table3_beta.parquet", t / "empden_table10_seeds.parquet",
                                   f / "empden_figure4_samples.png", f / "empden_figure2_trajectories.png"]
    off = edited(h, beta_ablation=None, repeated_seeds=None, figure2=None,
                 full_batch={**h.config["empden"]["full_batch"], "sigma_min": []})
    assert Wiring(off).targets() == always


def test_every_private_cell_and_figure2_writes_its_own_transcript(tmp_path):
    h = house(tmp_path)
    em = Wiring(h)
    specs = em.transcripts()
    private = [c for c in em.cells() if c.private]
    assert list(specs) == [*(em.ledger_path(c) for c in private), em.figure2_ledger]
    one = specs[em.ledger_path(private[0])]
    assert (one.claims, one.run, one.stage, one.delta) == (1, private[0].ledger_stem, "empden_sample", 1e-5)
    assert one.as_dict()["data"] == str(tmp_path / "r" / "digits" / "data" / "private_train.npz")
    f2 = specs[em.figure2_ledger]
    assert (f2.claims, f2.run, f2.stage) == (2, FIGURE2, FIGURE2)
    assert em.figure2_ledger not in Wiring(edited(h, figure2=None)).transcripts()


def test_all_runs_records_every_cell_and_draws_all_but_full_batch(tmp_path):
    em, exp = Wiring(house(tmp_path)), tmp_path / "r" / "digits"
    recs = {r.config: r for r in em.records()}
    assert list(recs) == [c.name for c in em.cells()]
    hyb = recs["hybrid/p50_B100_T3_beta1_s0"]
    assert hyb.method == "empden" and hyb.label == LABELS["hybrid"] and hyb.in_figure and hyb.private
    assert [Path(p) for p in hyb.ledgers] == [exp / "ledger" / "empden_sample_hybrid_p50_B100_T3_beta1_s0.jsonl"]
    assert [Path(p) for p in hyb.benchmarks] == [
        exp / "benchmarks" / "empden_sample" / "hybrid" / "p50_B100_T3_beta1_s0.tsv",
        exp / "benchmarks" / "empden_evaluate" / "hybrid" / "p50_B100_T3_beta1_s0.tsv"]
    assert not recs["full_batch/smin5_beta1_s0"].in_figure
    # the hybrid sampler is the paper's method: its cells alone are the headline's candidates
    assert {c.split("/")[0] for c, r in recs.items() if r.headline} == {"hybrid"}
    pub = recs["public_only/s0"]
    assert not pub.private and pub.ledgers == () and pub.in_figure and pub.label == "public denoiser only (EMPDEN)"

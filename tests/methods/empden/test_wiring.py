"""EMPDEN's wiring (pipeline/methods/empden/wiring.py): its cells' paths and params, the tables' inputs, its targets
per switch of the empden section, its transcripts and all_runs records."""

from __future__ import annotations

import copy
import json
import math
import shlex
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.methods.accounting.wiring import GRID_KEYS
from pipeline.methods.empden import costs
from pipeline.methods.empden.wiring import FIGURE2, LABELS, Wiring
from pipeline.methods.empden.grid import Cell, grid_cells
from pipeline.wiring import House
from tests.methods import check_requests, house


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
    requests = check_requests(em, "empden.smk", costs.REQUESTS)
    assert requests["empden_sample_subsampled"]["mem_mb"] == costs.sample_mem_mb(h.config) >= 4000
    # each job's runtime is its own cell's (pipeline/methods/empden/costs.py), read from its wildcards
    for rule, wildcards in (("empden_sample_subsampled", dict(HYBRID, method="hybrid")),
                            ("empden_sample_full_batch", {"smin": "0p002", "beta": "1", "seed": "0"}),
                            ("empden_sample_public_only", {"seed": "0"})):
        assert requests[rule]["runtime"](wildcards) >= 15
    # the evaluation core's, at the cell's n_out (a shard's features: at its share)
    assert requests["empden_features"]["runtime"] >= 5 and requests["empden_evaluate"]["runtime"] >= 5


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
    # EMPDEN's noise is configured, not calibrated: every line's parameters fix its event
    assert all(s.epsilon_target == (None,) * s.claims and len(s.params) == s.claims for s in specs.values())


def lines(em: Wiring, name: str) -> list[dict]:
    """The registered parameters of each line of the transcript of cell ``name``."""
    return [dict(p) for p in em.transcripts()[em.ledger_path(Cell.from_name(name))].params]


def test_a_hybrid_cells_line_is_registered_with_the_block_the_configuration_runs(tmp_path):
    """config.yaml: the cell's p = 50% of the 39-step EDM grid (sigma 0.002 .. 80, rho 7) over B = 100 of the 2,500
    private records, C = 0.5 scaled with the subset, beta = 1, 250 outputs (empden.n_out)."""
    (line,) = lines(Wiring(house(tmp_path)), "hybrid/p50_B100_T3_beta1_s0")
    k = math.ceil(0.50 * 39)
    assert line == {"mechanism": "empden_outputwise_block", "count": 250,
                    "sampling.scheme": "fixed_size_per_output", "sampling.B": 100, "sampling.n": 2500,
                    "sampling.probability": 100 / 2500,
                    "extra.sigma_min": 0.002, "extra.sigma_max": 80.0, "extra.rho": 7.0, "extra.N": 39,
                    "extra.k_steps": k, "extra.t_end": EDMSchedule(N=39).times()[k], "extra.C": 0.5 * 100,
                    "extra.beta": 1.0}


def test_each_sampler_and_cell_registers_its_own_block(tmp_path):
    em = Wiring(house(tmp_path))
    (per_step,) = lines(em, "per_step/p50_B100_T3_beta1_s0")
    assert (per_step["mechanism"], per_step["sampling.scheme"]) == ("empden_per_step_subsampled",
                                                                    "fixed_size_per_step")
    # full batch: every record at every one of the N_full_batch = 50 steps but the last, down to the cell's sigma_min
    (full,) = lines(em, "full_batch/smin0p1_beta1_s0")
    assert full["mechanism"] == "empden_full_batch" and "sampling.B" not in full
    assert (full["sampling.scheme"], full["sampling.n"], full["extra.N"], full["extra.k_steps"]) == (
        "none", 2500, 50, 49)
    assert (full["extra.sigma_min"], full["extra.C"]) == (0.1, 0.5 * 2500)
    # the beta ablation's cell runs at its own beta
    (ablated,) = lines(em, "hybrid/p50_B100_T3_beta0p5_s0")
    assert ablated["extra.beta"] == 0.5 and ablated["extra.C"] == 50.0
    # a cell of Table 10's repeated seeds: another p, another k
    (p30,) = lines(em, "hybrid/p30_B100_T3_beta1_s1")
    assert p30["extra.k_steps"] == math.ceil(0.30 * 39)


def test_the_registered_lines_follow_the_configuration(tmp_path):
    def edit(cfg):
        cfg["data"]["private"]["n_private_train"] = 2000
        cfg["accounting"] = {"N": 20, "C": 0.25, "C_scales_with_subset": False, "beta": 2.0, "sigma_max": 40.0}
        cfg["empden"] = {**cfg["empden"], "n_out": 120, "grid": [{"p": [40], "B": [50], "T": [2]}]}

    (line,) = lines(Wiring(house(tmp_path, edit)), "hybrid/p40_B50_T2_beta2_s0")
    assert (line["sampling.B"], line["sampling.n"], line["sampling.probability"], line["count"]) == (
        50, 2000, 50 / 2000, 120)
    assert (line["extra.N"], line["extra.k_steps"], line["extra.sigma_max"], line["extra.C"], line["extra.beta"]) == (
        20, math.ceil(0.40 * 20), 40.0, 0.25, 2.0)


def test_figure2s_two_lines_are_registered_output_wise_then_per_step(tmp_path):
    h = house(tmp_path)
    f2 = [dict(p) for p in Wiring(h).transcripts()[Wiring(h).figure2_ledger].params]
    assert [p["mechanism"] for p in f2] == ["empden_outputwise_block", "empden_per_step_subsampled"]
    # its 4 trajectories (the section's default n_rows) at figure2's p = 50%, B = 100
    assert all((p["count"], p["sampling.B"], p["extra.k_steps"], p["sampling.n"]) == (4, 100, 20, 2500) for p in f2)
    other = edited(h, figure2={"p": 30, "B": 50, "T": 2, "n_rows": 3})
    f2 = [dict(p) for p in Wiring(other).transcripts()[Wiring(other).figure2_ledger].params]
    assert all((p["count"], p["sampling.B"], p["extra.k_steps"]) == (3, 50, math.ceil(0.30 * 39)) for p in f2)


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


def sharded(tmp_path, shards: int = 3) -> Wiring:
    """EMPDEN's wiring with sampling.shards (batches of 100 outputs: the quick tour's 250 are 3 batches)."""
    return Wiring(house(tmp_path, lambda c: c.update(sampling={"shards": shards},
                                                      empden={**c["empden"], "batch_size": 100})))


def test_unsharded_a_cell_is_one_job_writing_the_cells_own_files(tmp_path):
    em = Wiring(house(tmp_path))
    assert not em.sharded and em.shards == 1
    exp = tmp_path / "r" / "digits"
    assert em.sample_outputs("{method}/p{p}_s{seed}") == {
        "samples": exp / "samples" / "empden" / "{method}" / "p{p}_s{seed}.npz",
        "manifest": exp / "samples" / "empden" / "{method}" / "p{p}_s{seed}.json",
        "ledger": exp / "ledger" / "empden_sample_{method}_p{p}_s{seed}.jsonl"}
    assert "ledger" not in em.sample_outputs("public_only/s{seed}", private=False)
    assert em.features_inputs({"cell": "hybrid/p50_B100_T3_beta1_s0"}) == {}
    assert em.features_args(None, {"clip": "c.pt"}) == ""
    cell = next(c for c in em.cells() if c.name == "hybrid/p50_B100_T3_beta1_s0")
    assert em.benchmarks(cell) == (exp / "benchmarks" / "empden_sample" / f"{cell.name}.tsv",
                                   exp / "benchmarks" / "empden_evaluate" / f"{cell.name}.tsv")
    assert "shard" not in json.loads(em.sample_params("hybrid", HYBRID))
    assert em.sample_job("public_only/s{seed}") == "public_only/s{seed}"
    assert em.sample_log(Path("logs"), "public_only_s{seed}") == Path("logs/empden_sample/public_only_s{seed}.log")


def test_sharded_each_shard_writes_its_part_and_the_gather_joins_them_into_the_cells_files(tmp_path):
    em = sharded(tmp_path)
    exp = tmp_path / "r" / "digits"
    out = em.sample_outputs("{method}/p{p}_s{seed}")
    assert out["samples"] == exp / "samples" / "empden" / "shards" / "{method}" / "p{p}_s{seed}" / "{shard,[0-9]+}.npz"
    assert out["ledger"] == exp / "ledger" / "shards" / "empden_sample_{method}_p{p}_s{seed}" / "{shard,[0-9]+}.jsonl"
    params = json.loads(em.sample_params("hybrid", {**HYBRID, "shard": "2"}))
    assert params["shard"] == {"index": 2, "of": 3} and params["n_out"] == 250 and params["batch_size"] == 100
    # every shard's line is bound to the cell's run
    assert params["ledger_binding"]["run"] == "empden_sample_hybrid_p50_B100_T3_beta1_s0"
    ins = em.gather_inputs({"method": "hybrid", "rest": "p50_B100_T3_beta1_s0"})
    cell = next(c for c in em.cells() if c.name == "hybrid/p50_B100_T3_beta1_s0")
    assert ins == {**{f"shard_{k}": em.shard_path(cell, k) for k in range(3)},
                   **{f"ledger_{k}": em.shard_ledger(cell, k) for k in range(3)}}
    assert set(em.gather_inputs({"method": "public_only", "rest": "s0"})) == {"shard_0", "shard_1", "shard_2"}
    gather = json.loads(em.gather_params({"method": "hybrid", "rest": "p50_B100_T3_beta1_s0"}))
    assert gather["cell"] == cell.as_dict() and gather["n_out"] == 250 and "shard" not in gather
    feats = em.features_inputs({"cell": cell.name})
    assert list(feats) == ["features_0", "features_1", "features_2"]
    assert shlex.split(em.features_args(None, {**{k: str(v) for k, v in feats.items()}, "clip": "c.pt"})) == [
        f"features_{k}={feats[f'features_{k}']}" for k in range(3)]
    # a shard's job: its own benchmark row, its own log, its own features
    assert em.sample_job("public_only/s{seed}") == "public_only/s{seed}/shard{shard}"
    assert em.sample_log(Path("logs"), "public_only_s{seed}") == Path("logs/empden_sample/public_only_s{seed}_shard{shard}.log")
    assert em.features_path(cell, 1) == exp / "eval" / "empden" / "shards" / cell.name / "1.features.npz"
    # the gather holds the cell's samples about twice beside the interpreter: 250 uint8 16x16 images add no MB
    assert em.resources("empden_gather") == {"mem_mb": 1000, "runtime": 10}
    bench = exp / "benchmarks"
    assert em.benchmarks(cell) == (*(bench / "empden_sample" / cell.name / f"shard{k}.tsv" for k in range(3)),
                                   bench / "empden_gather" / f"{cell.name}.tsv",
                                   *(bench / "empden_features" / cell.name / f"shard{k}.tsv" for k in range(3)),
                                   bench / "empden_evaluate" / f"{cell.name}.tsv")


def test_sharded_a_cells_transcript_holds_one_claim_per_shard(tmp_path):
    em = sharded(tmp_path)
    specs = em.transcripts()
    cells = [c for c in em.cells() if c.private]
    assert all(specs[em.ledger_path(c)].claims == 3 for c in cells)
    assert specs[em.figure2_ledger].claims == 2  # Figure 2 is one job whatever the shards
    # each shard's line counts the outputs it drew: 250 in batches of 100 over 3 jobs
    assert all([p["count"] for p in specs[em.ledger_path(c)].params] == [100, 100, 50] for c in cells)
    assert all(specs[em.ledger_path(c)].params[0] == {**specs[em.ledger_path(c)].params[2], "count": 100}
               for c in cells)
    # all_runs reads the joined transcript, one per cell
    assert all(r.ledgers == ((str(em.ledger_path(Cell.from_name(r.config))),) if r.private else ())
               for r in em.records())


def test_more_shards_than_a_cells_batches_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"sampling.shards: sampling.shards = 4 exceeds the 3 batch"):
        sharded(tmp_path, shards=4)


def test_every_private_cell_has_a_bundle_of_its_synthetic_set_and_the_public_only_cell_none(tmp_path):
    em = Wiring(house(tmp_path))
    private = [c for c in em.cells() if c.private]
    assert em.bundle_runs() == [c.name.replace("/", "_") for c in private] and len(private) < len(em.cells())
    cell = next(c for c in private if c.name == "hybrid/p50_B100_T3_beta1_s0")
    b = em.bundle("hybrid_p50_B100_T3_beta1_s0")
    assert b.kind == "synthetic" and b.model is None and b.epsilon_target is None
    assert (b.samples, b.metrics, b.transcripts) == (str(em.sample_path(cell)), str(em.metrics_path(cell)),
                                                     (str(em.ledger_path(cell)),))

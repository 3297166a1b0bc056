# EMPDEN's wiring functions (rules/empden.smk includes this file): its cells, their paths and
# params, the tables' inputs, its targets and transcripts. Cells and their names: pipeline/sampling/empden_grid.py.
from pipeline.runs import NUMBER_PATTERN
from pipeline.sampling.empden_grid import CELL_PATTERN, cell_from_wildcards, grid_cells


def empden_cells():
    """Every EMPDEN sampling cell of the config."""
    return grid_cells(config["empden"], config["accounting"])


def empden_sample_path(cell):
    return EMPDEN_SAMPLES / f"{cell.name}.npz"


def empden_metrics_path(cell):
    return EXPDIR / "eval" / "empden" / cell.name / "metrics.json"


def empden_ledger_claims():
    """Each cell that reads private data writes its own transcript (parallel jobs never append to the
    same file) with one claim, bound to the cell (its ledger stem); Figure 2 writes two (output-wise and
    per-step). Every line at the accounting delta, on the private split."""
    common = dict(delta=config["accounting"]["delta"], data=DATA / "private_train.npz")
    claims = {EXPDIR / "ledger" / f"{c.ledger_stem}.jsonl": TranscriptSpec(claims=1, run=c.ledger_stem,
                                                                           stage="empden_sample", **common)
              for c in empden_cells() if c.private}
    if config["empden"]["figure2"]:
        claims[EMPDEN_FIGURE2_LEDGER] = TranscriptSpec(claims=2, run="empden_figure2_trajectories",
                                                       stage="empden_figure2_trajectories", **common)
    return claims


def empden_targets():
    """EMPDEN grid tables and figures: the main grid always, the rest as the empden section asks."""
    e = config["empden"]
    out = [EMPDEN_TABLE8, TABLES / "empden_table2_comparison.parquet", FIGURES / "empden_figure3_tradeoffs.png"]
    if e["beta_ablation"]:
        out.append(TABLES / "empden_table3_beta.parquet")
    if e["repeated_seeds"]:
        out.append(TABLES / "empden_table10_seeds.parquet")
    if e["full_batch"]["sigma_min"]:
        out.append(FIGURES / "empden_figure4_samples.png")
    if e["figure2"]:
        out.append(FIGURES / "empden_figure2_trajectories.png")
    return out


def empden_sample_params(method, wildcards):
    """Stage params of one cell, parsed from its target path's wildcards."""
    cell = cell_from_wildcards(method, wildcards)
    return stage_params(cell=cell.as_dict(), accounting=ACCOUNTING_MECHANISM, n_out=cost.empden_n_out(config),
                        batch_size=config["empden"]["batch_size"], device=config["device"],
                        threads=TORCH_THREADS, ledger_binding=ledger_binding(cell.ledger_stem),
                        **EMPDEN_NORMALISER_PARAMS)


def empden_table8_inputs():
    """samples_<i> / metrics_<i> of every cell: the inputs of the Table 8 join."""
    out = {}
    for i, cell in enumerate(empden_cells()):
        out[f"samples_{i}"] = empden_sample_path(cell)
        out[f"metrics_{i}"] = empden_metrics_path(cell)
    return out


def empden_figure4_inputs():
    """The full-batch cells (Figure 4 right)."""
    cells = [c for c in empden_cells() if c.method == "full_batch"]
    return {f"samples_{i}": empden_sample_path(c) for i, c in enumerate(cells)}


def empden_records():
    """all_runs records: every evaluated cell; the figure draws the subsampled cells (hybrid, per-step) as
    points and the public-only cell as a reference (full-batch eps ~1e3-1e4 stay in the table only)."""
    from pipeline.registry import RunRecord

    labels = {"hybrid": "EMPDEN hybrid (p, B, T grid)", "per_step": "EMPDEN per-step (p, B, T grid)",
              "full_batch": "EMPDEN full batch", "public_only": "public denoiser only (EMPDEN)"}
    return [RunRecord(method="empden", config=c.name, seed=c.seed, private=c.private, metrics=empden_metrics_path(c),
                      ledgers=(EXPDIR / "ledger" / f"{c.ledger_stem}.jsonl",) if c.private else (),
                      label=labels[c.method], in_figure=c.method != "full_batch",
                      benchmarks=(benchmark_path("empden_sample", c.name), benchmark_path("empden_evaluate", c.name)))
            for c in empden_cells()]


def empden_table2_prior_inputs(wildcards=None):
    """Table 2's prior-method rows read the baselines' and DPDM's main tables, when those methods are chosen."""
    out = {}
    if method_on("baselines"):
        out["baselines"] = TABLES / "baselines.parquet"
    if method_on("dpdm"):
        out["dpdm"] = TABLES / "dpdm_table_main.parquet"
    return out

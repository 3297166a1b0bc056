"""EMPDEN results over the sampling grid: Tables 2, 3, 8/9 (FID + eps), 10 and Figures 3, 4 right.

``empden_table8_grid`` is the one stage that joins: for every sampled cell it reads the cell's
facts (from the samples' manifest, written by ``empden_sample``) and its metrics (from
``evaluate_samples``), rebuilds the cell's private block from the facts
(:meth:`pipeline.privacy.empden_block.EmpdenBlock.from_facts`: the value the sampler and its
ledger line derived from), and accounts each distinct output-wise block (mu_bar_B, q_B, N_out) once
with :func:`pipeline.methods.accounting.blocks.account_block` (App. G: certified PLD eps_u, optimistic
eps_l -- NOT a bound --, Edgeworth estimate with its App. D diagnostics). Full-batch cells are
exact GDP (Sec. 3.2), per-step cells carry their ledger's Prop. C.1 PLD bound, the public-only
cell has eps = 0. Every other table and figure only selects rows of Table 8, so no block is
accounted twice and every number leads back to a cell (``cell`` column) and a ledger line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.config import schema_defaults
from pipeline.io import load_split, manifest_path, read_json
from pipeline.privacy import accountants as acc
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.reporting import read_table, save_figure, write_table
from pipeline.reporting.figures import readable_log_axis
from pipeline.methods.accounting.blocks import AccountingConfig, account_block
from pipeline.stage import PipelineError, stage

#: metric columns carried from evaluate_samples into Table 8
METRICS = ("fid", "kid_mean", "kid_std", "precision", "recall", "fid_val", "clip_fd", "clip_zero_shot_acc")
FACTS = ("cell", "method", "seed", "beta", "p_percent", "B", "T", "sigma_min", "k_steps", "t0", "t1", "n",
         "q_B", "mu_bar_B", "n_out", "delta", "claimed_epsilon", "normaliser", "normaliser_n")
EPS = ("eps_lower_estimate", "eps_upper_bound", "eps_edgeworth_estimate", "edgeworth_valid", "edgeworth_reason")
TABLE_DOC = {"config_id": "id of the configuration (provenance column)"}
#: Table 8's ``grid`` column: its rows are the runs sampled, unlike the accounting tables' paper grid
SAMPLED_GRID = "sampled: empden cells"
#: relative tolerance between a manifest's mu_bar_B and the block its parameters rebuild (the same
#: code on the same numbers agrees to the last bits; an edited manifest differs by far more)
REL_TOL = 1e-9


def _pairs(inputs: Mapping[str, Path]) -> list[tuple[Path, Path]]:
    """(samples, metrics) per cell from inputs named samples_<i> / metrics_<i>."""
    idx = sorted({m.group(1) for k in inputs if (m := re.fullmatch(r"(?:samples|metrics)_(\w+)", k))})
    bad = [k for k in inputs if not re.fullmatch(r"(?:samples|metrics)_\w+", k)]
    if bad:
        raise PipelineError(f"empden_table8_grid: input {bad[0]!r} is not samples_<i> or metrics_<i>")
    missing = [f"{kind}_{i}" for i in idx for kind in ("samples", "metrics") if f"{kind}_{i}" not in inputs]
    if missing:
        raise PipelineError(f"empden_table8_grid: input {missing[0]} missing (each cell needs samples_<i> and "
                            "metrics_<i>)")
    if not idx:
        raise PipelineError("empden_table8_grid: no cells given (--in samples_0=... metrics_0=...)")
    return [(inputs[f"samples_{i}"], inputs[f"metrics_{i}"]) for i in idx]


def _cell_facts(samples: Path) -> dict[str, Any]:
    man = read_json(manifest_path(samples))
    if "empden" not in man:
        raise PipelineError(f"{samples}: not written by empden_sample (its manifest has no 'empden' facts)")
    return man["empden"]


class BlockAccountant:
    """eps of each distinct output-wise block (mu_bar_B, q_B, N_out), computed once (App. G)."""

    def __init__(self, accounting: Mapping[str, Any]):
        # a cell's eps needs only delta, the PLD settings and the RDP orders: the rule passes those
        # (so editing a table grid such as accounting.asr_N does not rerun the join), the schema
        # fills the grid keys AccountingConfig carries but account_block never reads
        self.base = {**schema_defaults("accounting"), **accounting}
        self.cache: dict[tuple[float, float, int, int], dict[str, Any]] = {}

    def __call__(self, block: EmpdenBlock) -> dict[str, Any]:
        key = (block.mu_bar_B, block.q_B, block.N_out, block.n)
        if key not in self.cache:
            cfg = AccountingConfig.from_params({"accounting": {**self.base, "B": [block.B], "n": block.n},
                                                "n": block.n})
            self.cache[key] = account_block(replace(cfg, N_out=block.N_out), block.mu_bar_B, block.q_B)
        return self.cache[key]


def facts_block(facts: Mapping[str, Any]) -> EmpdenBlock:
    """The private block of a sampled cell, rebuilt from its manifest facts and checked against them."""
    try:
        block = EmpdenBlock.from_facts(facts)
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"cell {facts.get('cell')}: its manifest facts build no EMPDEN block ({exc})") from None
    if not math.isclose(block.mu_bar_B, float(facts["mu_bar_B"]), rel_tol=REL_TOL, abs_tol=0.0):
        raise PipelineError(f"cell {facts.get('cell')}: manifest mu_bar_B = {facts['mu_bar_B']!r} but its "
                            f"parameters give {block.mu_bar_B!r}")
    return block


def cell_privacy(facts: Mapping[str, Any], blocks: BlockAccountant) -> dict[str, Any]:
    """eps columns of one cell: certified eps_u, estimate eps_l, Edgeworth estimate (NaN where not defined)."""
    method = facts["method"]
    none = {"eps_lower_estimate": math.nan, "eps_edgeworth_estimate": math.nan, "edgeworth_valid": False,
            "edgeworth_reason": "not applicable"}
    if method == "public_only":
        return {**none, "eps_lower_estimate": 0.0, "eps_upper_bound": 0.0, "eps_edgeworth_estimate": 0.0,
                "accountant": "none (no private data read)"}
    if method == "full_batch":
        # exact GDP composition (Sec. 3.2): the bound is tight, there is no discretisation slack
        eps = acc.gdp_epsilon(facts["delta"], facts_block(facts).mu_total)
        return {**none, "eps_lower_estimate": eps, "eps_upper_bound": eps, "accountant": "gdp (exact)"}
    if method == "per_step":
        # Prop. C.1, as claimed (and replayed) in the cell's ledger
        return {**none, "eps_upper_bound": facts["claimed_epsilon"], "accountant": "pld_pessimistic (Prop. C.1)"}
    row = blocks(facts_block(facts))
    return {**{k: row[k] for k in EPS}, "accountant": "pld_pessimistic (Prop. 4.1)"}


def grid_rows(pairs: list[tuple[Path, Path]], accounting: Mapping[str, Any]) -> pd.DataFrame:
    blocks = BlockAccountant(accounting)
    rows = []
    for samples, metrics_path in pairs:
        facts = _cell_facts(samples)
        metrics = read_json(metrics_path)
        row = {k: facts.get(k) for k in FACTS}
        row.update({k: metrics.get(k) for k in METRICS})
        row.update(cell_privacy(facts, blocks))
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("beta", "p_percent", "sigma_min", "t0", "t1", "q_B", "mu_bar_B", *METRICS,
                "eps_lower_estimate", "eps_upper_bound", "eps_edgeworth_estimate"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("B", "T", "n", "k_steps", "normaliser_n"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    order = {"public_only": 0, "hybrid": 1, "per_step": 2, "full_batch": 3}
    df["_o"] = df["method"].map(order)
    return df.sort_values(["_o", "T", "p_percent", "B", "beta", "sigma_min", "seed"]).drop(columns="_o")


@stage("empden_table8_grid", outputs=("table",), any_inputs=True,
       params={"accounting": "delta, PLD settings and rdp_orders of the config's `accounting` section", **TABLE_DOC})
def empden_table8_grid(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """EMPDEN Tables 8/9: every sampled cell with FID and PLD [eps_l, eps_u], Edgeworth eps_ew (inputs
    samples_<i>=<cell>.npz metrics_<i>=<cell metrics>.json)."""
    if "accounting" not in params:
        raise PipelineError("empden_table8_grid: params need the config's `accounting` section")
    df = grid_rows(_pairs(inputs), params["accounting"])
    df["grid"] = SAMPLED_GRID
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")))


def _grid(path: Path) -> pd.DataFrame:
    return read_table(path)


def _write(df: pd.DataFrame, out: Path, params: Mapping[str, Any]) -> None:
    write_table(df.reset_index(drop=True), out, config_id=str(params.get("config_id", "unknown")))


def _agg_seeds(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean and std (ddof = 1, as 'mean +- std over three generation seeds') of FID per group."""
    g = rows.groupby(keys, dropna=False)
    # ``seed`` (the provenance column) is the group's first seed; ``seeds`` lists them all
    out = g.agg(fid_mean=("fid", "mean"), fid_std=("fid", "std"), fid_val_mean=("fid_val", "mean"),
                n_seeds=("seed", "nunique"), seed=("seed", "min"),
                eps_lower_estimate=("eps_lower_estimate", "first"), eps_upper_bound=("eps_upper_bound", "first"),
                eps_edgeworth_estimate=("eps_edgeworth_estimate", "first"),
                edgeworth_valid=("edgeworth_valid", "first"), seeds=("seed", lambda s: ",".join(map(str, sorted(s)))),
                cells=("cell", lambda s: ";".join(sorted(s))))
    return out.reset_index()


@stage("empden_table10_seeds", inputs=("grid",), outputs=("table",),
       params={"repeated_seeds": "the config's empden.repeated_seeds ({p, B, T, seeds})",
               "beta": "beta of the main grid (accounting.beta)", **TABLE_DOC})
def empden_table10_seeds(inputs, outputs, params) -> None:
    """EMPDEN Table 10: the handoff sweep p at one (B, T), FID mean +- std over generation seeds."""
    rs = params.get("repeated_seeds")
    if not rs:
        raise PipelineError("empden_table10_seeds: params.repeated_seeds is not set in the config")
    df = _grid(inputs["grid"])
    rows = df[(df["method"] == "hybrid") & (df["B"] == rs["B"]) & (df["T"] == rs["T"])
              & (df["beta"] == float(params["beta"])) & df["p_percent"].isin([float(p) for p in rs["p"]])
              & df["seed"].isin(rs["seeds"])]
    if rows.empty:
        raise PipelineError("empden_table10_seeds: no cell of the repeated-seed sweep is in the grid table")
    out = _agg_seeds(rows, ["p_percent", "B", "T", "beta"]).rename(columns={"p_percent": "handoff_percent"})
    _write(out, outputs["table"], params)


@stage("empden_table3_beta", inputs=("grid",), outputs=("table",),
       params={"beta_ablation": "the config's empden.beta_ablation ({p, B, T, beta})",
               "seed": "generation seed of the ablation (the first of empden.seeds)", **TABLE_DOC})
def empden_table3_beta(inputs, outputs, params) -> None:
    """EMPDEN Table 3: the public normaliser beta against Edgeworth eps, certified PLD eps_u and FID."""
    ab = params.get("beta_ablation")
    if not ab:
        raise PipelineError("empden_table3_beta: params.beta_ablation is not set in the config")
    df = _grid(inputs["grid"])
    rows = df[(df["method"] == "hybrid") & (df["p_percent"] == float(ab["p"])) & (df["B"] == ab["B"])
              & (df["T"] == ab["T"]) & (df["seed"] == int(params.get("seed", 0)))
              & df["beta"].isin([float(b) for b in ab["beta"]])]
    if rows.empty:
        raise PipelineError("empden_table3_beta: no cell of the beta ablation is in the grid table")
    cols = ["beta", "p_percent", "B", "T", "eps_edgeworth_estimate", "edgeworth_valid", "edgeworth_reason",
            "eps_lower_estimate", "eps_upper_bound", "fid", "cell", "seed"]
    _write(rows.sort_values("beta", ascending=False)[cols], outputs["table"], params)


def prior_method_rows(runs: pd.DataFrame, eps: float) -> pd.DataFrame:
    """EMPDEN Table 2's prior-method rows from other pipelines' runs (a baselines or DPDM table in the
    all_runs layout, or DPDM's main table): per method, its configuration whose certified eps is
    nearest ``eps`` (the hybrid row's; a choice that reads no sample quality), FID mean +- std over
    its seeds, under the same evaluation."""
    runs = runs.rename(columns={"eps_target": "epsilon_target"})
    if "method" not in runs:
        runs = runs.assign(method="dpdm")
    rows = []
    for method, g in runs.groupby("method", sort=True):
        by = g.groupby("epsilon_target").agg(eps_upper_bound=("eps_certified", "max"), fid_mean=("fid", "mean"),
                                             fid_std=("fid", "std"), n_seeds=("seed", "nunique"),
                                             seed=("seed", "min")).reset_index()
        best = by.iloc[[int((by["eps_upper_bound"] - eps).abs().argmin())]]
        rows.append(best.assign(role=f"prior_{method}", method=method, chosen_on="eps_u"))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


#: EMPDEN Table 2's published prior-method numbers (FID of 50,000 samples, each paper's own setup): shown beside our
#: rows, never mixed with them (columns published_*; their measured columns stay empty)
PUBLISHED_TABLE2 = (
    ("CIFAR-10", "DP-Diffusion (Ghalebikesabi et al., 2023)", 10.0, 9.8),
    ("CIFAR-10", "DP-LDM (Liu et al., 2024)", 10.0, 8.4),
    ("CIFAR-10", "DP-API (Lin et al., 2023)", 0.67, 7.87),
    ("CIFAR-10", "DP-MEPF (Harder et al., 2023)", 10.0, 29.1),
    ("CIFAR-10", "DP-DM (Dockhorn et al., 2023)", 10.0, 97.7),
    ("CIFAR-10", "DP-Promise (Wang et al., 2024)", 10.0, 17.9),
    ("CelebA-64", "DP-LDM (Liu et al., 2024)", 10.0, 14.3),
    ("CelebA-64", "DP-MEPF (Harder et al., 2023)", 10.0, 17.4),
    ("CelebA-64", "DP-DM (Dockhorn et al., 2023)", 10.0, 78.3),
    ("CelebA-64", "DP-Promise (Wang et al., 2024)", 10.0, 25.3),
)
PUBLISHED_COLUMNS = ("published", "published_dataset", "published_method", "published_eps", "published_fid")


def published_rows() -> pd.DataFrame:
    """EMPDEN Table 2's published rows (role ``published``): the papers' own numbers, marked ``published``; seed -1
    (the tables' provenance column is an integer; no seed of ours made them)."""
    return pd.DataFrame([{"role": "published", "published": True, "published_dataset": d, "published_method": m,
                          "published_eps": e, "published_fid": f, "seed": -1} for d, m, e, f in PUBLISHED_TABLE2])


@stage("empden_table2_comparison", inputs=("grid",), optional_inputs=("baselines", "dpdm"), outputs=("table",),
       params={"beta": "beta of the main grid (accounting.beta)", **TABLE_DOC})
def empden_table2_comparison(inputs, outputs, params) -> None:
    """EMPDEN Table 2 (our rows): the hybrid sampler against the public-only and full-private references.

    Rows (``role``): ``reference_public_only`` (no private block, eps = 0), ``reference_full_private``
    (full-batch to the smallest sigma_min sampled), ``hybrid_best_val_fid`` (the grid cell, i.e. the
    handoff p and subset size B, with the lowest FID against the *validation* split, averaged over
    the seeds it was sampled with; its test FID mean +- std is what the row reports, so the test split
    scores a cell it did not choose) and ``hybrid_tightest_eps`` (the cell with the smallest
    certified eps_u, a choice that reads no data). With the optional inputs ``baselines``
    (baselines.parquet) and ``dpdm`` (dpdm_table_main.parquet), the paper's prior-method rows
    (``prior_<method>``, :func:`prior_method_rows`) at the eps nearest the best hybrid cell's. Last, the
    paper's published numbers (:data:`PUBLISHED_TABLE2`, role ``published``), in their own ``published_*``
    columns: another dataset and scale than ours, never a measured value.
    """
    df = _grid(inputs["grid"])
    beta = float(params["beta"])
    keys = ["method", "p_percent", "B", "T", "beta", "sigma_min"]
    agg = _agg_seeds(df, keys)
    rows = []
    pub = agg[agg["method"] == "public_only"]
    if len(pub):
        rows.append(pub.assign(role="reference_public_only"))
    fb = agg[agg["method"] == "full_batch"]
    if len(fb):
        rows.append(fb.nsmallest(1, "sigma_min").assign(role="reference_full_private"))
    hyb = agg[(agg["method"] == "hybrid") & (agg["beta"] == beta)]
    if len(hyb):
        if hyb["fid_val_mean"].isna().any():
            raise PipelineError("empden_table2_comparison: a hybrid cell has no fid_val (evaluate its samples with "
                                "--in val=...); the best cell is chosen on the validation split, never on test")
        rows.append(hyb.nsmallest(1, "fid_val_mean").assign(role="hybrid_best_val_fid", chosen_on="val"))
        rows.append(hyb.nsmallest(1, "eps_upper_bound").assign(role="hybrid_tightest_eps", chosen_on="eps_u"))
    if not rows:
        raise PipelineError("empden_table2_comparison: the grid table has no cell")
    hybrid_eps = next((float(r["eps_upper_bound"].iloc[0]) for r in rows if r["role"].iloc[0] == "hybrid_best_val_fid"),
                      None)
    for key in ("baselines", "dpdm"):
        if key in inputs and hybrid_eps is not None:
            rows.append(prior_method_rows(read_table(inputs[key]), hybrid_eps))
    measured = pd.concat(rows, ignore_index=True).assign(published=False)
    out = pd.concat([measured, published_rows()], ignore_index=True)
    if "chosen_on" not in out:
        out["chosen_on"] = None
    out["published"] = out["published"].astype(bool)
    _write(out[["role", "chosen_on", *keys, "eps_lower_estimate", "eps_upper_bound", "eps_edgeworth_estimate",
                "edgeworth_valid", "fid_mean", "fid_std", "fid_val_mean", "n_seeds", "seed", "cells",
                *PUBLISHED_COLUMNS]], outputs["table"], params)


def _reference_T(df: pd.DataFrame) -> int:
    """The T of panels (a) and (c): 3 as in the paper when sampled, else the most sampled T."""
    ts = df["T"].dropna().astype(int)
    return 3 if (ts == 3).any() else int(ts.mode().iloc[0])


@stage("empden_figure3_tradeoffs", inputs=("grid",), outputs=("figure",),
       params={"beta": "beta of the main grid (accounting.beta)", "seed": "seed of the main grid", **TABLE_DOC})
def empden_figure3_tradeoffs(inputs, outputs, params) -> None:
    """EMPDEN Figure 3: FID against certified eps_u, varying (a) t0 (p), (b) T, (c) q = B/n, each panel only where
    the grid varies it."""
    df = _grid(inputs["grid"])
    df = df[(df["method"] == "hybrid") & (df["beta"] == float(params["beta"]))
            & (df["seed"] == int(params.get("seed", 0)))]
    if df.empty:
        raise PipelineError("empden_figure3_tradeoffs: no hybrid cell at the main beta and seed in the grid table")
    save_figure(figure3_of(df), outputs["figure"])


def figure3_panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str, str, Any, str]]:
    """Figure 3's panels that this grid can draw: (title, rows, one line per value of, points ordered by, entry
    label, legend title), the paper's letters kept. A panel is drawn only when its rows hold two values or more of
    what it varies (on the quick tour T is 3 alone: no "varying T" panel holding one T)."""
    T_ref, B_min = _reference_T(df), int(df["B"].min())
    q_min = B_min / int(df["n"].iloc[0])
    panels = [
        (f"(a) varying the handoff t0 (set by the private share p; T = {T_ref})", df[df["T"] == T_ref], "p_percent",
         "B", lambda v: f"p = {v:g}%", "private share p (sets t0)\n(points: B)"),
        (f"(b) varying the re-noising steps T (q = {q_min:.2g})", df[df["B"] == B_min], "T", "p_percent",
         lambda v: f"T = {int(v)}", "re-noising steps T\n(points: p)"),
        (f"(c) varying the subsample rate q = B/n (T = {T_ref})", df[df["T"] == T_ref], "q_B", "p_percent",
         lambda v: f"q = {v:.2g}", "subsample rate q = B/n\n(points: p)"),
    ]
    return [panel for panel in panels if panel[1][panel[2]].nunique() >= 2]


def figure3_of(df: pd.DataFrame) -> Any:
    """EMPDEN Figure 3 from the main grid's hybrid cells: FID against certified eps_u, one panel per parameter the
    grid varies (:func:`figure3_panels`; one panel of every cell when it varies none)."""
    import matplotlib.pyplot as plt

    delta = float(df["delta"].iloc[0])
    panels = figure3_panels(df) or [("every hybrid cell (the grid varies neither p, T nor q)", df, "cell", "B",
                                     lambda v: str(v), "cell")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.9), squeeze=False)
    for ax, (title, sub, line_key, along, label, legend_title) in zip(axes[0], panels):
        for value, g in sub.groupby(line_key):
            g = g.sort_values(along)
            ax.plot(g["eps_upper_bound"], g["fid"], "o-", label=label(value))
        ax.set_xscale("log")
        # eps often spans less than a decade: default log ticks label minor ticks and collide
        readable_log_axis(ax.xaxis)
        ax.set_xlabel(f"certified $\\varepsilon_u$ (PLD pessimistic, $\\delta$ = {delta:g})")
        ax.set_ylabel("FID (lower is better)")
        ax.set_title(title, fontsize=9, wrap=True)
        ax.legend(fontsize=7, title=legend_title, title_fontsize=7)
    fig.tight_layout()
    return fig


def figure4_of(grid: pd.DataFrame, samples: Sequence[Path], *, n_images: int = 8) -> Any:
    """Figure 4 (right): a row of ``n_images`` samples per full-batch cell (``samples``: their npz files),
    largest sigma_min first, each titled with its eps and FID from ``grid`` (Table 8)."""
    import matplotlib.pyplot as plt

    df = grid.set_index("cell")
    cells = sorted(((_cell_facts(p), p) for p in samples), key=lambda fp: -fp[0]["sigma_min"])
    if not cells or any(f["method"] != "full_batch" for f, _ in cells):
        raise PipelineError("empden_figure4_samples: give the full-batch cells as samples_<i>=<cell>.npz")
    # constrained layout keeps each row's title clear of the image row above it
    fig, axes = plt.subplots(len(cells), 1, figsize=(max(n_images * 0.9, 6.0), 1.5 * len(cells)), squeeze=False,
                             layout="constrained")
    for ax, (facts, path) in zip(axes[:, 0], cells):
        imgs = load_split(path).images[:n_images]
        strip = np.concatenate(list(imgs), axis=-1)  # [C, H, n W]
        ax.imshow(strip[0] if strip.shape[0] == 1 else strip.transpose(1, 2, 0), cmap="gray", vmin=0, vmax=255)
        row = df.loc[facts["cell"]] if facts["cell"] in df.index else None
        eps = f"{row['eps_upper_bound']:.3g}" if row is not None else "?"
        fid = f"{row['fid']:.3g}" if row is not None else "?"
        ax.set_title(f"$\\sigma_{{min}}$ = {facts['sigma_min']:g}: ε = {eps} (GDP, δ = {facts['delta']:g}, "
                     f"$N_{{out}}$ = {facts['n_out']}), FID = {fid}", fontsize=8)
        ax.axis("off")
    return fig


@stage("empden_figure4_samples", inputs=("grid",), outputs=("figure",), any_inputs=True,
       params={"n_images": "samples shown per sigma_min (default 8)", **TABLE_DOC})
def empden_figure4_samples(inputs, outputs, params) -> None:
    """EMPDEN Figure 4 right: full-batch samples at each sigma_min of the sweep, with eps and FID
    (inputs grid=<table 8> and samples_<i>=<full-batch cell>.npz)."""
    samples = [p for k, p in inputs.items() if k.startswith("samples_")]
    fig = figure4_of(_grid(inputs["grid"]), samples, n_images=int(params.get("n_images", 8)))
    save_figure(fig, outputs["figure"])

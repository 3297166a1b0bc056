"""Every method side by side: ``all_runs.parquet`` and the privacy-utility figure.

One row per evaluated (method, configuration, seed) that a method's rule file registered
(its wiring's ``records()``, :class:`pipeline.registry.RunRecord`): the metrics of the shared
``evaluate_samples`` stage, the certified eps recomputed here from the run's own ledger
transcripts (every line checked against its parameters, the lines of one run composed in one
PLD: STRAIGHTDP's release + THA), and the cost of the jobs that made it (their rows of
``runtime.parquet``, :mod:`pipeline.results.runtime`). Column schema: README, "all_runs.parquet".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import read_json
from pipeline.privacy import ledger, rebuild
# every mechanism's rebuilder registers on import: a line is checked against its parameters
from pipeline.privacy import dp_merf, moments, private_evolution, tha  # noqa: F401
from pipeline.privacy.certify import composed_entry, recompute_cached
from pipeline.reporting.figures import readable_log_axis, save_figure
from pipeline.reporting.tables import write_table
from pipeline.results.runtime import job_cost, runtime_frame
from pipeline.stage import PipelineError, stage

#: metric columns copied from evaluate_samples' JSON (null when a metric does not apply)
METRICS = ("fid", "kid_mean", "kid_std", "precision", "recall", "fid_class_mean", "label_consistency",
           "acc_logreg", "acc_mlp", "acc_cnn", "acc_logreg_std", "acc_mlp_std", "acc_cnn_std",
           "clip_fd", "clip_zero_shot_acc", "n_samples")
#: the name of a run's in-memory composition of its lines (never written to a ledger)
COMPOSED_MECHANISM = "run_composition"

def run_privacy(transcripts: Sequence[Path]) -> dict[str, Any]:
    """Privacy columns of one run from its transcripts: every line rebuilt from its parameters, all lines
    composed (one delta, one accountant) and certified by the replay's accountant."""
    lines: list[ledger.LedgerEntry] = []
    for path in transcripts:
        try:
            found = [e for _, e in ledger.read_ledger(path)]
            for e in found:
                rebuild.check(e)
        except (FileNotFoundError, ledger.LedgerError) as exc:
            raise PipelineError(f"{path}: {exc}") from None
        if not found:
            raise PipelineError(f"{path}: empty transcript (a private run without its claim)")
        lines += found
    entry = composed_entry(lines, mechanism=COMPOSED_MECHANISM)
    return {"eps_certified": recompute_cached(entry), "delta": lines[0].delta, "accountant": entry.accountant["name"],
            "adjacency": ",".join(sorted({e.adjacency for e in lines})),
            "mechanisms": ",".join(e.mechanism for e in lines)}


def checked_runs(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``params.runs`` checked: a non-empty list whose items name method, config, seed and private."""
    runs = params.get("runs")
    if not isinstance(runs, list) or not runs:
        raise PipelineError("stage all_runs_table: params.runs must be a non-empty list of runs")
    for i, r in enumerate(runs):
        missing = [f for f in ("method", "config", "seed", "private") if f not in r]
        if missing:
            raise PipelineError(f"stage all_runs_table: params.runs[{i}] lacks {', '.join(missing)}")
    return runs


def run_rows(inputs: Mapping[str, Path], runs: Sequence[Mapping[str, Any]],
             runtime: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run: its fields, its privacy (private runs), its metrics and, given ``runtime`` (the runtime
    table), its cost (its jobs' rows there). Without it no cost column is written: a table made before the last
    job (the baselines') leaves the cost to all_runs rather than print columns of NaN."""
    rows = []
    for i, r in enumerate(runs):
        if f"metrics_{i}" not in inputs:
            raise PipelineError(f"stage all_runs_table: run {i} ({r['method']}/{r['config']}) needs --in metrics_{i}")
        ledgers = [inputs[k] for k in sorted((k for k in inputs if k.startswith(f"ledger_{i}_")),
                                             key=lambda k: int(k.rsplit("_", 1)[1]))]
        if r["private"] and not ledgers:
            raise PipelineError(f"stage all_runs_table: private run {r['method']}/{r['config']} has no ledger "
                                f"transcript (--in ledger_{i}_0=...)")
        privacy = (run_privacy(ledgers) if r["private"] else
                   {"eps_certified": math.nan, "delta": math.nan, "accountant": "", "adjacency": "", "mechanisms": ""})
        metrics = read_json(inputs[f"metrics_{i}"])
        eps_target = r.get("epsilon_target")
        rows.append({"method": str(r["method"]), "label": str(r.get("label") or r["method"]),
                     "config": str(r["config"]),
                     "seed": int(r["seed"]), "private": bool(r["private"]),
                     "epsilon_target": math.nan if eps_target is None else float(eps_target), **privacy,
                     **{m: (math.nan if metrics.get(m) is None else float(metrics[m])) for m in METRICS},
                     **({} if runtime is None else job_cost(runtime, r.get("benchmarks", []))),
                     "in_figure": bool(r.get("in_figure", True)), "headline": bool(r.get("headline", True)),
                     "transcripts": ",".join(Path(p).stem for p in ledgers)})
    df = pd.DataFrame(rows)
    df["n_samples"] = df["n_samples"].astype("Int64")  # a count (null where the evaluation did not say)
    bad = df[df["private"] & ~np.isfinite(df["eps_certified"])]
    if len(bad):
        raise PipelineError(f"stage all_runs_table: private run {bad.iloc[0]['method']}/{bad.iloc[0]['config']} has "
                            f"no finite certified eps")
    return df


#: the audit columns, null where a run has no attacked model (membership: EMPDEN cells, baselines) or no
#: audited line (one-run: the non-private references)
AUDIT_COLUMNS = ("mia_auc_max", "mia_tpr_at_1pct_fpr_max", "mia_under_curve", "audit_eps_lb")


def model_run(config: str) -> str:
    """The trained model's run name of a configuration (DPDM's ``run/sampler`` -> ``run``)."""
    return config.split("/", 1)[0]


def join_audits(df: pd.DataFrame, audit_mia: Path | None, audit_one_run: Path | None) -> pd.DataFrame:
    """The audit columns of each run, from the audits' tables (joined on the trained model's run name):
    the strongest membership attack's AUC and TPR at 1% FPR, whether every attack's ROC stayed under the
    certified eps's curve, and the largest one-run eps_lb (95%) of the run's audited ledger lines (joined on
    the run's transcripts)."""
    df = df.copy()
    for col in AUDIT_COLUMNS:
        df[col] = pd.Series([None] * len(df), dtype="object" if col == "mia_under_curve" else "float64")
    runs = df["config"].map(model_run)
    if audit_mia is not None:
        mia = pd.read_parquet(audit_mia)
        g = mia.groupby("run").agg(auc=("auc", "max"), tpr=("tpr_at_1pct_fpr", "max"), under=("under_curve", "all"))
        hit = runs.isin(g.index) & df["private"]
        df.loc[hit, "mia_auc_max"] = runs[hit].map(g["auc"])
        df.loc[hit, "mia_tpr_at_1pct_fpr_max"] = runs[hit].map(g["tpr"])
        df.loc[hit, "mia_under_curve"] = runs[hit].map(g["under"]).astype(bool)
    if audit_one_run is not None:
        # the audit names a line by its transcript (a DPDM run has its own; STRAIGHTDP's train line too)
        one = pd.read_parquet(audit_one_run).groupby("transcript")["epsilon_lb"].max()
        for i, stems in df["transcripts"].items():
            found = [one[t] for t in str(stems).split(",") if t in one.index]
            if found and df.loc[i, "private"]:
                df.loc[i, "audit_eps_lb"] = max(found)
    df["mia_under_curve"] = df["mia_under_curve"].astype("boolean")
    return df


@stage("all_runs_table", outputs=("table",), any_inputs=True,
       params={"runs": "list of {method, config, seed, epsilon_target, private, label, in_figure, benchmarks}; run i "
                       "reads --in metrics_i= and ledger_i_0=, ledger_i_1=, ...", "config_id": "id of the settings"})
def all_runs_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """all_runs.parquet: every evaluated run of every method, certified eps recomputed from its transcripts, the
    audit columns from --in audit_mia= / audit_one_run= (the audits' tables) and the cost columns from
    --in runtime= (runtime.parquet) when given."""
    runs = {k: v for k, v in inputs.items() if k not in ("audit_mia", "audit_one_run", "runtime")}
    # all_runs always has its cost columns (NaN where a run's jobs are not in a runtime table)
    runtime = pd.read_parquet(inputs["runtime"]) if "runtime" in inputs else runtime_frame(None)
    df = join_audits(run_rows(runs, checked_runs(params), runtime), inputs.get("audit_mia"),
                     inputs.get("audit_one_run"))
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")))


# --------------------------------------------------------------------------- the figure

def configuration(config: str) -> str:
    """A run's configuration without its seed (``pe_eps1_seed2`` -> ``pe_eps1``, an EMPDEN cell's ``_s0``
    dropped, DPDM's ``run_seed0/sampler`` -> ``run/sampler``): what the seeds of one point share."""
    return re.sub(r"_s(?:eed)?[0-9]+(?=$|/)", "", config)


#: colour families, one per private method in the table's order (a method's variants take shades of its family)
COLOUR_FAMILIES = ("Blues", "Oranges", "Greens", "Purples", "RdPu", "YlOrBr", "Reds", "Greys")
#: what tells a method's variants apart besides their shade: line style and marker, in turn
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def label_styles(private: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Each label's colour, line style and marker: one colour family per method (``COLOUR_FAMILIES``, in the order
    the methods first appear), its labels in shades from dark to light with their own line style and marker."""
    import matplotlib

    styles: dict[str, dict[str, Any]] = {}
    for k, (method, g) in enumerate(private.groupby("method", sort=False)):
        cmap = matplotlib.colormaps[COLOUR_FAMILIES[k % len(COLOUR_FAMILIES)]]
        labels = list(dict.fromkeys(g["label"]))
        shades = np.linspace(0.9, 0.45, len(labels)) if len(labels) > 1 else [0.75]
        for j, (label, shade) in enumerate(zip(labels, shades)):
            styles[label] = {"color": cmap(float(shade)), "linestyle": LINE_STYLES[j % len(LINE_STYLES)],
                             "marker": MARKERS[j % len(MARKERS)]}
    return styles


def _points(g: pd.DataFrame, metric: str) -> pd.DataFrame:
    """A label's points: mean certified eps and metric per configuration over its seeds, the seeds' range and
    count."""
    points = g.assign(point=g["config"].map(configuration)).groupby("point")
    by = points.agg(eps=("eps_certified", "mean"), mean=(metric, "mean"), lo=(metric, "min"), hi=(metric, "max"),
                    seeds=("seed", "nunique"), target=("epsilon_target", "mean")).sort_values("eps")
    return by[np.isfinite(by["mean"]) & np.isfinite(by["eps"])]


def _line(ax: Any, by: pd.DataFrame, label: str, style: Mapping[str, Any]) -> bool:
    """One label's marks: a line through its configurations (a band from the seeds' min to max where a point has
    two seeds or more), or points for a grid without a target eps (EMPDEN's cells). Whether a band was drawn."""
    if not by["target"].notna().all():
        ax.scatter(by["eps"], by["mean"], marker=style["marker"], s=22, color=style["color"], label=label)
        return False
    ax.plot(by["eps"], by["mean"], ms=5, label=label, **style)
    seeded = by[by["seeds"] >= 2]
    if len(seeded):
        ax.fill_between(seeded["eps"], seeded["lo"], seeded["hi"], color=style["color"], alpha=0.2, linewidth=0)
    return bool(len(seeded))


def privacy_utility_figure_of(df: pd.DataFrame) -> Any:
    """Downstream CNN accuracy and FID vs certified eps: a line per method label (one colour family per method),
    references horizontal, one legend with every mark of either panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    private = df[df["private"] & df["in_figure"]]
    refs = df[~df["private"] & df["in_figure"]]
    styles = label_styles(private)
    banded = False
    for ax, metric, name in ((axes[0], "acc_cnn", "downstream CNN accuracy on real test (fraction)"),
                             (axes[1], "fid", "FID vs real test (eval-net features; lower is better)")):
        for label, style in styles.items():
            by = _points(private[private["label"] == label], metric)
            if len(by):
                banded |= _line(ax, by, label, style)
        for j, (label, g) in enumerate(refs.groupby("label", sort=False)):
            value = g[metric].mean()
            if np.isfinite(value):
                ax.axhline(value, color="0.3", linestyle=("--", ":", "-.")[j % 3], linewidth=1,
                           label=f"{label} (reference)")
        ax.set_xscale("log")
        readable_log_axis(ax.xaxis)
        ax.set_xlabel("certified ε (PLD upper bound, δ as in each run's ledger)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")  # FIDs span three decades across methods and eps
    readable_log_axis(axes[1].yaxis)
    axes[0].set_title("Utility vs privacy: downstream accuracy")
    axes[1].set_title("Utility vs privacy: sample quality")
    # one legend over both panels: a method without labels (EMPDEN) or a reference without a FID draws on one only
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(name, handle)
    fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=min(3, max(1, len(entries))),
               fontsize=8, frameon=False)
    bands = "band = the seeds' range" if banded else "one seed per point, so no band"
    fig.suptitle(f"Every method under one ledger and one evaluation (mean over seeds; {bands})")
    rows = math.ceil(len(entries) / 3)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * rows + 0.02), 1, 0.95))
    return fig


@stage("privacy_utility_figure", inputs=("table",), outputs=("figure",))
def privacy_utility_figure(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """results/figures/privacy_utility.png (+ PDF): accuracy and FID vs certified eps, one line per method."""
    df = pd.read_parquet(inputs["table"])
    if df.empty:
        raise PipelineError(f"stage privacy_utility_figure: {inputs['table']} holds no runs")
    save_figure(privacy_utility_figure_of(df), outputs["figure"])

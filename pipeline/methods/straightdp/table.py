"""STRAIGHTDP's result stages: Tables 1, 5, 6, 7 as Parquet, Figure 3 and Figure 2a.

Every table row is one (Table 1 row, target eps) of STRAIGHTDP (Che, Xu & Wu 2026) aggregated
over seeds: the mean and the sample standard deviation (ddof = 1, NaN for one seed) of each
metric of the shared ``evaluate_samples`` JSON, as the paper reports "mean +- std over 3 seeds".
Its privacy columns are recomputed here from the run's ledger transcripts alone, never taken
from a stage's claim:

* ``eps_release``: the Stage-1 line (``moment_release``, Prop. B.9) on its own;
* ``eps_train``: the Stage-2 line (``tha_dpsgd``, Sec. 3.2; uniform DP-SGD is the THA plan
  with one bucket, beta = 0) on its own;
* ``eps_certified``: the certified (pessimistic PLD) eps of the *composition* of both events,
  i.e. what the whole pipeline spends (Sec. 3: "both compose to eps in one PLD accountant").
  For a row with one stage it is that stage's eps. Over seeds the table keeps the largest.

A table is a claim: a row whose ``eps_certified`` exceeds its target raises instead of being
written. The tables:

``table1_main``         Table 1: downstream accuracy (logreg / MLP / CNN), FID, label consistency
``table5_per_class``    Table 5: per-class FID (mean over classes), label consistency, domain rate
``table6_fid_vs_eps``   Table 6: FID over the budget
``table7_precision_recall`` Table 7: improved precision / recall (k = ``prc_neighborhood``, 3)

Figures: ``straightdp_figure_accuracy`` (Figure 3: downstream CNN accuracy vs eps, one line per
row, +-1 std band over seeds) and ``straightdp_figure_horizon`` (Figure 2a: worst-class
conditional and unconditional cosine between the released and the empirical field vs t, from
public data only, with the threshold and the horizon tau).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import read_json
from pipeline.privacy import ledger, rebuild
# moments and tha register their rebuilders on import: a line is checked against its parameters
from pipeline.privacy import moments, tha  # noqa: F401
from pipeline.privacy.certify import composed_entry, recompute_cached
from pipeline.privacy.replay import REL_TOL
from pipeline.reporting import save_figure
from pipeline.reporting.figures import readable_log_axis
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage
from pipeline.methods.straightdp.runs import LABELS, ROWS, StraightRun, table_rows

import matplotlib.pyplot as plt  # noqa: E402  (pipeline.reporting selected the Agg backend)

RELEASE_MECHANISM = moments.MECHANISM
TRAIN_MECHANISM = "tha_dpsgd"
# Names the in-memory composition line only: it is certified here and never written to a
# transcript (the transcripts keep one line per mechanism), so the replay needs no rebuilder.
COMPOSED_MECHANISM = "straightdp_composition"

#: metric columns of each table, read from evaluate_samples' JSON (null -> NaN, never invented)
TABLE_METRICS: dict[str, tuple[str, ...]] = {
    "table1_main": ("acc_logreg", "acc_mlp", "acc_cnn", "fid", "label_consistency", "clip_fd", "clip_zero_shot_acc"),
    "table5_per_class": ("fid_class_mean", "label_consistency", "domain_rate"),
    "table6_fid_vs_eps": ("fid",),
    "table7_precision_recall": ("precision", "recall"),
    "table3_frozen": ("acc_cnn", "fid", "label_consistency", "clip_zero_shot_acc"),
}
#: the ``arm`` column of the main configuration's runs (an arm's runs carry the arm's name)
MAIN_ARM = "main"
#: metrics that must agree over the seeds of one row (settings, not results): kept as one column
SETTING_COLUMNS: dict[str, tuple[str, ...]] = {"table7_precision_recall": ("prc_neighborhood",)}

PARAMS_DOC = {
    "runs": "list of STRAIGHTDP run names (<row>_eps<eps>_seed<seed>); each reads --in metrics_RUN= and, "
            "as the row needs, release_RUN= (Stage-1 transcript) and train_RUN= (Stage-2 transcript)",
    "epsilons": "the target budgets the table covers (every run's eps must be one of them, each needs a run)",
    "config_id": "id of the configuration",
    "seed": "seed of the table (the seeds of each row are listed in its column seeds)",
}


# --------------------------------------------------------------------------- privacy of one run

def _one_line(path: Path, mechanism: str) -> ledger.LedgerEntry:
    """The one ``mechanism`` line of transcript ``path``, checked against its own parameters."""
    try:
        entry = ledger.only_line(path, mechanism)
    except ledger.LedgerError as exc:
        raise PipelineError(str(exc)) from None
    try:
        # the event must be the one the line's parameters imply (an edited sigma is refused here)
        rebuild.check(entry)
    except rebuild.RebuildError as exc:
        raise PipelineError(f"{path}: {exc}") from None
    if entry.accountant.get("name") != "pld_pessimistic":
        raise PipelineError(f"{path}: accountant {entry.accountant.get('name')!r}, expected pld_pessimistic "
                            f"(the table's eps is the certified PLD bound)")
    return entry


def run_privacy(release: Path | None, train: Path | None) -> dict[str, Any]:
    """Privacy columns of one STRAIGHTDP run from its transcripts (either may be None, not both).

    ``eps_release`` / ``eps_train``: each line recomputed alone; ``eps_certified``: the
    certified pessimistic-PLD eps of Composed([release, THA]) at the lines' (equal) delta with
    the lines' (equal) accountant settings (Sec. 3, Table 1's total budget).
    """
    if release is None and train is None:
        raise PipelineError("run_privacy: a STRAIGHTDP run needs a release or a train transcript, got neither")
    rel = _one_line(Path(release), RELEASE_MECHANISM) if release is not None else None
    tr = _one_line(Path(train), TRAIN_MECHANISM) if train is not None else None
    out: dict[str, Any] = {"eps_release": math.nan, "eps_train": math.nan, "release_noise_multiplier": math.nan,
                           "train_noise_scale": math.nan, "train_noise_multipliers": [], "train_clips": [],
                           "dpsgd_steps": 0, "K_buckets": 0, "tau": math.nan, "beta": math.nan,
                           "sampling_rate": math.nan}
    if rel is not None:
        out["eps_release"] = recompute_cached(rel)
        out["release_noise_multiplier"] = float(rel.extra.get("moment_noise_multiplier", rel.noise_multiplier))
    if tr is not None:
        out["eps_train"] = recompute_cached(tr)
        edges = [float(e) for e in tr.extra.get("edges", [])]
        out.update(train_noise_scale=float(tr.noise_std), train_noise_multipliers=list(tr.extra.get("sigma_k", [])),
                   train_clips=list(tr.extra.get("C_k", [])), dpsgd_steps=int(tr.count),
                   K_buckets=len(edges) - 1 if edges else 0, tau=edges[0] if edges else math.nan,
                   beta=float(tr.extra.get("beta", math.nan)), sampling_rate=float(tr.sampling["probability"]))
    if rel is not None and tr is not None:
        try:
            composed = composed_entry([rel, tr], mechanism=COMPOSED_MECHANISM)
        except PipelineError as exc:
            raise PipelineError(f"{release} and {train}: {exc}") from None
        out["eps_certified"] = recompute_cached(composed)
    else:
        out["eps_certified"] = out["eps_release"] if tr is None else out["eps_train"]
    line = tr if tr is not None else rel
    assert line is not None
    out.update(delta=line.delta, pld_discretization=float(line.accountant.get("value_discretization_interval",
                                                                               math.nan)))
    return out


# --------------------------------------------------------------------------- per-run records

def param_runs(params: Mapping[str, Any], where: str) -> list[StraightRun]:
    names = params.get("runs")
    if not names or not isinstance(names, (list, tuple)):
        raise PipelineError(f"{where}: params.runs must be a non-empty list of run names, got {names!r}")
    try:
        runs = [StraightRun.from_name(str(n)) for n in names]
    except ValueError as exc:
        raise PipelineError(f"{where}: params.runs: {exc}") from None
    if len(set(runs)) != len(runs):
        raise PipelineError(f"{where}: params.runs lists a run twice")
    return runs


def _epsilons(params: Mapping[str, Any], runs: Sequence[StraightRun], where: str) -> list[float]:
    """The table's eps columns: params.epsilons (every run's eps must be one), else the runs' own."""
    given = params.get("epsilons")
    if given is None:
        return sorted({r.epsilon for r in runs})
    eps = [float(e) for e in given]
    for run in runs:
        if not any(math.isclose(run.epsilon, e, rel_tol=1e-12) for e in eps):
            raise PipelineError(f"{where}: run {run.name} has eps {run.epsilon:g}, not one of params.epsilons {eps}")
    return eps


def run_records(inputs: Mapping[str, Path], runs: Sequence[StraightRun], where: str) -> pd.DataFrame:
    """One row per run: row, eps_target, seed, :func:`run_privacy` and every metric of its JSON."""
    out = []
    for run in runs:
        need = [f"metrics_{run.name}"] + ([f"release_{run.name}"] if run.releases else []) + (
            [f"train_{run.name}"] if run.trains else [])
        missing = [k for k in need if k not in inputs]
        if missing:
            raise PipelineError(f"{where}: run {run.name} needs --in {' '.join(k + '=PATH' for k in missing)}")
        for kind, wanted in (("release", run.releases), ("train", run.trains)):
            if not wanted and f"{kind}_{run.name}" in inputs:
                raise PipelineError(f"{where}: row {run.row} has no {kind} transcript, got --in {kind}_{run.name}")
        privacy = run_privacy(inputs.get(f"release_{run.name}"), inputs.get(f"train_{run.name}"))
        metrics = read_json(inputs[f"metrics_{run.name}"])
        out.append({"run": run.name, "arm": run.arm or MAIN_ARM, "row": run.row, "label": run_label(run),
                    "eps_target": run.epsilon, "seed_run": run.seed, **privacy, "metrics": metrics})
    return pd.DataFrame(out)


def run_label(run: StraightRun) -> str:
    """The paper's name of the run's row, with the arm in brackets for an arm's run."""
    return LABELS[run.row] + (f" [{run.arm}]" if run.arm else "")


# --------------------------------------------------------------------------- aggregation

def _value(metrics: Mapping[str, Any], key: str) -> float:
    v = metrics.get(key)
    return math.nan if v is None else float(v)


def aggregate(records: pd.DataFrame, *, metrics: Sequence[str], epsilons: Sequence[float],
              settings: Sequence[str] = (), where: str = "straightdp") -> pd.DataFrame:
    """One row per (arm, row, eps_target) -- the main configuration first, then the arms in the order
    the records meet them, each in ROWS x ``epsilons`` order: each metric's mean and std over seeds.

    ``<m>_mean`` and ``<m>_std_seeds`` (sample std, ddof = 1: NaN for one seed) of each metric;
    ``eps_certified`` / ``eps_release`` / ``eps_train`` / ``delta`` are the largest over seeds (the
    row's claim). Raises when a row's certified eps exceeds its target (beyond the replay's
    floating-point slack ``REL_TOL``).
    """
    rows = []
    order = {r: i for i, r in enumerate(ROWS)}
    arms = {a: i for i, a in enumerate(dict.fromkeys([MAIN_ARM, *records["arm"]]))}
    for (arm, row, eps), group in sorted(records.groupby(["arm", "row", "eps_target"]),
                                         key=lambda kv: (arms[kv[0][0]], order[kv[0][1]], kv[0][2])):
        group = group.sort_values("seed_run")
        eps_cert = float(group["eps_certified"].max())
        if not eps_cert <= eps * (1 + REL_TOL):
            worst = group.loc[group["eps_certified"].idxmax(), "run"]
            raise PipelineError(f"{where}: run {worst} certifies eps {eps_cert:.6g} > its target {eps:g} "
                                f"(the table would overstate privacy)")
        out: dict[str, Any] = {"arm": arm, "row": row, "label": group["label"].iloc[0], "eps_target": float(eps),
                               "eps_certified": eps_cert, "eps_release": float(group["eps_release"].max()),
                               "eps_train": float(group["eps_train"].max()), "delta": float(group["delta"].max()),
                               "n_seeds": len(group), "seeds": ",".join(str(s) for s in group["seed_run"])}
        for m in metrics:
            values = np.array([_value(mx, m) for mx in group["metrics"]], dtype=np.float64)
            # a metric absent in some seed is absent for the row: no mean over a subset of seeds
            out[f"{m}_mean"] = float(values.mean()) if len(values) else math.nan
            out[f"{m}_std_seeds"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        for s in settings:
            values = {mx.get(s) for mx in group["metrics"]}
            if len(values) != 1:
                raise PipelineError(f"{where}: row {row}{'' if arm == MAIN_ARM else f' [{arm}]'} at eps {eps:g}: "
                                    f"{s} differs over seeds "
                                    f"({sorted(map(str, values))})")
            out[s] = values.pop()
        rows.append(out)
    df = pd.DataFrame(rows)
    present = set(df["eps_target"]) if len(df) else set()
    missing = [e for e in epsilons if not any(math.isclose(e, p, rel_tol=1e-12) for p in present)]
    if missing:
        raise PipelineError(f"{where}: no run at eps {missing} of params.epsilons")
    return df


def without_unmeasured_spread(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without its ``*_std_seeds`` columns when no row has two seeds (every value would be NaN: a spread
    that was not measured, not one of zero)."""
    if len(df) and (df["n_seeds"] >= 2).any():
        return df
    return df.drop(columns=[c for c in df.columns if c.endswith("_std_seeds")])


# --------------------------------------------------------------------------- stages

@stage("straightdp_table", outputs=("table",), any_inputs=True,
       params={"table": f"one of {', '.join(TABLE_METRICS)}", **PARAMS_DOC})
def straightdp_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A STRAIGHTDP table (1, 3, 5, 6 or 7): metrics mean/std over seeds and the certified eps of each row
    (Table 3: the frozen-model route's rows; the others: Table 1's)."""
    name = params.get("table")
    if name not in TABLE_METRICS:
        raise PipelineError(f"stage straightdp_table: params.table must be one of {', '.join(TABLE_METRICS)}, "
                            f"got {name!r}")
    where = f"stage straightdp_table {name}"
    rows = table_rows(name)
    runs = [r for r in param_runs(params, where) if r.row in rows]
    if not runs:
        raise PipelineError(f"{where}: no run of its rows ({', '.join(rows)}) in params.runs")
    epsilons = _epsilons(params, runs, where)
    df = aggregate(run_records(inputs, runs, where), metrics=TABLE_METRICS[name], epsilons=epsilons,
                   settings=SETTING_COLUMNS.get(name, ()), where=where)
    df.insert(0, "table", name)
    # a row is a mean over its seeds (named in `seeds`): no single seed column, and no spread where no row has two
    write_table(without_unmeasured_spread(df), outputs["table"], config_id=str(params["config_id"]))


def band_note(n_min: int, n_max: int) -> str:
    """What a figure's bands are, from its points' seed counts: none with one seed (a std needs two)."""
    if n_max < 2:
        return "one seed: no band"
    seeds = f"{n_max}" if n_min == n_max else f"{max(n_min, 2)}-{n_max}"
    return f"bands ±1 std over {seeds} seeds" + ("; one-seed points have none" if n_min < 2 else "")


@stage("straightdp_figure_accuracy", outputs=("figure",), any_inputs=True,
       params={**PARAMS_DOC, "metric": "metric on the y axis (default acc_cnn, Figure 3)"})
def straightdp_figure_accuracy(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                               params: Mapping[str, Any]) -> None:
    """STRAIGHTDP Figure 3: downstream accuracy vs eps, one line per row, +-1 std over seeds.

    Reads the same inputs as ``straightdp_table`` and certifies every eps the same way: an
    x position is a privacy claim too.
    """
    where = "stage straightdp_figure_accuracy"
    metric = str(params.get("metric", "acc_cnn"))
    runs = param_runs(params, where)
    df = aggregate(run_records(inputs, runs, where), metrics=(metric,), epsilons=_epsilons(params, runs, where),
                   where=where)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for row in ROWS:
        part = df[df["row"] == row].sort_values("eps_target")
        if part.empty:
            continue
        x = part["eps_target"].to_numpy()
        y = part[f"{metric}_mean"].to_numpy()
        sd = part[f"{metric}_std_seeds"].to_numpy()
        (line,) = ax.plot(x, y, "o-", ms=4, label=LABELS[row])
        ok = np.isfinite(sd)  # one seed: no band rather than a band of width zero that looks certain
        if ok.any():
            ax.fill_between(x[ok], (y - sd)[ok], (y + sd)[ok], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xscale("log")
    readable_log_axis(ax.xaxis)
    delta = float(df["delta"].max())
    ax.set(xlabel=f"ε (δ = {delta:g})", ylabel=f"downstream accuracy ({metric.removeprefix('acc_')})",
           title=f"STRAIGHTDP: accuracy vs ε ({band_note(int(df['n_seeds'].min()), int(df['n_seeds'].max()))})")
    ax.legend(fontsize=7)
    save_figure(fig, outputs["figure"])


@stage("straightdp_figure_horizon", inputs=("horizon",), outputs=("figure",))
def straightdp_figure_horizon(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                              params: Mapping[str, Any]) -> None:
    """STRAIGHTDP Figure 2a: cosine of the released vs empirical field over t (public data only), tau marked."""
    h = read_json(inputs["horizon"])
    try:
        ts = np.asarray(h["ts"], dtype=np.float64)
        worst = np.asarray(h["conditional_worst"], dtype=np.float64)
        uncond = np.asarray(h["unconditional"], dtype=np.float64)
        tau, threshold = float(h["tau"]), float(h["threshold"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"input horizon {inputs['horizon']}: not a straightdp_geometry horizon ({exc!r})") from None
    if not (ts.ndim == 1 and worst.shape == ts.shape and uncond.shape == ts.shape and len(ts) >= 2):
        raise PipelineError(f"input horizon {inputs['horizon']}: ts, conditional_worst and unconditional must be "
                            f"equal-length lists (>= 2 points), got {ts.shape}, {worst.shape}, {uncond.shape}")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ts, worst, "-", label="conditional, worst class (eq. 3)")
    ax.plot(ts, uncond, "--", label="unconditional (eq. 4)")
    ax.axhline(threshold, color="k", ls=":", lw=1, label=f"threshold {threshold:g}")
    ax.axvline(tau, color="C3", lw=1.2, label=f"τ = {tau:.3g}")
    if "tau_max" in h:
        ax.axvline(float(h["tau_max"]), color="C3", ls=":", lw=0.8, label=f"τ cap {float(h['tau_max']):g}")
    ax.set(xlabel="t (0 = noise end)", ylabel="cosine(released, empirical field)",
           title="STRAIGHTDP Fig. 2a (public data)")
    ax.legend(fontsize=7)
    save_figure(fig, outputs["figure"])

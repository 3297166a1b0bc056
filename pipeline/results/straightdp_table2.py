"""Stages ``straightdp_table2_noise_sweep`` (Table 2 right, the backbone under noise) and
``straightdp_table2_ablation`` (Table 2 left, one constraint at a time at the smallest eps).

Two runs of the same STRAIGHTDP rows that differ only in the Sec. 3.3 backbone constraints (e.g.
``configs/diagnostics/straightdp_b0_off.yaml`` and ``straightdp_b0_16.yaml``): their Table 1 Parquet
files and their training metrics. Per (row, eps): CNN accuracy and FID of each backbone (mean, std over
seeds), the clamp's signed gain acc_cnn(constrained) / acc_cnn(unconstrained) - 1 reported whichever way
it goes, and App. D.3's upper-tail ratio p90/p50 of the per-sample gradient norms of each (the
step-weighted mean of the run's per-bucket ratios of medians, then the mean over seeds). The ratios are
NON-PRIVATE diagnostics (functions of the private batches, logged by ``train_straightdp``); the
accuracies and FIDs are the shared evaluation's. Both inputs must be the same rows at the same budgets.
The ablation reads any number of backbones' Table 1 files (one named ``unconstrained``; e.g. the
``configs/diagnostics/straightdp_b0_*.yaml`` arms) at one (row, eps) and reports each arm's gain over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import read_json
from pipeline.reporting.tables import read_table, write_table
from pipeline.stage import PipelineError, stage
from pipeline.training.straightdp_runs import StraightRun

ARMS = ("unconstrained", "constrained")
#: the Table 1 columns each backbone (arm) contributes to either panel
ARM_COLUMNS = ("acc_cnn_mean", "acc_cnn_std_seeds", "fid_mean", "fid_std_seeds", "eps_certified", "n_seeds")
KEY = "grad_norms_non_private_diagnostic"


def run_tail_ratio(metrics: Mapping[str, Any], where: str) -> float:
    """The step-weighted mean over buckets of p90/p50 in one training run's metrics."""
    per_bucket = (metrics.get(KEY) or {}).get("per_bucket")
    if not per_bucket:
        raise PipelineError(f"{where}: no gradient-norm log ({KEY}); rerun train_straightdp with this version")
    steps = np.array([b["steps"] for b in per_bucket.values()], dtype=float)
    ratios = np.array([b["p90_over_p50"] for b in per_bucket.values()], dtype=float)
    return float((steps * ratios).sum() / steps.sum())


def tail_ratios(metrics_dir: Path, where: str) -> pd.DataFrame:
    """(row, eps_target, seed, p90_over_p50) of every training run's metrics JSON in ``metrics_dir``."""
    rows = []
    for path in sorted(Path(metrics_dir).glob("*.json")):
        try:
            run = StraightRun.from_name(path.stem)
        except ValueError:
            continue
        m = read_json(path)
        rows.append({"row": run.row, "eps_target": run.epsilon, "seed": run.seed,
                     "p90_over_p50": run_tail_ratio(m, f"{where}: {path}"),
                     "stream_clamp": (m.get("backbone_constraints") or {}).get("stream_clamp")})
    if not rows:
        raise PipelineError(f"{where}: no training metrics (<row>_eps<eps>_seed<seed>.json) in {metrics_dir}")
    return pd.DataFrame(rows)


def noise_sweep(tables: Mapping[str, pd.DataFrame], ratios: Mapping[str, pd.DataFrame], where: str) -> pd.DataFrame:
    keys = ["row", "eps_target"]
    a, b = (tables[arm].set_index(keys).sort_index() for arm in ARMS)
    if list(a.index) != list(b.index):
        raise PipelineError(f"{where}: the two Table 1 files cover different (row, eps): {list(a.index)} vs "
                            f"{list(b.index)}")
    out = pd.DataFrame(index=a.index)
    for arm, t in zip(ARMS, (a, b)):
        for col in ARM_COLUMNS:
            out[f"{col}_{arm}"] = t[col]
        r = ratios[arm].groupby(keys)["p90_over_p50"].mean()
        out[f"grad_p90_over_p50_{arm}"] = r.reindex(out.index)
    out["signed_gain_acc_cnn"] = out["acc_cnn_mean_constrained"] / out["acc_cnn_mean_unconstrained"] - 1
    out["delta_fid"] = out["fid_mean_constrained"] - out["fid_mean_unconstrained"]
    return out.reset_index()


@stage("straightdp_table2_noise_sweep", inputs=("unconstrained", "constrained", "unconstrained_metrics",
                                                 "constrained_metrics"), outputs=("table",),
       params={"config_id": "id of the settings (the constrained arm's)", "seed": "the table's seed column"})
def straightdp_table2_noise_sweep(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                                  params: Mapping[str, Any]) -> None:
    """Table 2 (right): the clamp's signed gain and the gradient-norm tail ratio at each eps, two backbones."""
    where = "stage straightdp_table2_noise_sweep"
    tables = {arm: read_table(inputs[arm]) for arm in ARMS}
    ratios = {arm: tail_ratios(inputs[f"{arm}_metrics"], where) for arm in ARMS}
    if any(v is not None for v in ratios["unconstrained"]["stream_clamp"]):
        raise PipelineError(f"{where}: --in unconstrained_metrics holds runs with a stream clamp")
    if not all(v is not None for v in ratios["constrained"]["stream_clamp"]):
        raise PipelineError(f"{where}: --in constrained_metrics holds runs without the stream clamp")
    df = noise_sweep(tables, ratios, where)
    df.insert(0, "table", "table2_noise_sweep")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))


def single_factor_ablation(tables: Mapping[str, pd.DataFrame], *, row: str, eps: float | None,
                           where: str) -> pd.DataFrame:
    """One line per arm (in the given order) at one (row, eps): CNN accuracy and FID (mean, std over
    seeds), the certified eps, and the signed gain acc_cnn(arm) / acc_cnn(unconstrained) - 1."""
    if "unconstrained" not in tables:
        raise PipelineError(f"{where}: one input must be named unconstrained (the reference arm); got "
                            f"{', '.join(tables)}")
    picked = {arm: t[t["row"] == row] for arm, t in tables.items()}
    common = set.intersection(*(set(t["eps_target"]) for t in picked.values()))
    if not common:
        raise PipelineError(f"{where}: the arms share no eps for row {row}")
    eps = min(common) if eps is None else float(eps)  # Table 2 (left) ablates at the smallest eps
    if eps not in common:
        raise PipelineError(f"{where}: eps {eps:g} is not in every arm (common: {sorted(common)})")
    out = []
    for arm, t in picked.items():
        line = t[t["eps_target"] == eps].iloc[0]
        out.append({"arm": arm, "row": row, "eps_target": eps, **{c: line[c] for c in ARM_COLUMNS}})
    df = pd.DataFrame(out)
    ref = float(df.loc[df["arm"] == "unconstrained", "acc_cnn_mean"].iloc[0])
    df["signed_gain_acc_cnn"] = df["acc_cnn_mean"] / ref - 1
    return df


@stage("straightdp_table2_ablation", outputs=("table",), any_inputs=True,
       params={"row": "the Table 1 row compared (default uniform_moments)",
               "eps": "the budget (default: the smallest eps every arm ran)",
               "config_id": "id of the settings", "seed": "the table's seed column"})
def straightdp_table2_ablation(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                               params: Mapping[str, Any]) -> None:
    """Table 2 (left): the single-factor ablation at the smallest eps. Inputs: arm name -> that backbone's
    Table 1 Parquet (e.g. unconstrained, clamp_only, late_only, decoupled_only, full)."""
    where = "stage straightdp_table2_ablation"
    tables = {arm: read_table(path) for arm, path in inputs.items()}
    eps = params.get("eps")
    df = single_factor_ablation(tables, row=str(params.get("row", "uniform_moments")),
                                eps=None if eps is None else float(eps), where=where)
    df.insert(0, "table", "table2_ablation")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))

"""Stage ``straightdp_table2``: STRAIGHTDP Table 2, the backbone under noise, from the runs of the arms.

An *arm* (``straightdp.arms``, :mod:`pipeline.methods.straightdp.runs`) reruns a Table 1 row on a
backbone with some of Sec. 3.3's constraints, pretrained with them from the start; its reference, the
*unconstrained* arm, is the main configuration's run of the same row, eps and seed (the main flow has no
constraint switch on). Per arm and eps, each run's privacy is recomputed from its transcripts and its
metrics are the shared evaluation's (:func:`pipeline.methods.straightdp.table.run_records`, ``aggregate``:
mean and std over seeds, the certified eps, refused above target). Two panels:

``noise_sweep`` (Table 2, right): the constrained backbone (the one arm of ``table2_noise_sweep``) against
  the unconstrained one at every eps of the arm: CNN accuracy and FID of each, the clamp's signed gain
  acc_cnn(constrained) / acc_cnn(unconstrained) - 1 reported whichever way it goes, and App. D.3's
  upper-tail ratio p90/p50 of the per-sample gradient norms of each (per run the step-weighted mean over
  buckets, then the mean over seeds). The ratios are NON-PRIVATE diagnostics (functions of the private
  batches, logged by ``train_straightdp``), read from each training run's metrics JSON (``grad_<run>``).
``ablation`` (Table 2, left): one line per arm of ``table2_ablation`` and the unconstrained reference at
  the smallest eps they all ran, each arm's signed gain over the reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import read_json
from pipeline.reporting.tables import write_table
from pipeline.methods.straightdp.table import MAIN_ARM, PARAMS_DOC, aggregate, param_runs, run_records
from pipeline.stage import PipelineError, stage
from pipeline.methods.straightdp.runs import StraightRun

PANELS = ("noise_sweep", "ablation")
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


def arm_name(run: StraightRun) -> str:
    """A run's backbone in Table 2: ``unconstrained`` for the main configuration's, else its arm."""
    return run.arm or "unconstrained"


def tail_ratios(runs: Sequence[StraightRun], inputs: Mapping[str, Path], where: str) -> pd.DataFrame:
    """(arm, row, eps_target, seed, p90_over_p50, stream_clamp) of each run's training metrics ``grad_<run>``,
    arm as :func:`arm_name`."""
    rows = []
    for run in runs:
        key = f"grad_{run.name}"
        if key not in inputs:
            raise PipelineError(f"{where}: run {run.name} needs --in {key}=<its train_straightdp metrics JSON>")
        m = read_json(inputs[key])
        rows.append({"arm": arm_name(run), "row": run.row, "eps_target": run.epsilon, "seed": run.seed,
                     "p90_over_p50": run_tail_ratio(m, f"{where}: {inputs[key]}"),
                     "stream_clamp": (m.get("backbone_constraints") or {}).get("stream_clamp")})
    return pd.DataFrame(rows)


def noise_sweep(tables: Mapping[str, pd.DataFrame], ratios: Mapping[str, pd.DataFrame], where: str) -> pd.DataFrame:
    """Both backbones' columns per (row, eps), the signed gain of the constrained one and each tail ratio."""
    keys = ["row", "eps_target"]
    a, b = (tables[arm].set_index(keys).sort_index() for arm in ARMS)
    if list(a.index) != list(b.index):
        raise PipelineError(f"{where}: the two backbones cover different (row, eps): {list(a.index)} vs "
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


def single_factor_ablation(tables: Mapping[str, pd.DataFrame], *, row: str, eps: float | None,
                           where: str) -> pd.DataFrame:
    """One line per arm (in the given order) at one (row, eps): CNN accuracy and FID (mean, std over
    seeds), the certified eps, and the signed gain acc_cnn(arm) / acc_cnn(unconstrained) - 1."""
    if "unconstrained" not in tables:
        raise PipelineError(f"{where}: one arm must be unconstrained (the reference); got {', '.join(tables)}")
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


def arm_tables(records: pd.DataFrame, where: str) -> dict[str, pd.DataFrame]:
    """Each arm's (row, eps) aggregate by :func:`arm_name`, the main configuration's (``unconstrained``) first."""
    out = {}
    for arm in dict.fromkeys([MAIN_ARM, *records["arm"]]):
        group = records[records["arm"] == arm]
        if group.empty:
            raise PipelineError(f"{where}: no run of the main configuration (the unconstrained reference) in "
                                f"params.runs")
        out["unconstrained" if arm == MAIN_ARM else arm] = aggregate(
            group, metrics=("acc_cnn", "fid"), epsilons=sorted(set(group["eps_target"])), where=where)
    return out


@stage("straightdp_table2", outputs=("table",), any_inputs=True,
       params={"panel": f"one of {', '.join(PANELS)}", **PARAMS_DOC,
               "runs": PARAMS_DOC["runs"] + "; the main configuration's runs are the unconstrained reference, an "
                                            "arm's (<arm>-<row>...) the constrained backbone(s); noise_sweep also "
                                            "reads --in grad_RUN= (the run's train_straightdp metrics JSON)",
               "eps": "ablation only: the budget (default: the smallest eps every arm ran)"})
def straightdp_table2(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Table 2: the clamp's signed gain and the gradient-norm tail ratio over eps (noise_sweep) or the
    single-factor ablation at the smallest eps (ablation), from the arms' runs and their references."""
    panel = params.get("panel")
    if panel not in PANELS:
        raise PipelineError(f"stage straightdp_table2: params.panel must be one of {', '.join(PANELS)}, got {panel!r}")
    where = f"stage straightdp_table2 {panel}"
    runs = param_runs(params, where)
    tables = arm_tables(run_records(inputs, runs, where), where)
    rows = sorted({r.row for r in runs})
    if len(rows) != 1:
        raise PipelineError(f"{where}: the runs must be of one Table 1 row, got {', '.join(rows)}")
    if panel == "noise_sweep":
        arms = [a for a in tables if a != "unconstrained"]
        if len(arms) != 1:
            raise PipelineError(f"{where}: the sweep compares one constrained arm with the main runs, got arms "
                                f"{arms or 'none'}")
        ratios = tail_ratios(runs, inputs, where)
        ref, con = ratios[ratios["arm"] == "unconstrained"], ratios[ratios["arm"] == arms[0]]
        if ref["stream_clamp"].notna().any():
            raise PipelineError(f"{where}: a main-configuration run (the unconstrained reference) has a stream clamp")
        if con["stream_clamp"].isna().any():
            raise PipelineError(f"{where}: an arm {arms[0]} run has no stream clamp (the sweep's constrained backbone)")
        df = noise_sweep({"unconstrained": tables["unconstrained"], "constrained": tables[arms[0]]},
                         {"unconstrained": ref, "constrained": con}, where)
        df.insert(1, "constrained_arm", arms[0])
    else:
        eps = params.get("eps")
        df = single_factor_ablation(tables, row=rows[0], eps=None if eps is None else float(eps), where=where)
    df.insert(0, "table", f"table2_{panel}")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))

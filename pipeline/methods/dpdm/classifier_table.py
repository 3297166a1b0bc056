"""Stage ``dpdm_classifier_table``: DPDM's synthetic-data classifiers beside the task-specific DP-SGD classifiers.

DPDM (Dockhorn et al. 2023, Sec. 5 "downstream utility") compares, at each eps, the real-test accuracy of a
classifier trained on the DPDM's synthetic data (its Table 1's downstream columns, here ``dpdm_table_main``) with the
same architecture trained directly on the private data by DP-SGD (rule train_dpsgd_classifier,
:mod:`pipeline.methods.dpdm.dpsgd_classifier`). One row per DP-SGD classifier run: its certified eps recomputed from its
ledger line by the replay's accountant (:func:`pipeline.methods.dpdm.table.run_privacy`), its test (and validation)
accuracy, and DPDM's synthetic-data accuracy of the same classifier at the same target eps (mean over DPDM's seeds,
with DPDM's certified eps beside it), and their difference. Both arms are scored on the same test split with the
same metric (the fraction of test images whose arg-max class is the label).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import read_json
from pipeline.reporting.tables import write_table
from pipeline.methods.dpdm.table import run_privacy
from pipeline.stage import PipelineError, stage

STAGE = "dpdm_classifier_table"


def _mean(column: pd.Series) -> float:
    """The mean of a column's numbers, NaN when it has none (an all-null column, e.g. an unconditional DPDM's
    accuracies, reads back from Parquet as strings)."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype="float64", na_value=math.nan)
    return math.nan if np.isnan(values).all() else float(np.nanmean(values))


def dpdm_accuracy(main: pd.DataFrame, classifier: str, eps_target: float) -> dict[str, Any]:
    """DPDM's synthetic-data accuracy of ``classifier`` at ``eps_target`` (mean over its seeds) from its main table,
    with the classifier seeds' std, DPDM's certified eps and its sampler; NaN where the table has no such row."""
    col = f"acc_{classifier}"
    rows = main[(main["eps_target"] - eps_target).abs() <= 1e-9 * max(1.0, eps_target)] if col in main else main[:0]
    if rows.empty:
        return {"acc_dpdm_synthetic": math.nan, "acc_dpdm_synthetic_std": math.nan, "dpdm_eps_certified": math.nan,
                "dpdm_sampler": None, "dpdm_seeds": 0}
    std = f"{col}_std"
    return {"acc_dpdm_synthetic": _mean(rows[col]),
            "acc_dpdm_synthetic_std": _mean(rows[std]) if std in rows else math.nan,
            "dpdm_eps_certified": float(rows["eps_certified"].mean()),
            "dpdm_sampler": ",".join(sorted(set(rows["sampler"].astype(str)))) if "sampler" in rows else None,
            "dpdm_seeds": int(rows["seed"].nunique()) if "seed" in rows else len(rows)}


def classifier_rows(inputs: Mapping[str, Path], rows: list[Mapping[str, Any]], main: pd.DataFrame) -> pd.DataFrame:
    """One row per ``rows`` item ({row, run, classifier, eps_target, seed}): the run's privacy from ``ledger_<row>``,
    its accuracy from ``metrics_<row>``, DPDM's beside it."""
    out = []
    for spec in rows:
        key, classifier = str(spec["row"]), str(spec["classifier"])
        for kind in ("metrics", "ledger"):
            if f"{kind}_{key}" not in inputs:
                raise PipelineError(f"stage {STAGE}: row {key!r} needs --in {kind}_{key}=PATH")
        metrics = read_json(inputs[f"metrics_{key}"])
        if metrics.get(f"acc_{classifier}") is None:
            raise PipelineError(f"stage {STAGE}: {inputs[f'metrics_{key}']} holds no acc_{classifier}")
        dpdm = dpdm_accuracy(main, classifier, float(spec["eps_target"]))
        acc = float(metrics[f"acc_{classifier}"])
        out.append({**dict(spec), **run_privacy(inputs[f"ledger_{key}"]),
                    "acc_dpsgd": acc, "acc_dpsgd_val": float(metrics[f"acc_{classifier}_val"]),
                    **dpdm, "acc_dpdm_minus_dpsgd": dpdm["acc_dpdm_synthetic"] - acc,
                    "n_test": int(metrics["n_test"])})
    return pd.DataFrame(out)


@stage(STAGE, outputs=("table",), any_inputs=True, params={
    "rows": "list of {row: KEY, run, classifier, eps_target, seed}; each row reads --in metrics_KEY= and ledger_KEY=",
    "config_id": "id of the configuration",
})
def dpdm_classifier_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DPDM's synthetic-data classifier accuracy beside the task-specific DP-SGD classifier's at the same eps (--in
    dpdm_main= the DPDM main table), certified eps recomputed from each run's ledger line."""
    rows = params.get("rows")
    if not rows:
        raise PipelineError(f"stage {STAGE}: params.rows is empty")
    if "dpdm_main" not in inputs:
        raise PipelineError(f"stage {STAGE}: --in dpdm_main=PATH (DPDM's main table) is required")
    main = pd.read_parquet(inputs["dpdm_main"])
    df = classifier_rows({k: v for k, v in inputs.items() if k != "dpdm_main"}, rows, main)
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")))

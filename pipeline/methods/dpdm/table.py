"""Stage ``dpdm_table``: DPDM's tables (main, noise multiplicity, samplers, configurations) as Parquet.

One row per (training run, sampler): the sample-quality metrics of ``evaluate_samples`` joined
with the run's privacy, read from the run's ledger transcript (the line ``train_dpdm`` wrote):
``eps_certified`` is recomputed here from the transcript alone by the replay's accountant
(:func:`pipeline.privacy.certify.recompute`), so the table's epsilon is a bound that does not
trust the training stage; ``eps_claimed`` is what the stage claimed, ``eps_target`` what the
config asked for. DPDM Table 1 (main: FID and downstream accuracy over epsilon), Table 4 / Fig. 4
(noise multiplicity K), Table 5 / App. F.4.3 (samplers) and App. C (configurations) share this
layout; their rules only choose the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.io import read_json
from pipeline.privacy import ledger
from pipeline.privacy.certify import recompute
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage

#: metric columns copied from evaluate_samples' JSON (null when the metric does not apply)
METRICS = ("fid", "kid_mean", "kid_std", "precision", "recall", "fid_class_mean", "label_consistency",
           "acc_logreg", "acc_mlp", "acc_cnn", "acc_logreg_std", "acc_mlp_std", "acc_cnn_std",
           "n_samples", "n_test", "feature_extractor",
           # what the choice of the main sampler read (rule dpdm_select_sampler), beside what test says
           "acc_cnn_val",
           # CLIP metrics (evaluation.clip; null when off)
           "clip_fd", "clip_zero_shot_acc")


def run_privacy(ledger_path: str | Path) -> dict[str, Any]:
    """Privacy columns of one DP-SGD run from its transcript (exactly one ``dpsgd`` line)."""
    lines = [entry for _, entry in ledger.read_ledger(ledger_path)]
    if len(lines) != 1 or lines[0].mechanism != "dpsgd":
        raise PipelineError(f"{ledger_path}: expected the one dpsgd line of a train_dpdm run, found "
                            f"{[e.mechanism for e in lines]}")
    entry = lines[0]
    return {"eps_certified": recompute(entry), "eps_claimed": entry.claimed_epsilon, "delta": entry.delta,
            "noise_multiplier": entry.noise_multiplier, "sampling_rate": float(entry.sampling["probability"]),
            "dpsgd_steps": entry.count, "clip": float(entry.extra.get("max_grad_norm", float("nan"))),
            "accountant": entry.accountant["name"]}


def table_rows(inputs: Mapping[str, Path], rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per ``rows`` item: its own columns, the privacy of ``ledger_<row>``, the metrics of ``metrics_<row>``."""
    out = []
    for spec in rows:
        key = str(spec["row"])
        for kind in ("metrics", "ledger"):
            if f"{kind}_{key}" not in inputs:
                raise PipelineError(f"stage dpdm_table: row {key!r} needs --in {kind}_{key}=PATH")
        metrics = read_json(inputs[f"metrics_{key}"])
        out.append({**dict(spec), **run_privacy(inputs[f"ledger_{key}"]),
                    **{m: metrics.get(m) for m in METRICS}})
    return pd.DataFrame(out)


@stage(
    "dpdm_table",
    outputs=("table",),
    any_inputs=True,
    params={
        "rows": "list of {row: KEY, column: value, ...}; each row reads --in metrics_KEY= and ledger_KEY=",
        "config_id": "id of the configuration",
        "seed": "seed of the table (each row also carries its run's seed when given in rows)",
    },
)
def dpdm_table(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A DPDM table: evaluation metrics joined with the certified eps recomputed from each run's ledger."""
    rows = params.get("rows")
    if not rows:
        raise PipelineError("stage dpdm_table: params.rows is empty")
    df = table_rows(inputs, rows)
    write_table(df, outputs["table"], config_id=params["config_id"], seed=int(params.get("seed", 0)))

"""dpdm_classifier_table: each DP-SGD classifier run beside DPDM's synthetic-data classifier at the same eps, both
certified eps recomputed from ledgers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from pipeline.privacy import dpsgd, ledger
from pipeline.methods.dpdm.classifier_table import dpdm_accuracy, dpdm_classifier_table
from pipeline.stage import PipelineError


def run_files(tmp: Path, run: str, eps: float, acc: float) -> tuple[Path, Path]:
    plan = dpsgd.plan_for_budget(target_epsilon=eps, delta=1e-5, max_grad_norm=1.0, batch_size=10, dataset_size=40,
                                 steps=4)
    path = tmp / f"train_dpsgd_classifier_{run}.jsonl"
    ledger.append_entry(path, dpsgd.ledger_entry(plan, stage="train_dpsgd_classifier", config_id="c", seed=0))
    metrics = tmp / f"{run}.json"
    metrics.write_text(json.dumps({"acc_cnn": acc, "acc_cnn_val": acc + 0.01, "n_test": 30}))
    return metrics, path


@pytest.fixture
def main_table(tmp_path) -> Path:
    path = tmp_path / "dpdm_table_main.parquet"
    pd.DataFrame({"eps_target": [1.0, 10.0, 10.0], "acc_cnn": [0.3, 0.4, 0.6], "acc_cnn_std": [0.02, 0.03, 0.01],
                  "eps_certified": [0.99, 9.9, 9.95], "sampler": ["churn"] * 3, "seed": [0, 0, 1]}).to_parquet(path)
    return path


def test_each_run_sits_beside_dpdms_accuracy_at_its_eps(tmp_path, main_table):
    inputs = {"dpdm_main": main_table}
    rows = []
    for run, eps, acc in (("cnn_eps1_seed0", 1.0, 0.7), ("cnn_eps10_seed0", 10.0, 0.85)):
        inputs[f"metrics_{run}"], inputs[f"ledger_{run}"] = run_files(tmp_path, run, eps, acc)
        rows.append({"row": run, "run": run, "classifier": "cnn", "eps_target": eps, "seed": 0})
    out = tmp_path / "t.parquet"
    dpdm_classifier_table(inputs, {"table": out}, {"rows": rows, "config_id": "c"})
    df = pd.read_parquet(out).set_index("run")
    assert df.loc["cnn_eps1_seed0", "acc_dpsgd"] == 0.7 and df.loc["cnn_eps1_seed0", "acc_dpdm_synthetic"] == 0.3
    assert df.loc["cnn_eps10_seed0", "acc_dpdm_synthetic"] == pytest.approx(0.5)  # mean over DPDM's seeds
    assert df.loc["cnn_eps10_seed0", "dpdm_seeds"] == 2
    assert df.loc["cnn_eps1_seed0", "acc_dpdm_minus_dpsgd"] == pytest.approx(-0.4)
    assert (df["eps_certified"] <= df["eps_target"]).all() and set(df["accountant"]) == {"pld_pessimistic"}
    assert df.loc["cnn_eps1_seed0", "acc_dpsgd_val"] == pytest.approx(0.71)


def test_an_eps_dpdm_did_not_run_leaves_its_columns_empty(main_table):
    got = dpdm_accuracy(pd.read_parquet(main_table), "cnn", 0.2)
    assert math.isnan(got["acc_dpdm_synthetic"]) and got["dpdm_seeds"] == 0


def test_a_missing_input_is_a_one_line_error(tmp_path, main_table):
    rows = [{"row": "r", "run": "r", "classifier": "cnn", "eps_target": 1.0, "seed": 0}]
    with pytest.raises(PipelineError, match="metrics_r"):
        dpdm_classifier_table({"dpdm_main": main_table}, {"table": tmp_path / "t.parquet"}, {"rows": rows})
    with pytest.raises(PipelineError, match="dpdm_main"):
        dpdm_classifier_table({}, {"table": tmp_path / "t.parquet"}, {"rows": rows})


def test_a_main_table_without_accuracies_gives_nan_not_a_type_error(tmp_path):
    # an unconditional DPDM's table: its accuracy columns are all null, stored as strings by the table writer
    path = tmp_path / "dpdm_table_main.parquet"
    null = pd.Series([None], dtype="string")
    pd.DataFrame({"eps_target": [1.0], "acc_cnn": null, "acc_cnn_std": null, "eps_certified": [0.99],
                  "sampler": ["churn"], "seed": [0]}).to_parquet(path)
    got = dpdm_accuracy(pd.read_parquet(path), "cnn", 1.0)
    assert math.isnan(got["acc_dpdm_synthetic"]) and math.isnan(got["acc_dpdm_synthetic_std"])
    assert got["dpdm_seeds"] == 1

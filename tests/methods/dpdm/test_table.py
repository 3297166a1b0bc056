"""dpdm_table: metrics joined with an eps recomputed from each run's ledger transcript."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.cli import load_stage
from pipeline.privacy import dpsgd, ledger
from pipeline.stage import PipelineError

PLAN = dpsgd.DPSGDPlan(noise_multiplier=1.2, max_grad_norm=1.0, sampling_rate=0.1, dataset_size=500, steps=20,
                       delta=1e-5)


def write_run(tmp_path, key, fid, acc):
    entry = dpsgd.ledger_entry(PLAN, stage="train_dpdm", config_id="test", seed=0)
    ledger.append_entry(tmp_path / f"{key}.jsonl", entry)
    (tmp_path / f"{key}.json").write_text(json.dumps({"fid": fid, "acc_cnn": acc, "acc_logreg": 0.5,
                                                      "n_samples": 100, "unrelated": 1}))
    return {f"metrics_{key}": tmp_path / f"{key}.json", f"ledger_{key}": tmp_path / f"{key}.jsonl"}


def test_rows_carry_their_columns_metrics_and_the_recomputed_certified_eps(tmp_path):
    inputs = {**write_run(tmp_path, "a", 50.0, 0.6), **write_run(tmp_path, "b", 30.0, 0.8)}
    rows = [{"row": "a", "eps_target": 1.0, "K": 1}, {"row": "b", "eps_target": 1.0, "K": 4}]
    load_stage("dpdm_table")(inputs, {"table": tmp_path / "t.parquet"}, {"rows": rows, "config_id": "c", "seed": 0})
    df = pd.read_parquet(tmp_path / "t.parquet")
    assert df["row"].tolist() == ["a", "b"] and df["K"].tolist() == [1, 4]
    assert df["fid"].tolist() == [50.0, 30.0] and df["acc_cnn"].tolist() == [0.6, 0.8]
    assert df["acc_mlp"].isna().all()  # not in the metrics: null, not invented
    # the certified eps is recomputed from the transcript (dp_accounting's own PLD): the stage's claim
    # (the fast path, split onto a coarser grid) covers it, above it by the split's excess only
    assert (df["eps_certified"] <= df["eps_claimed"]).all()
    assert (df["eps_claimed"] <= df["eps_certified"] * (1 + 1e-3)).all()
    assert df["eps_certified"].iloc[0] == pytest.approx(PLAN.epsilon(), rel=1e-2)
    assert df["noise_multiplier"].tolist() == [1.2, 1.2] and df["dpsgd_steps"].tolist() == [20, 20]
    assert df["config_id"].tolist() == ["c", "c"]


def test_a_transcript_with_more_than_the_one_run_line_is_refused(tmp_path):
    inputs = write_run(tmp_path, "a", 50.0, 0.6)
    ledger.append_entry(tmp_path / "a.jsonl", dpsgd.ledger_entry(PLAN, stage="train_dpdm", config_id="x", seed=1))
    with pytest.raises(PipelineError, match="expected the one dpsgd line"):
        load_stage("dpdm_table")(inputs, {"table": tmp_path / "t.parquet"},
                                 {"rows": [{"row": "a"}], "config_id": "c"})


def test_a_row_without_its_inputs_is_a_one_line_error(tmp_path):
    with pytest.raises(PipelineError, match="needs --in metrics_z"):
        load_stage("dpdm_table")({}, {"table": tmp_path / "t.parquet"}, {"rows": [{"row": "z"}], "config_id": "c"})

"""DPDM's main sampler is chosen on the validation split: the best mean val CNN accuracy, never test."""

from __future__ import annotations

import json

import pytest

from pipeline.io import write_json
from pipeline.methods.dpdm.select_sampler import dpdm_select_sampler
from pipeline.stage import PipelineError
from pipeline.methods.dpdm import runs as dpdm_runs


def rows_and_metrics(tmp_path, val, test):
    """Sampler ablation rows over two eps; metrics with the given per-sampler val / test accuracies."""
    rows, inputs = [], {}
    for eps in (1, 10):
        for sampler in val:
            row = f"{sampler}_eps{eps}"
            rows.append({"row": row, "sampler": sampler, "eps_target": eps})
            path = tmp_path / f"{row}.json"
            write_json(path, {"acc_cnn_val": val[sampler][eps == 10], "acc_cnn": test[sampler][eps == 10]})
            inputs[f"metrics_{row}"] = path
    return rows, inputs


def test_the_best_mean_val_accuracy_wins_whatever_test_says(tmp_path):
    val = {"ddim": (0.30, 0.50), "churn": (0.40, 0.45), "guided": (0.20, 0.60)}   # means 0.40, 0.425, 0.40
    test = {"ddim": (0.90, 0.90), "churn": (0.10, 0.10), "guided": (0.90, 0.90)}  # test would pick otherwise
    rows, inputs = rows_and_metrics(tmp_path, val, test)
    dpdm_select_sampler(inputs, {"selection": tmp_path / "sel.json"}, {"rows": rows})
    sel = json.loads((tmp_path / "sel.json").read_text())
    assert sel["sampler"] == "churn" and sel["split"] == "val" and sel["criterion"] == "acc_cnn_val"
    assert sel["mean_scores"]["churn"] == pytest.approx(0.425)


def test_ties_go_to_the_first_listed_sampler():
    assert dpdm_runs.select_sampler({"b": [0.5], "a": [0.5]}) == "b"


def test_metrics_without_val_are_refused(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"acc_cnn": 0.9})
    with pytest.raises(PipelineError, match="has no acc_cnn_val"):
        dpdm_select_sampler({"metrics_r": path}, {"selection": tmp_path / "s.json"},
                            {"rows": [{"row": "r", "sampler": "ddim"}]})


def test_the_chosen_sampler_replaces_auto_in_every_main_table_row():
    from pipeline.config import validate_config

    d = validate_config({})["dpdm"]
    assert d["sampling"]["main"] == dpdm_runs.AUTO
    chosen = dpdm_runs.with_main_sampler(d, "churn")
    for table in ("dpdm_table_main", "dpdm_table_noise_multiplicity", "dpdm_table_configurations"):
        rows = dpdm_runs.TABLES[table][0](chosen)
        assert {r["sampler"] for r in rows} == {"churn"} and {r["sampler_chosen_on"] for r in rows} == {"val"}
    fixed = {**d, "sampling": {**d["sampling"], "main": "guided"}}
    assert {r["sampler_chosen_on"] for r in dpdm_runs.main_rows(fixed)} == {"config"}

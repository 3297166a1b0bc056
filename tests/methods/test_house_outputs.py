"""The house's own outputs (pipeline/methods/_house.py): rule all's targets, the report's tables, figures, captions and
categories, the replay's transcripts and all_runs' rows, from the core's outputs and the chosen methods'
registrations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.plugins import method_names
from pipeline.methods._house import (CORE_REPORT_CATEGORIES, HEADLINE_EPSILON, OTHER_CATEGORY, Outputs,
                                     run_table_inputs, run_table_params)
from pipeline.registry import MethodRegistry, RunRecord, TranscriptSpec
from pipeline.config import config_id
from pipeline.wiring import House
from tests.methods import ROOT, house

CAPTIONS = ROOT / "report" / "captions"


def choosing(tmp_path: Path, methods: list[str]) -> House:
    """config.yaml's House with ``methods`` chosen."""
    return house(tmp_path, lambda cfg: cfg.update(methods=methods))


def registry(tmp_path: Path) -> MethodRegistry:
    """dpdm: a table, a figure, a JSON and one transcript and run; sensgeo: a table only."""
    reg = MethodRegistry()
    spec = TranscriptSpec(claims=1, run="r1", stage="train_dpdm", delta=1e-5, data=tmp_path / "p.npz",
                          params={"count": 1})
    run = RunRecord(method="dpdm", config="r1/ddim", seed=0, metrics=tmp_path / "m.json", ledgers=(tmp_path / "l",))
    reg.register_targets("dpdm", lambda: [tmp_path / "dpdm_t.parquet", tmp_path / "dpdm_f.png", tmp_path / "x.json"])
    reg.register_transcripts("dpdm", lambda: {tmp_path / "l.jsonl": spec})
    reg.register_runs("dpdm", lambda: [run])
    reg.register_bundles("dpdm", lambda: ["r1"], lambda name: None)
    reg.register_targets("sensgeo", lambda: [tmp_path / "sensgeo_t.parquet"])
    return reg


@pytest.fixture
def out(tmp_path) -> Outputs:
    return Outputs(choosing(tmp_path, ["dpdm", "sensgeo"]), registry(tmp_path), CAPTIONS)


def test_rule_all_is_the_splits_the_core_report_every_chosen_target_and_bundle_the_replay_and_the_summary(out,
                                                                                                       tmp_path):
    r = tmp_path / "r"
    targets = out.all_targets()
    assert targets[:len(out.house.data_splits())] == list(out.house.data_splits().values())
    assert targets[-3:] == [r / "digits" / "ledger" / "replay.json", r / "index.html", r / "report" / "tables"]
    assert tmp_path / "x.json" in targets and tmp_path / "sensgeo_t.parquet" in targets
    # every private run's bundle (a folder), before the replay and the summary
    assert targets[-4] == r / "bundles" / "dpdm" / "r1"
    assert out.core_report == [r / "figures" / "privacy_utility.png", r / "tables" / "all_runs.parquet",
                               r / "tables" / "runtime.parquet", r / "figures" / "runtime.png",
                               r / "tables" / "reference_real.parquet", r / "figures" / "data_samples.png"]
    assert out.after_all == out.core_report[:4]


def test_the_report_shows_tables_and_figures_and_the_runtime_table_waits_for_all_but_the_comparison(out,
                                                                                                   tmp_path):
    inputs = out.report_inputs()
    assert tmp_path / "x.json" not in inputs and tmp_path / "dpdm_f.png" in inputs
    before = out.before_runtime()
    bundles = [tmp_path / "r" / "bundles" / "dpdm" / "r1"]  # each export_bundle job's cost is a row of the table
    assert before[-1:] == bundles and not set(before) & set(out.after_all)
    assert set(before) | set(out.after_all) == set(inputs) | set(bundles)
    tables = out.report_table_inputs()
    assert tables["dpdm_t"] == tmp_path / "dpdm_t.parquet" and "all_runs" in tables and "dpdm_f" not in tables
    # each view's inputs: the tables and, keyed caption_of_<table>, the caption its view shows above it
    views = out.report_view_inputs()
    assert {k: v for k, v in views.items() if not k.startswith("caption_of_")} == tables
    assert views["caption_of_all_runs"] == CAPTIONS / "all_runs.rst"
    assert views["caption_of_dpdm_t"] == out.missing_caption and len(views) == 2 * len(tables)


def test_a_method_left_out_of_methods_reaches_nothing(tmp_path):
    out = Outputs(choosing(tmp_path, ["sensgeo"]), registry(tmp_path), CAPTIONS)
    assert tmp_path / "dpdm_t.parquet" not in out.all_targets()
    assert out.ledger_claims() == {} and out.ledger_transcripts() == []
    assert [r.method for r in out.all_run_records()] == ["reference"]


def test_the_replay_reads_every_chosen_transcript_and_all_runs_the_reference_first(out, tmp_path):
    assert out.ledger_transcripts() == [tmp_path / "l.jsonl"] == list(out.ledger_claims())
    records = out.all_run_records()
    assert [r.method for r in records] == ["reference", "dpdm"]
    ref = records[0]
    assert (ref.private, ref.ledgers, ref.label) == (False, (), "real held-out data")
    assert ref.metrics == str(out.reference_metrics) == str(tmp_path / "r" / "digits" / "eval" / "reference_real" /
                                                            "metrics.json")
    assert out.core_runs() == [ref]


def test_a_chosen_method_no_rule_file_registers_is_one_line(tmp_path):
    Outputs(choosing(tmp_path, ["dpdm"]), registry(tmp_path), CAPTIONS).check_registered()
    with pytest.raises(ValueError, match="config error at methods: empden has no rule file registering it"):
        Outputs(choosing(tmp_path, ["dpdm", "empden"]), registry(tmp_path), CAPTIONS).check_registered()


def test_a_run_tables_inputs_and_params_are_its_records_files_and_the_rest(tmp_path):
    a = RunRecord(method="m", config="a", seed=0, metrics="e/a.json", ledgers=("l/a1", "l/a2"))
    b = RunRecord(method="m", config="b", seed=1, metrics="e/b.json", private=False)
    assert run_table_inputs([a, b]) == {"metrics_0": "e/a.json", "ledger_0_0": "l/a1", "ledger_0_1": "l/a2",
                                        "metrics_1": "e/b.json"}
    runs = json.loads(run_table_params([a, b]))["runs"]
    assert [r["config"] for r in runs] == ["a", "b"] and not any("metrics" in r or "ledgers" in r for r in runs)


def test_every_table_and_figure_has_a_category_the_core_first_then_each_methods_declaration(out):
    assert out.report_categories[:len(CORE_REPORT_CATEGORIES)] == CORE_REPORT_CATEGORIES
    assert out.report_category("all_runs") == "1 Comparison"
    assert out.report_category("dpdm_table_main") == "4 DPDM"
    # the diagnostics and the accounting tables declare no category of their own: their empden_* names are EMPDEN's
    assert out.report_category("empden_diagnostics_table1") == out.report_category("empden_table8_grid") == "3 EMPDEN"
    assert out.report_category("straightdp_table1_main") == "5 STRAIGHTDP"
    assert out.report_category("nobody_declares_this") == OTHER_CATEGORY
    assert {cat for _, cat in out.report_categories} >= {"1 Comparison", "9 Cost"}
    assert len(method_names()) >= 8


def test_a_caption_is_the_kinds_own_then_the_names_then_the_missing_one(out, tmp_path):
    caps = tmp_path / "captions"
    caps.mkdir()
    (caps / "t_table.rst").write_text("table view")
    (caps / "t.rst").write_text("shared")
    (caps / "_missing.rst").write_text("missing")
    o = Outputs(out.house, out.registry, caps)
    assert o.caption_path("t", "table") == str(caps / "t_table.rst")
    assert o.caption_path("t", "figure") == str(caps / "t.rst")
    assert o.caption_path("u", "figure") == str(o.missing_caption) == str(caps / "_missing.rst")
    assert out.table_captions()["all_runs"] == (CAPTIONS / "all_runs.rst").read_text()


def test_the_summary_page_is_titled_by_the_experiment_says_what_was_run_and_its_headlines_sit_nearest_eps_1(out):
    params = json.loads(out.index_params(configfiles=[Path("config.yaml").resolve(), "/elsewhere/mine.yaml"],
                                         overrides=["seed", "dpdm"]))
    assert params == {"title": "DP generative models: digits", "headline_epsilon": 1.0,
                      "run": {"configfiles": ["config.yaml", "/elsewhere/mine.yaml"], "overrides": ["dpdm", "seed"],
                              "config_id": config_id(dict(out.house.config)), "seed": out.house.seed}}
    assert HEADLINE_EPSILON == 1.0 and out.chosen == ["dpdm", "sensgeo"]

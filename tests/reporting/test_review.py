"""The reviewer's first page and the report's table views (pipeline/reporting/review.py).

The summary picks each method's headline configuration by certified eps only (nearest the headline
eps, mean over seeds; never by a test metric), shows the non-private references apart, and embeds the
privacy-utility figure so the page stands alone inside Snakemake's report. Table views keep every row
and column of the table but are readable: grouped columns, 4 significant digits, long strings as codes.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.reporting.review import (MISSING, code_commit, column_group, headline_html, headline_rows, index_html,
                                       methods_without_headline, provenance_html, reference_rows, report_tables,
                                       summary_fragment, table_view, without_seed)
from pipeline.reporting.tables import write_table

REPO = Path(__file__).resolve().parents[2]


def runs() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        for eps, fid in ((0.2, 90.0), (1.0, 60.0 + seed), (10.0, 40.0)):
            rows.append({"method": "dpdm", "label": "DPDM", "config": f"eps{eps}_seed{seed}/ddim", "seed": seed,
                         "private": True, "headline": True, "eps_certified": eps * 0.999, "fid": fid, "acc_cnn": 0.5,
                         "label_consistency": 0.9, "audit_eps_lb": 0.01 * (1 + seed)})
        # an ablation at exactly the headline eps: never the headline
        rows.append({"method": "dpdm", "label": "DPDM (ablations)", "config": f"eps1.0_seed{seed}/churn",
                     "seed": seed, "private": True, "headline": False, "eps_certified": 1.0, "fid": 900.0,
                     "acc_cnn": 0.1, "label_consistency": 0.1, "audit_eps_lb": 0.0})
        rows.append({"method": "pe", "label": "PE", "config": "eps3", "seed": seed, "private": True, "headline": True,
                     "eps_certified": 3.0, "fid": 70.0, "acc_cnn": 0.4, "label_consistency": 0.5,
                     "audit_eps_lb": np.nan})
        rows.append({"method": "reference", "label": "real held-out data", "config": "reference_real", "seed": seed,
                     "private": False, "headline": True, "eps_certified": np.nan, "fid": 7.0, "acc_cnn": 0.8,
                     "label_consistency": np.nan, "audit_eps_lb": np.nan})
    return pd.DataFrame(rows)


def test_each_method_heads_with_its_main_configuration_nearest_the_headline_eps():
    head = headline_rows(runs(), 1.0).set_index("method")
    assert list(head.index) == ["dpdm", "pe"]  # one row per method, references apart
    assert head.loc["dpdm", "config"] == "eps1.0/ddim" and head.loc["dpdm", "seeds"] == 2  # seeds pooled
    assert head.loc["dpdm", "label"] == "DPDM"  # not the ablation at exactly eps 1
    assert head.loc["dpdm", "fid"] == pytest.approx(60.5)  # mean over seeds
    assert head.loc["dpdm", "audit_eps_lb"] == pytest.approx(0.02)  # the largest over seeds
    assert head.loc["pe", "config"] == "eps3" and np.isnan(head.loc["pe", "audit_eps_lb"])
    assert headline_rows(runs(), 10.0).set_index("method").loc["dpdm", "config"] == "eps10.0/ddim"
    assert [without_seed(c) for c in ("uniform_eps1_seed1", "hybrid/p40_B200_T3_beta1_s0", "sensgeo")] == \
        ["uniform_eps1", "hybrid/p40_B200_T3_beta1", "sensgeo"]


def test_a_method_with_only_ablation_rows_gets_no_headline_and_is_named_instead():
    df = runs()
    df.loc[df["method"] == "pe", "headline"] = False
    assert "pe" not in set(headline_rows(df, 1.0)["method"])
    assert methods_without_headline(df) == ["pe"] and methods_without_headline(runs()) == []
    html = headline_html(headline_rows(df, 1.0), methods_without_headline(df))
    assert "No main-configuration row" in html and "pe." in html


def test_an_empty_audit_cell_says_not_audited_and_an_unlabelled_sampler_says_why_it_has_no_accuracy():
    df = runs()
    df = pd.concat([df, pd.DataFrame([{"method": "empden", "label": "EMPDEN hybrid", "config": "hybrid/p50_s0",
                                       "seed": 0, "private": True, "headline": True, "eps_certified": 1.1,
                                       "fid": 80.0, "acc_cnn": np.nan, "label_consistency": np.nan,
                                       "audit_eps_lb": 0.0}])], ignore_index=True)
    view = headline_html(headline_rows(df, 1.0), [])
    rows = dict(re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", view))
    assert "<td>not audited</td>" in rows["PE"] and "<td>0</td>" in rows["EMPDEN hybrid"]
    assert "<td>–¹</td>" in rows["EMPDEN hybrid"] and "<td>0.5</td>" in rows["DPDM"]
    assert "these samples carry no class label" in view and "0 means the audit ran and found no evidence" in view
    # with every sampler labelled, no footnote mark is explained
    assert "carry no class label" not in headline_html(headline_rows(runs(), 1.0), [])


def test_an_unlabelled_reference_says_why_it_has_no_accuracy():
    refs = pd.DataFrame({"label": ["real held-out data", "public denoiser only"], "config": ["r", "p"],
                         "fid": [7.0, 170.0], "acc_cnn": [0.8, np.nan]})
    page = summary_fragment(verdict_html="", figure=None, headline=headline_rows(runs(), 1.0), references=refs,
                            epsilon=1.0)
    assert "<td>public denoiser only</td><td>p</td><td>170</td><td>–¹</td>" in page
    assert "an unconditional sampler's samples carry no class label" in page
    assert "carry no class label" not in summary_fragment(verdict_html="", figure=None,
                                                           headline=headline_rows(runs(), 1.0),
                                                           references=refs.iloc[:1], epsilon=1.0)


def test_the_page_says_what_was_run_under_its_title(tmp_path):
    run = {"configfiles": ["config.yaml", "configs/digits_full.yaml"], "overrides": ["seed"], "config_id": "abc123",
           "seed": 3}
    line = provenance_html(run, commit="0123456789ab", written="2026-12-05 10:00 UTC")
    mono = "<span style='font-family:monospace'>{}</span>".format
    for said in (f"{mono('config.yaml')} + {mono('configs/digits_full.yaml')}", "the reference run", mono("seed"),
                 mono("abc123"), "<b>seed:</b> 3", mono("0123456789ab"), "2026-12-05 10:00 UTC"):
        assert said in line, said
    assert "<code>" not in line  # the report's stylesheet would wrap each in backticks
    assert "the quick tour" in provenance_html({"configfiles": ["config.yaml"]}, commit="c", written="w")
    assert "a paper preset" in provenance_html({"configfiles": ["config.yaml", "configs/mnist.yaml"]}, commit="c",
                                               written="w")
    assert re.fullmatch(r"[0-9a-f]{12}( \+ local changes)?|unknown \(not a git checkout\)", code_commit())


def test_references_are_the_non_private_rows():
    ref = reference_rows(runs())
    assert ref["label"].tolist() == ["real held-out data"] and ref["fid"].tolist() == [7.0]


def test_the_summary_page_embeds_the_figure_and_writes_the_same_fragment_for_the_report(tmp_path):
    write_table(runs(), tmp_path / "all_runs.parquet", config_id="c", seed=0)
    png = tmp_path / "privacy_utility.png"
    png.write_bytes(b"\x89PNG fake")
    index_html({"all_runs": tmp_path / "all_runs.parquet", "figure": png},
               {"index": tmp_path / "index.html", "fragment": tmp_path / "summary.html"},
               {"title": "unit", "run": {"configfiles": ["config.yaml"], "config_id": "c0ffee", "seed": 0}})
    page, fragment = (tmp_path / "index.html").read_text(), (tmp_path / "summary.html").read_text()
    assert fragment.strip() in page
    assert base64.b64encode(png.read_bytes()).decode() in fragment
    assert fragment.index("c0ffee") < fragment.index("no report given") < fragment.index("<img") < \
        fragment.index("One row per method")
    assert fragment.index("One row per method") < fragment.index("References")
    assert re.search(r"<td>DPDM</td><td>eps1.0/ddim</td><td>2</td><td>0.999</td>", fragment)


def test_a_table_view_puts_the_rows_name_and_key_columns_first_and_keeps_every_label_whole():
    long = "STRAIGHTDP: Released moments only, a label far longer than a table cell"
    df = pd.DataFrame({"note": ["x", "y"], "wall_s": [3.0, 4.0], "fid": [12.3456789, np.nan],
                       "config": ["a", "b"], "label": [long, "short"], "eps_certified": [0.99949, 1.0],
                       "acc_cnn": [0.5, 0.6], "delta": [1e-5, 1e-5], "kid_mean": [1.0, 2.0]})
    view = table_view(df)
    headers = re.findall(r"<th>([a-z_]+)</th>", view)
    assert headers == ["label", "eps_certified", "fid", "acc_cnn", "config", "delta", "kid_mean", "wall_s", "note"]
    assert re.findall(r"<th colspan='(\d)'>(\w+)</th>", view) == [
        ("4", "key"), ("1", "run"), ("1", "privacy"), ("1", "quality"), ("1", "cost"), ("1", "other")]
    assert "12.35" in view and "0.9995" in view and "12.3456789" not in view
    assert f"<td class='text'>{long}</td>" in view and "[s1]" not in view  # in full, wrapped, never a code
    assert [column_group(c) for c in ("acc_cnn", "epsilon_lb", "max_rss_mb", "config", "clip_fd_mean",
                                      "clip_zero_shot_acc", "clip_norm")] == \
        ["quality", "privacy", "cost", "run", "quality", "quality", "privacy"]


def test_a_table_view_has_one_missing_value_mark_whatever_the_type_and_says_what_it_means():
    df = pd.DataFrame({"method": ["a", "b", "c"], "fid": [1.0, np.nan, 2.0]})
    df["note"] = pd.array(["x", pd.NA, None], dtype="string")
    df["n"] = pd.array([1, pd.NA, 3], dtype="Int64")
    view = table_view(df)
    assert "&lt;NA&gt;" not in view and "<NA>" not in view and "None" not in view and "nan" not in view
    assert view.count(f"<td>{MISSING}</td>") == 4 and f"{MISSING} no value" in view
    assert f"{MISSING} no value" not in table_view(df.dropna())


def test_a_table_views_caption_is_above_the_table(tmp_path):
    write_table(pd.DataFrame({"fid": [1.0]}), tmp_path / "t.parquet", config_id="c", seed=0)
    (tmp_path / "t.rst").write_text("The **certified** ε of each run.")
    report_tables({"t": tmp_path / "t.parquet", "caption_of_t": tmp_path / "t.rst"}, {"dir": tmp_path / "v"}, {})
    view = (tmp_path / "v" / "t.html").read_text()
    assert "<strong>certified</strong>" in view and view.index("certified") < view.index("<table>")
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["t.html"]  # a caption is not a table


def test_report_tables_writes_one_view_per_table(tmp_path):
    for name in ("a", "b"):
        write_table(pd.DataFrame({"fid": [1.0, 2.0]}), tmp_path / f"{name}.parquet", config_id="c", seed=0)
    report_tables({"a": tmp_path / "a.parquet", "b": tmp_path / "b.parquet"}, {"dir": tmp_path / "views"}, {})
    assert sorted(p.name for p in (tmp_path / "views").iterdir()) == ["a.html", "b.html"]


def test_every_table_and_figure_of_the_default_all_has_its_own_caption(tmp_path):
    """The report's captions (report/captions/): every table view and figure the embedded default builds has
    a caption file of its own (not the placeholder) that names what is certified."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--nolock", "--cores", "1", "all",
                          "--config", f"results_dir={tmp_path / 'r'}"], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    shell = next(line for line in res.stdout.splitlines() if line.startswith("Shell command: python -m pipeline "
                                                                              "report_tables"))
    tables = re.findall(r" (\w+)=\S+\.parquet", shell)
    figures = set(re.findall(r'report_figure\("(\w+)"\)', "".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))))
    assert len(tables) > 30 and len(figures) > 15
    captions = REPO / "report" / "captions"
    for name, kind in [(t, "table") for t in tables] + [(f, "figure") for f in figures]:
        path = next((p for p in (captions / f"{name}_{kind}.rst", captions / f"{name}.rst") if p.is_file()), None)
        assert path is not None, f"no caption for {kind} {name}"
        assert len(path.read_text().split()) >= 15, f"{path.name} is too short to say what it shows"

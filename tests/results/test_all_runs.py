"""all_runs.parquet: one row per evaluated run of every method, its certified eps recomputed from its
own transcripts (several lines composed), references without eps, the figure drawn from it."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import rgb_to_hsv
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from pipeline.privacy import accountants as acc
from pipeline.privacy import dp_merf as merf
from pipeline.privacy import ledger
from pipeline.privacy import private_evolution as pe
from pipeline.results.all_runs import all_runs_table, label_styles, privacy_utility_figure, privacy_utility_figure_of
from pipeline.results.baselines import baselines_table
from pipeline.results.runtime import runtime_table
from pipeline.stage import PipelineError

COARSE = acc.PLDSettings(1e-3)
MERF = merf.MerfReleasePlan(sigma=2.0, m=100, n_features=4, n_classes=2, delta=1e-5)
PE = pe.PEHistogramPlan(sigma=4.0, T=3, delta=1e-5)


def write_metrics(path, fid, acc_cnn):
    path.write_text(json.dumps({"fid": fid, "acc_cnn": acc_cnn, "kid_mean": 0.01, "n_samples": 10, "clip_fd": None}))
    return path


def write_line(path, entry):
    ledger.append_entry(path, entry)
    return path


@pytest.fixture()
def files(tmp_path):
    f = {"m_merf": write_metrics(tmp_path / "merf.json", 50.0, 0.7),
         "m_two": write_metrics(tmp_path / "two.json", 40.0, 0.8),
         "m_ref": write_metrics(tmp_path / "ref.json", 1.0, 0.95),
         "l_merf": write_line(tmp_path / "merf.jsonl", merf.ledger_entry(MERF, stage="s", config_id="c", seed=0,
                                                                          settings=COARSE)),
         "l_pe": write_line(tmp_path / "pe.jsonl", pe.ledger_entry(PE, stage="s", config_id="c", seed=0,
                                                                    settings=COARSE))}
    return f


RUNS = [{"method": "dp_merf", "config": "dp_merf_eps3_seed0", "seed": 0, "epsilon_target": 3.0, "private": True,
         "label": "DP-MERF"},
        {"method": "two", "config": "both", "seed": 1, "epsilon_target": 9.0, "private": True, "label": "two lines"},
        {"method": "reference", "config": "reference_real", "seed": 0, "epsilon_target": None, "private": False,
         "label": "real"}]


def inputs(f):
    return {"metrics_0": f["m_merf"], "ledger_0_0": f["l_merf"], "metrics_1": f["m_two"], "ledger_1_0": f["l_merf"],
            "ledger_1_1": f["l_pe"], "metrics_2": f["m_ref"]}


def test_one_row_per_run_with_its_composed_certified_eps(files, tmp_path):
    all_runs_table(inputs(files), {"table": tmp_path / "all.parquet"}, {"runs": RUNS, "config_id": "x"})
    df = pd.read_parquet(tmp_path / "all.parquet")
    assert list(df["config"]) == ["dp_merf_eps3_seed0", "both", "reference_real"]
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dp_event.GaussianDpEvent(2.0))
    assert df.loc[0, "eps_certified"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)
    both = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    both.compose(dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(2.0),
                                           dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(4.0), 3)]))
    assert df.loc[1, "eps_certified"] == pytest.approx(both.get_epsilon(1e-5), rel=1e-6)
    assert df.loc[1, "eps_certified"] > df.loc[0, "eps_certified"]  # composing never spends less
    assert df.loc[1, "mechanisms"] == "dp_merf_embedding,pe_nn_histogram"
    assert math.isnan(df.loc[2, "eps_certified"]) and not df.loc[2, "private"]
    assert df["private"].sum() == 2 and df.loc[df["private"], "eps_certified"].notna().all()
    assert df.loc[0, "fid"] == 50.0 and math.isnan(df.loc[0, "clip_fd"])
    assert math.isnan(df.loc[0, "cost_wall_s"])  # no benchmark files given
    assert str(df["n_samples"].dtype) == "Int64" and df["n_samples"].tolist() == [10, 10, 10]  # a count
    assert df["headline"].tolist() == [True, True, True]  # a run is its method's main configuration unless it says


def test_a_private_run_without_its_transcript_is_refused(files, tmp_path):
    ins = inputs(files)
    del ins["ledger_0_0"]
    with pytest.raises(PipelineError, match="no ledger transcript"):
        all_runs_table(ins, {"table": tmp_path / "t.parquet"}, {"runs": RUNS, "config_id": "x"})


BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def test_costs_come_from_the_runtime_table_rows_of_the_runs_jobs(files, tmp_path):
    root = tmp_path / "benchmarks"
    (root / "train").mkdir(parents=True)
    (root / "evaluate").mkdir()
    (root / "train" / "a.tsv").write_text(BENCH_HEADER + "12.5\t0:00:12\t300.0\t1\t1\t1\t0\t0\t50\t20.0\n")
    (root / "evaluate" / "a.tsv").write_text(BENCH_HEADER + "2.5\t0:00:02\t100.0\t1\t1\t1\t0\t0\t50\t3.0\n")
    runtime_table({}, {"table": tmp_path / "runtime.parquet"}, {"benchmarks": str(root), "config_id": "x"})
    runs = [dict(RUNS[0], benchmarks=[str(root / "train" / "a.tsv"), str(root / "evaluate" / "a.tsv")]),
            dict(RUNS[2], benchmarks=[str(root / "train" / "never_ran.tsv")])]
    all_runs_table({"metrics_0": files["m_merf"], "ledger_0_0": files["l_merf"], "metrics_1": files["m_ref"],
                    "runtime": tmp_path / "runtime.parquet"}, {"table": tmp_path / "a.parquet"},
                   {"runs": runs, "config_id": "x"})
    df = pd.read_parquet(tmp_path / "a.parquet")
    assert (df.loc[0, "cost_wall_s"], df.loc[0, "cost_cpu_s"], df.loc[0, "cost_max_rss_mb"]) == (15.0, 23.0, 300.0)
    assert math.isnan(df.loc[1, "cost_wall_s"])  # a job without a benchmark row: unknown, not zero


def test_the_baselines_table_leaves_cost_to_all_runs_rather_than_print_columns_of_nan(files, tmp_path):
    """baselines_table runs before the runtime table exists: it has no cost columns (all_runs has them)."""
    baselines_table({"metrics_0": files["m_merf"], "ledger_0_0": files["l_merf"]},
                    {"table": tmp_path / "b.parquet"}, {"runs": [RUNS[0]], "config_id": "x"})
    df = pd.read_parquet(tmp_path / "b.parquet")
    assert not [c for c in df.columns if c.startswith("cost_")] and df.loc[0, "eps_certified"] <= 3.0


def test_the_baselines_table_fails_a_run_over_its_target(files, tmp_path):
    over = [dict(RUNS[0], epsilon_target=0.5)]
    with pytest.raises(PipelineError, match="> its target"):
        baselines_table({"metrics_0": files["m_merf"], "ledger_0_0": files["l_merf"]},
                        {"table": tmp_path / "b.parquet"}, {"runs": over, "config_id": "x"})


def test_the_figure_draws_every_private_label_and_the_references(files, tmp_path):
    all_runs_table(inputs(files), {"table": tmp_path / "all.parquet"}, {"runs": RUNS, "config_id": "x"})
    privacy_utility_figure({"table": tmp_path / "all.parquet"}, {"figure": tmp_path / "pu.png"}, {})
    assert (tmp_path / "pu.png").stat().st_size > 10_000 and (tmp_path / "pu.pdf").is_file()


def comparison_rows(seeds=(0,)) -> pd.DataFrame:
    """An all_runs table shaped like the embedded default's: EMPDEN cells without labels (points, no accuracy), its
    public-only reference (FID only), seven STRAIGHTDP lines, two baselines, the real data."""
    rows = []
    for seed in seeds:
        for k in range(11):
            rows.append({"method": "empden", "label": "EMPDEN hybrid", "config": f"hybrid/p{k}_s{seed}",
                         "epsilon_target": math.nan, "eps_certified": 0.5 + k, "fid": 60.0 + 80 * k,
                         "acc_cnn": math.nan})
        rows.append({"method": "empden", "label": "EMPDEN per-step", "config": f"per_step/p1_s{seed}",
                     "epsilon_target": math.nan, "eps_certified": 3.0, "fid": 900.0, "acc_cnn": math.nan})
        rows.append({"method": "empden", "label": "public denoiser only (EMPDEN)", "config": f"public_only/s{seed}",
                     "private": False, "fid": 200.0, "acc_cnn": math.nan})
        for j in range(7):
            for eps in (0.3, 1.0, 3.0):
                rows.append({"method": "straightdp", "label": f"STRAIGHTDP: row {j}", "config": f"r{j}_eps{eps}_seed{seed}",
                             "epsilon_target": eps, "eps_certified": eps, "fid": 100.0 + j + 10 * seed,
                             "acc_cnn": 0.5 + 0.01 * j + 0.05 * seed})
        for method in ("dp_merf", "pe"):
            rows.append({"method": method, "label": method.upper(), "config": f"{method}_eps1_seed{seed}",
                         "epsilon_target": 1.0, "eps_certified": 1.0, "fid": 300.0, "acc_cnn": 0.3})
        rows.append({"method": "reference", "label": "real held-out data", "config": "reference_real",
                     "private": False, "fid": 5.0, "acc_cnn": 0.97})
    df = pd.DataFrame(rows)
    df["private"] = df["private"].fillna(True).astype(bool) if "private" in df else True
    df["in_figure"] = True
    df["seed"] = [int(c.rsplit("s", 1)[-1].replace("eed", "")) if c != "reference_real" else 0 for c in df["config"]]
    return df


def test_every_mark_of_the_comparison_figure_is_in_its_legend_one_colour_family_per_method():
    fig = privacy_utility_figure_of(comparison_rows())
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    drawn = {a.get_label() for ax in fig.axes for a in (*ax.lines, *ax.collections)
             if not a.get_label().startswith("_")}
    assert drawn == legend and len(legend) == 2 + 7 + 2 + 2  # EMPDEN's points and public line although no accuracy
    styles = label_styles(comparison_rows())
    colours = {label: style["color"] for label, style in styles.items()}
    assert len(set(colours.values())) == len(colours)  # no two labels share a colour (tab10 wrapped at 10)
    # a method's labels share a hue (shades of one family); two methods' hues differ
    hue = {label: rgb_to_hsv(np.array(c)[:3])[0] for label, c in colours.items()}
    private = comparison_rows()[lambda d: d["private"]]
    first = {}
    for method, g in private.groupby("method", sort=False):
        hues = [hue[lab] for lab in dict.fromkeys(g["label"])]
        assert max(hues) - min(hues) < 0.06, method
        first[method] = hues[0]
    assert min(abs(a - b) for i, a in enumerate(first.values()) for b in list(first.values())[i + 1:]) > 0.06
    # STRAIGHTDP's seven lines differ in line style or marker too, not in shade alone
    assert len({(styles[f"STRAIGHTDP: row {j}"]["linestyle"], styles[f"STRAIGHTDP: row {j}"]["marker"])
                for j in range(7)}) == 7


def test_the_comparison_figures_log_axes_have_readable_ticks_and_its_title_says_whether_bands_are_drawn():
    fig = privacy_utility_figure_of(comparison_rows())
    fig.canvas.draw()
    fid_ax = fig.axes[1]
    lo, hi = fid_ax.get_ylim()
    ticks = [t for t in fid_ax.yaxis.get_majorticklocs() if lo <= t <= hi]
    assert len(ticks) >= 4, ticks  # FIDs 5 to 900: more than the decades' 10 and 100
    assert all(t.get_text() for t in fid_ax.get_yticklabels() if lo <= t.get_position()[1] <= hi)
    bands = [c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert "no band" in fig._suptitle.get_text() and not bands  # one seed: no band of width zero that looks certain
    two = privacy_utility_figure_of(comparison_rows(seeds=(0, 1)))
    assert "band = the seeds' range" in two._suptitle.get_text()
    assert [c for c in two.axes[0].collections if isinstance(c, PolyCollection)]
    # two seeds of a grid drawn as points (EMPDEN's cells) draw no band, so the title says none
    points = comparison_rows(seeds=(0, 1))[lambda d: d["method"].isin(["empden", "reference"])]
    assert "no band" in privacy_utility_figure_of(points)._suptitle.get_text()


def test_the_audit_columns_join_on_the_trained_models_run(files, tmp_path):
    from pipeline.reporting.tables import write_table

    mia = pd.DataFrame({"run": ["dp_merf_eps3_seed0"] * 2 + ["other"], "auc": [0.52, 0.55, 0.9],
                        "tpr_at_1pct_fpr": [0.01, 0.02, 0.5], "under_curve": [True, True, False]})
    one = pd.DataFrame({"transcript": ["merf", "elsewhere"], "epsilon_lb": [0.4, 2.0]})
    write_table(mia, tmp_path / "mia.parquet", config_id="x", seed=0)
    write_table(one, tmp_path / "one.parquet", config_id="x", seed=0)
    runs = [dict(RUNS[0], config="dp_merf_eps3_seed0/sampler"), RUNS[2]]
    all_runs_table({"metrics_0": files["m_merf"], "ledger_0_0": files["l_merf"], "metrics_1": files["m_ref"],
                    "audit_mia": tmp_path / "mia.parquet", "audit_one_run": tmp_path / "one.parquet"},
                   {"table": tmp_path / "a.parquet"}, {"runs": runs, "config_id": "x"})
    df = pd.read_parquet(tmp_path / "a.parquet")
    row = df.loc[0]
    assert (row["mia_auc_max"], row["mia_tpr_at_1pct_fpr_max"], row["audit_eps_lb"]) == (0.55, 0.02, 0.4)
    assert bool(df.loc[0, "mia_under_curve"]) and pd.isna(df.loc[1, "mia_under_curve"])
    assert math.isnan(df.loc[1, "mia_auc_max"]) and math.isnan(df.loc[1, "audit_eps_lb"])


@pytest.mark.parametrize(("config", "point"), [
    ("pe_eps1_seed2", "pe_eps1"), ("hybrid/p55_B25_T3_beta1_s0", "hybrid/p55_B25_T3_beta1"),
    ("edm_eps1_K4_seed3/ddim", "edm_eps1_K4/ddim"), ("reference_real", "reference_real")])
def test_a_figure_point_is_a_configuration_over_its_seeds(config, point):
    from pipeline.results.all_runs import configuration

    assert configuration(config) == point

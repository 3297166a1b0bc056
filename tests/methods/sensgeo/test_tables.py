"""SENSGEO stages: every table and figure is written from the config's own keys, and says what it should."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from pipeline.methods.sensgeo import tables as stages
from pipeline.cli import STAGES, load_stage
from pipeline.config import validate_config
from pipeline.stage import PipelineError


@pytest.fixture(scope="module")
def small():
    """The schema defaults with every grid shrunk, so the key names are the real ones."""
    cfg = validate_config({"sensgeo": {
        "fig1": {"d": [2, 3], "n_covariances": 200},
        "guarantees": {"rho_star": [0.1, 2.0], "delta": [1e-5, 1e-9]},
        "sdp": {"m": [3, 5], "d": [2], "queries": ["fixed", "uniform"], "weight": "random", "eta": 0.01},
        "mi": {"n_points": 20, "kappa": [0.01, 0.3]},
        "bridge": {"m": 10, "n_records": 5, "t": [0.1, 1.0], "n_queries": 4},
    }})["sensgeo"]
    return cfg


def _params(cfg, section):
    return {"config_id": "test", "seed": cfg["seed"], section: cfg[section]}


def test_fig1_titles_in_mathtext_and_gives_each_dimension_its_own_outlined_colour():
    rng = np.random.default_rng(0)
    ratios = {2: 1 + rng.random(50), 3: 1.2 + rng.random(50)}
    fig = stages.fig1_figure_of(ratios, n_covariances=50, bins=10, how="Wishart")
    title = fig.axes[0].get_title()
    assert "$K=[0,1]^d$" in title and "<=" not in title
    outlines = [p for p in fig.axes[0].patches if not p.get_fill()]
    assert len(outlines) == 2 and outlines[0].get_edgecolor() != outlines[1].get_edgecolor()
    assert [t.get_text().split(":")[0] for t in fig.axes[0].get_legend().get_texts()] == ["d = 2", "d = 3"]
    assert "≤" in stages.fig1_figure_of(ratios, n_covariances=5, bins=4, how="log-uniform spectrum, cond ≤ 100"
                                        ).axes[0].get_title()


@pytest.mark.parametrize("distribution", ["log_uniform", "wishart"])
def test_fig1_writes_figure_and_a_summary_whose_ratios_are_at_least_one(tmp_path, small, distribution):
    out = {"figure": tmp_path / "f.png", "table": tmp_path / "f.parquet"}
    params = _params(small, "fig1")
    params["fig1"] = {**params["fig1"], "distribution": distribution}
    stages.sensgeo_fig1_naive_vs_exact({}, out, params)
    assert (tmp_path / "f.png").is_file() and (tmp_path / "f.pdf").is_file()
    df = pd.read_parquet(out["table"])
    assert list(df["d"]) == [2, 3] and (df["ratio_min"] >= 1 - 1e-12).all()
    assert (df["ratio_max"] >= df["ratio_mean"]).all() and set(df["config_id"]) == {"test"}


def test_guarantee_table_exact_is_never_above_any_bound(tmp_path, small):
    out = {"table": tmp_path / "g.parquet"}
    stages.sensgeo_table_guarantees({}, out, _params(small, "guarantees"))
    df = pd.read_parquet(out["table"])
    assert len(df) == 4
    assert (df["eps_exact"] <= df["eps_pld_pessimistic_bound"] + 1e-9).all()
    assert (df["eps_pld_optimistic_estimate"] <= df["eps_exact"] + 1e-9).all()
    assert (df["ratio_rdp_dp_accounting_over_exact"] >= 1).all() and (df["ratio_rdp_classic_over_exact"] >= 1).all()


def test_sdp_table_rows_are_certified(tmp_path, small):
    out = {"table": tmp_path / "s.parquet"}
    stages.sensgeo_table_sdp({}, out, _params(small, "sdp"))
    df = pd.read_parquet(out["table"])
    assert len(df) == 4 and df["certified"].all() and (df["gap_rel"] < stages.GAP_TOLERANCE).all()
    assert (df["n_generators"] == df["m"] * (df["m"] - 1)).all()
    assert (df["mse_gain_over_isotropic"] >= 1 - 1e-9).all()
    assert (abs(df["gap_rel_dual_sdp"]) < 1e-6).all()


def test_mi_figure_is_written(tmp_path, small):
    stages.sensgeo_fig_mi_snr({}, {"figure": tmp_path / "mi.png"}, _params(small, "mi"))
    assert (tmp_path / "mi.png").is_file() and (tmp_path / "mi.pdf").is_file()


def test_bridge_table_puts_exact_next_to_empden_bound(tmp_path, small):
    out = {"table": tmp_path / "b.parquet"}
    stages.sensgeo_table_bridge({}, out, _params(small, "bridge"))
    df = pd.read_parquet(out["table"])
    assert list(df["t"]) == [0.1, 1.0]
    assert (df["empden_mu_exact_query_max"] <= df["empden_mu_bound"] * (1 + 1e-12)).all()
    assert (df["ideal_mu_fixed_query_max"] <= df["ideal_mu_uniform_query"] * (1 + 1e-12)).all()
    assert (df["empden_sensitivity_bound"] == 2 * df["clip_C"] / (df["beta"] * df["n_records"])).all()


def test_missing_section_is_a_one_line_error(tmp_path):
    with pytest.raises(PipelineError, match="sensgeo.sdp"):
        stages.sensgeo_table_sdp({}, {"table": tmp_path / "s.parquet"}, {"config_id": "x", "seed": 0})


def test_every_rule_calls_a_registered_stage(repo):
    text = (repo / "rules" / "sensgeo.smk").read_text()
    called = re.findall(r"python -m pipeline (\w+)", text)
    rules = re.findall(r"^rule (\w+):", text, flags=re.M)
    assert called == rules and len(rules) == 5
    for name in called:
        assert name in STAGES and load_stage(name).name == name

"""dpdm_gradient_variance (DPDM Fig. 3 / Theorem 1): on a tiny denoiser the measured gradient variance falls with K,
the Gram-matrix variance is the plain one, and the stage writes its table and figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.methods.dpdm.gradient_variance import choose_images, dpdm_gradient_variance, trace_variance
from pipeline.io import Split, save_split
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.stage import PipelineError
from tests.conftest import one_thread

SPEC = UNetSpec(image_size=8, block_out_channels=(4, 8), attention=(False, False), norm_num_groups=4, num_classes=3)
PARAMS = {"K": [1, 2, 8], "repeats": 12, "n_images": 2, "clip": 1.0, "bootstrap": 50, "seed": 0, "device": "cpu",
          "threads": 1, "config_id": "test"}


@pytest.fixture(scope="module")
def public(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("public")
    torch.manual_seed(3)
    save_denoiser(tmp / "public_edm.pt", EDMPrecond(build_unet(SPEC)), unet=SPEC, precond="edm")
    rng = np.random.default_rng(0)
    save_split(tmp / "public.npz", Split(rng.integers(0, 256, (12, 1, 8, 8), dtype=np.uint8), np.arange(12) % 3),
               name="public", source="test", seed=0)
    return {"denoiser": tmp / "public_edm.pt", "public": tmp / "public.npz"}


@pytest.fixture(scope="module")
def measured(public, tmp_path_factory) -> tuple[pd.DataFrame, dict[str, Path]]:
    out = tmp_path_factory.mktemp("out")
    outputs = {"table": out / "dpdm_figure3_gradient_variance.parquet",
               "figure": out / "dpdm_figure3_gradient_variance.png"}
    with one_thread():
        dpdm_gradient_variance(public, outputs, PARAMS)
    return pd.read_parquet(outputs["table"]), outputs


def test_the_measured_variance_falls_with_noise_multiplicity(measured):
    df, _ = measured
    assert df["K"].tolist() == [1, 2, 8]
    v, raw = df["variance"].to_numpy(), df["variance_unclipped"].to_numpy()
    # Theorem 1: the unclipped gradient's variance is Var(K=1) / K (12 draws of each of 2 images: within a factor 2)
    assert raw[1] < raw[0] and raw[2] < raw[1]
    assert 0.5 / 8 < raw[2] / raw[0] < 2 / 8
    assert df["loglog_slope_unclipped"].iloc[0] == pytest.approx(-1, abs=0.35)
    # the clipped gradient, what DP-SGD sums, falls too (slower where clipping bounds it)
    assert v[2] < v[0]
    assert df["reference_1_over_K"].tolist() == pytest.approx([v[0], v[0] / 2, v[0] / 8])
    assert (df["variance_ci_low"] <= df["variance"]).all() and (df["variance"] <= df["variance_ci_high"]).all()
    assert (df["variance_se"] > 0).all() and df["clipped_fraction"].between(0, 1).all()
    assert set(df["data"]) == {"public"} and set(df["parameterisation"]) == {"edm"}
    assert (df["n_parameters"] == sum(p.numel() for p in EDMPrecond(build_unet(SPEC)).parameters())).all()


def test_the_stage_writes_its_table_and_figure_png_and_pdf(measured):
    df, outputs = measured
    assert outputs["table"].is_file() and {"config_id", "seed"} <= set(df.columns)
    assert outputs["figure"].stat().st_size > 5_000
    assert outputs["figure"].with_suffix(".pdf").stat().st_size > 1_000


def test_the_same_seed_gives_the_same_table(public, measured, tmp_path):
    outputs = {"table": tmp_path / "t.parquet", "figure": tmp_path / "f.png"}
    with one_thread():
        dpdm_gradient_variance(public, outputs, PARAMS)
    pd.testing.assert_frame_equal(pd.read_parquet(outputs["table"]), measured[0])


def test_the_gram_matrix_variance_is_the_sum_of_per_parameter_variances():
    g = np.random.default_rng(1).normal(size=(7, 30))
    assert trace_variance(g @ g.T) == pytest.approx(g.var(axis=0, ddof=1).sum())
    idx = np.array([0, 0, 3, 5, 6, 6, 2])
    assert trace_variance(g @ g.T, idx) == pytest.approx(g[idx].var(axis=0, ddof=1).sum())


def test_the_images_cycle_through_the_classes():
    labels = np.array([0, 1, 2, 0, 1, 2, 0])
    chosen = choose_images(labels, 5, np.random.default_rng(0))
    assert labels[chosen].tolist() == [0, 1, 2, 0, 1] and len(set(chosen.tolist())) == 5


@pytest.mark.parametrize("bad, message", [({"K": [2, 4]}, "must contain 1"), ({"K": [1, 1]}, "distinct"),
                                          ({"repeats": 2}, "repeats"), ({"clip": 0}, "clip"),
                                          ({"n_images": 99}, "n_images"), ({"bogus": 1}, "unknown param")])
def test_bad_params_are_one_line_errors(public, tmp_path, bad, message):
    with pytest.raises(PipelineError, match=message):
        dpdm_gradient_variance(public, {"table": tmp_path / "t.parquet", "figure": tmp_path / "f.png"},
                               {**PARAMS, **bad})

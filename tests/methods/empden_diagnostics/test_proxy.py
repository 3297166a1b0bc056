"""EMPDEN proxy diagnostics: directions (Table 4, Fig. 1), window swap vs noise redraw
(Tables 1, 5, 6) and the critical window (Fig. 6a)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.methods.empden_diagnostics import proxy as dx
from pipeline.diagnostics.classifiers import EvalNetClassifier
from pipeline.io import Split, save_split
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import build_unet
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.schedule import EDMSchedule
from pipeline.stage import PipelineError
from tests.diagnostics.conftest import SHAPE, SPEC



@pytest.fixture(scope="module")
def neural() -> dx.Denoiser:
    torch.manual_seed(0)
    return dx.neural_denoiser(EDMPrecond(build_unet(SPEC)).eval())


def _noise(b=3, N=6, keys=(0,)):
    return dx.trajectory_noise((b, *SHAPE), N, 80.0, *keys)


def test_sde_step_is_the_private_samplers_update_with_its_noise():
    data = emp.prepare_records(torch.rand(5, 4, dtype=torch.float64) * 2 - 1)
    x = torch.randn(2, 4, dtype=torch.float64)
    expected = emp.private_step(x, data, 2.0, 1.5, C=0.3, beta=1.0, generator=torch.Generator().manual_seed(7))
    eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    e_hat = emp.clipped_empirical_denoiser(x, data, 2.0, C=0.3, beta=1.0)
    torch.testing.assert_close(dx.sde_step(x, e_hat, 2.0, 1.5, eps), expected)


def test_identical_denoisers_point_the_same_way(neural):
    times = EDMSchedule(N=6).times()
    x_T, eps = _noise()
    res = dx.proxy_along_trajectory(x_T, times, eps, neural, {"same": neural})
    cos, sq = res["same"]
    np.testing.assert_allclose(cos, 1.0, atol=1e-12)
    np.testing.assert_array_equal(sq, 0.0)


def test_swapping_in_an_identical_denoiser_leaves_the_endpoint_unchanged(neural, files):
    times = EDMSchedule(N=6).times()
    x_T, eps = _noise()
    windows = [dx.Window("mid", 2, 3), dx.Window("all", 0, 5)]
    end, variants = dx.window_variants(x_T, times, eps, neural, neural, windows,
                                       redraw=lambda w: torch.randn(eps.shape, generator=torch.Generator().manual_seed(1)))
    net = EvalNetClassifier(dx.load_evalnet(files["evalnet"]))
    for w in windows:
        torch.testing.assert_close(variants[w.name]["swap"], end, rtol=0, atol=0)
        a = dx.endpoint_agreement(end, variants[w.name]["swap"], [net], net)
        np.testing.assert_allclose(1 - a.similarity["evalnet"], 0.0, atol=1e-12)
        assert np.all(a.label_agreement == 1) and np.all(np.isinf(a.psnr_db))


def test_redrawing_a_windows_noise_moves_the_endpoint(neural, files):
    times = EDMSchedule(N=6).times()
    x_T, eps = _noise()
    end, variants = dx.window_variants(x_T, times, eps, neural, neural, [dx.Window("mid", 2, 3)],
                                       redraw=lambda w: torch.randn(eps.shape, generator=torch.Generator().manual_seed(1)))
    ref = variants["mid"]["ref"]
    assert torch.linalg.vector_norm((ref - end).flatten(1), dim=1).min() > 0
    net = EvalNetClassifier(dx.load_evalnet(files["evalnet"]))
    a = dx.endpoint_agreement(end, ref, [net], net)
    assert np.all(a.similarity["evalnet"] < 1) and np.all(np.isfinite(a.psnr_db)) and np.all(a.ssim < 1)


def test_the_swap_uses_the_empirical_denoiser_inside_the_window_only(neural):
    times = EDMSchedule(N=6).times()
    x_T, eps = _noise(b=1)
    calls = []

    def recording(x, t):
        calls.append(t)
        return torch.zeros_like(x)

    dx.window_variants(x_T, times, eps, neural, recording, [dx.Window("w", 2, 3)], redraw=lambda w: eps)
    assert calls == [float(times[2]), float(times[3])]


def test_empirical_denoiser_kinds_match_the_privacy_module():
    x0 = torch.rand(6, *SHAPE, dtype=torch.float64) * 2 - 1
    data = emp.prepare_records(x0)
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    clipped = dx.EmpiricalDenoiser(data, "clipped", C=0.7, beta=2.0)(x, 1.3)
    torch.testing.assert_close(clipped.flatten(1), emp.clipped_empirical_denoiser(x.flatten(1), data, 1.3, C=0.7, beta=2.0))
    pm = dx.EmpiricalDenoiser(data, "posterior_mean", C=0.7, beta=2.0)(x, 1.3)
    torch.testing.assert_close(pm.flatten(1), emp.empirical_posterior_mean(x.flatten(1), data, 1.3))
    # a subset that holds every record is the full posterior mean; a one-record subset is that record
    full = torch.arange(6).repeat(2, 1)
    torch.testing.assert_close(dx.posterior_mean(x.flatten(1), data, 1.3, subset=full), pm.flatten(1))
    one = torch.tensor([[4], [1]])
    torch.testing.assert_close(dx.posterior_mean(x.flatten(1), data, 1.3, subset=one), data.x0[[4, 1]])


def test_clipped_denoiser_uses_the_samplers_public_normaliser():
    """Table 4's clipped E_hat is the sampler's: v divided by the public marginal Z before the clip."""
    x0 = torch.rand(6, *SHAPE, dtype=torch.float64) * 2 - 1
    data, public = emp.prepare_records(x0), emp.prepare_records(torch.rand(9, *SHAPE, dtype=torch.float64) * 2 - 1)
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    got = dx.EmpiricalDenoiser(data, "clipped", C=0.7, beta=2.0, public=public)(x, 1.3).flatten(1)
    log_z = emp.log_public_marginal(x.flatten(1), public, 1.3)
    want = emp.clipped_empirical_denoiser(x.flatten(1), data, 1.3, C=0.7, beta=2.0, log_normaliser=log_z)
    torch.testing.assert_close(got, want)
    # the normaliser matters: without it (eq. 38's Z = 1) the 64-pixel kernel leaves a different E_hat
    plain = dx.EmpiricalDenoiser(data, "clipped", C=0.7, beta=2.0)(x, 1.3).flatten(1)
    assert not torch.allclose(got, plain)


def test_the_diagnostics_clip_is_the_samplers_block_clip():
    """E_hat of the diagnostics clips where the sampler's block does: C |S| when C scales with the subset."""
    schedule = EDMSchedule(N=5)
    for scales, B, want in ((True, 5, 2.5), (False, 5, 0.5), (True, None, 15.0)):
        s = dx.Settings.from_params({"diagnostics": {"B": B}, "device": "cpu",
                                     "accounting": {"C": 0.5, "beta": 2.0, "C_scales_with_subset": scales}})
        block = s.block(30, schedule)
        assert block.C_eff == want and block.beta == 2.0 and block.B == (30 if B is None else B)


def test_hybrid_phase_labels_follow_the_private_block_length():
    # N = 50: ceil(0.55 * 50) = 28, ceil(0.65 * 50) = 33, ceil(0.70 * 50) = 35
    labels = [dx.hybrid_phase(i, 50, [55, 65, 70]) for i in (0, 27, 28, 30, 33, 35, 36)]
    assert labels == ["emp.", "emp.", "switch 55%", "between handoffs", "switch 65%", "switch 70%", "pub."]


def _params(tmp_path, **diag):
    base = {"n_trajectories": 4, "batch_size": 2, "proxy_N": 5, "proxy_seeds": 2, "swap_N": 6,
            "windows": [{"name": "early", "first": 1, "last": 2}, {"name": "late", "first": 3, "last": 4}],
            "bootstrap_resamples": 100, "critical_window_N": 5}
    return {"diagnostics": {**base, **diag}, "accounting": {"C": 0.5, "beta": 1.0}, "config_id": "test", "seed": 0,
            "device": "cpu", "threads": 1}


def test_table4_stage_writes_both_empirical_variants_per_grid_point(files, tmp_path):
    out = {"table": tmp_path / "t4.parquet", "figure": tmp_path / "fig1.png"}
    dx.empden_table4_proxy({k: files[k] for k in ("private", "denoiser")}, out, _params(tmp_path))
    df = pd.read_parquet(out["table"])
    assert sorted(df["empirical"].unique()) == ["clipped", "posterior_mean"]
    assert len(df) == 2 * 5 and df["non_private_diagnostic"].all()
    assert df["cos_mean"].between(-1, 1).all() and (df["sq_dist_mean"] >= 0).all()
    assert df["cos_se"].notna().all()  # two seeds give a standard error
    np.testing.assert_allclose(df["t"].iloc[0], 80.0)
    assert out["figure"].is_file() and out["figure"].with_suffix(".pdf").is_file()


def test_table4_stage_uses_the_samplers_normaliser(files, tmp_path):
    outs = {}
    for kind in ("constant", "public_marginal"):
        out = {"table": tmp_path / f"t4_{kind}.parquet", "figure": tmp_path / f"fig1_{kind}.png"}
        ins = {k: files[k] for k in ("private", "denoiser", "public_data")}
        dx.empden_table4_proxy(ins, out, {**_params(tmp_path), "normaliser": kind, "normaliser_n": 20})
        outs[kind] = pd.read_parquet(out["table"])
        assert (outs[kind]["normaliser"] == kind).all()
    clipped = {k: df[df["empirical"] == "clipped"]["cos_mean"].to_numpy() for k, df in outs.items()}
    pm = {k: df[df["empirical"] == "posterior_mean"]["cos_mean"].to_numpy() for k, df in outs.items()}
    np.testing.assert_allclose(pm["constant"], pm["public_marginal"])  # the reference does not change
    assert not np.allclose(clipped["constant"], clipped["public_marginal"])


def test_public_marginal_without_the_public_split_is_one_line(files, tmp_path):
    out = {"table": tmp_path / "t4.parquet", "figure": tmp_path / "fig1.png"}
    with pytest.raises(PipelineError, match="public_marginal needs the public split"):
        dx.empden_table4_proxy({k: files[k] for k in ("private", "denoiser")}, out,
                               {**_params(tmp_path), "normaliser": "public_marginal"})


def test_window_swap_stage_writes_tables_1_5_6(files, tmp_path):
    out = {"table1": tmp_path / "t1.parquet", "table5": tmp_path / "t5.parquet", "table6": tmp_path / "t6.parquet"}
    dx.empden_table1_window_swap({k: files[k] for k in ("private", "denoiser", "evalnet")}, out,
                                 _params(tmp_path, B=5))
    t1, t5, t6 = (pd.read_parquet(out[k]) for k in ("table1", "table5", "table6"))
    assert list(t1["window"]) == ["early", "late"] and (t1["subset_size"] == 5).all()
    assert (t1["embedding"] == "evalnet").all()
    assert (t1["ref_distance"] > 0).all()  # re-drawn noise always moves the endpoint
    for col in ("swap_similarity", "ref_similarity", "delta_distance_ref_minus_swap"):
        assert (t5[f"{col}_low"] <= t5[col] + 1e-12).all() and (t5[col] <= t5[f"{col}_high"] + 1e-12).all()
    assert sorted(t6["variant"].unique()) == ["ref", "swap"] and t6["ssim"].between(-1, 1).all()
    assert t6["label_agreement"].between(0, 1).all()


def test_critical_window_stage_gives_probabilities_ending_at_the_final_label(files, tmp_path):
    out = {"table": tmp_path / "f6.parquet", "figure": tmp_path / "fig6.png"}
    dx.empden_figure6_critical_window({k: files[k] for k in ("denoiser", "evalnet")}, out, _params(tmp_path))
    df = pd.read_parquet(out["table"])
    assert set(df["view"]) == {"iterate", "denoised"} and len(df) == 2 * 5 and set(df["classifier"]) == {"evalnet"}
    assert df["prob_final_label_mean"].between(0, 1).all()
    assert out["figure"].is_file()


def test_a_window_outside_the_grid_is_one_line(files, tmp_path):
    out = {"table1": tmp_path / "a.parquet", "table5": tmp_path / "b.parquet", "table6": tmp_path / "c.parquet"}
    params = _params(tmp_path, windows=[{"name": "bad", "first": 3, "last": 9}])
    with pytest.raises(PipelineError, match="window 'bad'.*swap_N=6"):
        dx.empden_table1_window_swap({k: files[k] for k in ("private", "denoiser", "evalnet")}, out, params)


def test_a_denoiser_for_other_images_is_refused(files, tmp_path):
    rng = np.random.default_rng(0)
    other = tmp_path / "p16.npz"
    save_split(other, Split(rng.integers(0, 256, size=(4, 1, 16, 16), dtype=np.uint8), np.zeros(4, dtype=np.int64)),
               name="private_train", source="test", seed=0)
    with pytest.raises(PipelineError, match="works on images"):
        dx.empden_table4_proxy({"private": other, "denoiser": files["denoiser"]},
                               {"table": tmp_path / "t.parquet", "figure": tmp_path / "f.png"}, _params(tmp_path))

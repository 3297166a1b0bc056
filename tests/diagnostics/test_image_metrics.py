"""PSNR, SSIM (Wang et al. 2004) and bootstrap intervals of EMPDEN Tables 5 and 6."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.diagnostics.image_metrics import (SSIM_K1, SSIM_K2, bootstrap_mean, gaussian_window,
                                                paired_bootstrap_difference, psnr, ssim)


def _images(n=4, c=1, side=16, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, c, side, side)).astype(np.float64)


def test_psnr_of_unit_mse_is_20_log10_of_the_range():
    x = _images()
    y = x + np.where(np.random.default_rng(1).random(x.shape) < 0.5, 1.0, -1.0)  # every pixel off by 1
    np.testing.assert_allclose(psnr(x, y), 20 * math.log10(255.0))
    np.testing.assert_allclose(psnr(x / 255, y / 255, data_range=1.0), 20 * math.log10(255.0))


def test_psnr_of_identical_images_is_infinite():
    x = _images()
    assert np.all(np.isinf(psnr(x, x)))


def test_ssim_of_identical_images_is_one():
    x = _images(c=3)
    np.testing.assert_allclose(ssim(x, x), 1.0)


@pytest.mark.parametrize("a, b", [(100.0, 100.0), (100.0, 150.0), (0.0, 255.0), (30.0, 10.0)])
def test_ssim_of_constant_images_is_the_luminance_term(a, b):
    # Flat images: every local variance and covariance is 0, so the contrast-structure factor
    # is C2/C2 = 1 and SSIM = (2ab + C1)/(a^2 + b^2 + C1) in closed form (Wang et al. 2004 eq. 13).
    x, y = np.full((1, 1, 16, 16), a), np.full((1, 1, 16, 16), b)
    c1 = (SSIM_K1 * 255) ** 2
    np.testing.assert_allclose(ssim(x, y), (2 * a * b + c1) / (a * a + b * b + c1), rtol=1e-12)


def test_ssim_of_a_negated_pattern_is_negative_and_bounded_by_its_structure_term():
    # y = 2m - x has the same local variance var as x and covariance -var, so each window's SSIM
    # is l * (C2 - 2 var)/(C2 + 2 var) with 0 < l <= 1: negative, and >= the value at var = 60^2.
    checker = (np.indices((16, 16)).sum(0) % 2) * 2 - 1.0
    x, y = 128 + 60 * checker[None, None], 128 - 60 * checker[None, None]
    c2 = (SSIM_K2 * 255) ** 2
    assert (c2 - 2 * 60.0**2) / (c2 + 2 * 60.0**2) - 1e-9 <= ssim(x, y)[0] < 0


def test_ssim_falls_as_noise_grows():
    x = _images(n=2)
    rng = np.random.default_rng(3)
    values = [ssim(x, np.clip(x + s * rng.standard_normal(x.shape), 0, 255)).mean() for s in (2, 20, 80)]
    assert values[0] > values[1] > values[2]


def test_ssim_window_is_a_normalised_gaussian_with_sigma_1_5():
    g = gaussian_window()
    assert len(g) == 11 and abs(float(g.sum()) - 1) < 1e-12
    assert float(g[5] / g[6]) == pytest.approx(math.exp(1 / (2 * 1.5**2)))


def test_ssim_works_on_images_smaller_than_the_window():
    x = _images(side=8)
    np.testing.assert_allclose(ssim(x, x), 1.0)


def test_bootstrap_interval_contains_the_mean():
    v = np.random.default_rng(0).normal(2.0, 1.0, size=200)
    iv = bootstrap_mean(v, n_resamples=500)
    assert iv.low < v.mean() < iv.high
    assert iv.estimate == pytest.approx(v.mean())
    assert iv.high - iv.low < 1.0  # ~ 4 standard errors of 1/sqrt(200)


def test_paired_bootstrap_interval_contains_the_mean_difference_and_uses_the_pairing():
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 10, size=300)  # large per-pair effect that the pairing cancels
    a, b = shared + 0.5 + rng.normal(0, 0.1, 300), shared + rng.normal(0, 0.1, 300)
    iv = paired_bootstrap_difference(a, b, n_resamples=500)
    assert iv.low < a.mean() - b.mean() < iv.high
    assert iv.low > 0.4 and iv.high < 0.6  # unpaired it would span several units


def test_degenerate_samples_get_a_point_interval():
    iv = bootstrap_mean(np.zeros(10))
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    inf = bootstrap_mean(np.array([np.inf, 1.0]))
    assert math.isinf(inf.estimate) and math.isnan(inf.low)

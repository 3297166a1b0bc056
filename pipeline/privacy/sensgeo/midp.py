"""Mutual-information DP for binary records (SENSGEO Sec. VI).

MI-DP (Cuff & Yu 2016) bounds sup_{P_X} max_i I(X_i; M(X) | X_-i) <= kappa (nats). For a
binary record the mechanism's two possible outputs differ by a shift s; whitening by
Sigma^-1/2 and projecting on the shift leaves the sufficient statistic of the binary-input
Gaussian channel (Sec. VI-B)

    Y = q B / 2 + Z,   Z ~ N(0, 1),   B in {-1, +1},   q = sqrt(s^T Sigma^-1 s),

so I(M) = sup C(W) = C(q_*) with q_* = sqrt(rho_*): MI-DP is exactly a budget on rho_*.
With snr = q^2/4 (signal amplitude q/2) the capacity, reached by the uniform prior (the
channel is symmetric and I is concave in the prior), is the classical BPSK formula

    C(snr) = snr - E[log cosh(snr + sqrt(snr) Z)]                            (nats),

and its derivative is mmse(snr)/2 with mmse(snr) = 1 - E[tanh(snr + sqrt(snr) Z)] (the
I-MMSE identity, Guo, Shamai & Verdu 2005), which is > 0: C is strictly increasing, so
kappa-MI-DP holds iff snr <= C^-1(kappa), i.e. rho_* <= 4 C^-1(kappa) (the calibration).

Expectations over Z use Gauss-Hermite quadrature (probabilists' weights): the integrands
are smooth, and 200 nodes give ~1e-12 accuracy over the SNR range used here.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize


class MIDPError(ValueError):
    """An SNR or MI budget out of range; one line."""


@lru_cache(maxsize=4)
def _hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    z, w = np.polynomial.hermite_e.hermegauss(n)
    return z, w / math.sqrt(2.0 * math.pi)


def _log_cosh(x: np.ndarray) -> np.ndarray:
    # log cosh x = |x| + log1p(e^{-2|x|}) - log 2, exact for large |x| where cosh overflows.
    a = np.abs(x)
    return a + np.log1p(np.exp(-2.0 * a)) - math.log(2.0)


def _check_snr(snr: np.ndarray) -> np.ndarray:
    s = np.asarray(snr, dtype=float)
    if np.any(~np.isfinite(s)) or np.any(s < 0):
        raise MIDPError(f"SNR must be finite and >= 0, got {snr!r}")
    return s


def binary_capacity(snr: np.ndarray | float, *, nodes: int = 200) -> np.ndarray:
    """C(snr) in nats of Y = sqrt(snr) B + Z, B uniform on {-1, 1} (SENSGEO Sec. VI-B)."""
    s = _check_snr(snr)
    z, w = _hermite(nodes)
    arg = s[..., None] + np.sqrt(s)[..., None] * z
    return s - _log_cosh(arg) @ w


def binary_mmse(snr: np.ndarray | float, *, nodes: int = 200) -> np.ndarray:
    """mmse(snr) = 1 - E[tanh(snr + sqrt(snr) Z)] of estimating B from Y (Guo, Shamai & Verdu 2005)."""
    s = _check_snr(snr)
    z, w = _hermite(nodes)
    return 1.0 - np.tanh(s[..., None] + np.sqrt(s)[..., None] * z) @ w


def snr_of_rho_star(rho_star: np.ndarray | float) -> np.ndarray:
    """snr = q^2/4 with q = sqrt(rho_*): the channel Y = q B/2 + Z of Sec. VI-B."""
    return np.asarray(rho_star, dtype=float) / 4.0


def mi_of_rho_star(rho_star: np.ndarray | float) -> np.ndarray:
    """I(M) = C(rho_*/4): the exact MI-DP level of a mechanism with sensitivity rho_* (Sec. VI)."""
    return binary_capacity(snr_of_rho_star(rho_star))


def calibrate_snr(kappa: float) -> float:
    """C^-1(kappa): the largest SNR whose capacity is <= kappa nats (0 < kappa < log 2)."""
    if not 0 < kappa < math.log(2.0):
        raise MIDPError(f"MI budget kappa must be in (0, log 2 = {math.log(2.0):.6f}) nats, got {kappa!r}")
    f = lambda s: float(binary_capacity(s)) - kappa  # noqa: E731 (strictly increasing)
    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-14, rtol=1e-13, maxiter=500))


def calibrate_rho_star(kappa: float) -> float:
    """Largest rho_* satisfying kappa-MI-DP for binary records: 4 C^-1(kappa) (SENSGEO Sec. VI-B)."""
    return 4.0 * calibrate_snr(kappa)

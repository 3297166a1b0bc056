"""Bridge to the samplers: one empirical-denoiser step, SENSGEO's exact rho_* next to EMPDEN's bound.

One EDM step from noise level t to t - Delta t (EMPDEN Sec. 3.1, eq. 5) is, after the public
rescaling by t / (2 Delta t), the Gaussian mechanism

    E_hat(D; x_t) + tau_t eps,   tau_t = sqrt(t^3 / (2 Delta t)),   eps ~ N(0, I)   (EMPDEN eq. 6)

* With the normaliser p_hat_t(x_t) of EMPDEN eq. 4, E_hat is exactly SENSGEO's ideal denoiser
  m_g(D) at query g = x_t and bandwidth sigma = t (the EDM kernel is N(x_t; x_0, t^2 I)). Its
  exact sensitivity over a finite public domain K is SENSGEO's: Theorem 1 for the given query,
  Corollary 1 (largest distance in K, Sigma = tau_t^2 I) for every query at once.
* EMPDEN replaces p_hat_t by a public constant beta and clips v(x_0; x_t) = x_0 p(x_t | x_0)
  to norm C, giving the bound 2C / (beta |D|) (EMPDEN Sec. 3.1 below eq. 6; mu_t of eq. 39 =
  that over tau_t). Over a finite K and one query the exact replace-one sensitivity of the
  clipped average is max_{x, y in K} ||v_bar(x) - v_bar(y)|| / (beta |D|) <= 2C/(beta |D|),
  computed here from the formula as a second, per-query comparison.

The two mechanisms differ (normalised vs clipped-unnormalised), so the table puts the
certified numbers of each side by side rather than calling one a bound on the other; the
local sensitivity of one concrete dataset is reported too and is NOT a DP guarantee (it is
what a data-dependent analysis would see, which SENSGEO's worst case over D must cover).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.privacy.sensgeo import geometry


def step_noise_std(t: float, dt: float) -> float:
    """tau_t = sqrt(t^3 / (2 Delta t)), the std of one rescaled EDM step (EMPDEN eq. 6)."""
    if not (t > 0 and 0 < dt < t):
        raise ValueError(f"need 0 < Delta t < t, got t={t}, Delta t={dt}")
    return math.sqrt(t ** 3 / (2.0 * dt))


def empden_sensitivity_bound(clip: float, beta: float, n_records: int) -> float:
    """2C / (beta |D|): EMPDEN's sensitivity of the clipped, beta-normalised average (Sec. 3.1, eq. 4-6)."""
    if not (clip > 0 and beta > 0 and n_records >= 1):
        raise ValueError(f"need C > 0, beta > 0, |D| >= 1, got C={clip}, beta={beta}, |D|={n_records}")
    return 2.0 * clip / (beta * n_records)


def clipped_contributions(g: np.ndarray, domain: np.ndarray, t: float, clip: float) -> np.ndarray:
    """v_bar(x_0; g) = v / max(1, ||v||/C), v = x_0 N(g; x_0, t^2 I) for every x_0 in K (EMPDEN Sec. 3.1)."""
    k_pts = np.asarray(domain, dtype=float)
    d = k_pts.shape[1]
    log_dens = geometry.log_weights(g, k_pts, t) - 0.5 * d * math.log(2.0 * math.pi * t * t)
    v = k_pts * np.exp(log_dens)[:, None]
    norm = np.linalg.norm(v, axis=1)
    return v / np.maximum(1.0, norm / clip)[:, None]


def empden_exact_sensitivity(g: np.ndarray, domain: np.ndarray, t: float, clip: float, beta: float,
                             n_records: int) -> float:
    """max_{x, y in K} ||v_bar(x; g) - v_bar(y; g)|| / (beta |D|): exact replace-one value for one query."""
    v = clipped_contributions(g, domain, t, clip)
    i, j = np.triu_indices(v.shape[0], k=1)
    return float(np.max(np.linalg.norm(v[i] - v[j], axis=1))) / (beta * n_records)


def local_ideal_sensitivity(g: np.ndarray, dataset: np.ndarray, sigma: float) -> float:
    """max_k ||s_k(g; D)|| for one concrete D: a LOCAL sensitivity, not a DP guarantee."""
    return float(np.max(np.linalg.norm(geometry.deletion_shifts(g, dataset, sigma), axis=1)))


def forward_queries(rng: np.random.Generator, domain: np.ndarray, t: float, n: int) -> np.ndarray:
    """n queries x_t = x_0 + t z with x_0 uniform on K: typical inputs of the step at noise level t."""
    k_pts = np.asarray(domain, dtype=float)
    x0 = k_pts[rng.integers(0, k_pts.shape[0], size=n)]
    return x0 + t * rng.standard_normal(x0.shape)

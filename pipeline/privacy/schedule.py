"""The per-step GDP parameters of the clipped empirical denoiser on the EDM time grid.

The grid itself (:class:`EDMSchedule`) is :mod:`pipeline.diffusion.schedule`'s, re-exported here.

EMPDEN Sec. 3.1-3.2 and Sec. 4: with the EDM update (eq. 1) from t_i to t_{i+1}, the
data-dependent part of one step is a Gaussian mechanism (eq. 6) with

    mu_t = (2 C / (beta |S|)) * sqrt(2 Delta t / t^3),                     (eq. 39)

where ``t`` is the step's starting noise level, ``Delta t = t_i - t_{i+1}``, ``C`` the clip
norm, ``beta`` the public normaliser and ``|S|`` the number of records the average runs over
(|D| in the full-batch regime, the subsample size B in the output-wise regime). A block of
private steps reused with one subsample composes exactly to mu_bar_B = sqrt(sum mu_t^2)
(eq. 9 / eq. 22).
"""

from __future__ import annotations

import math

import numpy as np

# the grid itself is the samplers' as much as privacy's: it lives in the neutral pipeline.diffusion
from pipeline.diffusion.schedule import EDMSchedule


def step_mu(schedule: EDMSchedule, *, C: float, beta: float, batch_size: int | float) -> np.ndarray:
    """mu_t of every step i = 0..N-1 (from t_i to t_{i+1}), EMPDEN eq. 39 / Sec. 4.

    The final step t_{N-1} -> 0 is included (it has the largest mu_t); callers that stop
    earlier take a prefix.
    """
    if C <= 0 or beta <= 0 or batch_size <= 0:
        raise ValueError(f"mu_t needs C > 0, beta > 0, |S| > 0; got C={C}, beta={beta}, |S|={batch_size}")
    t = schedule.times()
    dt = t[:-1] - t[1:]
    return (2.0 * C / (beta * batch_size)) * np.sqrt(2.0 * dt / t[:-1] ** 3)


def k_private_steps(N: int, p_percent: float) -> int:
    """k, the number of private (empirical) steps of a p% block on an N-step grid: ceil(p N / 100).

    Named for EMPDEN's k (the private block is steps 0..k-1; Algorithm 1's switch time t0 = t_k),
    not to be confused with :func:`pipeline.privacy.empirical_denoiser.private_step`, which runs one step.

    The handoff after k steps lands at t_k. The ceiling is the convention that reproduces
    EMPDEN Table 7's mu_bar_B (0.69 / 1.56 / 2.09 / 2.84 for 55 / 62 / 65 / 67% of N = 39);
    a tiny tolerance keeps e.g. 50% of 40 at 20 despite floating-point rounding.
    """
    if not 0 < p_percent <= 100:
        raise ValueError(f"private block share p must be in (0, 100] percent, got {p_percent}")
    return min(N, math.ceil(p_percent * N / 100 - 1e-9))


def block_mu(mu_t: np.ndarray, k: int) -> float:
    """mu_bar_B = sqrt(sum_{t in B} mu_t^2) of the first ``k`` steps (EMPDEN eq. 9)."""
    if not 0 <= k <= len(mu_t):
        raise ValueError(f"block of {k} steps does not fit a grid of {len(mu_t)} steps")
    return float(np.sqrt(np.sum(np.asarray(mu_t[:k], dtype=np.float64) ** 2)))


def log_snr(t: np.ndarray) -> np.ndarray:
    """log SNR = log(1 / (4 t^2)), the x-axis of EMPDEN Figures 1 and 5."""
    return np.log(1.0 / (4.0 * np.asarray(t, dtype=np.float64) ** 2))

"""One step of each sampler the methods share: EMPDEN eq. 1 and EDM's Heun step.

Both move a state x_t = y + t n (the variance-exploding convention of Karras et al. 2022,
Table 1) down a decreasing noise grid given a denoiser's estimate of y. They are written once
here so that a private step (:func:`pipeline.privacy.empirical_denoiser.private_step`), the
diagnostics that replay it and the public samplers cannot drift apart.

* :func:`eq1_step` -- EMPDEN eq. 1, the stochastic EDM update
  x_{t - dt} = (1 - 2 dt/t) x_t + (2 dt/t) E[y | x_t] + sqrt(2 t dt) eps.
* :func:`heun_step` -- the probability-flow ODE dx/dt = (x - D(x; t)) / t (Karras et al. 2022,
  eq. 3) integrated by Heun's method (their Alg. 1 lines 4-8, Alg. 2 lines 7-11); a step to
  t = 0 is an Euler step. :func:`heun_sampler` runs it along a grid (Alg. 1, S_churn = 0);
  DPDM's churn (Alg. 2) injects its noise before each :func:`heun_step`.

The floating-point operation order of each formula is the one the released tables were computed
with; a change of order changes numbers in the last bits, so it is part of the contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

#: D(x, t) -> estimate of the clean y at noise level t (a Python float), same shape as x.
StepDenoiser = Callable[[Tensor, float], Tensor]


def eq1_noise_std(t: float, t_next: float) -> float:
    """Std of the noise eq. 1 adds on a step from t to t_next, sqrt(2 t dt) (EMPDEN eq. 1)."""
    dt = t - t_next
    if not (t > 0 and dt > 0):
        raise ValueError(f"a step needs t > t_next >= 0, got t={t}, t_next={t_next}")
    return math.sqrt(2.0 * t * dt)


def eq1_step(x: Tensor, x0_hat: Tensor, t: float, t_next: float, eps: Tensor) -> Tensor:
    """x_{t_next} = (1 - 2 dt/t) x + (2 dt/t) x0_hat + sqrt(2 t dt) eps, dt = t - t_next (EMPDEN eq. 1).

    ``x0_hat`` is the denoiser's estimate of E[y | x_t] (neural, empirical or clipped empirical),
    ``eps`` standard normal: the caller draws it, so a private step can own its mechanism noise
    and a diagnostic can hold it fixed.
    """
    dt = t - t_next
    return (1.0 - 2.0 * dt / t) * x + (2.0 * dt / t) * x0_hat + eq1_noise_std(t, t_next) * eps


def heun_step(x: Tensor, denoise: StepDenoiser, t_cur: float, t_next: float) -> Tensor:
    """One Heun step of dx/dt = (x - D(x; t)) / t from t_cur to t_next (Karras et al. 2022, Alg. 2 l. 7-11).

    Euler when t_next = 0 (the ODE's slope is undefined there; Alg. 1 line 5 and 7). The
    denoiser's output is cast to ``x``'s dtype, so a float32 network can drive a float64 state.
    """
    d_cur = (x - denoise(x, t_cur).to(x.dtype)) / t_cur
    x_next = x + (t_next - t_cur) * d_cur
    if t_next > 0:  # second-order correction
        d_next = (x_next - denoise(x_next, t_next).to(x.dtype)) / t_next
        x_next = x + (t_next - t_cur) * 0.5 * (d_cur + d_next)
    return x_next


@torch.no_grad()
def heun_sampler(x: Tensor, denoise: StepDenoiser, times: np.ndarray) -> Tensor:
    """Deterministic EDM Heun sampler (Karras et al. 2022, Alg. 1 with S_churn = 0) along decreasing ``times``."""
    for t_cur, t_next in zip(times[:-1], times[1:]):
        x = heun_step(x, denoise, float(t_cur), float(t_next))
    return x

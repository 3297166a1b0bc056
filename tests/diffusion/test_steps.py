"""The shared diffusion formulas: the EDM grid, EMPDEN eq. 1 and the Heun step, each as the paper writes it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.diffusion.schedule import EDMSchedule
from pipeline.diffusion.steps import eq1_noise_std, eq1_step, heun_sampler, heun_step
from pipeline.privacy import schedule as privacy_schedule


def test_the_grid_is_karras_eq5_and_privacy_sees_the_same_class():
    s = EDMSchedule(sigma_min=0.002, sigma_max=80.0, rho=7.0, N=5)
    t = s.times()
    i = np.arange(5)
    want = (80 ** (1 / 7) + i / 4 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    np.testing.assert_allclose(t[:-1], want, rtol=1e-12)
    assert t[0] == pytest.approx(80.0) and t[-2] == pytest.approx(0.002) and t[-1] == 0.0
    assert privacy_schedule.EDMSchedule is EDMSchedule  # one class, re-exported for privacy


def test_eq1_step_is_the_paper_update_in_the_released_operation_order():
    g = torch.Generator().manual_seed(0)
    x, d, eps = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    t, t_next = 1.7, 0.9
    dt = t - t_next
    # the expression privacy.empirical_denoiser.private_step and the proxy diagnostics used before
    old = (1.0 - 2.0 * dt / t) * x + (2.0 * dt / t) * d + math.sqrt(2.0 * t * dt) * eps
    assert torch.equal(eq1_step(x, d, t, t_next, eps), old)
    assert eq1_noise_std(t, t_next) == math.sqrt(2.0 * t * dt)


def test_eq1_step_without_noise_keeps_the_denoised_point_fixed():
    d = torch.full((2, 3), 0.25, dtype=torch.float64)
    out = eq1_step(d.clone(), d, 2.0, 1.0, torch.zeros_like(d))
    assert torch.allclose(out, d)


@pytest.mark.parametrize("t, t_next", [(1.0, 1.0), (1.0, 2.0), (0.0, 0.0)])
def test_eq1_needs_a_decreasing_step(t, t_next):
    with pytest.raises(ValueError, match="t > t_next >= 0"):
        eq1_noise_std(t, t_next)


def test_heun_is_exact_on_a_linear_ode_up_to_second_order_and_euler_to_zero():
    # D(x; t) = 0 gives dx/dt = x / t, solution x(t) = x0 t / t0: Heun's trapezoid is exact on it
    x = torch.tensor([[2.0]], dtype=torch.float64)
    out = heun_step(x, lambda x, t: torch.zeros_like(x), 4.0, 1.0)
    assert out.item() == pytest.approx(0.5)
    # the last step to t = 0 is a single Euler step, x + (0 - t)(x - D)/t = D
    d = torch.tensor([[0.3]], dtype=torch.float64)
    calls = []
    out = heun_step(x, lambda x, t: (calls.append(t), d)[1], 4.0, 0.0)
    assert out.item() == pytest.approx(0.3) and calls == [4.0]


def test_heun_sampler_is_heun_steps_along_the_grid():
    times = EDMSchedule(N=4).times()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, generator=g)
    den = lambda x, t: torch.tanh(x) / (1 + t)  # noqa: E731
    want = x
    for a, b in zip(times[:-1], times[1:]):
        want = heun_step(want, den, float(a), float(b))
    assert torch.equal(heun_sampler(x, den, times), want)

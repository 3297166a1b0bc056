"""EDM schedule and per-step GDP parameters (EMPDEN Sec. 3.1-3.2, eq. 39)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.privacy.schedule import EDMSchedule, block_mu, k_private_steps, log_snr, step_mu


def test_edm_times_run_from_sigma_max_to_sigma_min_then_zero():
    t = EDMSchedule(sigma_min=0.002, sigma_max=80, rho=7, N=39).times()
    assert len(t) == 40
    assert t[0] == pytest.approx(80) and t[38] == pytest.approx(0.002) and t[39] == 0
    assert np.all(np.diff(t) < 0)


def test_edm_times_follow_the_rho_formula_at_an_interior_step():
    s = EDMSchedule(sigma_min=0.5, sigma_max=20, rho=3, N=5)
    i = 2
    expected = (20 ** (1 / 3) + i / 4 * (0.5 ** (1 / 3) - 20 ** (1 / 3))) ** 3
    assert s.times()[i] == pytest.approx(expected, rel=1e-12)


def test_step_mu_is_the_gaussian_mechanism_of_eq_39():
    # N = 2: steps 80 -> 0.002 and 0.002 -> 0; written out independently of the code.
    s = EDMSchedule(sigma_min=0.002, sigma_max=80, rho=7, N=2)
    C, beta, S = 3.0, 2.0, 10
    mu = step_mu(s, C=C, beta=beta, batch_size=S)
    sens_over_noise = 2 * C / (beta * S)  # sensitivity 2C/|S| of the clipped average, over beta
    assert mu[0] == pytest.approx(sens_over_noise * math.sqrt(2 * (80 - 0.002) / 80**3), rel=1e-12)
    assert mu[1] == pytest.approx(sens_over_noise * math.sqrt(2 * 0.002 / 0.002**3), rel=1e-12)


def test_step_mu_scales_with_sensitivity_and_inverse_beta_and_subset():
    s = EDMSchedule()
    base = step_mu(s, C=1.0, beta=1.0, batch_size=25)
    np.testing.assert_allclose(step_mu(s, C=2.0, beta=1.0, batch_size=25), 2 * base, rtol=1e-12)
    np.testing.assert_allclose(step_mu(s, C=1.0, beta=2.0, batch_size=25), base / 2, rtol=1e-12)
    np.testing.assert_allclose(step_mu(s, C=1.0, beta=1.0, batch_size=50), base / 2, rtol=1e-12)


def test_later_steps_leak_more():
    # Sec. 3.2: mu_t ~ t^{-1-1/(2 rho)}, so the low-noise steps dominate.
    mu = step_mu(EDMSchedule(), C=1, beta=1, batch_size=1)
    assert np.all(np.diff(mu) > 0)


@pytest.mark.parametrize("p, k", [(55, 22), (62, 25), (65, 26), (67, 27), (70, 28), (100, 39)])
def test_k_private_steps_is_ceil_of_p_percent(p, k):
    assert k_private_steps(39, p) == k


def test_block_mu_reproduces_empden_table7_mu_bar():
    # EMPDEN Table 7 prints mu_bar_B = 0.69 / 1.56 / 2.09 / 2.84 for the 55/62/65/67% blocks
    # of N = 39 with 2C/(beta |S|) = 1. A halved sensitivity (C/|S|) would halve all four.
    mu_t = step_mu(EDMSchedule(N=39), C=0.5, beta=1.0, batch_size=1)
    got = [round(block_mu(mu_t, k_private_steps(39, p)), 2) for p in (55, 62, 65, 67)]
    assert got == [0.69, 1.56, 2.09, 2.84]


def test_block_mu_composes_exactly():
    mu_t = np.array([0.3, 0.4, 1.2])
    assert block_mu(mu_t, 2) == pytest.approx(0.5)
    assert block_mu(mu_t, 0) == 0


def test_log_snr_matches_empden_axis():
    # SNR = 1/(4 t^2): t = 80 -> -10.2, t = 0.002 -> +11.0 (EMPDEN Table 4's first/last rows)
    assert log_snr(np.array([80.0, 0.002])) == pytest.approx([-10.2, 11.0], abs=0.05)


@pytest.mark.parametrize("kwargs", [dict(sigma_min=0), dict(sigma_min=90), dict(rho=0), dict(N=1)])
def test_bad_schedules_are_refused(kwargs):
    with pytest.raises(ValueError):
        EDMSchedule(**kwargs)


def test_bad_step_parameters_are_refused():
    with pytest.raises(ValueError, match="C > 0"):
        step_mu(EDMSchedule(), C=0, beta=1, batch_size=1)
    with pytest.raises(ValueError, match="percent"):
        k_private_steps(39, 0)

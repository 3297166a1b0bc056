"""Degree-2 Edgeworth estimate and its App. D diagnostics (EMPDEN eq. 25, App. D, G)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.privacy import accountants as acc
from pipeline.privacy.edgeworth import Block, block_cumulants, block_loss, edgeworth_cdf, edgeworth_epsilon

CIFAR = dict(q=25 / 50000, count=50000, delta=1e-5)  # EMPDEN's CIFAR-10 setting (App. G.2)


def test_without_subsampling_the_privacy_loss_is_gaussian():
    # q = 1: L = mu z - mu^2/2, so kappa_1 = -/+ mu^2/2, kappa_2 = mu^2 under P/Q, higher ones 0
    mu = 1.7
    c = block_cumulants(mu, 1.0)
    assert (c["P"].k1, c["Q"].k1) == pytest.approx((-mu**2 / 2, mu**2 / 2), rel=1e-10)
    assert (c["P"].k2, c["Q"].k2) == pytest.approx((mu**2, mu**2), rel=1e-10)
    assert max(abs(c[d].k3) + abs(c[d].k4) for d in "PQ") < 1e-9


def test_cumulants_match_monte_carlo():
    rng = np.random.default_rng(0)
    mu, q = 1.2, 0.3
    z_p = rng.standard_normal(2_000_000)
    z_q = np.where(rng.random(z_p.size) < q, mu, 0.0) + rng.standard_normal(z_p.size)
    c = block_cumulants(mu, q)
    for d, z in (("P", z_p), ("Q", z_q)):
        loss = block_loss(z, mu, q)
        assert c[d].k1 == pytest.approx(loss.mean(), abs=3e-3)
        assert c[d].k2 == pytest.approx(loss.var(), rel=1e-2)


def test_block_loss_does_not_overflow():
    assert np.all(np.isfinite(block_loss(np.array([-1e3, 0.0, 1e3]), 5.0, 1e-4)))


def test_edgeworth_is_exact_for_composed_gaussians():
    # q = 1: the composition is exactly Gaussian, the corrections vanish, eps = GDP eps
    result = edgeworth_epsilon([Block(0.2, 1.0, 100)], 1e-5)
    assert result.eps == pytest.approx(acc.gdp_epsilon(1e-5, 0.2 * math.sqrt(100)), rel=1e-6)
    assert result.valid, result.reason


def test_edgeworth_cdf_is_the_normal_cdf_plus_eq_25_corrections():
    c = block_cumulants(1.0, 0.2)["P"]
    z = np.array([-1.0, 0.0, 2.0])
    corrections = edgeworth_cdf(z, c) - 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    assert np.any(np.abs(corrections) > 1e-6)  # skewness of a subsampled loss is not zero


@pytest.mark.parametrize("mu_bar", [0.6946, 1.5610])
def test_edgeworth_within_one_percent_of_pld_for_small_eps(mu_bar):
    # EMPDEN App. G.2: for eps <~ 2 (the 55% and 62% blocks) Edgeworth is within 1% of eps_u.
    ew = edgeworth_epsilon([Block(mu_bar, CIFAR["q"], CIFAR["count"])], CIFAR["delta"])
    pld = acc.pld_epsilon(acc.outputwise_event(mu_bar, CIFAR["q"], CIFAR["count"]), CIFAR["delta"],
                          settings=acc.PLDSettings(1e-4))
    assert ew.valid, ew.reason
    assert ew.eps == pytest.approx(pld, rel=0.01)


@pytest.mark.parametrize("mu_bar", [2.0904, 2.8351])
def test_edgeworth_is_anticonservative_and_flagged_for_large_eps(mu_bar):
    # App. G.2: at the 65% and 67% blocks Edgeworth understates eps_u by 10-15%.
    ew = edgeworth_epsilon([Block(mu_bar, CIFAR["q"], CIFAR["count"])], CIFAR["delta"])
    pld = acc.pld_epsilon(acc.outputwise_event(mu_bar, CIFAR["q"], CIFAR["count"]), CIFAR["delta"],
                          settings=acc.PLDSettings(1e-3))
    assert ew.eps < 0.95 * pld
    assert not ew.valid and ew.reason


def test_celeba_flags_match_empden_table9():
    # Table 9 (n = 162770, delta = 1e-6): the 65%, B = 25 block is invalid with rho4^Q = 3.32,
    # the 62%, B = 25 block is valid.
    q = 25 / 162770
    invalid = edgeworth_epsilon([Block(2.0904, q, 50000)], 1e-6)
    valid = edgeworth_epsilon([Block(1.5610, q, 50000)], 1e-6)
    assert not invalid.valid and not invalid.rho_ok and "rho4_Q" in invalid.reason
    assert invalid.rho4_Q == pytest.approx(3.32, rel=0.02)
    assert valid.valid and valid.rho_ok, valid.reason


def test_one_dominant_block_is_flagged():
    result = edgeworth_epsilon([Block(1.0, 0.1, 1)], 1e-5)
    assert not result.valid and "variance" in result.reason


def test_vanishing_variance_is_flagged():
    result = edgeworth_epsilon([Block(1e-4, 1e-5, 10)], 1e-5)
    assert not result.valid and "variance too small" in result.reason


def test_heterogeneous_blocks_sum_their_cumulants():
    a, b = Block(1.0, 0.01, 300), Block(0.5, 0.02, 700)
    both = edgeworth_epsilon([a, b], 1e-5)
    alone = edgeworth_epsilon([a], 1e-5)
    assert both.V_P == pytest.approx(alone.V_P + edgeworth_epsilon([b], 1e-5).V_P, rel=1e-9)
    assert both.eps > alone.eps

"""The vectorised Gaussian PLD builds dp_accounting's PMF, only faster."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from pipeline.privacy import accountants as acc
from pipeline.privacy import fast_pld


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("mu, q, h", [(0.69, 5e-4, 1e-4), (2.0, 0.05, 1e-3), (1.3, 1.0, 1e-4), (3.0, 0.5, 1e-3)])
def test_same_pmf_as_dp_accounting(mu, q, h, pessimistic):
    # pessimistic: connect-the-dots (eps_u); optimistic: privacy buckets rounded down (eps_l)
    ours = fast_pld.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=h,
                                            pessimistic_estimate=pessimistic)
    ref = pld_lib.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=h,
                                          pessimistic_estimate=pessimistic, use_connect_dots=pessimistic)
    for direction in ("_pmf_remove", "_pmf_add"):
        a, b = getattr(ours, direction).to_dense_pmf(), getattr(ref, direction).to_dense_pmf()
        assert a._lower_loss == b._lower_loss and a._probs.shape == b._probs.shape
        np.testing.assert_allclose(a._probs, b._probs, rtol=0, atol=1e-10)
        assert a._infinity_mass == pytest.approx(b._infinity_mass, abs=1e-15)


@pytest.mark.parametrize("pessimistic", [True, False])
def test_composed_eps_matches_the_reference_path(pessimistic):
    event = acc.outputwise_event(1.56, 5e-4, 2000)
    settings = acc.PLDSettings(1e-4)
    fast = acc.pld_epsilon(event, 1e-5, settings=settings, pessimistic=pessimistic)
    ref = acc.pld_epsilon(event, 1e-5, settings=settings, pessimistic=pessimistic, reference=True)
    assert fast == pytest.approx(ref, rel=1e-7)  # float rounding, amplified by 2000 compositions


@pytest.mark.parametrize("mu, q, n", [(2.09, 5e-4, 50000), (1.0, 0.3, 100), (0.5, 1.0, 30)])
def test_self_composition_matches_dp_accounting(mu, q, n):
    single = fast_pld.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=1e-3)
    for direction in ("_pmf_remove", "_pmf_add"):
        probs = getattr(single, direction).to_dense_pmf()._probs
        assert fast_pld.self_convolve_bounds(probs, n, 1e-15) == common.compute_self_convolve_bounds(probs, n, 1e-15)
    ours, ref = fast_pld.self_compose(single, n), single.self_compose(n)
    for direction in ("_pmf_remove", "_pmf_add"):
        a, b = getattr(ours, direction).to_dense_pmf(), getattr(ref, direction).to_dense_pmf()
        assert a._lower_loss == b._lower_loss
        np.testing.assert_allclose(a._probs, b._probs, rtol=0, atol=1e-12)
        assert a._infinity_mass == pytest.approx(b._infinity_mass, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("mu, q, n, delta", [(2.0, 5e-4, 50000, 1e-5), (1.0, 0.3, 100, 1e-5), (0.5, 1.0, 30, 1e-6),
                                             (0.01, 1e-4, 10, 1e-5), (4.0, 0.5, 50, 1e-5)])
def test_epsilon_scan_matches_dp_accounting(mu, q, n, delta, pessimistic):
    composed = fast_pld.self_compose(fast_pld.from_gaussian_mechanism(
        1 / mu, sampling_prob=q, value_discretization_interval=1e-3, pessimistic_estimate=pessimistic), n)
    ref = composed.get_epsilon_for_delta(delta)
    assert fast_pld.epsilon_for_delta(composed, delta) == pytest.approx(ref, rel=1e-9, abs=1e-12)

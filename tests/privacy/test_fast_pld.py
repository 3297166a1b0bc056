"""The vectorised Gaussian PLD builds dp_accounting's PMF, only faster; compositions on a
coarser grid are never below dp_accounting's and stay within 0.1% of it."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm

from pipeline.methods.accounting import blocks as empden
from pipeline.config import validate_config
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
    if pessimistic:  # never below the reference: the fast path adds its margin over float rounding
        assert ref <= fast <= ref * (1 + 2 * acc.FAST_PATH_REL_MARGIN)
    else:
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


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.0])
def test_the_noise_cdfs_are_the_librarys_bit_for_bit(sigma):
    """The ndtr shortcut returns exactly what the library's frozen scipy.stats.norm returns."""
    ours = fast_pld.VectorizedGaussianPrivacyLoss(sigma, sampling_prob=0.01)
    ref = plm.GaussianPrivacyLoss(sigma, sampling_prob=0.01)
    x = np.concatenate([np.linspace(-40 * sigma, 40 * sigma, 10_001), [-np.inf, np.inf, 0.0, -0.0]])
    for name in ("noise_cdf", "noise_log_cdf", "mu_upper_cdf", "mu_lower_log_cdf"):
        np.testing.assert_array_equal(getattr(ours, name)(x), getattr(ref, name)(x), err_msg=name)
        assert getattr(ours, name)(0.3) == getattr(ref, name)(0.3)


@pytest.mark.parametrize("mu, q, n", [(2.09, 5e-4, 50000), (3.9, 4e-3, 50000), (1.0, 0.3, 100)])
def test_the_spectrum_power_drops_only_components_below_1e_40(mu, q, n):
    single = fast_pld.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=1e-3)
    spectrum = np.fft.rfft(single._pmf_remove.to_dense_pmf()._probs, 1 << 16)
    full, ours = spectrum ** n, fast_pld._spectrum_power(spectrum, n)
    kept = ours != 0
    np.testing.assert_array_equal(ours[kept], full[kept])  # the kept ones are numpy's own power
    assert np.abs(full[~kept]).max(initial=0.0) <= 1e-40 * (1 + 1e-9)  # what the docstring promises
    assert kept.sum() >= 1 and kept[0]  # the DC term (total mass ~ 1) is always kept


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("mu, q, n, delta", [(2.0, 5e-4, 50000, 1e-5), (1.0, 0.3, 100, 1e-5), (0.5, 1.0, 30, 1e-6),
                                             (0.01, 1e-4, 10, 1e-5), (4.0, 0.5, 50, 1e-5)])
def test_epsilon_scan_matches_dp_accounting(mu, q, n, delta, pessimistic):
    composed = fast_pld.self_compose(fast_pld.from_gaussian_mechanism(
        1 / mu, sampling_prob=q, value_discretization_interval=1e-3, pessimistic_estimate=pessimistic), n)
    ref = composed.get_epsilon_for_delta(delta)
    assert fast_pld.epsilon_for_delta(composed, delta) == pytest.approx(ref, rel=1e-9, abs=1e-12)


# --------------------------------------------------------------------------- coarse composition
# At the paper's h = 1e-5 the composition runs on ~1e-4; here the same mechanism is tested at
# h = 1e-3 composed on <= 1e-2, so that dp_accounting's own path takes a second.

H, INTERVAL, DELTA = 1e-3, 1e-2, 1e-5


def _hockey_stick(pmf, epsilons):
    return np.asarray(pmf.get_delta_for_epsilon(epsilons), dtype=float)


def test_split_keeps_mass_and_e_minus_loss_mass_and_never_lowers_delta():
    fine = fast_pld.from_gaussian_mechanism(0.5, sampling_prob=0.1, value_discretization_interval=H)
    for direction in ("_pmf_remove", "_pmf_add"):
        a = getattr(fine, direction).to_dense_pmf()
        b = fast_pld.coarsen_pmf(a, 7)  # 7 does not divide the grid offset: cells straddle 0
        assert b._discretization == pytest.approx(7 * H)
        loss_a = (a._lower_loss + np.arange(a.size)) * a._discretization
        loss_b = (b._lower_loss + np.arange(b.size)) * b._discretization
        assert b._probs.sum() == pytest.approx(a._probs.sum(), rel=1e-12)
        assert b._probs @ np.exp(-loss_b) == pytest.approx(a._probs @ np.exp(-loss_a), rel=1e-12)
        eps = np.linspace(loss_a[0] - 0.1, loss_a[-1] + 0.1, 997)
        gap = _hockey_stick(b, eps) - _hockey_stick(a, eps)
        # a mean-preserving spread of e^{-L}: delta never lower (up to rounding of 1 - e^eps E[e^-L] ~ 1)
        assert gap.min() >= -1e-13
        assert gap.max() > 0  # ... and the coarsening really happened


@pytest.mark.parametrize("mu, q, n", [(2.0, 0.1, 100), (1.0, 0.2, 200)])
def test_composed_delta_on_the_coarse_grid_dominates_the_fine_one(mu, q, n):
    single = fast_pld.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=H)
    fine = fast_pld.self_compose(single, n)
    coarse = fast_pld.coarse_self_compose(single, n, interval=INTERVAL)
    assert coarse._pmf_remove._discretization > H
    for direction in ("_pmf_remove", "_pmf_add"):
        a, b = getattr(fine, direction), getattr(coarse, direction)
        eps = np.linspace(0.0, fast_pld.epsilon_for_delta(fine, 1e-9) + 1, 200)
        assert (_hockey_stick(b, eps) >= _hockey_stick(a, eps)).all()


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("mu, q, n", [(2.0, 0.1, 100), (1.0, 0.2, 200), (3.0, 0.02, 200)])
def test_coarse_eps_is_never_below_dp_accounting_and_within_a_tenth_of_a_percent(mu, q, n, pessimistic):
    naive = pld_lib.from_gaussian_mechanism(
        1 / mu, sampling_prob=q, value_discretization_interval=H, pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic, log_mass_truncation_bound=-50).self_compose(n).get_epsilon_for_delta(DELTA)
    single = fast_pld.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=H,
                                              pessimistic_estimate=pessimistic, log_mass_truncation_bound=-50)
    composed = fast_pld.coarse_self_compose(single, n, interval=INTERVAL)
    ours = fast_pld.epsilon_for_delta(composed, DELTA)
    assert composed._pmf_remove._discretization > H  # the coarse path was taken
    assert ours >= naive  # eps_u: certified and never below the naive one; eps_l: moved up
    assert (ours - naive) / naive <= 1e-3


def test_a_narrow_loss_keeps_the_fine_grid_a_wide_one_is_coarsened():
    narrow = fast_pld.from_gaussian_mechanism(2.0, sampling_prob=1e-3, value_discretization_interval=H)
    wide = fast_pld.from_gaussian_mechanism(0.5, sampling_prob=0.1, value_discretization_interval=H)
    assert fast_pld.split_factor(narrow._pmf_remove, 10) == 1
    assert fast_pld.split_factor(wide._pmf_remove, 10) == 10
    assert fast_pld.composition_factor(1e-5) == 10
    # at h >= 1e-4 the interval alone would force k = 1; the split tolerance decides up to 8
    assert fast_pld.composition_factor(1e-4) == fast_pld.composition_factor(1e-3) == 8
    assert fast_pld.composition_factor(1e-3, min_factor=1) == 1


@pytest.mark.parametrize("h", [5.063129624349869e-30, 2.2250738585e-313])
def test_a_grid_step_far_below_any_accountants_caps_the_factor(h):
    # the CLI takes any discretisation: a denormal h made interval / h infinite (OverflowError), 5e-30 made k too large
    # for numpy's indices
    k = fast_pld.composition_factor(h)
    assert k == fast_pld.MAX_COMPOSITION_FACTOR and k * h <= fast_pld.COMPOSITION_INTERVAL


def test_at_the_cli_grid_a_strong_block_is_coarsened_and_stays_above_dp_accounting():
    """h = 1e-4 (the CLI's and DP-SGD calibration's grid): a DP-SGD-like mechanism (sigma 1, q 0.05,
    1,000 steps) composes on k h > h and its eps_u is >= dp_accounting's, within 1e-4 relative."""
    h, n, sigma, q = 1e-4, 1_000, 1.0, 0.05
    naive = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h,
                                            log_mass_truncation_bound=-50, use_connect_dots=True)
    single = fast_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h,
                                              log_mass_truncation_bound=-50)
    composed = fast_pld.coarse_self_compose(single, n)
    assert composed._pmf_remove._discretization >= 4 * h
    eps_naive = naive.self_compose(n).get_epsilon_for_delta(DELTA)
    eps_ours = fast_pld.epsilon_for_delta(composed, DELTA)
    assert eps_naive <= eps_ours <= eps_naive * (1 + 1e-4)


def test_empden_tables_take_the_fast_path(monkeypatch):
    """Table 7/8/9/11/13 eps comes from acc.pld_epsilon's fast path, never dp_accounting's own build."""
    calls = []
    real = fast_pld.coarse_self_compose
    monkeypatch.setattr(fast_pld, "coarse_self_compose", lambda *a, **k: calls.append(a[1]) or real(*a, **k))

    def refuse(*args, **kwargs):
        raise AssertionError("the reference (slow) PLD path was used")

    monkeypatch.setattr(pld_lib, "from_gaussian_mechanism", refuse)
    acc._build_pld_cached.cache_clear()  # noqa: SLF001  a cached PLD would hide the path taken
    section = validate_config({"accounting": {"N_out": 300, "discretisation": 1e-3, "B": [25], "p": [62]}})
    cfg = empden.AccountingConfig.from_params({"accounting": section["accounting"], "n": 3000})
    row = empden.account_block(cfg, 1.5, 25 / 3000)
    assert calls == [300, 300]  # eps_u and eps_l, each composed once
    assert row["eps_lower_estimate"] <= row["eps_upper_bound"]
    acc._build_pld_cached.cache_clear()  # noqa: SLF001

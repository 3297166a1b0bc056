"""SENSGEO (Do & Alabi): exact sensitivity, exact guarantees, optimal covariance, MI-DP.

Each test states one claim of the paper and checks it against an independent computation:
brute force over datasets, the denoiser's own outputs, dp_accounting, numerical
integration, or numpy eigenvalues of the SDP's constraints.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import integrate, stats

from pipeline.privacy.sensgeo import bridge, geometry, guarantees, midp, sdp

# --------------------------------------------------------------------------- strategies

_coord = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False)


@st.composite
def domains(draw, max_m: int = 6, max_d: int = 3):
    """A public domain K (m <= 6 points in R^d, d <= 3), a query g, a bandwidth and an SPD Sigma."""
    m = draw(st.integers(2, max_m))
    d = draw(st.integers(1, max_d))
    k_pts = draw(hnp.arrays(float, (m, d), elements=_coord))
    g = draw(hnp.arrays(float, (d,), elements=st.floats(-3.0, 3.0)))
    sigma = draw(st.floats(0.2, 3.0))
    a = draw(hnp.arrays(float, (d, d), elements=st.floats(-1.0, 1.0)))
    cov = a @ a.T + 0.1 * np.eye(d)
    return k_pts, g, sigma, cov


def _spd(rng: np.random.Generator, d: int, floor: float = 0.1) -> np.ndarray:
    a = rng.standard_normal((d, d))
    return a @ a.T / d + floor * np.eye(d)


# --------------------------------------------------------------------------- Sec. II-III definitions

def test_ideal_denoiser_is_the_softmax_weighted_mean():
    rng = np.random.default_rng(0)
    x, g, sigma = rng.normal(size=(7, 3)), rng.normal(size=3), 0.8
    w = np.exp(-np.sum((g - x) ** 2, axis=1) / (2 * sigma ** 2))
    np.testing.assert_allclose(geometry.ideal_denoiser(g, x, sigma), w @ x / w.sum(), rtol=1e-12)


def test_deletion_shift_is_the_change_of_the_denoiser_and_matches_both_paper_forms():
    rng = np.random.default_rng(1)
    x, g, sigma = rng.normal(size=(5, 2)), rng.normal(size=2), 1.3
    r = geometry.responsibilities(g, x, sigma)
    m_full = geometry.ideal_denoiser(g, x, sigma)
    for k in range(5):
        s_k = geometry.deletion_shift(g, x, sigma, k)
        np.testing.assert_allclose(s_k, m_full - geometry.ideal_denoiser(g, np.delete(x, k, 0), sigma), atol=1e-12)
        np.testing.assert_allclose(s_k, r[k] / (1 - r[k]) * (x[k] - m_full), atol=1e-12)


def test_two_record_deletion_shift_is_the_generator_t_g():
    rng = np.random.default_rng(2)
    x, y, g = rng.normal(size=(3, 2))
    t_xy = geometry.pair_generators(g, np.stack([x, y]), 0.7)[0]  # ordered pair (x, y)
    np.testing.assert_allclose(geometry.deletion_shift(g, np.stack([x, y]), 0.7, 0), t_xy, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(domains())
def test_two_record_reduction_equals_brute_force_over_all_datasets(case):
    """Theorem 1: sup over ALL D subset of K (|D| <= 5) and k of s_k^T Sigma^-1 s_k is the pair value."""
    k_pts, g, sigma, cov = case
    brute = geometry.mahalanobis_sq(geometry.add_remove_set(g, k_pts, sigma, max_size=5), cov)
    pair = geometry.mahalanobis_sq(geometry.pair_generators(g, k_pts, sigma), cov).max()
    assert np.all(brute <= pair * (1 + 1e-9) + 1e-12), "a dataset exceeded the two-record value"
    assert brute.max() == pytest.approx(pair, rel=1e-9, abs=1e-12)
    assert geometry.fixed_query_rho_star(g, k_pts, sigma, cov) == pytest.approx(pair, rel=1e-9, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(domains(max_m=5))
def test_larger_datasets_stay_inside_the_generator_hull(case):
    """Sec. III-C: datasets of 3+ records never beat pairs (they are convex combinations with 0)."""
    k_pts, g, sigma, cov = case
    if k_pts.shape[0] < 3:
        return
    pair = geometry.mahalanobis_sq(geometry.pair_generators(g, k_pts, sigma), cov).max()
    for size in range(3, k_pts.shape[0] + 1):
        for k in range(size):
            s = geometry.deletion_shift(g, k_pts[:size], sigma, k)
            assert geometry.mahalanobis_sq(s, cov)[0] <= pair * (1 + 1e-9) + 1e-12


def test_reduction_is_attained_by_real_neighbouring_datasets():
    """rho_* is the Mahalanobis norm of an actual output difference m_g(D) - m_g(D'): halving any
    sensitivity (generator, shift or diameter) breaks this equality by a factor 4."""
    rng = np.random.default_rng(3)
    k_pts, g, sigma, cov = rng.uniform(size=(6, 3)), rng.uniform(size=3), 0.4, _spd(rng, 3)
    rho = geometry.fixed_query_rho_star(g, k_pts, sigma, cov)
    best = 0.0
    for i in range(6):
        for j in range(6):
            if i != j:
                diff = geometry.ideal_denoiser(g, k_pts[[i, j]], sigma) - geometry.ideal_denoiser(g, k_pts[[j]], sigma)
                best = max(best, float(diff @ np.linalg.solve(cov, diff)))
    assert rho == pytest.approx(best, rel=1e-10)


def test_uniform_query_worst_case_is_the_largest_mahalanobis_distance():
    """Corollary 1: every query stays below max (x-y)^T Sigma^-1 (x-y), and g_gamma approaches it."""
    rng = np.random.default_rng(4)
    k_pts, cov, sigma = rng.uniform(size=(6, 2)), _spd(rng, 2), 0.5
    uniform = geometry.uniform_query_rho_star(k_pts, cov)
    for g in rng.normal(scale=3.0, size=(50, 2)):
        assert geometry.fixed_query_rho_star(g, k_pts, sigma, cov) <= uniform * (1 + 1e-12)
    d2 = geometry.mahalanobis_sq(geometry.uniform_query_generators(k_pts), cov)
    i, j = np.array(np.triu_indices(6, k=1))[:, np.argmax(d2)]
    x, y = k_pts[i], k_pts[j]
    values = []
    for gamma in (0.0, 1.0, 5.0, 50.0):
        g = x + gamma * (x - y)
        t = geometry.query_family_generator(x, y, sigma, gamma)
        np.testing.assert_allclose(t, geometry.deletion_shift(g, np.stack([x, y]), sigma, 0), atol=1e-12)
        values.append(geometry.fixed_query_rho_star(g, k_pts, sigma, cov))
    assert values == sorted(values) and values[-1] == pytest.approx(uniform, rel=1e-9)


def test_replacement_shifts_are_at_most_twice_the_add_remove_norm():
    """Sec. III-B2: m_g(V+x) - m_g(V+x') = [m_g(V+x) - m_g(V)] + [m_g(V) - m_g(V+x')]."""
    rng = np.random.default_rng(5)
    k_pts, g, sigma, cov = rng.uniform(size=(5, 2)), rng.uniform(size=2), 0.6, _spd(rng, 2)
    rep = geometry.rho_star(geometry.replacement_set(g, k_pts, sigma, max_size=4), cov)
    ar = geometry.fixed_query_rho_star(g, k_pts, sigma, cov)
    assert ar < rep <= 4 * ar * (1 + 1e-12)


def test_unit_cube_exact_sensitivity_matches_vertex_brute_force_and_never_exceeds_naive():
    rng = np.random.default_rng(6)
    for d in (2, 3, 4):
        cov = geometry.random_covariances(rng, d, 20, cond_max=50.0)
        exact = geometry.cube_exact_sensitivity(cov)
        corners = np.array(np.meshgrid(*[[0.0, 1.0]] * d)).reshape(d, -1).T
        brute = [geometry.uniform_query_rho_star(corners, c) for c in cov]
        np.testing.assert_allclose(exact, brute, rtol=1e-10)
        inside = rng.uniform(size=(200, d))
        for c, e in zip(cov[:3], exact[:3]):
            assert geometry.uniform_query_rho_star(inside, c) <= e
        assert np.all(geometry.cube_naive_sensitivity(cov) >= exact * (1 - 1e-12))
    assert geometry.cube_naive_sensitivity(np.eye(3)) == pytest.approx(geometry.cube_exact_sensitivity(np.eye(3)))


def test_bad_inputs_give_one_line_errors():
    with pytest.raises(geometry.SensitivityError, match="positive definite"):
        geometry.rho_star(np.ones((2, 2)), np.diag([1.0, -1.0]))
    with pytest.raises(geometry.SensitivityError, match="bandwidth"):
        geometry.ideal_denoiser(np.zeros(2), np.ones((3, 2)), 0.0)
    with pytest.raises(geometry.SensitivityError, match="coordinates"):
        geometry.ideal_denoiser(np.zeros(3), np.ones((3, 2)), 1.0)


# --------------------------------------------------------------------------- Sec. IV guarantees

@pytest.mark.parametrize("rho_star,delta", [(0.05, 1e-3), (1.0, 1e-7), (6.0, 1e-5), (0.5, 1e-10)])
def test_exact_epsilon_matches_dp_accounting_gaussian_pld(rho_star, delta):
    """Theorem 2 + Balle-Wang: eps(delta) from rho_* is dp_accounting's Gaussian PLD for mu = sqrt(rho_*)."""
    mu, h = math.sqrt(rho_star), 2e-4
    eps = guarantees.exact_epsilon(delta, rho_star)
    upper = pld_lib.from_gaussian_mechanism(1.0 / mu, value_discretization_interval=h).get_epsilon_for_delta(delta)
    lower = pld_lib.from_gaussian_mechanism(1.0 / mu, value_discretization_interval=h, pessimistic_estimate=False,
                                            use_connect_dots=False).get_epsilon_for_delta(delta)
    assert lower - 1e-9 <= eps <= upper + 1e-9
    assert upper - lower <= 2 * h


def test_exact_delta_curve_and_its_inverse():
    for rho_star, eps in ((0.3, 0.5), (2.0, 1.0), (20.0, 3.0)):
        delta = guarantees.exact_delta(eps, rho_star)
        assert guarantees.exact_epsilon(delta, rho_star) == pytest.approx(eps, rel=1e-8)
        assert guarantees.max_rho_star(eps, delta) == pytest.approx(rho_star, rel=1e-8)


def test_renyi_divergence_of_the_projected_gaussians_is_alpha_rho_over_two():
    """Theorem 2: D_alpha(N(q,1) || N(0,1)) = alpha q^2 / 2, by numerical integration."""
    for rho_star, alpha in ((0.5, 2.0), (2.0, 3.5), (4.0, 1.5)):
        q = math.sqrt(rho_star)
        integrand = lambda z: math.exp(alpha * stats.norm.logpdf(z, q) + (1 - alpha) * stats.norm.logpdf(z))  # noqa: E731
        val = math.log(integrate.quad(integrand, -40, 40, points=[alpha * q], limit=200)[0]) / (alpha - 1)
        assert guarantees.renyi_curve(alpha, rho_star) == pytest.approx(val, rel=1e-7)


def test_generic_conversions_are_never_tighter_than_the_exact_curve():
    for rho_star in (0.01, 0.5, 3.0, 30.0):
        for delta in (1e-2, 1e-5, 1e-10):
            exact = guarantees.exact_epsilon(delta, rho_star)
            assert guarantees.rdp_to_dp_accountant(delta, rho_star) >= exact - 1e-9
            assert guarantees.rdp_to_dp_classic(delta, rho_star) >= guarantees.rdp_to_dp_accountant(delta, rho_star) - 1e-9
    assert guarantees.zcdp_rho(2.0) == 1.0 and guarantees.gdp_mu(4.0) == 2.0


# --------------------------------------------------------------------------- Sec. V SDP

def _independent_feasibility(sigma, shifts, rho, eta):
    """Every constraint of (P_rho,eta) as written, checked with numpy eigenvalues only."""
    d = sigma.shape[0]
    worst_block = min(np.linalg.eigvalsh(np.block([[sigma, s[:, None]], [s[None, :], np.array([[rho]])]]))[0]
                      for s in shifts)
    return np.linalg.eigvalsh(sigma - eta * np.eye(d))[0], worst_block


@pytest.mark.parametrize("d,query", [(2, "fixed"), (3, "uniform")])
def test_sdp_gap_is_certified_and_the_optimum_is_feasible(d, query):
    rng = np.random.default_rng(10 + d)
    k_pts = rng.uniform(size=(7, d))
    shifts = (geometry.dominant_pair_generators(rng.uniform(size=d), k_pts, 0.5) if query == "fixed"
              else geometry.uniform_query_generators(k_pts))
    inst = sdp.Instance(shifts, _spd(rng, d), rho=0.8, eta=0.02)
    cert = sdp.certify(inst, sdp.solve_primal(inst))
    assert 0 <= cert.gap_rel < 1e-6
    floor, block = _independent_feasibility(cert.sigma, shifts, inst.rho, inst.eta)
    assert floor >= -1e-12 and block >= -1e-9
    assert cert.primal_value == pytest.approx(float(np.trace(inst.weight @ cert.sigma)), rel=1e-12)
    assert cert.max_schur_ratio == pytest.approx(1.0, abs=1e-6)  # the budget binds at the optimum
    # Theorem 3: the conic dual solved on its own reaches the same value.
    assert sdp.solve_dual(inst).value == pytest.approx(cert.primal_value, rel=1e-6)
    # the isotropic covariance is feasible, so it can only be worse
    assert sdp.isotropic_baseline(inst)[1] >= cert.primal_value * (1 - 1e-9)


def test_certified_dual_point_is_exactly_feasible():
    rng = np.random.default_rng(20)
    inst = sdp.Instance(geometry.uniform_query_generators(rng.uniform(size=(5, 2))), _spd(rng, 2), rho=1.5)
    H, Z = sdp.feasible_dual(inst, sdp.solve_primal(inst).Z)
    np.testing.assert_allclose(H + Z[:, :2, :2].sum(axis=0), inst.weight, atol=1e-12)
    assert np.linalg.eigvalsh(H)[0] >= -1e-12 and np.linalg.eigvalsh(Z)[:, 0].min() >= -1e-12


def test_one_dimensional_sdp_has_the_closed_form_optimum():
    """d = 1: Sigma = max_j s_j^2 / rho, so the optimum is w max_j s_j^2 / rho (and equals isotropic)."""
    s = np.array([[0.3], [-1.2], [0.7]])
    inst = sdp.Instance(s, np.array([[2.0]]), rho=0.5)
    cert = sdp.certify(inst, sdp.solve_primal(inst))
    assert cert.primal_value == pytest.approx(2.0 * 1.44 / 0.5, rel=1e-6)
    assert sdp.isotropic_baseline(inst)[1] == pytest.approx(cert.primal_value, rel=1e-6)


def test_schur_form_of_the_constraint():
    rng = np.random.default_rng(21)
    shifts = rng.normal(size=(30, 3))
    cov = _spd(rng, 3)
    ratios = sdp.schur_ratios(cov, shifts, 2.0)
    np.testing.assert_array_equal(ratios <= 1, sdp.block_min_eigs(cov, shifts, 2.0) >= 0)


def test_sdp_rejects_a_singular_weight():
    with pytest.raises(sdp.SDPError, match="positive definite"):
        sdp.Instance(np.ones((2, 2)), np.diag([1.0, 0.0]), rho=1.0)


# --------------------------------------------------------------------------- Sec. VI MI-DP

def test_binary_capacity_matches_direct_integration():
    """C(snr) against I(B;Y) = h(Y) - h(Z) of Y = sqrt(snr) B + Z integrated numerically."""
    for snr in (0.05, 0.7, 4.0):
        a = math.sqrt(snr)
        p = lambda y: 0.5 * (stats.norm.pdf(y, a) + stats.norm.pdf(y, -a))  # noqa: E731
        h_y = integrate.quad(lambda y: -p(y) * math.log(p(y)), -a - 12, a + 12, limit=200)[0]
        direct = h_y - 0.5 * math.log(2 * math.pi * math.e)
        assert float(midp.binary_capacity(snr)) == pytest.approx(direct, abs=1e-9)


def test_i_mmse_identity_and_strict_monotonicity():
    snr = np.geomspace(1e-3, 30, 25)
    h = 1e-6 * snr
    derivative = (midp.binary_capacity(snr + h) - midp.binary_capacity(snr - h)) / (2 * h)
    np.testing.assert_allclose(derivative, midp.binary_mmse(snr) / 2, rtol=1e-5, atol=1e-9)
    cap = midp.binary_capacity(snr)
    assert np.all(np.diff(cap) > 0) and cap[-1] < math.log(2) and float(midp.binary_capacity(0.0)) == 0.0


def test_mi_calibration_inverts_the_capacity():
    for kappa in (1e-3, 0.1, 0.6):
        rho = midp.calibrate_rho_star(kappa)
        assert float(midp.mi_of_rho_star(rho)) == pytest.approx(kappa, rel=1e-9)
    with pytest.raises(midp.MIDPError, match="log 2"):
        midp.calibrate_rho_star(0.7)


# --------------------------------------------------------------------------- bridge (EMPDEN Sec. 3.1)

def test_normalised_empirical_denoiser_is_the_ideal_denoiser():
    """EMPDEN eq. 4 with the EDM kernel N(x_t; x_0, t^2 I) is m_g(D) at sigma = t."""
    rng = np.random.default_rng(30)
    x, g, t = rng.uniform(size=(9, 2)), rng.uniform(size=2), 0.3
    dens = stats.multivariate_normal(mean=np.zeros(2), cov=t * t * np.eye(2)).pdf(g - x)
    np.testing.assert_allclose(geometry.ideal_denoiser(g, x, t), dens @ x / dens.sum(), rtol=1e-10)


def test_empden_exact_clipped_sensitivity_never_exceeds_its_bound():
    rng = np.random.default_rng(31)
    k_pts = rng.uniform(size=(12, 2))
    for t in (0.05, 0.3, 2.0):
        for g in bridge.forward_queries(rng, k_pts, t, 10):
            v = bridge.clipped_contributions(g, k_pts, t, clip=1.0)
            assert np.all(np.linalg.norm(v, axis=1) <= 1.0 + 1e-12)
            exact = bridge.empden_exact_sensitivity(g, k_pts, t, clip=1.0, beta=1.0, n_records=8)
            assert exact <= bridge.empden_sensitivity_bound(1.0, 1.0, 8) == 0.25
    assert bridge.step_noise_std(2.0, 0.5) == pytest.approx(math.sqrt(8.0 / 1.0))

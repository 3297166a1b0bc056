"""STRAIGHTDP Stage 1, the class-conditional moment release (Prop. B.9).

Each privacy test checks the mechanism against an independent computation (brute force over
every neighbour of small datasets, empirical noise, dp_accounting's own accountant, the GDP
closed form) and comes with a detector: the same check run with a halved sensitivity or with
the noise switched off must fail.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats

import pipeline.privacy.moments as moments  # registers the "moment_release" rebuilder
from pipeline.io import CorruptFileError
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger, rebuild
from pipeline.privacy.replay import ReplayError, audit
from pipeline.stage import DataNotFoundError

COARSE = acc.PLDSettings(1e-3)  # fast, and recorded on the ledger line like any other setting


# --------------------------------------------------------------------------- helpers

def stats_of(f, y, *, Y, R, N):
    return moments.whitened_statistic(f, y, n_classes=Y, R=R), moments.second_moment(f, N=N)


def distances(a, b, *, Y, R, N):
    """(||u(D) - u(D')||_2, ||M2(D) - M2(D')||_F) for datasets a = (f, y), b = (f', y')."""
    ua, ma = stats_of(*a, Y=Y, R=R, N=N)
    ub, mb = stats_of(*b, Y=Y, R=R, N=N)
    return float(np.linalg.norm(ua - ub)), float(np.linalg.norm(ma - mb))


def assert_within_declared(a, b, *, Y, R, N):
    """The neighbours a, b move u and M2 by at most what the accountant is told (read from the module)."""
    du, dm = distances(a, b, Y=Y, R=R, N=N)
    assert du <= moments.DELTA_U * (1 + 1e-12), f"||du|| = {du} > declared {moments.DELTA_U}"
    bound = moments.second_moment_sensitivity(R, N)
    assert dm <= bound * (1 + 1e-12), f"||dM2||_F = {dm} > declared {bound}"
    return du, dm


def on_sphere(v, R):
    return v * (R / np.linalg.norm(v))


def adversarial_records(z, R, p, rng):
    """Replacements of record z: zero, antipodal, orthogonal at norm R, each axis at +-R, a random one."""
    out = [np.zeros(p), on_sphere(rng.standard_normal(p), R)]
    if np.linalg.norm(z) > 1e-9:  # a (sub)normal-tiny z has no direction floating point can rescale to R
        out.append(-on_sphere(z, R))
        if p >= 2:
            w = rng.standard_normal(p)
            w -= (w @ z) / (z @ z) * z  # orthogonal to z
            if np.linalg.norm(w) > 1e-9:
                out.append(on_sphere(w, R))
    for k in range(p):
        e = np.zeros(p)
        e[k] = R
        out += [e, -e]
    return out


@st.composite
def datasets(draw):
    """n in 2..8 records, Y in 2..4 classes, p in 1..4 dims, points in the R-ball, some ON its sphere."""
    n, Y, p = draw(st.integers(2, 8)), draw(st.integers(2, 4)), draw(st.integers(1, 4))
    R = draw(st.floats(0.1, 5.0))
    raw = draw(hnp.arrays(float, (n, p), elements=st.floats(-1.0, 1.0)))
    sphere = draw(hnp.arrays(bool, (n,)))
    f = moments.clip_to_ball(raw * R, R)
    for i in range(n):
        if sphere[i] and np.linalg.norm(raw[i]) > 1e-6:
            f[i] = on_sphere(raw[i], R)
    y = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, Y - 1)))
    return f, y, Y, R, draw(st.integers(0, 2**31 - 1))


def worst_case_pair(R=1.5, p=3):
    """Record (R e1, class 0) replaced by (R e2, class 1): ||du|| = sqrt(5/2) exactly (Prop. B.9)."""
    f = np.zeros((3, p))
    f[0, 0], f[1, 1], f[2, 0] = R, R / 2, -R / 3
    y = np.array([0, 1, 1])
    f2, y2 = f.copy(), y.copy()
    f2[0] = 0.0
    f2[0, 1] = R
    y2[0] = 1
    return (f, y), (f2, y2)


def orthogonal_same_label_pair(R=1.5, p=3):
    """Record R e1 replaced by R e2 in the same class: ||dM2||_F = sqrt(2) R^2 / N."""
    (f, y), (f2, _) = worst_case_pair(R, p)
    return (f, y), (f2, y.copy())


# --------------------------------------------------------------------------- sensitivities (Prop. B.9)

def sweep_replace_one(f, y, *, Y, R, rng):
    """Every replace-one neighbour (each record x adversarial replacements x every label) checked
    against the declared and the proven bound; returns the largest ||du|| seen."""
    N = len(f)
    worst = 0.0
    for i in range(N):
        for z_new in adversarial_records(f[i], R, f.shape[1], rng):
            for y_new in range(Y):
                f2, y2 = f.copy(), y.copy()
                f2[i], y2[i] = z_new, y_new
                du, dm = assert_within_declared((f, y), (f2, y2), Y=Y, R=R, N=N)
                assert du <= moments.U_WORST_CASE * (1 + 1e-12)  # the proven exact bound, below the declared 2
                worst = max(worst, du)
    return worst


@settings(max_examples=60, deadline=None)
@given(datasets())
def test_every_replace_one_neighbour_is_within_the_proven_and_the_declared_sensitivity(case):
    f, y, Y, R, seed = case
    worst = sweep_replace_one(f, y, Y=Y, R=R, rng=np.random.default_rng(seed))
    # a label change to a record at norm R in another class is always among the neighbours tried
    assert worst >= math.sqrt(1 + 1 + 0.25) - 1e-12


@pytest.mark.parametrize("constant", ["DELTA_U", "second_moment_sensitivity"])
def test_detector_the_brute_force_sweep_fails_when_a_declared_sensitivity_is_halved(monkeypatch, constant):
    rng = np.random.default_rng(3)
    R, Y = 1.0, 3
    f = moments.clip_to_ball(rng.standard_normal((5, 3)), R)
    f[0] = on_sphere(f[0], R)
    y = np.array([0, 1, 2, 0, 1])
    sweep_replace_one(f, y, Y=Y, R=R, rng=np.random.default_rng(0))
    if constant == "DELTA_U":
        monkeypatch.setattr(moments, "DELTA_U", moments.DELTA_U / 2)
    else:
        real = moments.second_moment_sensitivity
        monkeypatch.setattr(moments, "second_moment_sensitivity", lambda R, N: real(R, N) / 2)
    with pytest.raises(AssertionError, match="declared"):
        sweep_replace_one(f, y, Y=Y, R=R, rng=np.random.default_rng(0))


@settings(max_examples=60, deadline=None)
@given(datasets())
def test_add_and_remove_on_the_padded_form_are_within_the_declared_sensitivity(case):
    """App. B.3: removal is r -> null (zero contribution), addition null -> r; N is the declared capacity."""
    f, y, Y, R, seed = case
    rng = np.random.default_rng(seed)
    N = len(f) + 1  # capacity of the padded database, the same for both datasets
    for i in range(len(f)):
        removed = (np.delete(f, i, axis=0), np.delete(y, i))
        du, dm = assert_within_declared((f, y), removed, Y=Y, R=R, N=N)
        assert du <= math.sqrt(1.25) * (1 + 1e-12) and dm <= R * R / N * (1 + 1e-12)
    for z_new in adversarial_records(f[0], R, f.shape[1], rng):
        for y_new in range(Y):
            added = (np.vstack([f, z_new]), np.append(y, y_new))
            assert_within_declared((f, y), added, Y=Y, R=R, N=N)


def test_the_worst_case_sqrt_5_over_2_is_attained():
    a, b = worst_case_pair()
    du, _ = distances(a, b, Y=2, R=1.5, N=3)
    assert du == pytest.approx(math.sqrt(5 / 2), rel=1e-12) and du == pytest.approx(moments.U_WORST_CASE)
    a, b = orthogonal_same_label_pair()
    _, dm = distances(a, b, Y=2, R=1.5, N=3)
    assert dm == pytest.approx(math.sqrt(2) * 1.5 ** 2 / 3, rel=1e-12)


def test_detector_a_halved_declared_u_sensitivity_is_caught(monkeypatch):
    a, b = worst_case_pair()
    assert_within_declared(a, b, Y=2, R=1.5, N=3)
    monkeypatch.setattr(moments, "DELTA_U", moments.DELTA_U / 2)
    with pytest.raises(AssertionError, match="du"):
        assert_within_declared(a, b, Y=2, R=1.5, N=3)


def test_detector_a_halved_second_moment_sensitivity_is_caught(monkeypatch):
    a, b = orthogonal_same_label_pair()
    assert_within_declared(a, b, Y=2, R=1.5, N=3)
    real = moments.second_moment_sensitivity
    monkeypatch.setattr(moments, "second_moment_sensitivity", lambda R, N: real(R, N) / 2)
    with pytest.raises(AssertionError, match="dM2"):
        assert_within_declared(a, b, Y=2, R=1.5, N=3)


def test_the_second_moment_is_normalised_by_the_declared_N_not_the_dataset_size():
    f = np.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(moments.second_moment(f, N=10), np.eye(2) / 10)
    with pytest.raises(moments.MomentsError, match="N"):
        moments.second_moment(f, N=0)


def test_the_whitened_statistic_is_counts_and_sums_over_2R_class_major():
    f = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    u = moments.whitened_statistic(f, np.array([0, 2, 2]), n_classes=3, R=3.0)
    np.testing.assert_allclose(u, [1, 1 / 6, 0, 0, 0, 0, 2, 1 / 6, 3 / 6])


# --------------------------------------------------------------------------- the noise of the release

def assert_noise_std(draws_u, draws_M2, clean_u, clean_M2, *, std_u, std_M2):
    """Residuals of many releases are centred with the expected std (chi-square bounds at 1e-6)."""
    for name, draws, clean, std in (("u", draws_u, clean_u, std_u), ("M2", draws_M2, clean_M2, std_M2)):
        r = (np.asarray(draws) - clean).reshape(-1)
        n = r.size
        lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], n)
        ss = float(r @ r)  # known mean 0: ss / std^2 ~ chi2(n)
        assert lo * std ** 2 <= ss <= hi * std ** 2, f"{name}: empirical std {math.sqrt(ss / n)} vs {std}"
        assert abs(r.mean()) <= 5 * std / math.sqrt(n), f"{name}: noise not centred"


def _release_draws(plan, f, y, n_draws=400, seed=0):
    gen = np.random.default_rng(seed)
    out = [moments.release(f, y, plan, generator=gen) for _ in range(n_draws)]
    return [o.u for o in out], [o.M2 for o in out]


def _small_release_case():
    rng = np.random.default_rng(5)
    R, N, Y, p = 1.3, 20, 3, 3
    f = moments.clip_to_ball(rng.standard_normal((N, p)), R)
    y = rng.integers(0, Y, N)
    plan = moments.MomentReleasePlan(sigma=0.7, R=R, N=N, n_classes=Y, p=p, delta=1e-5)
    return plan, f, y


def test_the_release_noise_has_std_2sigma_on_u_and_sigma_2R2_over_N_on_every_M2_entry():
    plan, f, y = _small_release_case()
    du, dM = _release_draws(plan, f, y)
    clean_u, clean_M2 = stats_of(f, y, Y=plan.n_classes, R=plan.R, N=plan.N)
    # the expected stds are written out here, not read from the plan
    assert_noise_std(du, dM, clean_u, clean_M2, std_u=0.7 * 2.0, std_M2=0.7 * 2 * 1.3 ** 2 / 20)
    # the full p x p matrix is noised: the two halves of an off-diagonal pair are independent
    off = np.array([[m[0, 1] - clean_M2[0, 1], m[1, 0] - clean_M2[1, 0]] for m in dM])
    assert abs(np.corrcoef(off.T)[0, 1]) < 5 / math.sqrt(len(off))
    assert plan.std_u == pytest.approx(1.4) and plan.std_M2 == pytest.approx(0.7 * 2 * 1.3 ** 2 / 20)


@pytest.mark.parametrize("which", ["std_u", "std_M2"])
def test_detector_the_noise_check_fails_when_noise_is_switched_off(monkeypatch, which):
    plan, f, y = _small_release_case()
    monkeypatch.setattr(moments.MomentReleasePlan, which, property(lambda self: 0.0))
    du, dM = _release_draws(plan, f, y, n_draws=20)
    clean_u, clean_M2 = stats_of(f, y, Y=plan.n_classes, R=plan.R, N=plan.N)
    with pytest.raises(AssertionError, match="empirical std 0.0"):
        assert_noise_std(du, dM, clean_u, clean_M2, std_u=0.7 * 2.0, std_M2=0.7 * 2 * 1.3 ** 2 / 20)


def test_detector_the_noise_check_fails_when_the_u_sensitivity_is_halved(monkeypatch):
    plan, f, y = _small_release_case()
    monkeypatch.setattr(moments, "DELTA_U", 1.0)
    du, dM = _release_draws(plan, f, y, n_draws=50)
    clean_u, clean_M2 = stats_of(f, y, Y=plan.n_classes, R=plan.R, N=plan.N)
    with pytest.raises(AssertionError, match="u: empirical std"):
        assert_noise_std(du, dM, clean_u, clean_M2, std_u=0.7 * 2.0, std_M2=0.7 * 2 * 1.3 ** 2 / 20)


def test_release_refuses_records_outside_the_R_ball_and_a_mismatched_plan():
    plan, f, y = _small_release_case()
    gen = np.random.default_rng(0)
    bad = f.copy()
    bad[0] = on_sphere(np.ones(3), 2 * plan.R)
    with pytest.raises(moments.MomentsError, match="R-ball"):
        moments.release(bad, y, plan, generator=gen)
    with pytest.raises(moments.MomentsError, match="p = 2"):
        moments.release(f[:, :2], y, plan, generator=gen)
    with pytest.raises(moments.MomentsError, match="labels"):
        moments.release(f, y + 5, plan, generator=gen)


# --------------------------------------------------------------------------- calibration and accounting

def test_calibrated_sigma_meets_the_target_and_a_slightly_smaller_one_exceeds_it():
    rtol = 1e-2
    plan = moments.calibrate_release(target_epsilon=1.0, delta=1e-5, R=1.0, N=100, n_classes=10, p=4,
                                     settings=COARSE, rtol=rtol)
    eps = lambda s: acc.pld_epsilon(moments.moment_event(s), 1e-5, settings=COARSE)  # noqa: E731
    assert eps(plan.sigma) <= 1.0 and plan.epsilon(COARSE) <= 1.0
    assert eps(plan.sigma * (1 - 2 * rtol)) > 1.0


@pytest.mark.parametrize("target", [0.3, 2.0])
def test_calibration_agrees_with_the_gdp_closed_form_and_dp_accountings_own_pld(target):
    rtol, delta = 1e-3, 1e-5
    sigma = moments.calibrate_noise_multiplier(target_epsilon=target, delta=delta, settings=COARSE, rtol=rtol)
    # two Gaussians of multiplier sigma = one of sigma / sqrt(2): mu = sqrt(2) / sigma
    sigma_gdp = moments.gdp_noise_multiplier(target_epsilon=target, delta=delta)
    assert acc.gdp_epsilon(delta, math.sqrt(2) / sigma_gdp) == pytest.approx(target, rel=1e-9)
    assert sigma_gdp <= sigma <= sigma_gdp * (1 + rtol) ** 2
    event = moments.moment_event(sigma)
    eps_pld = acc.pld_epsilon(event, delta, settings=COARSE)
    eps_gdp = acc.gdp_epsilon(delta, math.sqrt(2) / sigma)
    # pessimistic PLD is a certified bound (never below the exact value) within h of it
    assert eps_gdp - 1e-9 <= eps_pld <= eps_gdp + COARSE.value_discretization_interval
    lib = pld_privacy_accountant.PLDAccountant(value_discretization_interval=COARSE.value_discretization_interval)
    lib.compose(event)
    assert eps_pld == pytest.approx(lib.get_epsilon(delta), rel=1e-6)


def test_the_event_is_two_gaussians_of_the_same_multiplier():
    plan = moments.MomentReleasePlan(sigma=1.7, R=2.0, N=50, n_classes=10, p=8, delta=1e-5)
    event = plan.event()
    assert isinstance(event, dp_event.ComposedDpEvent)
    assert [e.noise_multiplier for e in event.events] == [1.7, 1.7]
    assert acc.gdp_mu_of_event(event) == pytest.approx(math.sqrt(2) / 1.7)
    assert plan.std_M2 / plan.sensitivity_M2 == pytest.approx(plan.std_u / moments.DELTA_U)


@pytest.mark.parametrize("bad, match", [(dict(sigma=0.0), "sigma"), (dict(R=-1.0), "R"), (dict(N=0), "N"),
                                        (dict(n_classes=0), "n_classes"), (dict(p=1.5), "p"),
                                        (dict(delta=1.0), "delta")])
def test_bad_plans_are_one_line_errors(bad, match):
    kw = dict(sigma=1.0, R=1.0, N=10, n_classes=3, p=2, delta=1e-5)
    kw.update(bad)
    with pytest.raises(moments.MomentsError, match=match):
        moments.MomentReleasePlan(**kw)


# --------------------------------------------------------------------------- public geometry

def test_public_geometry_is_pca_of_the_centred_public_data_with_a_quantile_clip():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((300, 5)) * np.array([5.0, 3.0, 1.0, 0.5, 0.1]) + 2.0
    g = moments.fit_public_geometry(z, p=2, clip_quantile=0.9)
    np.testing.assert_allclose(g.basis @ g.basis.T, np.eye(2), atol=1e-12)
    assert abs(g.basis[0, 0]) > 0.99 and abs(g.basis[1, 1]) > 0.99  # the two largest-variance axes
    np.testing.assert_allclose(g.mean, z.mean(0))
    norms = np.linalg.norm((z - g.mean) @ g.basis.T, axis=1)
    assert g.R == pytest.approx(np.quantile(norms, 0.9))
    f = g.features(z)
    assert f.shape == (300, 2) and np.linalg.norm(f, axis=1).max() <= g.R * (1 + 1e-12)
    inside = norms <= g.R
    np.testing.assert_allclose(f[inside], ((z - g.mean) @ g.basis.T)[inside])
    again = moments.fit_public_geometry(z.copy(), p=2, clip_quantile=0.9)
    np.testing.assert_array_equal(again.basis, g.basis)


@pytest.mark.parametrize("kw, match", [(dict(p=6), r"min\(n, d\)"), (dict(p=0), "p"),
                                       (dict(p=2, clip_quantile=0.0), "clip_quantile")])
def test_bad_geometry_requests_are_one_line_errors(kw, match):
    with pytest.raises(moments.MomentsError, match=match):
        moments.fit_public_geometry(np.random.default_rng(0).standard_normal((10, 5)), **kw)


# --------------------------------------------------------------------------- post-processing

def _mixture(n=600, d=4, Y=3, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((Y, d)) * 3
    A = rng.standard_normal((d, d)) * 0.5
    y = rng.integers(0, Y, n)
    z = centres[y] + rng.standard_normal((n, d)) @ A.T
    return z, y


def _wide_geometry(z, p):
    """PCA of the data with R large enough that no record is clipped (so the empirical moments are exact)."""
    g = moments.fit_public_geometry(z, p=p, clip_quantile=1.0)
    return moments.PublicGeometry(mean=g.mean, basis=g.basis, R=g.R * 1.01)


def test_with_negligible_noise_the_model_recovers_empirical_class_means_and_pooled_covariance():
    z, y = _mixture()
    n, d = z.shape
    g = _wide_geometry(z, p=d)
    plan = moments.MomentReleasePlan(sigma=1e-10, R=g.R, N=n, n_classes=3, p=d, delta=1e-5)
    noisy = moments.release(g.features(z), y, plan, generator=np.random.default_rng(0))
    model = moments.moment_model(noisy, g, rank=d, floor=1e-6, min_count=1)
    means = np.stack([z[y == k].mean(0) for k in range(3)])
    resid = z - means[y]
    np.testing.assert_allclose(model.mu, means, atol=1e-6)
    np.testing.assert_allclose(model.pi, np.bincount(y) / n, atol=1e-9)
    np.testing.assert_allclose(model.covariance(), resid.T @ resid / n, atol=1e-6)
    assert not model.fell_back.any()


def test_a_low_rank_basis_recovers_the_projected_means_and_the_top_eigenpairs():
    z, y = _mixture(d=5)
    g = _wide_geometry(z, p=3)
    plan = moments.MomentReleasePlan(sigma=1e-10, R=g.R, N=len(z), n_classes=3, p=3, delta=1e-5)
    model = moments.moment_model(moments.release(g.features(z), y, plan, generator=np.random.default_rng(0)),
                                 g, rank=2, floor=1e-3)
    P = g.basis
    means = np.stack([z[y == k].mean(0) for k in range(3)])
    np.testing.assert_allclose(model.mu, g.mean + (means - g.mean) @ P.T @ P, atol=1e-6)
    f = (z - g.mean) @ P.T
    fm = np.stack([f[y == k].mean(0) for k in range(3)])
    C = (f - fm[y]).T @ (f - fm[y]) / len(z)
    top = np.sort(np.linalg.eigvalsh(C))[::-1][:2]
    np.testing.assert_allclose(model.eigvals, top, rtol=1e-6)
    np.testing.assert_allclose(model.eigvecs.T @ model.eigvecs, np.eye(2), atol=1e-12)
    cov_eigs = np.sort(np.linalg.eigvalsh(model.covariance()))[::-1]
    np.testing.assert_allclose(cov_eigs, [*top, 1e-3, 1e-3, 1e-3], rtol=1e-6)


def _geometry(p=2, d=3, R=2.0):
    return moments.PublicGeometry(mean=np.arange(d, dtype=float), basis=np.eye(d)[:p], R=R)


def test_counts_are_clamped_at_1_and_small_classes_fall_back_to_the_global_mean():
    g = _geometry()
    # class 0 noisy count -5, class 1: 0.3, class 2: 50; whitened sums S / (2R)
    u = np.array([-5.0, 0.25, 0.0, 0.3, 0.0, 0.5, 50.0, 10.0, 5.0])
    M2 = np.eye(2) * 10
    # min_count below every noisy count: clamping only (a count of -5 still becomes 1)
    model = moments.moment_model(moments.NoisyMoments(u=u, M2=M2), g, rank=2, floor=1e-3, min_count=-10.0)
    np.testing.assert_allclose(model.pi, np.array([1, 1, 50]) / 52)
    np.testing.assert_allclose(model.mu[:, :2] - g.mean[:2], [[1.0, 0.0], [0.0, 2.0], [0.8, 0.4]])
    np.testing.assert_allclose(model.mu[:, 2], g.mean[2])  # no offset outside the basis
    assert not model.fell_back.any()
    fb = moments.moment_model(moments.NoisyMoments(u=u, M2=M2), g, rank=2, floor=1e-3, min_count=10)
    np.testing.assert_array_equal(fb.fell_back, [True, True, False])
    glob = np.array([1.0 + 0.0 + 40.0, 0.0 + 2.0 + 20.0]) / 52  # sum of 2R S~ over sum of clamped counts
    np.testing.assert_allclose(fb.mu[:2, :2] - g.mean[:2], [glob, glob])
    np.testing.assert_allclose(fb.mu[2, :2] - g.mean[:2], [0.8, 0.4])


def test_the_noisy_second_moment_is_symmetrised_psd_projected_and_floored():
    g = _geometry(p=3, d=4)
    u = np.array([10.0, 0, 0, 0, 10.0, 0, 0, 0])  # two classes, zero means
    sym = np.diag([4.0, -1.0, 1e-4])
    skew = np.array([[0, 1.0, 2.0], [-1.0, 0, 3.0], [-2.0, -3.0, 0]])
    a = moments.moment_model(moments.NoisyMoments(u=u, M2=sym + skew), g, rank=3, floor=1e-2)
    b = moments.moment_model(moments.NoisyMoments(u=u, M2=sym), g, rank=3, floor=1e-2)
    np.testing.assert_allclose(a.eigvals, b.eigvals)
    np.testing.assert_allclose(a.covariance(), b.covariance())
    # eigenvalue -1 clipped to 0 then floored; 1e-4 floored; 4 kept
    np.testing.assert_allclose(a.eigvals, [4.0, 1e-2, 1e-2])
    assert np.linalg.eigvalsh(a.covariance()).min() >= 1e-2 * (1 - 1e-9)
    neg = moments.moment_model(moments.NoisyMoments(u=u, M2=-np.eye(3)), g, rank=2, floor=0.5)
    np.testing.assert_allclose(neg.eigvals, [0.5, 0.5])
    np.testing.assert_allclose(neg.covariance(), 0.5 * np.eye(4), atol=1e-12)


@pytest.mark.parametrize("kw, match", [(dict(rank=4, floor=1.0), "rank"), (dict(rank=0, floor=1.0), "rank"),
                                       (dict(rank=2, floor=0.0), "floor")])
def test_bad_post_processing_requests_are_one_line_errors(kw, match):
    noisy = moments.NoisyMoments(u=np.ones(6), M2=np.eye(2))
    with pytest.raises(moments.MomentsError, match=match):
        moments.moment_model(noisy, _geometry(), **kw)


def test_a_release_for_another_p_than_the_geometry_is_refused():
    with pytest.raises(moments.MomentsError, match="p = 3"):
        moments.moment_model(moments.NoisyMoments(u=np.ones(8), M2=np.eye(3)), _geometry(p=2), rank=1, floor=1.0)


def test_samples_of_the_release_have_its_mean_and_covariance():
    g = _geometry(p=2, d=4)
    u = np.array([30.0, 3.0, -1.0, 20.0, 0.0, 2.0])
    model = moments.moment_model(moments.NoisyMoments(u=u, M2=np.array([[5.0, 1.0], [1.0, 3.0]])), g, rank=1,
                                 floor=0.2)
    x = model.sample(0, 40_000, np.random.default_rng(0))
    assert x.shape == (40_000, 4)
    cov = model.covariance()
    se = np.sqrt(np.diag(cov) / len(x))
    assert np.all(np.abs(x.mean(0) - model.mu[0]) < 5 * se)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.05 * np.abs(cov).max())
    with pytest.raises(moments.MomentsError, match="class y"):
        model.sample(2, 1, np.random.default_rng(0))


def test_save_load_round_trip_and_one_line_errors(tmp_path):
    g = _geometry(p=2, d=3)
    model = moments.moment_model(moments.NoisyMoments(u=np.array([5.0, 1, 0, 0.1, 0, 1]), M2=np.eye(2)), g,
                                 rank=2, floor=0.1, min_count=1.0)
    path = tmp_path / "out" / "moments.npz"
    model.save(path)
    back = moments.ReleasedMoments.load(path)
    for name in ("pi", "mu", "eigvecs", "eigvals", "fell_back"):
        np.testing.assert_array_equal(getattr(back, name), getattr(model, name))
    assert back.floor == model.floor
    assert [p.name for p in path.parent.iterdir()] == ["moments.npz"]  # no temporary left behind
    with pytest.raises(DataNotFoundError, match="not found"):
        moments.ReleasedMoments.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", images=np.zeros(3))
    with pytest.raises(CorruptFileError, match="format"):
        moments.ReleasedMoments.load(tmp_path / "other.npz")
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptFileError, match="cut.npz"):
        moments.ReleasedMoments.load(tmp_path / "cut.npz")


# --------------------------------------------------------------------------- ledger and replay

def _entry(**kw):
    plan = moments.MomentReleasePlan(sigma=kw.pop("sigma", 2.5), R=1.2, N=500, n_classes=10, p=8, delta=1e-5)
    return plan, moments.ledger_entry(plan, stage="release_moments", config_id="c", seed=0, settings=COARSE)


def test_the_ledger_line_validates_and_records_both_mechanisms():
    plan, entry = _entry()
    entry.validate()
    assert entry.mechanism == "moment_release" and entry.count == 1 and entry.sampling == {"scheme": "none"}
    assert entry.sensitivity == 2.0 and entry.noise_std == plan.std_u and entry.noise_multiplier == plan.sigma
    assert entry.extra["std_M2"] == pytest.approx(2.5 * 2 * 1.2 ** 2 / 500)
    assert entry.extra["sensitivity_M2"] == pytest.approx(2 * 1.2 ** 2 / 500)
    assert entry.claimed_epsilon == plan.epsilon(COARSE)
    assert entry.accountant == {"name": "pld_pessimistic", **acc.describe(COARSE)}
    assert not rebuild.mismatches(entry, rebuild.rebuild(entry))


def test_the_ledger_line_replays(tmp_path):
    plan, entry = _entry()
    path = tmp_path / "ledger" / "release_moments.jsonl"
    ledger.append_entry(path, entry)
    results, summaries = audit({"release_moments": path}, {"release_moments": 1})
    assert summaries[0]["ok"] and results[0]["event_rebuilt"]
    assert results[0]["recomputed_epsilon"] == pytest.approx(entry.claimed_epsilon, rel=1e-6)


def _tampered(tmp_path, edit):
    _, entry = _entry()
    line = json.loads(entry.to_json())
    edit(line)
    path = tmp_path / "ledger" / "release_moments.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(line) + "\n")
    return path


def _halve_one_gaussian(line):
    line["event"]["events"][1]["noise_multiplier"] /= 2


def _halve_both_gaussians(line):
    for e in line["event"]["events"]:
        e["noise_multiplier"] /= 2


def _change_R(line):
    line["extra"]["R"] *= 0.5


def _change_N(line):
    line["extra"]["N"] *= 4


@pytest.mark.parametrize("edit, match", [(_halve_one_gaussian, "event"), (_halve_both_gaussians, "noise_multiplier"),
                                         (_change_R, "std_M2"), (_change_N, "std_M2")])
def test_a_tampered_line_fails_the_replay(tmp_path, edit, match):
    path = _tampered(tmp_path, edit)
    with pytest.raises(ReplayError, match=match):
        audit({"release_moments": path}, {"release_moments": 1})


def test_a_line_without_its_parameters_cannot_be_rebuilt(tmp_path):
    path = _tampered(tmp_path, lambda line: line["extra"].pop("moment_noise_multiplier"))
    with pytest.raises(ReplayError, match="lacks parameter extra.moment_noise_multiplier"):
        audit({"release_moments": path}, {"release_moments": 1})

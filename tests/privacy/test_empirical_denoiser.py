"""The clipped empirical denoiser (EMPDEN eq. 4-6, 38) and the Gaussian mechanism of one step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax
from scipy.stats import multivariate_normal

from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.schedule import EDMSchedule, step_mu


def denoise(x_t, data, t, *, C, beta, subset=None, method="auto", public=None):
    """E_hat; with ``public`` records, normalised by Z = p_hat_pub(x_t) over them (the public marginal)."""
    prep = emp.prepare_records(torch.as_tensor(data, dtype=torch.float64))
    x_t = torch.as_tensor(x_t, dtype=torch.float64)
    log_z = None
    if public is not None:
        log_z = emp.log_public_marginal(x_t, emp.prepare_records(torch.as_tensor(public, dtype=torch.float64)), t)
    return emp.clipped_empirical_denoiser(x_t, prep, t, C=C, beta=beta, subset=subset, method=method,
                                          log_normaliser=log_z).numpy()


def reference(x_t: np.ndarray, data: np.ndarray, t: float, *, C: float, beta: float) -> np.ndarray:
    """Independent float64 reference: direct differences, log-density, clip, plain exp (no max shift)."""
    d = data.shape[1]
    sq = ((x_t[:, None, :] - data[None, :, :]) ** 2).sum(-1)
    log_p = -sq / (2 * t**2) - 0.5 * d * np.log(2 * np.pi * t**2)
    norm = np.linalg.norm(data, axis=1)
    clipped_norm = np.exp(np.minimum(log_p + np.log(norm)[None, :], np.log(C)))  # ||vbar|| <= C: no overflow
    return clipped_norm @ (data / norm[:, None]) / (beta * len(data))


# --------------------------------------------------------------------------- sensitivity

def _neighbour_changes(rng, n, d, C, beta, t, n_xt, *, adversarial: bool, public=None):
    """Max ||E_hat(D) - E_hat(D')|| over x_t for replace-one and remove-one neighbours of a random D.

    ``public``: records of a public-marginal normaliser, the same for D and D' (it is public).
    """
    if adversarial:
        # one record a against n-1 copies of -a, seen from x_t = 0 where (t = 0.02, ||a|| = 0.02)
        # p ||a|| ~ 100 >> C, so every v is clipped: the extreme case of both neighbour relations.
        a = rng.normal(size=d)
        a *= 0.02 / np.linalg.norm(a)
        data = np.vstack([a, np.repeat(-a[None], n - 1, axis=0)])
        x_t = np.zeros((1, d))
    else:
        data = rng.uniform(-1, 1, size=(n, d))
        x_t = np.vstack([data[rng.integers(n, size=n_xt // 2)] + t * rng.normal(size=(n_xt // 2, d)),
                         t * rng.normal(size=(n_xt - n_xt // 2, d))])
    replaced = data.copy()
    replaced[0] = -data[0] if adversarial else rng.uniform(-1, 1, size=d)
    base = denoise(x_t, data, t, C=C, beta=beta, public=public)
    change_replace = np.linalg.norm(base - denoise(x_t, replaced, t, C=C, beta=beta, public=public), axis=1).max()
    change_remove = np.linalg.norm(base - denoise(x_t, data[1:], t, C=C, beta=beta, public=public), axis=1).max()
    return change_replace, change_remove


@pytest.mark.parametrize("C,beta", [(1.0, 1.0), (0.05, 1.0), (3.0, 0.5)])
def test_clipped_average_sensitivity_is_at_most_2C_over_beta_S_and_attained(C, beta):
    """Brute force over random datasets and many x_t: ||E_hat(D) - E_hat(D')|| <= 2C/(beta |S|).

    |S| is the larger of the two datasets (n). The adversarial dataset attains the bound, so a
    halved sensitivity would make this test fail; so would removing the clip (next test).
    """
    rng = np.random.default_rng(0)
    n, d = 6, 3
    bound = emp.sensitivity(C=C, beta=beta, subset_size=n)
    for trial in range(12):
        t = float(np.exp(rng.uniform(np.log(0.05), np.log(5.0))))
        changes = _neighbour_changes(rng, n, d, C, beta, t, 40, adversarial=False)
        assert max(changes) <= bound * (1 + 1e-9), f"trial {trial}: change {max(changes)} > bound {bound}"
    changes = _neighbour_changes(rng, n, d, C, beta, 0.02, 1, adversarial=True)
    assert max(changes) <= bound * (1 + 1e-9)
    assert min(changes) >= 0.999 * bound, "the bound 2C/(beta|S|) is attained by both neighbour relations"


def test_without_clipping_the_change_exceeds_the_bound():
    """The clip is what bounds the sensitivity: with C -> infinity the same neighbours move E_hat far more."""
    rng = np.random.default_rng(1)
    n, d, C = 6, 3, 1.0
    unclipped = _neighbour_changes(rng, n, d, 1e300, 1.0, 0.02, 1, adversarial=True)
    assert min(unclipped) > 10 * emp.sensitivity(C=C, beta=1.0, subset_size=n)


@pytest.mark.parametrize("method", ["mask", "gather"])
def test_subsampled_sensitivity_is_2C_over_beta_B(method):
    rng = np.random.default_rng(2)
    n, d, B, C = 10, 3, 4, 0.5
    data = rng.uniform(-1, 1, size=(n, d))
    x_t = data[rng.integers(n, size=30)] + 0.2 * rng.normal(size=(30, d))
    subset = emp.draw_subsets(n, B, 30, generator=torch.Generator().manual_seed(0))
    replaced = data.copy()
    worst = 0.0
    for r in range(n):
        replaced[r] = rng.uniform(-1, 1, size=d)
        change = denoise(x_t, data, 0.2, C=C, beta=1.0, subset=subset, method=method) - \
            denoise(x_t, replaced, 0.2, C=C, beta=1.0, subset=subset, method=method)
        worst = max(worst, np.linalg.norm(change, axis=1).max())
        replaced[r] = data[r]
    bound = emp.sensitivity(C=C, beta=1.0, subset_size=B)
    assert worst <= bound * (1 + 1e-9)

    # attained: record a against copies of -a, all clipped at x_t = 0 (as in the full-batch test)
    a = np.full(d, 0.02 / np.sqrt(d))
    data = np.vstack([a, np.repeat(-a[None], n - 1, axis=0)])
    flipped = np.vstack([-a, data[1:]])
    subset = torch.tensor([[0, 3, 5, 7], [1, 2, 4, 6]])
    change = denoise(np.zeros((2, d)), data, 0.02, C=C, beta=1.0, subset=subset, method=method) - \
        denoise(np.zeros((2, d)), flipped, 0.02, C=C, beta=1.0, subset=subset, method=method)
    norms = np.linalg.norm(change, axis=1)
    assert norms[0] == pytest.approx(bound, rel=1e-9), "an output whose subset holds the record moves by 2C/(beta B)"
    assert norms[1] == 0.0, "an output whose subset misses the record does not move"


@pytest.mark.parametrize("C,beta", [(1.0, 1.0), (0.05, 1.0), (3.0, 0.5)])
def test_a_public_normaliser_keeps_the_sensitivity_at_2C_over_beta_S(C, beta):
    """v = x0 p(x_t|x0) / Z(x_t) with Z from public records only: still ||E_hat(D) - E_hat(D')|| <= 2C/(beta|S|).

    Z is the same for D and D' (it reads no private record), and the clip still bounds every
    term, so replace-one and remove-one change E_hat by at most 2C/(beta n); the bound is still
    attained (public records far from x_t = 0 make Z tiny, so every term is clipped).
    """
    rng = np.random.default_rng(10)
    n, d = 6, 3
    public = rng.uniform(-1, 1, size=(5, d))
    bound = emp.sensitivity(C=C, beta=beta, subset_size=n)
    for trial in range(12):
        t = float(np.exp(rng.uniform(np.log(0.05), np.log(5.0))))
        changes = _neighbour_changes(rng, n, d, C, beta, t, 40, adversarial=False, public=public)
        assert max(changes) <= bound * (1 + 1e-9), f"trial {trial}: change {max(changes)} > bound {bound}"
    far = 3.0 + rng.uniform(size=(5, d))
    changes = _neighbour_changes(rng, n, d, C, beta, 0.02, 1, adversarial=True, public=far)
    assert max(changes) <= bound * (1 + 1e-9)
    assert min(changes) >= 0.999 * bound, "the bound 2C/(beta|S|) is attained by both neighbour relations"


@pytest.mark.parametrize("method", ["mask", "gather"])
def test_a_public_normaliser_keeps_the_subsampled_sensitivity_at_2C_over_beta_B(method):
    rng = np.random.default_rng(11)
    n, d, B, C, t = 10, 3, 4, 0.5, 0.2
    data = rng.uniform(-1, 1, size=(n, d))
    public = rng.uniform(-1, 1, size=(7, d))
    x_t = data[rng.integers(n, size=30)] + t * rng.normal(size=(30, d))
    subset = emp.draw_subsets(n, B, 30, generator=torch.Generator().manual_seed(0))
    base = denoise(x_t, data, t, C=C, beta=1.0, subset=subset, method=method, public=public)
    bound = emp.sensitivity(C=C, beta=1.0, subset_size=B)
    for r in range(n):
        replaced = data.copy()
        replaced[r] = rng.uniform(-1, 1, size=d)
        change = base - denoise(x_t, replaced, t, C=C, beta=1.0, subset=subset, method=method, public=public)
        assert np.linalg.norm(change, axis=1).max() <= bound * (1 + 1e-9), f"record {r}"


# --------------------------------------------------------------------------- the formula

@pytest.mark.parametrize("t", [0.3, 1.0, 5.0])
def test_unclipped_full_batch_is_the_empirical_marginal_times_the_posterior_mean(t):
    """C -> infinity: E_hat = (p_hat_t(x_t) / beta) * E[x0 | x_t] (EMPDEN eq. 37-38), scipy densities."""
    rng = np.random.default_rng(3)
    n, d, beta = 20, 5, 1.0
    data = rng.uniform(-1, 1, size=(n, d))
    x_t = data[:4] + t * rng.normal(size=(4, d))
    log_p = np.stack([multivariate_normal(mean=x0, cov=t**2).logpdf(x_t) for x0 in data], axis=1)  # [4, n]
    posterior_mean = softmax(log_p, axis=1) @ data
    log_marginal = logsumexp(log_p, axis=1) - np.log(n)
    got = denoise(x_t, data, t, C=1e300, beta=beta)
    np.testing.assert_allclose(got, np.exp(log_marginal)[:, None] / beta * posterior_mean, rtol=1e-9, atol=0)
    prep = emp.prepare_records(torch.as_tensor(data))
    np.testing.assert_allclose(emp.empirical_posterior_mean(torch.as_tensor(x_t), prep, t).numpy(),
                               posterior_mean, rtol=1e-9, atol=1e-12)


def test_log_public_marginal_is_the_log_mixture_density_of_the_public_records():
    """log p_hat_pub(x_t) = log (1/m) sum_j N(x_t; y_j, t^2 I), against scipy's densities."""
    rng = np.random.default_rng(12)
    public = rng.uniform(-1, 1, size=(9, 4))
    x_t = rng.normal(size=(5, 4))
    for t in (0.1, 1.0, 30.0):
        log_p = np.stack([multivariate_normal(mean=y, cov=t**2).logpdf(x_t) for y in public], axis=1)
        got = emp.log_public_marginal(torch.as_tensor(x_t), emp.prepare_records(torch.as_tensor(public)), t).numpy()
        np.testing.assert_allclose(got, logsumexp(log_p, axis=1) - np.log(len(public)), rtol=1e-10, err_msg=f"t={t}")


@pytest.mark.parametrize("t", [0.05, 0.3, 1.0, 5.0])
def test_normalised_by_the_marginal_of_the_same_set_unclipped_E_hat_is_the_posterior_mean(t):
    """Z = p_hat_t(x_t) of the private set itself, C -> infinity, beta = 1: E_hat = E[x0 | x_t] (eq. 37).

    The public-marginal normaliser is eq. 37's normaliser estimated on other records; on the same
    records it is eq. 37 exactly. Reference: scipy's softmax of the log densities.
    """
    rng = np.random.default_rng(13)
    n, d = 20, 5
    data = rng.uniform(-1, 1, size=(n, d))
    x_t = np.vstack([data[:3] + t * rng.normal(size=(3, d)), t * rng.normal(size=(3, d))])
    log_p = np.stack([multivariate_normal(mean=x0, cov=t**2).logpdf(x_t) for x0 in data], axis=1)
    posterior_mean = softmax(log_p, axis=1) @ data
    for method, subset in (("mask", None), ("gather", torch.arange(n).repeat(len(x_t), 1))):
        got = denoise(x_t, data, t, C=1e300, beta=1.0, public=data, subset=subset, method=method)
        np.testing.assert_allclose(got, posterior_mean, rtol=1e-8, atol=1e-12, err_msg=method)
    prep = emp.prepare_records(torch.as_tensor(data))
    np.testing.assert_allclose(emp.empirical_posterior_mean(torch.as_tensor(x_t), prep, t).numpy(), posterior_mean,
                               rtol=1e-9, atol=1e-12)


def test_at_d_256_only_the_public_normaliser_gives_a_nonzero_E_hat_over_the_edm_grid():
    """16x16 images: the literal eq. 38 (Z = 1) rounds E_hat to 0 at mid and high noise; Z = p_hat_pub does not.

    States are private records plus t-noise (x_t ~ p_t of the private set); private and public
    records are independent draws of the same law. (Far from every private record, e.g. pure
    noise at small t, E_hat ~ 0 is right: there p_hat_priv / p_hat_pub is itself ~ 0.)
    """
    from pipeline.privacy.schedule import EDMSchedule

    rng = np.random.default_rng(14)
    d, C = 256, 1.0
    private = emp.prepare_records(torch.as_tensor(rng.uniform(-1, 1, size=(30, d))))
    public = emp.prepare_records(torch.as_tensor(rng.uniform(-1, 1, size=(50, d))))
    for t in map(float, EDMSchedule(N=39).times()[:-1]):
        x_t = private.x0[:6] + t * torch.as_tensor(rng.normal(size=(6, d)))
        log_z = emp.log_public_marginal(x_t, public, t)
        normalised = emp.clipped_empirical_denoiser(x_t, private, t, C=C, beta=1.0, log_normaliser=log_z)
        norms = normalised.norm(dim=1)
        # not merely > 0: a sizeable share of C at every noise level
        assert (norms > 1e-3 * C).all(), f"t={t}: {norms}"
        if t >= 1.0:
            literal = emp.clipped_empirical_denoiser(x_t, private, t, C=C, beta=1.0)
            assert literal.norm(dim=1).max() < 1e-100, f"t={t}: eq. 38 literally is not inert here"


def test_log_space_computation_is_finite_and_exact_at_64x64_over_the_whole_edm_range():
    """d = 3*64*64, t in [0.002, 80]: the kernel spans e^{+-65000}, yet E_hat is finite and correct.

    E_hat itself is compared with a plain float64 reference (exact where that is finite; it is 0
    beyond the clip/underflow crossover t ~ 0.25); the log-scaled sum is compared, coordinate by
    coordinate, with scipy's signed logsumexp at every t, including where exp would underflow.
    """
    rng = np.random.default_rng(4)
    n, d, C, beta = 8, 3 * 64 * 64, 1.0, 1.0
    data = rng.uniform(-1, 1, size=(n, d))
    prep = emp.prepare_records(torch.as_tensor(data))
    coords = rng.choice(d, size=20, replace=False)
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    for t in [0.002, 0.01, 0.1, 0.2, 0.24, 0.26, 0.3, 1.0, 10.0, 80.0]:
        x_t = np.vstack([data[:2] + t * rng.normal(size=(2, d)), t * rng.normal(size=(2, d))])
        got = emp.clipped_empirical_denoiser(torch.as_tensor(x_t), prep, t, C=C, beta=beta).numpy()
        assert np.isfinite(got).all(), f"t={t}: non-finite E_hat"
        np.testing.assert_allclose(got, reference(x_t, data, t, C=C, beta=beta), rtol=1e-6, atol=1e-12 * C / beta,
                                   err_msg=f"t={t}")

        log_scale, direction = emp.clipped_sum_log_scaled(torch.as_tensor(x_t), prep, t, C=C)
        log_scale, direction = log_scale.numpy(), direction.numpy()
        assert np.isfinite(log_scale).all() and np.isfinite(direction).all(), f"t={t}"
        sq = ((x_t[:, None, :] - data[None, :, :]) ** 2).sum(-1)
        log_norm = np.minimum(-sq / (2 * t**2) - 0.5 * d * np.log(2 * np.pi * t**2)
                              + np.log(np.linalg.norm(data, axis=1))[None, :], np.log(C))
        for j in range(len(x_t)):
            value, sign = logsumexp(log_norm[j][:, None], b=unit[:, coords], axis=0, return_sign=True)
            np.testing.assert_allclose(direction[j, coords], sign * np.exp(value - log_scale[j]),
                                       rtol=1e-6, atol=1e-12, err_msg=f"t={t}, output {j}")


@pytest.mark.parametrize("method", ["mask", "gather", "auto"])
def test_subset_restricts_the_average_to_each_outputs_own_records(method, monkeypatch):
    """Both ways of applying a subset (mask all n records, gather the B) give E_hat over S_j, |S| = B."""
    monkeypatch.setattr(emp, "GATHER_BLOCK_ELEMENTS", 3 * 5 * 4)  # several gather blocks of 3 outputs
    rng = np.random.default_rng(5)
    n, d, B = 12, 4, 5
    data = rng.uniform(-1, 1, size=(n, d))
    x_t = rng.normal(size=(7, d)) * 0.5
    subset = emp.draw_subsets(n, B, 7, generator=torch.Generator().manual_seed(1))
    got = denoise(x_t, data, 0.5, C=0.3, beta=2.0, subset=subset, method=method)
    for j in range(7):
        alone = denoise(x_t[j:j + 1], data[subset[j].numpy()], 0.5, C=0.3, beta=2.0)
        np.testing.assert_allclose(got[j], alone[0], rtol=1e-12, atol=1e-15)


def test_draw_subsets_gives_distinct_uniform_subsets():
    n, B, n_out = 20, 5, 4000
    subset = emp.draw_subsets(n, B, n_out, generator=torch.Generator().manual_seed(2))
    assert subset.shape == (n_out, B)
    assert all(len(set(row.tolist())) == B for row in subset)
    freq = torch.bincount(subset.flatten(), minlength=n).double() / n_out
    # inclusion probability B/n = 0.25; binomial std sqrt(.25 * .75 / 4000) ~ 0.007
    assert (freq - B / n).abs().max() < 0.035
    with pytest.raises(ValueError, match="subsample size B"):
        emp.draw_subsets(n, n + 1, 1)


# --------------------------------------------------------------------------- the mechanism

def test_step_noise_is_exactly_the_noise_mu_t_claims():
    """Residual of a private step, x' - (1 - 2dt/t) x - (2dt/t) E_hat, has the std that gives mu_t (eq. 6, 39).

    Implied mu = sensitivity * (2dt/t) / std(residual) must equal schedule.step_mu; a sampler
    with the noise switched off or shrunk fails here.
    """
    rng = np.random.default_rng(6)
    n, d, C, beta = 10, 20000, 1.0, 1.0
    data = torch.as_tensor(rng.uniform(-1, 1, size=(n, d)))
    prep = emp.prepare_records(data)
    schedule = EDMSchedule(N=12)
    times = schedule.times()
    mu_t = step_mu(schedule, C=C, beta=beta, batch_size=n)
    gen = torch.Generator().manual_seed(3)
    for i in (0, 5, 10):
        t, t_next = float(times[i]), float(times[i + 1])
        x = data[:1] + t * torch.randn((1, d), generator=gen, dtype=torch.float64)
        x_next = emp.private_step(x, prep, t, t_next, C=C, beta=beta, generator=gen)
        dt = t - t_next
        e_hat = emp.clipped_empirical_denoiser(x, prep, t, C=C, beta=beta)
        residual = x_next - (1 - 2 * dt / t) * x - (2 * dt / t) * e_hat
        implied_mu = emp.sensitivity(C=C, beta=beta, subset_size=n) * (2 * dt / t) / residual.std().item()
        # std of a 20000-sample std estimate is ~0.5%
        assert implied_mu == pytest.approx(mu_t[i], rel=0.03), f"step {i}"
        assert emp.mechanism_noise_std(t, t_next) == pytest.approx(
            emp.sensitivity(C=C, beta=beta, subset_size=n) / mu_t[i], rel=1e-12)


def test_bad_parameters_raise_one_line_errors():
    prep = emp.prepare_records(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="clip norm C"):
        emp.clipped_empirical_denoiser(torch.zeros(1, 2, dtype=torch.float64), prep, 1.0, C=0.0, beta=1.0)
    with pytest.raises(ValueError, match="beta"):
        emp.clipped_empirical_denoiser(torch.zeros(1, 2, dtype=torch.float64), prep, 1.0, C=1.0, beta=0.0)
    with pytest.raises(ValueError, match="shape"):
        emp.clipped_empirical_denoiser(torch.zeros(1, 3, dtype=torch.float64), prep, 1.0, C=1.0, beta=1.0)
    with pytest.raises(ValueError, match="t must be > 0"):
        emp.clipped_empirical_denoiser(torch.zeros(1, 2, dtype=torch.float64), prep, 0.0, C=1.0, beta=1.0)
    with pytest.raises(ValueError, match="log_normaliser must have shape"):
        emp.clipped_empirical_denoiser(torch.zeros(2, 2, dtype=torch.float64), prep, 1.0, C=1.0, beta=1.0,
                                       log_normaliser=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-finite"):
        emp.clipped_empirical_denoiser(torch.zeros(1, 2, dtype=torch.float64), prep, 1.0, C=1.0, beta=1.0,
                                       log_normaliser=torch.full((1,), float("-inf"), dtype=torch.float64))


def test_all_zero_records_give_zero_not_nan():
    prep = emp.prepare_records(torch.zeros(3, 2))
    out = emp.clipped_empirical_denoiser(torch.ones(2, 2, dtype=torch.float64), prep, 0.5, C=1.0, beta=1.0)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    rng = np.random.default_rng(7)
    data = torch.as_tensor(rng.uniform(-1, 1, size=(30, 48)))
    x_t = torch.as_tensor(rng.normal(size=(5, 48)))
    subset = emp.draw_subsets(30, 7, 5, generator=torch.Generator().manual_seed(0))
    cpu = emp.clipped_empirical_denoiser(x_t, emp.prepare_records(data), 0.3, C=0.2, beta=1.0, subset=subset)
    gpu = emp.clipped_empirical_denoiser(x_t.cuda(), emp.prepare_records(data, device="cuda"), 0.3, C=0.2, beta=1.0,
                                         subset=subset.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-10, atol=1e-12)

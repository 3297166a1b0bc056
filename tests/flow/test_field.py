"""The analytic field of Prop. 3.1 against a brute-force d x d implementation, its limits, Monte Carlo; the horizon."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.flow.field import (CosineCurve, GaussianMomentModel, empirical_posterior_mean, empirical_velocity,
                                 field_cosine_curve, guided_start, knee_horizon, knee_point)
from pipeline.flow.rectified import interpolate

D64 = torch.float64


def random_model(seed: int, *, d: int = 5, r: int = 2, n_classes: int = 3, floor: float = 0.05) -> GaussianMomentModel:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=D64))
    pi = torch.rand(n_classes, generator=g, dtype=D64) + 0.2
    return GaussianMomentModel(pi=pi / pi.sum(), mu=torch.randn(n_classes, d, generator=g, dtype=D64),
                               eigvecs=q[:, :r], eigvals=0.2 + 2 * torch.rand(r, generator=g, dtype=D64), floor=floor)


# --------------------------------------------------------------------------- brute force (the only d x d code)

def dense_posterior_mean(m: GaussianMomentModel, x, t: float, mean):
    sigma = m.covariance()
    a = (1 - t) ** 2 * torch.eye(m.dim, dtype=D64) + t ** 2 * sigma
    return mean + t * torch.linalg.solve(a, (x - t * mean).T).T @ sigma.T


def dense_unconditional(m: GaussianMomentModel, x, t: float):
    sigma = m.covariance()
    a = (1 - t) ** 2 * torch.eye(m.dim, dtype=D64) + t ** 2 * sigma
    logp = torch.stack([torch.log(m.pi[k]) + torch.distributions.MultivariateNormal(t * m.mu[k], a).log_prob(x)
                        for k in range(m.n_classes)], 1)
    w = torch.softmax(logp, 1)
    per_class = torch.stack([dense_posterior_mean(m, x, t, m.mu[k].expand_as(x)) for k in range(m.n_classes)], 1)
    return (w[:, :, None] * per_class).sum(1), w


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 16), t=st.floats(0.0, 0.98), r=st.integers(0, 4))
def test_eq3_eq4_eq2_match_the_dense_formulas(seed, t, r):
    m = random_model(seed, r=r)
    g = torch.Generator().manual_seed(seed + 1)
    x, y = 2 * torch.randn(7, m.dim, generator=g, dtype=D64), torch.randint(m.n_classes, (7,), generator=g)
    cond = m.posterior_mean(x, t, y)
    assert torch.allclose(cond, dense_posterior_mean(m, x, t, m.mu[y]), atol=1e-10)
    unc, w = dense_unconditional(m, x, t)
    assert torch.allclose(m.log_responsibilities(x, t).exp(), w, atol=1e-10)
    assert torch.allclose(m.unconditional_posterior_mean(x, t), unc, atol=1e-10)
    # eq. 2, with the 1/(1 - t) cancelled analytically inside velocity()
    assert torch.allclose(m.velocity(x, t, y), (cond - x) / (1 - t), atol=1e-8)
    assert torch.allclose(m.velocity(x, t), (unc - x) / (1 - t), atol=1e-8)
    sigma = m.covariance()
    a = (1 - t) ** 2 * torch.eye(m.dim, dtype=D64) + t ** 2 * sigma
    want = torch.trace(sigma - t ** 2 * sigma @ torch.linalg.solve(a, sigma))
    assert float(m.posterior_cov_trace(t)) == pytest.approx(float(want), rel=1e-10)


def test_one_time_per_row_equals_row_by_row_scalars():
    m = random_model(3)
    g = torch.Generator().manual_seed(4)
    x, y, t = torch.randn(6, m.dim, generator=g, dtype=D64), torch.arange(6) % 3, torch.rand(6, generator=g, dtype=D64)
    rows = torch.stack([m.velocity(x[i:i + 1], float(t[i]), y[i:i + 1])[0] for i in range(6)])
    assert torch.allclose(m.velocity(x, t, y), rows, atol=1e-12)
    rows = torch.stack([m.velocity(x[i:i + 1], float(t[i]))[0] for i in range(6)])
    assert torch.allclose(m.velocity(x, t), rows, atol=1e-12)
    assert torch.allclose(m.posterior_cov_trace(t[:3]), torch.stack([m.posterior_cov_trace(float(s)) for s in t[:3]]))


def test_noise_end_limits_of_prop31():
    m = random_model(5)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(8, m.dim, generator=g, dtype=D64), torch.arange(8) % 3
    # t -> 0: the conditional field tends to mu_y - x, the unconditional one to sum_y pi_y mu_y - x
    for t, tol in ((1e-3, 2e-2), (1e-6, 2e-5)):
        assert torch.allclose(m.velocity(x, t, y), m.mu[y] - x, atol=tol)
        assert torch.allclose(m.velocity(x, t), (m.pi @ m.mu) - x, atol=tol)
    assert torch.allclose(m.velocity(x, 0.0, y), m.mu[y] - x)
    # t -> 1: the path has arrived, x_1 = z, and the velocity E[z - xi | z] is z itself; no division by zero
    assert torch.allclose(m.velocity(x, 1.0, y), x) and torch.allclose(m.velocity(x, 1.0), x)
    assert torch.allclose(m.velocity(x, 1 - 1e-9, y), x, atol=1e-6)
    assert float(m.posterior_cov_trace(0.0)) == pytest.approx(float(torch.trace(m.covariance())))
    assert float(m.posterior_cov_trace(1.0)) == 0.0


def test_monte_carlo_eq3_is_the_conditional_expectation():
    """Gaussian regression: the residual z - E[z | x_t, y] has mean 0, is uncorrelated with x_t,
    and its mean squared norm is Vbar(t) = tr Cov[z | x_t, y]."""
    m = random_model(7, d=4, r=2)
    g = torch.Generator().manual_seed(8)
    n, t = 200_000, 0.6
    y = torch.full((n,), 1)
    z = m.sample(y, g)
    assert torch.allclose(torch.cov(z.T), m.covariance(), atol=0.03)
    assert torch.allclose(z.mean(0), m.mu[1], atol=0.02)
    x = interpolate(z, torch.randn(z.shape, generator=g, dtype=D64), t)
    resid = z - m.posterior_mean(x, t, y)
    assert torch.allclose(resid.mean(0), torch.zeros(4, dtype=D64), atol=0.01)
    assert torch.allclose((resid.T @ (x - x.mean(0))) / n, torch.zeros(4, 4, dtype=D64), atol=0.01)
    assert float(resid.pow(2).sum(1).mean()) == pytest.approx(float(m.posterior_cov_trace(t)), rel=0.02)
    # detector: a field that forgets the covariance term (the t -> 0 formula) fails the orthogonality check
    wrong = z - m.mu[y]
    assert float(((wrong.T @ (x - x.mean(0))) / n).abs().max()) > 0.1


def test_monte_carlo_eq4_is_the_mixture_posterior_mean():
    m = random_model(9, d=3, r=1, n_classes=3)
    m = GaussianMomentModel(pi=m.pi, mu=2.5 * m.mu, eigvecs=m.eigvecs, eigvals=m.eigvals, floor=m.floor)
    g = torch.Generator().manual_seed(10)
    n, t = 200_000, 0.5
    y = torch.multinomial(m.pi, n, replacement=True, generator=g)
    z = m.sample(y, g)
    x = interpolate(z, torch.randn(z.shape, generator=g, dtype=D64), t)
    tests = torch.cat([x, x.pow(2), torch.ones(n, 1, dtype=D64)], 1)  # E[(z - E[z | x]) g(x)] = 0 for every g

    def worst(mean):
        return float((((z - mean).T @ tests) / n).abs().max())

    assert worst(m.unconditional_posterior_mean(x, t)) < 0.03
    # detector: the prior weights pi_y in place of the responsibilities w_y(x, t) are not the posterior mean
    prior_weighted = m._conditional_mean(x, torch.full((n, 1), t, dtype=D64), (m.pi @ m.mu).expand(n, -1))
    assert worst(prior_weighted) > 0.1


def test_guided_start_has_the_moment_models_marginal():
    m = random_model(11, d=3, r=1)
    g = torch.Generator().manual_seed(12)
    t0, n = 0.3, 100_000
    x = guided_start(m, torch.full((n,), 2), t0=t0, generator=g)
    want = t0 ** 2 * m.covariance() + (1 - t0) ** 2 * torch.eye(3, dtype=D64)
    assert torch.allclose(x.mean(0), t0 * m.mu[2], atol=0.01)
    assert torch.allclose(torch.cov(x.T), want, atol=0.02)


def test_fit_recovers_class_means_and_pooled_covariance_without_a_dense_matrix():
    truth = random_model(13, d=6, r=2, floor=0.1)
    g = torch.Generator().manual_seed(14)
    y = torch.multinomial(truth.pi, 60_000, replacement=True, generator=g)
    z = truth.sample(y, g)
    fitted = GaussianMomentModel.fit(z, y, rank=2, floor=0.1)
    assert torch.allclose(fitted.pi, truth.pi, atol=0.01)
    assert torch.allclose(fitted.mu, truth.mu, atol=0.03)
    assert torch.allclose(fitted.covariance(), truth.covariance(), atol=0.03)
    # against the dense pooled within-class covariance of the same data
    resid = z - fitted.mu[y]
    evals, evecs = torch.linalg.eigh(resid.T @ resid / len(z))
    assert torch.allclose(fitted.eigvals, evals.flip(0)[:2], rtol=1e-8)
    assert torch.allclose((fitted.eigvecs.T @ evecs[:, -2:]).abs().sum(0), torch.ones(2, dtype=D64), atol=1e-6)
    # floor: an eigenvalue below it is raised to it
    floored = GaussianMomentModel.fit(z, y, rank=4, floor=0.5)
    assert float(floored.eigvals.min()) == 0.5
    with pytest.raises(ValueError, match="every one of the 4 classes needs at least one example"):
        GaussianMomentModel.fit(z[:10], torch.zeros(10, dtype=torch.long), rank=1, floor=0.1, n_classes=4)


def test_invalid_models_are_one_line_errors():
    m = random_model(15)
    with pytest.raises(ValueError, match="orthonormal columns"):
        GaussianMomentModel(pi=m.pi, mu=m.mu, eigvecs=2 * m.eigvecs, eigvals=m.eigvals, floor=0.1)
    with pytest.raises(ValueError, match="sum to 1"):
        GaussianMomentModel(pi=2 * m.pi, mu=m.mu, eigvecs=m.eigvecs, eigvals=m.eigvals, floor=0.1)
    with pytest.raises(ValueError, match="floor lambda0 must be > 0"):
        GaussianMomentModel(pi=m.pi, mu=m.mu, eigvecs=m.eigvecs, eigvals=m.eigvals, floor=0.0)
    with pytest.raises(ValueError, match="null label is y=None"):
        m.velocity(torch.zeros(1, m.dim, dtype=D64), 0.5, torch.tensor([3]))
    with pytest.raises(ValueError, match="flatten images first"):
        m.velocity(torch.zeros(1, 1, m.dim, dtype=D64), 0.5)
    arrays = GaussianMomentModel.from_arrays(pi=m.pi.numpy(), mu=m.mu.numpy(), eigvecs=m.eigvecs.numpy(),
                                             eigvals=m.eigvals.numpy(), floor=0.05, dtype=torch.float32)
    assert arrays.mu.dtype == torch.float32 and arrays.rank == 2


# --------------------------------------------------------------------------- the empirical field

def brute_empirical(x, t, data, weights):
    out = []
    for row in x:
        logw = torch.log(weights) - ((row - t * data) ** 2).sum(1) / (2 * (1 - t) ** 2)
        out.append(torch.softmax(logw, 0) @ data)
    return torch.stack(out)


def test_empirical_posterior_mean_matches_brute_force_per_class_and_in_chunks():
    g = torch.Generator().manual_seed(16)
    data, labels = torch.randn(40, 3, generator=g, dtype=D64), torch.arange(40) % 4
    w = torch.rand(40, generator=g, dtype=D64) + 0.1
    x, y, t = torch.randn(9, 3, generator=g, dtype=D64), torch.arange(9) % 4, 0.55
    got = empirical_posterior_mean(x, t, data, w, chunk=4)
    assert torch.allclose(got, brute_empirical(x, t, data, w), atol=1e-12)
    cond = empirical_posterior_mean(x, t, data, w, labels=labels, y=y, chunk=2)
    for i in range(9):
        keep = labels == y[i]
        assert torch.allclose(cond[i], brute_empirical(x[i:i + 1], t, data[keep], w[keep])[0], atol=1e-12)
    # t = 0: x carries no information, the posterior mean is the (weighted) mean of the set
    assert torch.allclose(empirical_posterior_mean(x, 0.0, data, w), ((w / w.sum()) @ data).expand(9, 3))
    assert torch.allclose(empirical_velocity(x, t, data, w), (got - x) / (1 - t))
    with pytest.raises(ValueError, match="0 <= t < 1"):
        empirical_posterior_mean(x, 1.0, data)


def test_remark_b5_the_empirical_field_is_the_moment_field_with_one_point_per_component():
    g = torch.Generator().manual_seed(17)
    data, x, t = torch.randn(12, 4, generator=g, dtype=D64), torch.randn(5, 4, generator=g, dtype=D64), 0.4
    h = 1e-5  # Sigma = h^2 I, one component per point, pi_i = 1/m
    kernel = GaussianMomentModel(pi=torch.full((12,), 1 / 12, dtype=D64), mu=data,
                                 eigvecs=torch.zeros(4, 0, dtype=D64), eigvals=torch.zeros(0, dtype=D64), floor=h ** 2)
    assert torch.allclose(kernel.unconditional_posterior_mean(x, t), empirical_posterior_mean(x, t, data), atol=1e-6)


# --------------------------------------------------------------------------- the cosine curve and the horizon

def test_cosine_curve_on_data_from_the_model_starts_collinear_then_falls():
    m = random_model(18, d=8, r=3, n_classes=3)
    g = torch.Generator().manual_seed(19)
    y = torch.arange(300) % 3
    data = m.sample(y, g)
    fitted = GaussianMomentModel.fit(data, y, rank=3, floor=0.05)
    ts = np.array([0.0, 0.1, 0.3, 0.6, 0.9])
    curve = field_cosine_curve(fitted, data, y, ts, n_probe=60, generator=g)
    assert isinstance(curve, CosineCurve) and curve.conditional_per_class.shape == (5, 3)
    assert np.allclose(curve.conditional_worst, curve.conditional_per_class.min(1))
    # at t = 0 both fields are mean - x with the same (fitted) means: exactly collinear
    assert curve.conditional_worst[0] == pytest.approx(1.0, abs=1e-9)
    assert curve.unconditional[0] == pytest.approx(1.0, abs=1e-9)
    # toward the data end the empirical field points at the probe's own point: the moment field cannot
    assert curve.conditional_worst[-1] < 0.9 and curve.unconditional[-1] < curve.unconditional[1]


def test_knee_horizon_rules():
    ts = np.linspace(0, 0.9, 10)
    shoulder = np.array([1.0, 0.99, 0.985, 0.98, 0.8, 0.6, 0.45, 0.4, 0.38, 0.37])
    assert knee_point(ts, shoulder) == pytest.approx(0.3)
    assert knee_horizon(ts, shoulder, threshold=0.5, tau_max=1.0) == pytest.approx(0.3)  # the knee comes first
    assert knee_horizon(ts, shoulder, threshold=0.99, tau_max=1.0) == pytest.approx(0.1)  # the threshold first
    assert knee_horizon(ts, shoulder, threshold=0.5, tau_max=0.25) == 0.25  # Table 9's cap
    assert knee_horizon(ts, shoulder, threshold=1.01) == 0.0  # below from the start: no horizon
    flat = 1 - 1e-3 * np.sin(7 * ts)  # noise, not a knee
    assert knee_point(ts, flat) == pytest.approx(0.9) and knee_horizon(ts, flat, tau_max=1.0) == pytest.approx(0.9)
    falling_fast = np.exp(-5 * ts)  # convex: no shoulder, only the threshold decides
    assert knee_point(ts, falling_fast) == pytest.approx(0.9)
    assert knee_horizon(ts, falling_fast, threshold=0.5, tau_max=1.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="strictly increasing"):
        knee_horizon(ts[::-1], shoulder)
    assert math.isclose(knee_horizon(ts, shoulder), 0.3)  # defaults: threshold 0.9, cap 0.35

"""DPDM samplers against exact denoisers: DDIM (eta), stochastic DDIM, EDM churn, guidance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.sampling import samplers
from pipeline.sampling.empirical import edm_heun

SHAPE = (1, 2, 2)


def gaussian_denoiser(m: float, s: float) -> samplers.Denoiser:
    """Exact D for data N(m, s^2 I): E[y | y + sigma n = x] = (s^2 x + sigma^2 m) / (s^2 + sigma^2)."""

    def d(x, sigma, class_labels=None):
        s2 = sigma.reshape(-1, 1, 1, 1) ** 2
        return (s ** 2 * x + s2 * m) / (s ** 2 + s2)

    return d


def two_point_denoiser(a: float) -> samplers.Denoiser:
    """Exact D for data = +a or -a (all pixels) with probability 1/2 each (softmax posterior)."""

    def d(x, sigma, class_labels=None):
        s2 = sigma.reshape(-1, 1, 1, 1) ** 2
        logit = (2 * a * x / s2).flatten(1).sum(1)  # log p(+a | x) - log p(-a | x)
        return (a * torch.tanh(logit / 2)).reshape(-1, 1, 1, 1).expand_as(x)

    return d


def class_point_denoiser(points: torch.Tensor) -> samplers.Denoiser:
    """Class y's data is the constant image points[y]; the 'empty' label len(points) denoises to 0."""

    def d(x, sigma, class_labels):
        table = torch.cat([points, torch.zeros(1)])
        return table[class_labels].reshape(-1, 1, 1, 1).expand_as(x).clone()

    return d


CONFIGS = {
    "ddim": samplers.SamplerConfig(name="ddim", steps=500),
    "ddim_ancestral": samplers.SamplerConfig(name="ddim", steps=500, eta=1.0),
    "stochastic_ddim": samplers.SamplerConfig(name="stochastic_ddim", steps=500),
    "edm": samplers.SamplerConfig(name="edm", steps=18),
    "edm_churn": samplers.SamplerConfig(name="edm", steps=200, S_churn=40, S_min=0.05, S_max=50),
    "ddim_vp_grid": samplers.SamplerConfig(name="ddim", steps=500, grid="vp"),
}
# The DDIM variants are first-order: with DPDM's 50 steps their std on Gaussian data is ~6% low
# (a discretisation error, see test_ddim_discretisation_error_matches_the_euler_product); the
# distribution tests use enough steps to make that negligible. Heun needs few steps without churn;
# the churn's noise injection makes it first order again (~2% excess std at 80 steps).


@pytest.mark.parametrize("name", CONFIGS)
def test_point_mass_data_every_sample_lands_on_the_point(name):
    config = CONFIGS[name]
    x, _ = samplers.generate(gaussian_denoiser(0.3, 0.0), 64, shape=SHAPE, config=config, num_classes=0, seed=0)
    assert torch.allclose(x, torch.full_like(x, 0.3), atol=1e-4)


@pytest.mark.parametrize("name", CONFIGS)
def test_gaussian_data_samples_have_the_data_mean_and_std(name):
    m, s = 0.25, 0.5
    x, _ = samplers.generate(gaussian_denoiser(m, s), 2048, shape=SHAPE, config=CONFIGS[name], num_classes=0, seed=1,
                         batch_size=1024, dtype=torch.float64)
    # 8192 numbers: the standard error of the mean is s/90, of the std s/128
    assert abs(x.mean().item() - m) < 0.03
    assert abs(x.std().item() / s - 1) < 0.05


@pytest.mark.parametrize("name", ["ddim", "stochastic_ddim", "edm_churn", "ddim_ancestral"])
def test_two_point_data_samples_land_on_either_point_in_equal_shares(name):
    a = 0.8
    x, _ = samplers.generate(two_point_denoiser(a), 1000, shape=SHAPE, config=CONFIGS[name], num_classes=0, seed=2,
                         batch_size=500, dtype=torch.float64)
    centre = x.flatten(1).mean(1)
    assert torch.all((centre.abs() - a).abs() < 0.02)
    assert 0.43 < (centre > 0).double().mean().item() < 0.57


def test_deterministic_ddim_is_an_euler_step_of_the_probability_flow_ode():
    torch.manual_seed(0)
    weights = torch.randn(1, *SHAPE)
    d = lambda x, sigma, y: torch.tanh(x * weights) * 0.7  # any denoiser  # noqa: E731
    latents = torch.randn(5, *SHAPE)
    sigmas = np.array([3.0, 1.2, 0.0])
    got = samplers.ddim_sampler(d, latents, None, sigmas[:2].tolist() + [0.4], eta=0.0)
    x = 3.0 * latents
    x = x + (1.2 - 3.0) * (x - d(x, None, None)) / 3.0  # dx/dsigma = (x - D) / sigma (EDM eq. 3)
    x = x + (0.4 - 1.2) * (x - d(x, None, None)) / 1.2
    assert torch.allclose(got, x, atol=1e-6)


def test_ddim_discretisation_error_matches_the_euler_product():
    # On N(m, s^2) data deterministic DDIM maps x_0 = sigma_max z to m + r (x_0 - m), r the product of
    # the Euler factors 1 + (sigma' - sigma) sigma / (s^2 + sigma^2), times the final s^2/(s^2 + sigma_min^2).
    m, s = 0.25, 0.5
    sig = samplers.edm_sigmas(50)
    r = s ** 2 / (s ** 2 + sig[-2] ** 2)
    for a, b in zip(sig[:-2], sig[1:-1]):
        r *= 1 + (b - a) * a / (s ** 2 + a ** 2)
    z = torch.randn(3, *SHAPE, dtype=torch.float64)
    got = samplers.ddim_sampler(gaussian_denoiser(m, s), z, None, sig)
    assert torch.allclose(got, m + r * (sig[0] * z - m), atol=1e-9)
    assert 0.9 < r * sig[0] / s < 0.97  # DPDM's 50 steps: about 6% too narrow


def test_churn_free_edm_sampler_is_the_empden_heun_sampler_bit_for_bit():
    # one Heun step (pipeline.diffusion.steps) under both: DPDM's churn is a layer on top of it
    torch.manual_seed(1)
    weights = torch.randn(1, *SHAPE)
    d = lambda x, sigma, y: torch.tanh(x * weights * sigma.reshape(-1, 1, 1, 1))  # noqa: E731
    latents = torch.randn(4, *SHAPE)
    sigmas = samplers.edm_sigmas(10)
    got = samplers.edm_sampler(d, latents, None, sigmas)
    want = edm_heun(latents * sigmas[0], lambda x, s: d(x, torch.full((x.shape[0],), s), None), sigmas)
    assert torch.equal(got, want)


def test_churn_outside_its_sigma_window_draws_no_noise():
    d = gaussian_denoiser(0.1, 0.4)
    latents = torch.randn(8, *SHAPE, generator=torch.Generator().manual_seed(0))
    sigmas = samplers.edm_sigmas(12)
    plain = samplers.edm_sampler(d, latents, None, sigmas)
    churned = samplers.edm_sampler(d, latents, None, sigmas, S_churn=30, S_min=100, S_max=200,
                               generator=torch.Generator().manual_seed(1))
    inside = samplers.edm_sampler(d, latents, None, sigmas, S_churn=30, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain, churned)
    assert not torch.allclose(plain, inside)


def test_guidance_zero_is_the_conditional_and_minus_one_the_unconditional_denoiser():
    points = torch.tensor([0.5, -0.4, 0.2])
    d = class_point_denoiser(points)
    x, sigma, y = torch.randn(6, *SHAPE), torch.ones(6), torch.tensor([0, 1, 2, 0, 1, 2])
    assert samplers.guided(d, 0.0, 3) is d
    assert torch.allclose(samplers.guided(d, -1.0, 3)(x, sigma, y), d(x, sigma, torch.full_like(y, 3)))
    assert torch.allclose(samplers.guided(d, 2.0, 3)(x, sigma, y), 3 * d(x, sigma, y))  # (1 + w) D_c - w * 0


@pytest.mark.parametrize("w", [0.0, 1.0, 3.0])
def test_guided_samples_land_at_the_extrapolated_class_point(w):
    points = torch.tensor([0.3, -0.2, 0.1, 0.05])
    config = samplers.SamplerConfig(name="edm", steps=10, guidance=w)
    x, labels = samplers.generate(class_point_denoiser(points), 12, shape=SHAPE, config=config, num_classes=4, seed=0)
    want = (1 + w) * points[torch.as_tensor(labels)]
    assert torch.allclose(x.flatten(1), want[:, None].expand(-1, 4), atol=1e-5)


def test_guidance_needs_a_class_conditional_denoiser():
    with pytest.raises(ValueError, match="class-conditional"):
        samplers.generate(gaussian_denoiser(0, 1), 4, shape=SHAPE, config=samplers.SamplerConfig(guidance=1.0),
                      num_classes=0, seed=0)


@pytest.mark.parametrize("name", ["ddim_ancestral", "stochastic_ddim", "edm_churn"])
def test_a_seed_fixes_the_samples_and_another_seed_changes_them(name):
    d = gaussian_denoiser(0.0, 0.5)
    run = lambda seed: samplers.generate(d, 16, shape=SHAPE, config=CONFIGS[name], num_classes=0, seed=seed,  # noqa: E731
                                     batch_size=8)[0]
    assert torch.equal(run(3), run(3))
    assert not torch.allclose(run(3), run(4))


def test_labels_are_balanced_over_classes():
    labels = samplers.balanced_labels(23, 10)
    counts = np.bincount(labels, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 23
    assert set(samplers.balanced_labels(5, 0)) == {-1}


def test_grids_decrease_from_sigma_max_to_sigma_min_then_zero():
    for sig in (samplers.edm_sigmas(20, 0.002, 80, 7), samplers.vp_sigmas(20, 0.002, 80)):
        assert len(sig) == 21 and sig[-1] == 0
        assert math.isclose(sig[0], 80, rel_tol=1e-9) and math.isclose(sig[-2], 0.002, rel_tol=1e-9)
        assert np.all(np.diff(sig) < 0)


def test_config_from_json_round_trips_and_rejects_unknown_keys():
    config = samplers.SamplerConfig(name="edm", S_churn=5, S_min=0.1)
    assert samplers.SamplerConfig.from_params(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown key 'S_chrun'"):
        samplers.SamplerConfig.from_params({"S_chrun": 1})
    with pytest.raises(ValueError, match="eta"):
        samplers.SamplerConfig(eta=2.0)
    assert samplers.SamplerConfig(name="edm", steps=18, guidance=1).denoiser_evaluations() == 70


def test_to_uint8_maps_minus_one_to_zero_and_one_to_255_and_clips():
    assert samplers.to_uint8(torch.tensor([-1.5, -1.0, 0.0, 1.0, 2.0])).tolist() == [0, 0, 128, 255, 255]

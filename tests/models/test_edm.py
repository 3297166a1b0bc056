"""EDM preconditioning (Karras et al. 2022 Table 1) around a diffusers UNet2DModel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import UNet2DModel

from pipeline.models import edm
from pipeline.privacy import dpsgd


def tiny_unet(num_classes: int | None = None) -> UNet2DModel:
    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 16), layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4, num_class_embeds=num_classes)


def test_coefficients_at_sigma_equal_sigma_data():
    c = edm.edm_coefficients(torch.tensor([0.5]), sigma_data=0.5)
    assert c.c_skip.item() == pytest.approx(0.5)
    assert c.c_out.item() == pytest.approx(0.5 / math.sqrt(2))
    assert c.c_in.item() == pytest.approx(1 / (0.5 * math.sqrt(2)))
    assert c.c_noise.item() == pytest.approx(math.log(0.5) / 4)


def test_loss_weight_times_c_out_squared_is_one():
    # Karras et al. eq. 8: the network's effective target has unit weight at every sigma
    sigma = torch.logspace(-3, 2, 11)
    c = edm.edm_coefficients(sigma)
    torch.testing.assert_close(edm.edm_loss_weight(sigma) * c.c_out ** 2, torch.ones(11))


def test_skip_path_is_identity_at_small_sigma_and_vanishes_at_large_sigma():
    unet = tiny_unet()
    torch.nn.init.zeros_(unet.conv_out.weight)
    torch.nn.init.zeros_(unet.conv_out.bias)  # F = 0: D(x; sigma) = c_skip x
    net = edm.EDMPrecond(unet)
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(net(x, torch.tensor(1e-4)), x, rtol=1e-6, atol=1e-6)
    assert net(x, torch.tensor(1e3)).abs().max().item() < 1e-6 * x.abs().max().item() + 1e-6


def test_loss_equals_the_effective_training_target_of_F():
    net = edm.EDMPrecond(tiny_unet())
    y, n = torch.randn(3, 1, 8, 8), torch.randn(3, 1, 8, 8)
    sigma = torch.tensor([0.05, 0.7, 20.0])
    loss = edm.edm_draw_loss(net, y, sigma, n)
    c = edm.edm_coefficients(sigma)
    v = lambda t: t.reshape(-1, 1, 1, 1)  # noqa: E731
    xn = y + v(sigma) * n
    f = net.unet(v(c.c_in) * xn, c.c_noise).sample
    target = (y - v(c.c_skip) * xn) / v(c.c_out)
    torch.testing.assert_close(loss, (f - target).pow(2).flatten(1).sum(1), rtol=1e-4, atol=1e-4)


def test_sigma_sampler_is_lognormal_with_P_mean_and_P_std():
    s = edm.edm_sigma_sampler()(20_000, torch.Generator().manual_seed(0)).log()
    assert s.mean().item() == pytest.approx(edm.P_MEAN, abs=5 * edm.P_STD / math.sqrt(20_000))
    assert s.std().item() == pytest.approx(edm.P_STD, rel=0.03)


@pytest.mark.parametrize("sigma_range", [(1.0, None), (0.0, 1.0), (0.2, 0.5)])
def test_a_sigma_range_draws_the_same_lognormal_conditioned_on_the_range(sigma_range):
    from scipy import stats

    lo, hi = sigma_range
    s = edm.edm_sigma_sampler(sigma_range=sigma_range)(20_000, torch.Generator().manual_seed(0)).double()
    assert s.min() >= lo and (hi is None or s.max() < hi)
    # the conditioned law: a normal on ln sigma truncated at ln lo, ln hi (scipy's truncnorm as the reference)
    a = -np.inf if lo == 0 else (math.log(lo) - edm.P_MEAN) / edm.P_STD
    b = np.inf if hi is None else (math.log(hi) - edm.P_MEAN) / edm.P_STD
    ref = stats.truncnorm(a, b, loc=edm.P_MEAN, scale=edm.P_STD)
    assert stats.kstest(s.log().numpy(), ref.cdf).pvalue > 1e-3
    assert s.log().mean().item() == pytest.approx(ref.mean(), abs=5 * ref.std() / math.sqrt(20_000))


def test_no_sigma_range_draws_as_before_and_an_empty_range_is_refused():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    torch.testing.assert_close(edm.edm_sigma_sampler()(50, g1), edm.edm_sigma_sampler(sigma_range=None)(50, g2))
    with pytest.raises(ValueError, match="0 <= lo < hi"):
        edm.edm_sigma_sampler(sigma_range=(2.0, 1.0))


def test_class_labels_condition_the_denoiser():
    net = edm.EDMPrecond(tiny_unet(num_classes=10))
    torch.nn.init.normal_(net.unet.class_embedding.weight)
    x = torch.randn(1, 1, 8, 8)
    a, b = net(x, torch.tensor(1.0), torch.tensor([3])), net(x, torch.tensor(1.0), torch.tensor([7]))
    assert (a - b).abs().max().item() > 1e-4


def test_dpsgd_per_example_gradients_through_the_conditional_edm_unet():
    # the full DPDM path: EDM loss, K draws, class labels, vmap(grad) over the UNet
    net = edm.EDMPrecond(tiny_unet(num_classes=10))
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([1, 4])
    sigma, noise = dpsgd.NoiseMultiplicity(3, edm.edm_sigma_sampler()).draw(x, torch.Generator().manual_seed(0))
    loss_fn = dpsgd.multiplicity_loss(edm.edm_draw_loss)
    grads, _ = dpsgd.per_example_gradients(net, loss_fn, (x, sigma, noise, y))
    for i in range(2):
        net.zero_grad()
        loss_fn(net, x[i], sigma[i], noise[i], y[i]).backward()
        for name, p in net.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-3, atol=1e-5)


def test_the_wrapper_swaps_in_attention_that_vmap_can_batch_without_changing_outputs():
    unet = tiny_unet()  # its mid block has attention
    x, s = torch.randn(2, 1, 8, 8), torch.tensor([0.3, 2.0])
    c = edm.edm_coefficients(s)
    v = lambda t: t.reshape(-1, 1, 1, 1)  # noqa: E731
    before = v(c.c_skip) * x + v(c.c_out) * unet(v(c.c_in) * x, c.c_noise).sample
    net = edm.EDMPrecond(unet)
    from diffusers.models.attention_processor import AttnProcessor
    processors = [m.processor for m in net.modules() if hasattr(m, "set_processor")]
    assert processors and all(isinstance(p, AttnProcessor) for p in processors)
    torch.testing.assert_close(net(x, s), before, rtol=1e-5, atol=1e-5)


def test_edm_is_a_preconditioned_denoiser_like_the_other_configurations():
    from pipeline.models.denoiser import Preconditioned

    net = edm.EDMPrecond(tiny_unet(), sigma_data=0.5)
    assert isinstance(net, Preconditioned) and net.convention == "ve_sigma"
    sigma = torch.tensor([0.3, 2.0])
    c, want = net.coefficients(sigma), edm.edm_coefficients(sigma, 0.5)
    assert all(torch.equal(getattr(c, k), getattr(want, k)) for k in ("c_skip", "c_out", "c_in", "c_noise"))

"""VP, VE and v-prediction in the VE convention (Karras et al. 2022 Table 1; DPDM App. C)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pipeline.models import precond
from pipeline.models.checkpoint import load_denoiser, save_denoiser
from pipeline.models.precond import PRECONDITIONERS
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import dpsgd

CONFIGS = ["vp", "ve", "vpred"]


class IdentityF(nn.Module):
    """A stand-in network F(u; c_noise) = u + c_noise, so D has a closed form."""

    def forward(self, sample, timestep, class_labels=None):
        return SimpleNamespace(sample=sample + timestep.reshape(-1, 1, 1, 1))


def closed_form(name: str, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """D(x; sigma) with F(u; c) = u + c, written out from Table 1 by hand."""
    v = s.reshape(-1, 1, 1, 1)
    if name == "vp":
        t = ((0.1 ** 2 + 2 * 19.9 * torch.log(1 + v ** 2)).sqrt() - 0.1) / 19.9  # sigma^-1, beta_min = 0.1
        return x - v * (x / (v ** 2 + 1).sqrt() + 999 * t)
    if name == "ve":
        return x + v * (x + torch.log(v / 2))
    return x / (v ** 2 + 1) + v / (v ** 2 + 1).sqrt() * (x / (v ** 2 + 1).sqrt() + 2 / math.pi * torch.atan(v))


@pytest.mark.parametrize("name", CONFIGS)
def test_denoiser_equals_the_table_1_closed_form_for_a_known_F(name):
    net = precond.parameterisation(name).build(IdentityF())
    x, s = torch.randn(4, 1, 3, 3, dtype=torch.float64), torch.tensor([0.002, 0.3, 2.0, 80.0], dtype=torch.float64)
    torch.testing.assert_close(net(x, s), closed_form(name, x, s))


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_weight_times_c_out_squared_is_one(name):
    # F regresses its effective target with unit weight at every sigma (Karras et al. eq. 8)
    net = precond.parameterisation(name).build(IdentityF())
    s = torch.logspace(-3, 2, 9, dtype=torch.float64)
    c = net.coefficients(s)
    draw_loss = precond.parameterisation(name).draw_loss
    y = torch.zeros(9, 1, 1, 1, dtype=torch.float64)
    # with D(x) = x + c_out (one unit of F error) and y = 0, n = 0: loss = lambda c_out^2
    unit = lambda x, sigma: x + c.c_out.reshape(-1, 1, 1, 1)  # noqa: E731
    torch.testing.assert_close(draw_loss(unit, y, s, torch.zeros_like(y)), torch.ones(9, dtype=torch.float64))


def test_vp_sigma_and_its_inverse_agree():
    t = torch.linspace(1e-5, 1, 50, dtype=torch.float64)
    torch.testing.assert_close(precond.vp_sigma_inv(precond.vp_sigma(t)), t)


@pytest.mark.parametrize("name", CONFIGS)
def test_zero_F_reduces_to_the_skip_path(name):
    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), norm_num_groups=4)
    torch.manual_seed(0)
    unet = build_unet(spec)
    nn.init.zeros_(unet.conv_out.weight)
    nn.init.zeros_(unet.conv_out.bias)
    net = precond.parameterisation(name).build(unet)
    x, s = torch.randn(2, 1, 8, 8), torch.tensor([0.1, 5.0])
    expected = x / (s ** 2 + 1).reshape(-1, 1, 1, 1) if name == "vpred" else x
    torch.testing.assert_close(net(x, s), expected)


@pytest.mark.parametrize("name", CONFIGS + ["edm"])
def test_losses_and_gradients_are_finite_at_extreme_sigma(name):
    cfg = precond.parameterisation(name)
    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), norm_num_groups=4, num_classes=3)
    torch.manual_seed(0)
    net = cfg.build(build_unet(spec))
    x = torch.rand(1, 1, 8, 8) * 2 - 1
    sigma = torch.tensor([[1e-4, 0.002, 80.0, 1e3]])
    noise = torch.randn(1, 4, 1, 8, 8)
    loss_fn = dpsgd.multiplicity_loss(cfg.draw_loss)
    grads, losses = dpsgd.per_example_gradients(net, loss_fn, (x, sigma, noise, torch.tensor([2])))
    assert torch.isfinite(losses).all()
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name,lo,hi", [("vp", precond.vp_sigma(torch.tensor(1e-5)).item(),
                                         precond.vp_sigma(torch.tensor(1.0)).item()),
                                        ("ve", 0.002, 80.0), ("vpred", 0.002, 80.0)])
def test_sigma_samplers_cover_their_training_range(name, lo, hi):
    s = precond.parameterisation(name).sigma_sampler(20_000, torch.Generator().manual_seed(0))
    assert s.min().item() >= lo * (1 - 1e-5) and s.max().item() <= hi * (1 + 1e-5)
    assert s.min().item() < lo * 3 and s.max().item() > hi / 3  # reaches both ends
    if name == "ve":  # log-uniform: ln sigma has the mean of its interval
        assert s.log().mean().item() == pytest.approx((math.log(lo) + math.log(hi)) / 2, abs=0.1)


def test_every_configuration_is_registered_and_round_trips(tmp_path):
    spec = UNetSpec(image_size=8, block_out_channels=(8, 16), norm_num_groups=4)
    for name in CONFIGS:
        assert name in PRECONDITIONERS
        torch.manual_seed(1)
        net = precond.parameterisation(name).build(build_unet(spec)).eval()
        save_denoiser(tmp_path / f"{name}.pt", net, unet=spec, precond=name)
        x = torch.randn(2, 1, 8, 8)
        with torch.no_grad():
            assert torch.equal(load_denoiser(tmp_path / f"{name}.pt")(x, 0.5), net(x, 0.5))


def test_unknown_parameterisation_is_one_line():
    with pytest.raises(ValueError, match="unknown parameterisation 'ddpm'"):
        precond.parameterisation("ddpm")

"""Ghost clipping with book-keeping (pipeline/privacy/ghost.py): the same per-example norms and the same clipped sum
as per-example gradients from vmap, on every backbone DP-SGD trains here, without forming per-example gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.flow.backbone import FlowSpec, build_flow_model
from pipeline.flow.lora import add_lora
from pipeline.flow.rectified import flow_loss
from pipeline.models.edm import EDMPrecond, edm_draw_loss
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.privacy import dpsgd, tha
from pipeline.privacy.ghost import ghost_clip_and_sum, ghost_is_cheaper, unsupported_parameters
from tests.conftest import one_thread


def draws(x: torch.Tensor, K: int, *, flow: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """K (sigma or t, noise) draws per example, as NoiseMultiplicity.draw makes them."""
    g = torch.Generator().manual_seed(seed)
    B = x.shape[0]
    level = (torch.rand(B, K, generator=g, dtype=x.dtype) if flow
             else torch.exp(torch.randn(B, K, generator=g, dtype=x.dtype) * 1.2 - 1.2))
    return level, torch.randn(B, K, *x.shape[1:], generator=g, dtype=x.dtype)


def both_routes(model: nn.Module, draw_loss, x: torch.Tensor, cond: tuple, *, K: int, C: float, flow: bool):
    loss = dpsgd.multiplicity_loss(draw_loss)
    chunk = (x, *draws(x, K, flow=flow), *cond)
    grads, ref_losses = dpsgd.per_example_gradients(model, loss, chunk)
    ref, ref_norms = dpsgd.clip_and_sum(grads, C)
    got, norms, losses = ghost_clip_and_sum(model, loss.batched, chunk, C)
    return ref, ref_norms, ref_losses, got, norms, losses


def embedded_unet():
    return EDMPrecond(build_unet(UNetSpec(image_size=16, channels=1, num_classes=10)))


def paper_width_unet():
    # DPDM's DDPM++ width (128 channels, attention at the second level) on a small image: the same layers
    return EDMPrecond(build_unet(UNetSpec(image_size=8, channels=3, block_out_channels=(128, 256),
                                          attention=(False, True), norm_num_groups=32, num_classes=10)))


TINY_FLOW = FlowSpec(image_size=8, channels=1, num_classes=3)


def mmdit():
    return build_flow_model(TINY_FLOW)


def constrained_mmdit():
    # Sec. 3.3's low-B0 backbone: the stream clamp, late injection and decoupled attention
    return build_flow_model(FlowSpec(image_size=8, channels=1, num_classes=3, stream_clamp=2.0, late_injection=1,
                                     decoupled_attention=True))


def lora_mmdit():
    model = build_flow_model(TINY_FLOW)
    add_lora(model, rank=2, alpha=2.0)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the adapters a gradient through A too
            nn.init.normal_(p, std=0.1)
    return model


BACKBONES = {
    "embedded_unet": (embedded_unet, (6, 1, 16, 16), 11, edm_draw_loss, False),
    "paper_width_unet": (paper_width_unet, (2, 3, 8, 8), 11, edm_draw_loss, False),
    "mmdit": (mmdit, (5, 1, 8, 8), 4, flow_loss, True),
    "constrained_mmdit": (constrained_mmdit, (5, 1, 8, 8), 4, flow_loss, True),
    "lora_mmdit": (lora_mmdit, (5, 1, 8, 8), 4, flow_loss, True),
}


# every example clipped (C = 1e-3) and none (1e3); the paper-width UNet (~40 s in float64) only clipped
CASES = [(name, C) for name in BACKBONES for C in (1e-3, 1e3) if (name, C) != ("paper_width_unet", 1e3)]


@pytest.mark.parametrize("name, C", CASES)
def test_the_clipped_sum_and_the_norms_are_vmaps_to_1e6(name, C):
    build, shape, n_labels, draw_loss, flow = BACKBONES[name]
    torch.manual_seed(0)
    model = build().double()
    x = torch.randn(*shape, dtype=torch.float64)
    y = torch.randint(0, n_labels, (shape[0],))
    with one_thread():
        ref, ref_norms, ref_losses, got, norms, losses = both_routes(model, draw_loss, x, (y,), K=3, C=C, flow=flow)
    assert set(got) == set(ref) == {n for n, p in model.named_parameters() if p.requires_grad}
    torch.testing.assert_close(norms, ref_norms, rtol=1e-9, atol=0)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-9, atol=0)
    flat = lambda g: torch.cat([g[k].reshape(-1) for k in sorted(ref)])  # noqa: E731
    assert ((flat(got) - flat(ref)).norm() / flat(ref).norm()).item() < 1e-6
    for k in ref:  # and parameter by parameter
        torch.testing.assert_close(got[k], ref[k], rtol=1e-6, atol=1e-9 * flat(ref).abs().max().item())


def test_in_float32_the_routes_agree_to_float_rounding():
    torch.manual_seed(0)
    model, x, y = embedded_unet(), torch.randn(6, 1, 16, 16), torch.randint(0, 11, (6,))
    with one_thread():
        ref, ref_norms, _, got, norms, _ = both_routes(model, edm_draw_loss, x, (y,), K=2, C=0.5, flow=False)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-5, atol=0)
    flat = lambda g: torch.cat([g[k].reshape(-1) for k in sorted(ref)])  # noqa: E731
    assert ((flat(got) - flat(ref)).norm() / flat(ref).norm()).item() < 1e-5


def test_one_examples_clipped_contribution_has_norm_min_of_its_norm_and_C():
    torch.manual_seed(0)
    model, x, y = mmdit().double(), torch.randn(1, 1, 8, 8, dtype=torch.float64), torch.tensor([1])
    loss = dpsgd.multiplicity_loss(flow_loss)
    chunk = (x, *draws(x, 2, flow=True), y)
    _, norms, _ = ghost_clip_and_sum(model, loss.batched, chunk, 1e9)
    for C in (norms.item() / 3, norms.item() * 3):
        summed, _, _ = ghost_clip_and_sum(model, loss.batched, chunk, C)
        total = torch.cat([g.reshape(-1) for g in summed.values()]).norm().item()
        assert total == pytest.approx(min(norms.item(), C), rel=1e-9)
    # the norm is over every parameter together: half of it (a sensitivity halved) would not be this one
    grads, _ = dpsgd.per_example_gradients(model, loss, chunk)
    assert norms.item() == pytest.approx(dpsgd.clip_and_sum(grads, 1e9)[1].item(), rel=1e-12)


def test_the_mixed_choice_takes_the_cheaper_norm_per_layer():
    assert ghost_is_cheaper(tokens=4, d_in=512, d_out=512)  # a linear layer on few tokens: ghost
    assert not ghost_is_cheaper(tokens=4 * 256, d_in=64 * 9, d_out=64)  # a conv on a 16x16 map x K=4: instantiate


class Odd(nn.Module):
    """A layer ghost clipping does not know: a bare parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x, sigma):
        return self.lin(x.flatten(1)).reshape(x.shape) * self.scale.reshape(1, 1, 2, 2)


def _square_loss(model_fn, x, sigma, noise):
    return (model_fn(x + noise, sigma) - x).pow(2).flatten(1).sum(1)


def test_auto_falls_back_to_vmap_where_ghost_cannot_run_and_ghost_asked_for_there_is_one_line():
    plan = dpsgd.DPSGDPlan(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=0.5, dataset_size=8, steps=2,
                           delta=1e-5)
    loss = dpsgd.multiplicity_loss(_square_loss)
    assert unsupported_parameters(Odd()) == ["scale (Odd)"]
    assert dpsgd.DPSGD(Odd(), loss, plan).clipping == "vmap"
    assert dpsgd.DPSGD(nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.Unflatten(1, (1, 2, 2))), loss,
                       plan).clipping == "ghost"
    assert dpsgd.DPSGD(Odd(), lambda f, x: f(x).sum(), plan).clipping == "vmap"  # no batched form
    with pytest.raises(dpsgd.DPSGDError, match=r"^dpsgd clipping ghost: parameter scale \(Odd\) is of a layer it "
                                               r"does not handle; use vmap or auto$"):
        dpsgd.DPSGD(Odd(), loss, plan, clipping="ghost")
    with pytest.raises(dpsgd.DPSGDError, match="clipping must be one of vmap, ghost, auto"):
        dpsgd.DPSGD(Odd(), loss, plan, clipping="hooks")
    grouped = nn.Conv2d(2, 2, 3, groups=2)
    assert unsupported_parameters(grouped) == ["weight (grouped convolution)", "bias (grouped convolution)"]


def test_thas_per_bucket_clips_and_noise_multiplicity_release_the_same_gradient_by_either_route():
    """The engine, step by step under a THA plan (bucket k clips at C_k, its draws in its time range), K = 3:
    the released gradient (clipped sum + the one Gaussian draw) / qN is the same for vmap and ghost."""
    plan = tha.THAPlan(edges=(0.0, 0.5, 1.0), clips=(0.05, 2.0), noise_std=0.3, sampling_rate=0.5, dataset_size=12,
                       steps=4, delta=1e-5)
    torch.manual_seed(0)
    model = mmdit()
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 4, (12,))
    released = {}
    for route in ("vmap", "ghost"):
        e = dpsgd.DPSGD(model, dpsgd.multiplicity_loss(flow_loss), plan, microbatch_size=5,
                        multiplicity=dpsgd.NoiseMultiplicity(3, tha.uniform_time_sampler),
                        generator=torch.Generator().manual_seed(0), noise_generator=torch.Generator().manual_seed(1),
                        clipping=route)
        assert e.clipping == route
        out = []
        with one_thread():
            for step in range(plan.steps):
                e.steps_taken = step
                grads, info = e.privatised_gradient((x, y), e.sample())
                out.append((torch.cat([g.reshape(-1) for g in grads.values()]), info.grad_norms, info.clip))
        released[route] = out
    for (g_v, n_v, c_v), (g_g, n_g, c_g) in zip(released["vmap"], released["ghost"]):
        assert c_v == c_g and ((g_v - g_g).norm() / g_v.norm()).item() < 1e-5
        torch.testing.assert_close(n_g, n_v, rtol=1e-4, atol=1e-7)
    assert {c for _, _, c in released["ghost"]} == {0.05, 2.0}


class InPlace(nn.Module):
    """A forward that modifies a layer's output in place: its captured output is no longer what the loss saw."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, sigma):
        h = self.lin(x.flatten(1))
        h.mul_(2.0)
        return h.reshape(x.shape)


def test_a_layer_output_modified_in_place_is_refused_not_silently_wrong():
    loss = dpsgd.multiplicity_loss(_square_loss)
    x = torch.randn(3, 1, 2, 2)
    chunk = (x, torch.ones(3, 2), torch.randn(3, 2, 1, 2, 2))
    with pytest.raises(ValueError, match=r"the output of lin \(Linear\) is modified in place later in the forward"):
        ghost_clip_and_sum(InPlace(), loss.batched, chunk, 1.0)

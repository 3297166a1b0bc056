"""The successors' feature maps (pipeline/baselines/features.py): each row of norm <= 1 whatever the input,
DP-HP's Hermite functions reproducing their Gaussian kernel (Mehler's formula) with a closed-form derivative,
DP-NTK's closed form equal to torch.func's parameter gradients, and DP-NTK's inner-product loss equal to the
explicit loss over its rows."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, grad, vmap

from pipeline.baselines import features as feat

F64 = torch.float64


def test_hermite_functions_reproduce_the_gaussian_kernel_of_their_rho():
    rho = torch.tensor([0.2, 0.5, 0.8], dtype=F64)
    x, y = torch.rand((6, 3), dtype=F64), torch.rand((6, 3), dtype=F64)
    k = (feat.hermite_features_1d(x, rho, 60) * feat.hermite_features_1d(y, rho, 60)).sum(-1)
    assert torch.allclose(k, torch.exp(-rho * (x - y) ** 2 / (1 - rho ** 2)), atol=1e-5)
    # truncated at any order the diagonal stays <= k(x, x) = 1: the norm bound the sensitivity needs
    for order in (0, 1, 3, 20):
        assert float(feat.hermite_features_1d(x * 4 - 2, rho, order).square().sum(-1).max()) <= 1 + 1e-12


def test_the_length_scale_maps_to_the_rho_of_the_same_kernel():
    length = torch.tensor([0.1, 0.5, 2.0], dtype=F64)
    rho = feat.rho_of_length_scale(length)
    assert torch.allclose(rho / (1 - rho ** 2), 1 / (2 * length ** 2)) and bool(((rho > 0) & (rho < 1)).all())


def test_the_hermite_derivative_is_the_autograd_one():
    rho = torch.tensor([0.3, 0.9], dtype=F64)
    x = torch.rand((3, 2), dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: feat.hermite_features_1d(t, rho, 20), (x,))


def test_dp_hp_rows_have_norm_at_most_one_and_the_declared_width():
    g = torch.Generator().manual_seed(0)
    public = torch.rand((50, 16), generator=g, dtype=F64)
    fm = feat.hermite_features(public, {"order": 5, "prod_order": 2, "n_pairs": 7, "alpha": 0.3}, g)
    phi = fm(torch.rand((9, 16), generator=g, dtype=F64) * 3 - 1)
    assert phi.shape == (9, fm.dim) and fm.dim == 16 * 6 + 7 * 9
    assert float(phi.norm(dim=1).max()) <= 1 + 1e-12
    # pairs are distinct, drawn among the pixels of above-median public variance
    var = public.var(dim=0)
    assert bool((var[fm.pairs] > var.median()).all()) and len({tuple(p) for p in fm.pairs.tolist()}) == 7


def ntk_reference(fm: feat.NTKFeatures, x: torch.Tensor) -> torch.Tensor:
    """grad_theta f(x) by torch.func on the nn.Module DP-NTK's code builds, normalised."""
    d, w = fm.W.shape[1], fm.W.shape[0]
    net = torch.nn.Sequential(torch.nn.Linear(d, w), torch.nn.ReLU(),
                              torch.nn.LayerNorm(w, elementwise_affine=False, eps=fm.eps), torch.nn.Linear(w, 1))
    params = {"0.weight": fm.W, "0.bias": fm.b, "3.weight": fm.v[None], "3.bias": fm.c}

    def f(p, xi):
        return functional_call(net.double(), p, (xi[None],)).squeeze()
    g = vmap(grad(f), in_dims=(None, 0))(params, x)
    rows = torch.cat([g[k].reshape(len(x), -1) for k in ("0.weight", "0.bias", "3.weight", "3.bias")], dim=1)
    return rows / rows.norm(dim=1, keepdim=True)


def test_dp_ntks_closed_form_is_torch_funcs_normalised_gradient():
    fm = feat.NTKFeatures(12, 7, torch.Generator().manual_seed(1))
    x = torch.rand((5, 12), dtype=F64)
    phi = fm(x)
    assert phi.shape == (5, fm.dim) and fm.dim == 12 * 7 + 7 + 7 + 1
    assert torch.allclose(phi, ntk_reference(fm, x), atol=1e-10)
    assert torch.allclose(phi.norm(dim=1), torch.ones(5, dtype=F64))


def test_dp_ntks_inner_product_loss_is_the_explicit_loss_and_its_gradient():
    fm = feat.NTKFeatures(10, 6, torch.Generator().manual_seed(2))
    mu = torch.randn((fm.dim, 3), dtype=F64) * 0.1
    x = torch.rand((8, 10), dtype=F64, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0])
    fast = fm.matching_loss(mu, 3)(x, y)
    slow = feat.explicit_matching_loss(mu, fm, 3)(x, y)
    assert float(fast) == pytest.approx(float(slow), rel=1e-10)
    g_fast, = torch.autograd.grad(fast, x)
    g_slow, = torch.autograd.grad(slow, x)
    assert torch.allclose(g_fast, g_slow, atol=1e-10)


def random_clip(path, image_size=8):
    """An untrained small CLIP file (a public tower needs no training to test the map's norms)."""
    from pipeline.evaluation import clip

    cfg = clip.small_clip_config(image_size, width=32, layers=1, embed_dim=16)
    torch.manual_seed(0)
    torch.save({"format": clip.FORMAT, "config": cfg, "class_names": ["zero", "one"], "template": clip.TEMPLATE,
                "state_dict": clip.build_clip(cfg).state_dict()}, path)
    return clip.ClipModel(path)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_dp_mepfs_two_moments_of_the_public_tower_have_norm_at_most_one(tmp_path, beta):
    fm = feat.PerceptualFeatures(random_clip(tmp_path / "clip.pt"), (1, 8, 8), beta)
    x = torch.rand((6, 64), requires_grad=True)
    phi = fm(x)
    # pooled 16 + 4 patch tokens x 32, then their squares
    assert phi.shape == (6, fm.dim) and fm.dim == 2 * (16 + 4 * 32)
    assert float(phi.norm(dim=1).max()) <= 1 + 1e-6
    first = phi[:, :fm.dim // 2]
    assert torch.allclose(first.norm(dim=1), torch.full((6,), math.sqrt(1 - beta)), atol=1e-6)
    phi.sum().backward()  # the generator is trained through the tower
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


def test_a_pixel_almost_constant_in_public_data_gives_finite_float32_features_and_gradients():
    """A tiny public length scale puts rho within float32 rounding of 1 (the generator trains in float32)."""
    rho = feat.rho_of_length_scale(torch.tensor([1e-4, 0.5], dtype=F64))
    assert float(rho[0]) > 1 - 1e-7
    x = torch.rand((4, 2), requires_grad=True)
    g = feat.hermite_features_1d(x, rho, 20)
    g.sum().backward()
    assert bool(torch.isfinite(g).all()) and bool(torch.isfinite(x.grad).all())


def test_every_map_and_loss_follows_the_generator_to_its_device():
    """On CUDA the generator's batches live on the GPU: each map moves there whole. The meta device stands in for
    a GPU here (a tensor left on the CPU fails to combine with it)."""
    g = torch.Generator().manual_seed(0)
    public = torch.rand((30, 16), generator=g, dtype=F64)
    hp = feat.hermite_features(public, {"order": 3, "prod_order": 2, "n_pairs": 4, "alpha": 0.5}, g)
    ntk = feat.NTKFeatures(16, 5, g)
    x, y = torch.rand((6, 16), device="meta"), torch.zeros(6, dtype=torch.long, device="meta")
    for fm in (hp, ntk):
        assert fm.to("meta")(x).shape == (6, fm.dim)  # (the explicit loss's label check reads values: not on meta)
    assert ntk.matching_loss(torch.zeros((ntk.dim, 3), device="meta"), 3)(x, y).shape == ()

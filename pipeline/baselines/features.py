"""The feature maps of DP-MERF's successors, each of norm <= 1 per record (the sensitivity of
:mod:`pipeline.privacy.mean_embedding` rests on it and its release checks it), built from public data
and public randomness only, and the matching loss a generator is trained with.

* **DP-HP** (Vinaroz et al. 2022): Hermite polynomial features of the Gaussian kernel. Mehler's formula
  gives, for 0 < rho < 1, the eigen-expansion (orthonormal under a Gaussian measure)::

      exp(-rho (x - y)^2 / (1 - rho^2)) = sum_c g_c(x) g_c(y),
      g_c(x) = sqrt(1 - rho) ((1 + rho)/(1 - rho))^(1/4) rho^(c/2) H_c(x) / sqrt(2^c c!) exp(-rho x^2 / (1 + rho))

  (H_c the physicists' Hermite polynomials; DP-HP Sec. 3, eqs. 5-7). The kernel is 1 on the diagonal,
  so the truncation phi_C(x) = [g_0(x) .. g_C(x)] has ||phi_C(x)||^2 <= 1. The **sum kernel** over the
  d pixels, (1/d) sum_k k(x_k, y_k), has features d^(-1/2) [phi_C(x_1); ..; phi_C(x_d)]; the **product
  kernel** over a pixel pair (i, j), k(x_i, y_i) k(x_j, y_j), has features phi_C'(x_i) (x) phi_C'(x_j)
  (norm <= 1 as a product of norms <= 1), averaged over P pairs the same way (DP-HP Sec. 4). One rho per
  pixel from the public median heuristic (DP-HP tunes its kernel length on the data; here only public
  data sets it). Assumed here: the pairs are drawn (public randomness) among the pixels whose PUBLIC
  variance is above the median, which is how we read STRAIGHTDP App. Table 9's "public-variance pixel
  pairs"; the two kernels' features are weighted sqrt(1 - alpha), sqrt(alpha) and released together.
* **DP-NTK** (Yang et al. 2023): the empirical NTK features of a randomly initialised one-hidden-layer
  ReLU network f(x) = v . LN(relu(W x + b)) + c (LayerNorm without affine, scalar output, the authors'
  public MNIST model): phi(x) = grad_theta f(x) / ||grad_theta f(x)|| (DP-NTK Sec. 3, eq. 4). Written out
  in closed form (:class:`NTKFeatures`): with r = relu(W x + b), n = LN(r), delta = s * J_LN^T v (s the
  ReLU mask), grad_theta f = [delta x^T, delta, n, 1]; so <phi(x), phi(x')> = (delta . delta')(x . x' + 1)
  + n . n' + 1 over the norms, which the generator's loss uses instead of the 77k-wide rows
  (tests/baselines/test_features.py checks the closed form against torch.func's gradients).
* **DP-MEPF** (Harder et al. 2023): perceptual features of a PUBLIC network, here the image tower of the
  CLIP trained on the public split (the house's public perceptual model; the paper's is an ImageNet
  VGG): its final patch tokens and pooled embedding, flattened and normalised to norm 1 (phi), and their
  elementwise squares (the second moment, ||phi * phi|| <= ||phi||^2 = 1), weighted sqrt(1 - beta),
  sqrt(beta). Its CLIP FD is measured in the space it was fitted to: read its eval-net FID.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.privacy.dp_merf import mean_embedding
from pipeline.stage import PipelineError

#: a generator's matching loss of a batch: (generated pixels [b, d] in [0, 1], labels [b]) -> scalar
MatchingLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: at most this many public images per pixel enter the median heuristic
MEDIAN_SUBSET = 500


def explicit_matching_loss(mu_tilde: torch.Tensor, features: Callable[[torch.Tensor], torch.Tensor],
                           n_classes: int) -> MatchingLoss:
    """||mu_tilde - mean_b phi(G_b) e_{y_b}^T||_F^2 (DP-MERF eq. 6 with another map phi)."""
    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (mu_tilde - mean_embedding(features(x), y, n_classes)).square().sum()
    return loss


# ------------------------------------------------------------------------------------------------- DP-HP

def rho_of_length_scale(length_scale: torch.Tensor) -> torch.Tensor:
    """The rho of Mehler's kernel exp(-rho (x-y)^2 / (1 - rho^2)) equal to exp(-(x-y)^2 / (2 l^2)):
    rho / (1 - rho^2) = a = 1 / (2 l^2), so rho = (sqrt(1 + 4 a^2) - 1) / (2 a) in (0, 1)."""
    a = 1.0 / (2.0 * length_scale.double() ** 2)
    return (torch.sqrt(1.0 + 4.0 * a ** 2) - 1.0) / (2.0 * a)


def per_pixel_length_scale(public: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per pixel, the median |x_k - x'_k| over public pairs (the mean when the median is 0, as for the
    near-binary pixels of digits; 1 for a pixel constant in public data): DP-HP's heuristic, public only."""
    idx = torch.randperm(len(public), generator=generator)[:MEDIAN_SUBSET]
    x = public[idx].double()
    iu = torch.triu_indices(len(x), len(x), offset=1)
    diffs = (x[iu[0]] - x[iu[1]]).abs()  # [pairs, d]
    med = diffs.median(dim=0).values
    mean = diffs.mean(dim=0)
    scale = torch.where(med > 0, med, mean)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _hermite_terms(x: torch.Tensor, rho: torch.Tensor, norm_c: torch.Tensor, order: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w [n, d, C+1], scale [n, d]): the normalised Hermite terms w_c = rho^(c/2) H_c(x) / sqrt(2^c c!) by their
    three-term recurrence (w_0 = 1, w_1 = sqrt(2 rho) x, w_{c+1} = sqrt(2 rho/(c+1)) x w_c - rho sqrt(c/(c+1)) w_{c-1};
    stable at order 20: no factorials) and g_c / w_c = sqrt(1 - rho) ((1+rho)/(1-rho))^(1/4) exp(-rho x^2/(1+rho)),
    whose constant is ``norm_c`` = (1 - rho^2)^(1/4) (computed in float64 by the caller: in float32 a rho near 1
    made (1+rho)/(1-rho) infinite and the features NaN)."""
    sx = torch.sqrt(rho) * x
    w = [torch.ones_like(x), math.sqrt(2.0) * sx][:order + 1]
    for c in range(1, order):
        w.append(torch.addcmul(-math.sqrt(c / (c + 1)) * rho * w[c - 1], sx, w[c], value=math.sqrt(2.0 / (c + 1))))
    scale = norm_c * torch.exp(-rho * x ** 2 / (1.0 + rho))
    return torch.stack(w, dim=-1), scale


class _HermiteFunctions(torch.autograd.Function):
    """g_c(x) with its derivative in closed form: H_c' = 2c H_{c-1} gives dw_c/dx = sqrt(2 c rho) w_{c-1}, so
    dg_c/dx = scale (sqrt(2 c rho) w_{c-1} - 2 rho x / (1 + rho) w_c). Written by hand because autograd through the
    recurrence records ~5 C small ops per call: the generator's step was 5x slower."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rho: torch.Tensor, norm_c: torch.Tensor, order: int) -> torch.Tensor:
        w, scale = _hermite_terms(x, rho, norm_c, order)
        ctx.save_for_backward(x, rho, w, scale)
        return w * scale.unsqueeze(-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        x, rho, w, scale = ctx.saved_tensors
        c = torch.arange(w.shape[-1], dtype=x.dtype, device=x.device)
        dw = torch.zeros_like(w)
        dw[..., 1:] = torch.sqrt(2.0 * c[1:] * rho.unsqueeze(-1)) * w[..., :-1]
        dg = scale.unsqueeze(-1) * (dw - (2.0 * rho * x / (1.0 + rho)).unsqueeze(-1) * w)
        return (grad * dg).sum(-1), None, None, None


def hermite_features_1d(x: torch.Tensor, rho: torch.Tensor, order: int) -> torch.Tensor:
    """[g_0(x) .. g_C(x)] ``[n, d, C+1]`` per coordinate of ``x [n, d]`` (one rho per coordinate)."""
    if order < 0:
        raise PipelineError(f"Hermite order must be >= 0, got {order}")
    norm_c = (1.0 - rho.double() ** 2) ** 0.25
    return _HermiteFunctions.apply(x, rho.to(x.dtype), norm_c.to(x.dtype), order)


def public_variance_pairs(public: torch.Tensor, n_pairs: int, generator: torch.Generator) -> torch.Tensor:
    """``[P, 2]`` distinct pixel pairs drawn among the pixels whose public variance is above the median."""
    var = public.double().var(dim=0)
    pool = torch.nonzero(var > var.median()).flatten()
    if len(pool) < 2:
        pool = torch.arange(public.shape[1])
    iu = torch.triu_indices(len(pool), len(pool), offset=1)
    pick = torch.randperm(iu.shape[1], generator=generator)[:n_pairs]
    return torch.stack([pool[iu[0, pick]], pool[iu[1, pick]]], dim=1)


@dataclass(frozen=True)
class HermiteFeatures:
    """DP-HP's map: sqrt(1 - alpha) x sum-kernel features (order ``order``, every pixel) next to
    sqrt(alpha) x product-kernel features (order ``prod_order``, over ``pairs``); norm <= 1."""

    rho: torch.Tensor
    order: int
    pairs: torch.Tensor
    prod_order: int
    alpha: float

    @property
    def dim(self) -> int:
        return len(self.rho) * (self.order + 1) + len(self.pairs) * (self.prod_order + 1) ** 2

    def to(self, device: torch.device | str) -> HermiteFeatures:
        """The same map on ``device`` (the generator trains there; the release runs on the CPU)."""
        return replace(self, rho=self.rho.to(device), pairs=self.pairs.to(device))

    def matching_loss(self, mu_tilde: torch.Tensor, n_classes: int) -> MatchingLoss:
        return explicit_matching_loss(mu_tilde, self, n_classes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[1]
        g = hermite_features_1d(x, self.rho, self.order)  # [n, d, C+1]
        parts = [math.sqrt(1.0 - self.alpha) * g.reshape(len(x), -1) / math.sqrt(d)]
        if len(self.pairs):
            gp = g[..., :self.prod_order + 1] if self.prod_order <= self.order else \
                hermite_features_1d(x, self.rho, self.prod_order)
            a, b = gp[:, self.pairs[:, 0]], gp[:, self.pairs[:, 1]]  # [n, P, C'+1]
            prod = (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(len(x), -1)
            parts.append(math.sqrt(self.alpha) * prod / math.sqrt(len(self.pairs)))
        return torch.cat(parts, dim=1)


def hermite_features(public: torch.Tensor, cfg: dict, generator: torch.Generator) -> HermiteFeatures:
    """DP-HP's map from public images ``[n, d]`` in [0, 1] and the ``dp_hp`` settings."""
    alpha = float(cfg["alpha"])
    pairs = (public_variance_pairs(public, int(cfg["n_pairs"]), generator) if alpha > 0
             else torch.zeros((0, 2), dtype=torch.long))
    return HermiteFeatures(rho=rho_of_length_scale(per_pixel_length_scale(public, generator)),
                           order=int(cfg["order"]), pairs=pairs, prod_order=int(cfg["prod_order"]), alpha=alpha)


# ------------------------------------------------------------------------------------------------ DP-NTK

class NTKFeatures:
    """DP-NTK's normalised e-NTK map of a random f(x) = v . LN(relu(W x + b)) + c of width ``width``
    (PyTorch's default Linear initialisation from the public generator ``generator``)."""

    def __init__(self, dim_in: int, width: int, generator: torch.Generator, eps: float = 1e-5) -> None:
        def linear(n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
            bound = 1.0 / math.sqrt(n_in)  # nn.Linear's default (kaiming_uniform a=sqrt 5 and its bias)
            w = (torch.rand((n_out, n_in), generator=generator, dtype=torch.float64) * 2 - 1) * bound
            b = (torch.rand((n_out,), generator=generator, dtype=torch.float64) * 2 - 1) * bound
            return w, b
        self.W, self.b = linear(dim_in, width)
        v, c = linear(width, 1)
        self.v, self.c = v[0], c
        self.eps = eps

    @property
    def dim(self) -> int:
        """Number of parameters of f: W, b, v and c."""
        return self.W.numel() + self.b.numel() + self.v.numel() + 1

    def to(self, device: torch.device | str) -> NTKFeatures:
        """This map, moved to ``device``."""
        self.W, self.b, self.v, self.c = (t.to(device) for t in (self.W, self.b, self.v, self.c))
        return self

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(delta, n, norm): grad_theta f = [delta x^T, delta, n, 1] and its norm, per row of ``x [n, d]``."""
        W, b, v = (t.to(x.dtype) for t in (self.W, self.b, self.v))
        pre = x @ W.T + b
        r = F.relu(pre)
        mu = r.mean(dim=1, keepdim=True)
        s = torch.sqrt(r.var(dim=1, unbiased=False, keepdim=True) + self.eps)
        n = (r - mu) / s
        g_r = (v - v.mean() - n * (n @ v).unsqueeze(1) / r.shape[1]) / s  # J_LN^T v (J_LN symmetric)
        delta = g_r * (pre > 0).to(x.dtype)
        sq = (delta * delta).sum(1) * ((x * x).sum(1) + 1.0) + (n * n).sum(1) + 1.0
        return delta, n, torch.sqrt(sq)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The rows phi(x) ``[n, dim]`` in the order of the parameters (W, b, v, c), norm 1."""
        delta, n, norm = self.parts(x)
        rows = torch.cat([(delta.unsqueeze(2) * x.unsqueeze(1)).reshape(len(x), -1), delta, n,
                          torch.ones((len(x), 1), dtype=x.dtype, device=x.device)], dim=1)
        return rows / norm.unsqueeze(1)

    def matching_loss(self, mu_tilde: torch.Tensor, n_classes: int) -> MatchingLoss:
        """The explicit loss ||mu_tilde - (1/b) sum_b phi(x_b) e_{y_b}^T||^2 written in inner products
        (never forming the [b, dim] rows): ||mu||^2 - (2/b) sum_b <mu_{y_b}, phi_b> + (1/b^2) sum_{b,b'}
        [y_b = y_b'] <phi_b, phi_b'>."""
        d = self.W.shape[1]
        width = self.W.shape[0]
        A = mu_tilde[:d * width].T.reshape(n_classes * width, d)  # the W block of each class's column, stacked
        a_b = mu_tilde[d * width:d * width + width].T
        a_v = mu_tilde[d * width + width:d * width + 2 * width].T
        a_c = mu_tilde[-1]
        const = mu_tilde.square().sum()

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            x = x.to(mu_tilde.dtype)
            delta, n, norm = self.parts(x)
            # A_y x for every class at once ([b, Y, width]), then each row's own class
            Ax = (x @ A.T).reshape(len(x), n_classes, width)[torch.arange(len(x), device=x.device), y]
            cross = ((delta * (Ax + a_b[y])).sum(1) + (n * a_v[y]).sum(1) + a_c[y]) / norm
            gram = ((delta @ delta.T) * (x @ x.T + 1.0) + n @ n.T + 1.0) / (norm[:, None] * norm[None, :])
            same = (y[:, None] == y[None, :]).to(x.dtype)
            b = len(x)
            return const - 2.0 * cross.sum() / b + (gram * same).sum() / b ** 2
        return loss


# ----------------------------------------------------------------------------------------------- DP-MEPF

class PerceptualFeatures:
    """DP-MEPF's map over a public CLIP image tower (:class:`pipeline.evaluation.clip.ClipModel`): phi =
    its patch tokens and pooled embedding normalised to norm 1, next to phi * phi (second moment),
    weighted sqrt(1 - beta), sqrt(beta)."""

    def __init__(self, clip: object, image_shape: tuple[int, int, int], beta: float) -> None:
        from pipeline.evaluation.clip import preprocess

        self._preprocess = preprocess
        self.clip, self.image_shape, self.beta = clip, tuple(image_shape), float(beta)
        self.visual = clip.model.visual
        self.tokens = hasattr(self.visual, "output_tokens")  # a ViT tower; a ResNet one gives its pooled output
        with torch.no_grad():
            self._dim = int(self.perceptual(torch.zeros(1, int(np.prod(image_shape)))).shape[1])

    def perceptual(self, x: torch.Tensor) -> torch.Tensor:
        """The tower's features of pixels ``[n, d]`` in [0, 1], normalised per row (differentiable in x)."""
        images = (x.float() * 255.0).reshape(len(x), *self.image_shape)
        inp = self._preprocess(images, self.clip.image_size)
        if self.tokens:
            self.visual.output_tokens = True
            try:
                pooled, tokens = self.visual(inp)
            finally:
                self.visual.output_tokens = False
            f = torch.cat([pooled, tokens.reshape(len(x), -1)], dim=1)
        else:
            f = self.visual(inp)
        return F.normalize(f, dim=1)

    @property
    def dim(self) -> int:
        return 2 * self._dim

    def to(self, device: torch.device | str) -> PerceptualFeatures:
        """This map with its tower on ``device``."""
        self.clip.model.to(device)
        self.clip.device = torch.device(device)
        return self

    def matching_loss(self, mu_tilde: torch.Tensor, n_classes: int) -> MatchingLoss:
        return explicit_matching_loss(mu_tilde, self, n_classes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        phi = self.perceptual(x)
        return torch.cat([math.sqrt(1.0 - self.beta) * phi, math.sqrt(self.beta) * phi * phi], dim=1)

"""EDM preconditioning around a diffusers ``UNet2DModel`` (Karras et al. 2022; DPDM App. C).

The denoiser is D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma))
with (Karras et al. 2022, Table 1, "Ours")

    c_skip = sigma_data^2 / (sigma^2 + sigma_data^2)
    c_out  = sigma sigma_data / sqrt(sigma^2 + sigma_data^2)
    c_in   = 1 / sqrt(sigma^2 + sigma_data^2)
    c_noise = ln(sigma) / 4

and is trained with ln sigma ~ N(P_mean, P_std^2) and the loss weight
lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2 on ||D(y + n; sigma) - y||^2,
n ~ N(0, sigma^2 I) (Table 1; eq. 2 and 8). lambda c_out^2 = 1, so the network F regresses
its effective target with unit weight at every sigma. DPDM uses P_mean = -1.2, P_std = 1.2,
sigma_data = 0.5 for its EDM configuration.

:func:`edm_draw_loss` has the per-draw signature of
:func:`pipeline.privacy.dpsgd.multiplicity_loss`, and :func:`edm_sigma_sampler` that of
:class:`pipeline.privacy.dpsgd.NoiseMultiplicity`, so DPDM's noise multiplicity is
``multiplicity_loss(edm_draw_loss)`` with ``NoiseMultiplicity(K, edm_sigma_sampler())``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

# EDMCoefficients and vmap_friendly_attention are re-exported: callers import them from here
from pipeline.models.denoiser import EDMCoefficients, Preconditioned, vmap_friendly_attention

#: DPDM App. C, EDM configuration (= Karras et al. 2022 Table 1).
P_MEAN, P_STD, SIGMA_DATA = -1.2, 1.2, 0.5


def edm_coefficients(sigma: Tensor, sigma_data: float = SIGMA_DATA) -> EDMCoefficients:
    """c_skip, c_out, c_in, c_noise of Karras et al. 2022, Table 1 (shape of ``sigma``)."""
    s2 = sigma ** 2 + sigma_data ** 2
    return EDMCoefficients(c_skip=sigma_data ** 2 / s2, c_out=sigma * sigma_data / s2.sqrt(),
                           c_in=1 / s2.sqrt(), c_noise=sigma.log() / 4)


def edm_loss_weight(sigma: Tensor, sigma_data: float = SIGMA_DATA) -> Tensor:
    """lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2 (Table 1)."""
    return (sigma ** 2 + sigma_data ** 2) / (sigma * sigma_data) ** 2


class EDMPrecond(Preconditioned):
    """EDM's D(x; sigma, y) = c_skip x + c_out F(c_in x; c_noise, y) with F a ``UNet2DModel`` (Table 1, "Ours").

    The :class:`~pipeline.models.denoiser.Preconditioned` forward with :func:`edm_coefficients`.
    """

    def __init__(self, unet: nn.Module, sigma_data: float = SIGMA_DATA) -> None:
        if not sigma_data > 0:
            raise ValueError(f"sigma_data must be > 0, got {sigma_data}")
        super().__init__(unet)
        self.sigma_data = float(sigma_data)

    def coefficients(self, sigma: Tensor) -> EDMCoefficients:
        return edm_coefficients(sigma, self.sigma_data)


def edm_sigma_sampler(p_mean: float = P_MEAN, p_std: float = P_STD,
                      sigma_range: tuple[float, float | None] | None = None
                      ) -> Callable[[int, torch.Generator | None], Tensor]:
    """n noise levels with ln sigma ~ N(P_mean, P_std^2) (Karras et al. 2022, Table 1).

    ``sigma_range = (lo, hi)`` (``hi`` None: no upper end): the same law conditioned on lo <= sigma < hi, drawn by
    the inverse CDF (u uniform between the normal CDF at ln lo and at ln hi), one uniform per draw, never rejected
    (DP-Promise's two phases each train on their own range of noise levels).
    """
    if not (p_std > 0 and math.isfinite(p_mean)):
        raise ValueError(f"need P_std > 0 and a finite P_mean, got {p_mean}, {p_std}")
    if sigma_range is None:
        def sample(n: int, generator: torch.Generator | None = None) -> Tensor:
            return torch.exp(torch.randn(n, generator=generator) * p_std + p_mean)

        return sample
    lo, hi = float(sigma_range[0]), (math.inf if sigma_range[1] is None else float(sigma_range[1]))
    if not 0 <= lo < hi:
        raise ValueError(f"sigma_range must be 0 <= lo < hi, got {sigma_range}")
    z = torch.tensor([(math.log(v) - p_mean) / p_std if 0 < v < math.inf else (-math.inf if v == 0 else math.inf)
                      for v in (lo, hi)], dtype=torch.float64)
    u_lo, u_hi = torch.special.ndtr(z).tolist()
    if not u_hi > u_lo:
        raise ValueError(f"sigma_range {sigma_range} has no probability under ln sigma ~ N({p_mean}, {p_std}^2)")

    def truncated(n: int, generator: torch.Generator | None = None) -> Tensor:
        u = u_lo + (u_hi - u_lo) * torch.rand(n, generator=generator, dtype=torch.float64)
        sigma = torch.exp(torch.special.ndtri(u) * p_std + p_mean)
        return sigma.clamp(lo, hi if math.isfinite(hi) else None).float()  # float64 rounding at the ends

    return truncated


def edm_draw_loss(model_fn: Callable[..., Tensor], x: Tensor, sigma: Tensor, noise: Tensor,
                  *cond: Tensor, sigma_data: float = SIGMA_DATA) -> Tensor:
    """lambda(sigma) ||D(x + sigma n; sigma) - x||^2 per draw (Karras et al. 2022 eq. 2/8), shape ``[K]``.

    ``noise`` is standard normal (scaled by ``sigma`` here); ``cond`` is passed to the model
    (e.g. class labels). Summed over pixels, as in EDM's training loop.
    """
    view = (-1,) + (1,) * (x.ndim - 1)
    denoised = model_fn(x + sigma.reshape(view) * noise, sigma, *cond)
    return edm_loss_weight(sigma, sigma_data) * (denoised - x).pow(2).flatten(1).sum(1)

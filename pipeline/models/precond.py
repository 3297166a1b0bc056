"""VP, VE and v-prediction preconditioning in the VE convention D(x, sigma, class_labels).

DPDM (Sec. 2.1, App. C) compares four diffusion configurations: variance preserving (VP),
variance exploding (VE), v-prediction and EDM. Karras et al. 2022 (Table 1) write each as a
denoiser D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma)) of the
noisy input x = y + sigma n, a training distribution of sigma and a loss weight lambda(sigma)
on ||D(y + sigma n; sigma) - y||^2. Expressed this way, every configuration plugs into the
same samplers (written once against D) and the same DP-SGD machinery
(:func:`pipeline.privacy.dpsgd.multiplicity_loss` with a per-draw loss, and
:class:`pipeline.privacy.dpsgd.NoiseMultiplicity` with a sigma sampler). EDM itself lives in
:mod:`pipeline.models.edm`.

=============  =================  ===================  ================  ==========================
configuration  c_skip             c_out                c_in              c_noise
=============  =================  ===================  ================  ==========================
VP             1                  -sigma               1/sqrt(s^2+1)     (M-1) sigma^-1(sigma)
VE             1                  sigma                1                 ln(sigma/2)
v-prediction   1/(sigma^2+1)      sigma/sqrt(s^2+1)    1/sqrt(s^2+1)     (2/pi) arctan(sigma)
=============  =================  ===================  ================  ==========================

Training distributions and weights (Karras et al. Table 1; DPDM App. C, which moves VE and
v-prediction to sigma in [0.002, 80] so that all configurations cover the EDM sampler's range):

* VP: t ~ U(eps_t, 1), sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1), beta_d = 19.9,
  beta_min = 0.1, eps_t = 1e-5, M = 1000; lambda = 1/sigma^2.
* VE: ln sigma ~ U(ln sigma_min, ln sigma_max), sigma_min = 0.002, sigma_max = 80;
  lambda = 1/sigma^2.
* v-prediction (Salimans & Ho 2022, cosine schedule): t ~ U(t(sigma_min), t(sigma_max)),
  sigma = tan(pi t / 2), the same sigma range; lambda = (sigma^2 + 1)/sigma^2. In VP
  variables z = x / sqrt(1 + sigma^2) the network output is (up to sign) the velocity v, so
  this is the usual v-loss; the sign of c_out follows DPDM's released denoiser.

In every row lambda(sigma) c_out(sigma)^2 = 1: F regresses its effective target
(y - c_skip x) / c_out with unit weight, as in EDM (Karras et al. eq. 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# Preconditioned is re-exported: the base class of every configuration, EDM's included
from pipeline.models.denoiser import EDMCoefficients, Preconditioned
from pipeline.models.edm import EDMPrecond, edm_draw_loss, edm_sigma_sampler

SigmaSampler = Callable[[int, "torch.Generator | None"], Tensor]
DrawLoss = Callable[..., Tensor]

#: Karras et al. 2022 Table 1 (VP column; Song et al. 2021).
VP_BETA_D, VP_BETA_MIN, VP_EPS_T, VP_M = 19.9, 0.1, 1e-5, 1000
#: DPDM App. C: VE and v-prediction trained over sigma in [0.002, 80] (the EDM sampler's range).
SIGMA_MIN, SIGMA_MAX = 0.002, 80.0


# --------------------------------------------------------------------------- VP

def vp_sigma(t: Tensor, beta_d: float = VP_BETA_D, beta_min: float = VP_BETA_MIN) -> Tensor:
    """sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1) (Karras et al. Table 1, VP)."""
    return torch.expm1(0.5 * beta_d * t ** 2 + beta_min * t).sqrt()


def vp_sigma_inv(sigma: Tensor, beta_d: float = VP_BETA_D, beta_min: float = VP_BETA_MIN) -> Tensor:
    """t(sigma) = (sqrt(beta_min^2 + 2 beta_d ln(sigma^2 + 1)) - beta_min) / beta_d (inverse of :func:`vp_sigma`)."""
    return ((beta_min ** 2 + 2 * beta_d * torch.log1p(sigma ** 2)).sqrt() - beta_min) / beta_d


class VPPrecond(Preconditioned):
    """Variance-preserving configuration (Song et al. 2021) as in Karras et al. 2022 Table 1; DPDM App. C."""

    def __init__(self, unet: nn.Module, beta_d: float = VP_BETA_D, beta_min: float = VP_BETA_MIN,
                 M: int = VP_M) -> None:
        super().__init__(unet)
        if not (beta_d > 0 and beta_min >= 0 and M >= 1):
            raise ValueError(f"VP needs beta_d > 0, beta_min >= 0, M >= 1; got {beta_d}, {beta_min}, {M}")
        self.beta_d, self.beta_min, self.M = float(beta_d), float(beta_min), int(M)

    def coefficients(self, sigma: Tensor) -> EDMCoefficients:
        return EDMCoefficients(c_skip=torch.ones_like(sigma), c_out=-sigma, c_in=(sigma ** 2 + 1).rsqrt(),
                               c_noise=(self.M - 1) * vp_sigma_inv(sigma, self.beta_d, self.beta_min))


def vp_sigma_sampler(beta_d: float = VP_BETA_D, beta_min: float = VP_BETA_MIN,
                     eps_t: float = VP_EPS_T) -> SigmaSampler:
    """sigma(t) with t ~ U(eps_t, 1) (Karras et al. Table 1, VP training distribution)."""
    if not 0 < eps_t < 1:
        raise ValueError(f"VP eps_t must be in (0, 1), got {eps_t}")

    def sample(n: int, generator: torch.Generator | None = None) -> Tensor:
        t = eps_t + (1 - eps_t) * torch.rand(n, generator=generator, dtype=torch.float64)
        return vp_sigma(t, beta_d, beta_min).float()

    return sample


# --------------------------------------------------------------------------- VE

class VEPrecond(Preconditioned):
    """Variance-exploding configuration (Song et al. 2021) as in Karras et al. 2022 Table 1; DPDM App. C."""

    def coefficients(self, sigma: Tensor) -> EDMCoefficients:
        return EDMCoefficients(c_skip=torch.ones_like(sigma), c_out=sigma, c_in=torch.ones_like(sigma),
                               c_noise=torch.log(0.5 * sigma))


def log_uniform_sigma_sampler(sigma_min: float = SIGMA_MIN, sigma_max: float = SIGMA_MAX) -> SigmaSampler:
    """ln sigma ~ U(ln sigma_min, ln sigma_max) (VE training distribution; DPDM App. C range)."""
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    lo, hi = math.log(sigma_min), math.log(sigma_max)

    def sample(n: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.exp(lo + (hi - lo) * torch.rand(n, generator=generator))

    return sample


# --------------------------------------------------------------------------- v-prediction

class VPredPrecond(Preconditioned):
    """v-prediction (Salimans & Ho 2022) in the VE convention, as DPDM App. C trains it.

    c_noise = (2/pi) arctan(sigma) is the cosine schedule's time t, whose sigma(t) = tan(pi t/2).
    """

    def coefficients(self, sigma: Tensor) -> EDMCoefficients:
        s2 = sigma ** 2 + 1
        return EDMCoefficients(c_skip=1 / s2, c_out=sigma * s2.rsqrt(), c_in=s2.rsqrt(),
                               c_noise=torch.atan(sigma) * (2 / math.pi))


def vpred_sigma_sampler(sigma_min: float = SIGMA_MIN, sigma_max: float = SIGMA_MAX) -> SigmaSampler:
    """sigma = tan(pi t / 2), t ~ U(t(sigma_min), t(sigma_max)): the cosine schedule restricted to
    [sigma_min, sigma_max] (DPDM App. C; equivalently log-SNR = -2 ln sigma in [-2 ln sigma_max, -2 ln sigma_min])."""
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    t_lo, t_hi = 2 / math.pi * math.atan(sigma_min), 2 / math.pi * math.atan(sigma_max)

    def sample(n: int, generator: torch.Generator | None = None) -> Tensor:
        t = t_lo + (t_hi - t_lo) * torch.rand(n, generator=generator, dtype=torch.float64)
        return torch.tan(0.5 * math.pi * t).float()

    return sample


# --------------------------------------------------------------------------- losses

def _weighted_draw_loss(weight: Callable[[Tensor], Tensor], model_fn: Callable[..., Tensor], x: Tensor,
                        sigma: Tensor, noise: Tensor, *cond: Tensor) -> Tensor:
    view = (-1,) + (1,) * (x.ndim - 1)
    denoised = model_fn(x + sigma.reshape(view) * noise, sigma, *cond)
    return weight(sigma) * (denoised - x).pow(2).flatten(1).sum(1)


def vp_draw_loss(model_fn: Callable[..., Tensor], x: Tensor, sigma: Tensor, noise: Tensor, *cond: Tensor) -> Tensor:
    """(1/sigma^2) ||D(x + sigma n; sigma) - x||^2 per draw (VP and VE weight, Karras et al. Table 1), shape ``[K]``.

    Same signature as :func:`pipeline.models.edm.edm_draw_loss`; summed over pixels.
    """
    return _weighted_draw_loss(lambda s: s.pow(-2), model_fn, x, sigma, noise, *cond)


#: VE uses the same weight 1/sigma^2 as VP (Karras et al. Table 1).
ve_draw_loss = vp_draw_loss


def vpred_draw_loss(model_fn: Callable[..., Tensor], x: Tensor, sigma: Tensor, noise: Tensor,
                    *cond: Tensor) -> Tensor:
    """((sigma^2 + 1)/sigma^2) ||D(x + sigma n; sigma) - x||^2 per draw (v-prediction, DPDM App. C), shape ``[K]``."""
    return _weighted_draw_loss(lambda s: (s ** 2 + 1) / s ** 2, model_fn, x, sigma, noise, *cond)


# --------------------------------------------------------------------------- the four configurations

#: name -> preconditioner class taking ``(unet, **precond_kwargs)``: the key a denoiser file records
#: (:mod:`pipeline.models.checkpoint` loads every one of them).
PRECONDITIONERS: dict[str, type[Preconditioned]] = {"edm": EDMPrecond, "vp": VPPrecond, "ve": VEPrecond,
                                                     "vpred": VPredPrecond}

@dataclass(frozen=True)
class Parameterisation:
    """One DPDM configuration: its denoiser class (a key of ``PRECONDITIONERS``), per-draw loss and sigma sampler."""

    name: str
    precond: str
    draw_loss: DrawLoss
    sigma_sampler: SigmaSampler

    def build(self, unet: nn.Module) -> nn.Module:
        """The denoiser around ``unet`` (with default arguments, as the training stage's file records none)."""
        return PRECONDITIONERS[self.precond](unet)


def parameterisation(name: str) -> Parameterisation:
    """The configuration ``name`` in edm | vpred | vp | ve with DPDM's default hyper-parameters (App. C)."""
    table = {
        "edm": lambda: Parameterisation("edm", "edm", edm_draw_loss, edm_sigma_sampler()),
        "vp": lambda: Parameterisation("vp", "vp", vp_draw_loss, vp_sigma_sampler()),
        "ve": lambda: Parameterisation("ve", "ve", ve_draw_loss, log_uniform_sigma_sampler()),
        "vpred": lambda: Parameterisation("vpred", "vpred", vpred_draw_loss, vpred_sigma_sampler()),
    }
    if name not in table:
        raise ValueError(f"unknown parameterisation {name!r} (known: {', '.join(table)})")
    return table[name]()

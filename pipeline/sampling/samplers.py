"""DPDM samplers: deterministic and stochastic DDIM, EDM Heun with churn, classifier-free guidance.

Every sampler is written once against the shared denoiser interface
``D(x, sigma, class_labels) -> x0_hat`` in the variance-exploding convention ``x = y + sigma n``
(:mod:`pipeline.models.checkpoint`; Karras et al. 2022, Table 1 write VP, VE, v-prediction and
EDM this way), so the same code samples any DPDM configuration (DPDM App. C). States move
along a decreasing noise grid sigma_0 = sigma_max > ... > sigma_{N-1} = sigma_min, then 0.

* :func:`ddim_sampler` -- DDIM (Song et al. 2021, eq. 12) in the VE variables. With eta = 0 it
  is the deterministic DDIM of DPDM Sec. 5 / F.4.3, which is *exactly* an Euler step of the
  probability-flow ODE dx/dsigma = (x - D(x; sigma)) / sigma (Karras et al. 2022, eq. 3 and
  Sec. 3: "DDIM = Euler in sigma"): x' = D + sigma'/sigma (x - D). eta = 1 is the ancestral
  (DDPM-like) step, eta in (0, 1) interpolates.
* :func:`stochastic_ddim_sampler` -- DPDM's "stochastic DDIM": Euler-Maruyama on the reverse-time
  SDE dx = -2 sigma score dsigma + sqrt(2 sigma) dW, i.e. x' = x + 2 dsigma (x - D)/sigma +
  sqrt(2 |dsigma| sigma) n (DPDM code ``samplers.ddim_sampler(stochastic=True)``; EMPDEN eq. 1 is
  the same update).
* :func:`edm_sampler` -- EDM's stochastic Heun sampler with churn (Karras et al. 2022, Alg. 2:
  S_churn, S_min, S_max, S_noise); S_churn = 0 is the deterministic Heun sampler (Alg. 1).
* :func:`guided` -- classifier-free guidance as DPDM uses it (Ho & Salimans 2021, eq. 6 on the
  denoiser): D_w(x; y) = (1 + w) D(x; y) - w D(x; empty), where "empty" is the extra label index
  ``num_classes`` the UNet was trained on by label dropout (:class:`pipeline.models.unet.UNetSpec`).
  w = 0 is the conditional model and w = -1 the unconditional one.

The DDIM samplers end with one denoising evaluation at sigma_min (x = D(x; sigma_min)), as DPDM's
code does; the EDM sampler's last step sigma_{N-1} -> 0 is an Euler step, which lands on the same
D(x_hat; sigma_hat). All randomness (initial latents, churn, SDE noise) comes from one seeded
CPU ``torch.Generator``, so a seed gives the same images on any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from pipeline import images, seeds
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.diffusion.steps import heun_step

#: D(x [B, C, H, W], sigma [B], class_labels [B] int64 or None) -> x0_hat [B, C, H, W]
Denoiser = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]

SAMPLERS = ("ddim", "stochastic_ddim", "edm")
GRIDS = ("edm", "vp")


# --------------------------------------------------------------------------------------------
# noise grids


def edm_sigmas(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> np.ndarray:
    """sigma_0 > ... > sigma_{N-1} = sigma_min, then 0: Karras et al. 2022 eq. 5 (DPDM's grid)."""
    return EDMSchedule(sigma_min=sigma_min, sigma_max=sigma_max, rho=rho, N=steps).times()


def vp_sigmas(steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, beta_d: float = 19.9,
              beta_min: float = 0.1) -> np.ndarray:
    """The VP/DDPM time grid in sigma, then 0 (Karras et al. 2022, Table 1, "VP" column).

    Uniform in the VP time t between t(sigma_max) and t(sigma_min) with
    sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1) (Song et al. 2021's VP SDE). DDIM on
    this grid is the original DDIM (Song et al. 2021) for a VP model, written in sigma.
    """
    _check_grid(steps, sigma_min, sigma_max)

    def t_of(sigma: float) -> float:  # inverse of sigma(t) (Karras et al. 2022, Table 1)
        return (math.sqrt(beta_min ** 2 + 2 * beta_d * math.log(sigma ** 2 + 1)) - beta_min) / beta_d

    t = np.linspace(t_of(sigma_max), t_of(sigma_min), steps)
    sigma = np.sqrt(np.expm1(0.5 * beta_d * t ** 2 + beta_min * t))
    return np.append(sigma, 0.0)


def _check_grid(steps: int, sigma_min: float, sigma_max: float) -> None:
    if steps < 2:
        raise ValueError(f"sampler needs steps >= 2 noise levels, got {steps}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"sampler needs 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class SamplerConfig:
    """One sampler and its settings; the field names are the papers' symbols.

    ``name``: ``ddim`` (eta = 0 deterministic, eta = 1 ancestral), ``stochastic_ddim`` (DPDM's
    Euler-Maruyama DDIM) or ``edm`` (Heun + churn, Karras et al. 2022 Alg. 2). ``steps`` is the
    number N of noise levels (DPDM samples with N = 50 and sigma in [0.002, 80], rho = 7).
    ``guidance`` is DPDM's guidance scale w (0 = plain conditional sampling). ``churn_limit``
    caps gamma_i; Karras et al. use sqrt(2) - 1, DPDM's code 1.
    """

    name: Literal["ddim", "stochastic_ddim", "edm"] = "ddim"
    steps: int = 50
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    grid: Literal["edm", "vp"] = "edm"
    eta: float = 0.0
    S_churn: float = 0.0
    S_min: float = 0.0
    S_max: float = float("inf")
    S_noise: float = 1.0
    churn_limit: float = math.sqrt(2) - 1
    guidance: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in SAMPLERS:
            raise ValueError(f"sampler name {self.name!r}: expected one of {', '.join(SAMPLERS)}")
        if self.grid not in GRIDS:
            raise ValueError(f"sampler grid {self.grid!r}: expected one of {', '.join(GRIDS)}")
        _check_grid(self.steps, self.sigma_min, self.sigma_max)
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"DDIM eta must be in [0, 1], got {self.eta}")
        if self.S_churn < 0 or self.S_noise < 0 or self.churn_limit < 0:
            raise ValueError(f"churn settings must be >= 0, got S_churn={self.S_churn}, S_noise={self.S_noise}, "
                             f"churn_limit={self.churn_limit}")
        if self.S_min > self.S_max:
            raise ValueError(f"churn window needs S_min <= S_max, got {self.S_min} > {self.S_max}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SamplerConfig:
        """Build from a JSON dict (``S_max: null`` means infinity); unknown keys are one-line errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"sampler: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        d = dict(params)
        if d.get("S_max", 0) is None:
            d["S_max"] = float("inf")
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if math.isinf(d["S_max"]):
            d["S_max"] = None
        return d

    def sigmas(self) -> np.ndarray:
        if self.grid == "vp":
            return vp_sigmas(self.steps, self.sigma_min, self.sigma_max)
        return edm_sigmas(self.steps, self.sigma_min, self.sigma_max, self.rho)

    def denoiser_evaluations(self) -> int:
        """Network evaluations per image (NFE), twice as many with guidance."""
        nfe = 2 * self.steps - 1 if self.name == "edm" else self.steps
        return nfe * (2 if self.guidance != 0 else 1)


# --------------------------------------------------------------------------------------------
# guidance


def guided(denoiser: Denoiser, w: float, num_classes: int) -> Denoiser:
    """Classifier-free guidance D_w = (1 + w) D(x; y) - w D(x; empty) (DPDM ``guidance_wrapper``).

    ``empty`` is the label index ``num_classes`` that label dropout trained as "no class".
    Returns ``denoiser`` itself for w = 0 (no extra evaluations). Both branches run as one batch.
    """
    if w == 0:
        return denoiser
    if num_classes < 1:
        raise ValueError("classifier-free guidance needs a class-conditional denoiser (num_classes >= 1)")

    def d_w(x: Tensor, sigma: Tensor, class_labels: Tensor | None) -> Tensor:
        if class_labels is None:
            raise ValueError("classifier-free guidance needs class labels")
        empty = torch.full_like(class_labels, num_classes)
        both = denoiser(torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([class_labels, empty]))
        cond, uncond = both.chunk(2)
        return (1 + w) * cond - w * uncond

    return d_w


# --------------------------------------------------------------------------------------------
# samplers


def _sigma_batch(x: Tensor, sigma: float) -> Tensor:
    return torch.full((x.shape[0],), sigma, dtype=x.dtype, device=x.device)


def _randn_like(x: Tensor, generator: torch.Generator | None) -> Tensor:
    # drawn on the (CPU) generator's device, then moved: the same seed gives the same images on any device
    device = generator.device if generator is not None else x.device
    return torch.randn(x.shape, generator=generator, dtype=x.dtype, device=device).to(x.device)


@torch.no_grad()
def ddim_sampler(denoiser: Denoiser, latents: Tensor, class_labels: Tensor | None, sigmas: np.ndarray, *,
                 eta: float = 0.0, generator: torch.Generator | None = None) -> Tensor:
    """DDIM (Song et al. 2021, eq. 12) from x = sigma_0 * latents along ``sigmas`` (ending in 0).

    In VE variables with eps_hat = (x - D) / sigma, one step sigma -> sigma' is
    x' = D + sqrt(sigma'^2 - c^2) eps_hat + c n, c = eta sigma' sqrt(1 - sigma'^2 / sigma^2)
    (DDIM's sigma_t(eta) divided by sqrt(alpha_{t-1})). eta = 0 gives x' = D + (sigma'/sigma)(x - D),
    an exact Euler step of the probability-flow ODE in sigma (Karras et al. 2022, eq. 3). The step to
    sigma' = 0 returns D(x; sigma_min).
    """
    x = latents * float(sigmas[0])
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        s, s_next = float(s), float(s_next)
        d = denoiser(x, _sigma_batch(x, s), class_labels).to(x.dtype)
        c = eta * s_next * math.sqrt(max(0.0, 1.0 - (s_next / s) ** 2))
        x = d + math.sqrt(max(0.0, s_next ** 2 - c ** 2)) * (x - d) / s
        if c > 0:
            x = x + c * _randn_like(x, generator)
    return x


@torch.no_grad()
def stochastic_ddim_sampler(denoiser: Denoiser, latents: Tensor, class_labels: Tensor | None, sigmas: np.ndarray, *,
                            generator: torch.Generator | None = None) -> Tensor:
    """DPDM's stochastic DDIM: Euler-Maruyama on the reverse-time SDE in sigma, then D(x; sigma_min).

    x' = x + 2 (sigma' - sigma) (x - D) / sigma + sqrt(2 |sigma' - sigma| sigma) n  (EMPDEN eq. 1;
    DPDM code ``ddim_sampler(stochastic=True)``). The last interval sigma_min -> 0 is the final
    denoising evaluation (an SDE step to 0 would overshoot). The update is
    :func:`pipeline.diffusion.steps.eq1_step` with dt = sigma - sigma' written in DPDM's operation
    order; the two orders differ in the last bits, and the released stochastic-DDIM samples were
    drawn with this one, so it is kept (routing it through ``eq1_step`` would change those numbers).
    """
    x = latents * float(sigmas[0])
    for s, s_next in zip(sigmas[:-2], sigmas[1:-1]):
        s, s_next = float(s), float(s_next)
        d = denoiser(x, _sigma_batch(x, s), class_labels).to(x.dtype)
        ds = s_next - s
        x = x + 2 * ds * (x - d) / s + math.sqrt(2 * abs(ds) * s) * _randn_like(x, generator)
    return denoiser(x, _sigma_batch(x, float(sigmas[-2])), class_labels).to(x.dtype)


@torch.no_grad()
def edm_sampler(denoiser: Denoiser, latents: Tensor, class_labels: Tensor | None, sigmas: np.ndarray, *,
                S_churn: float = 0.0, S_min: float = 0.0, S_max: float = float("inf"), S_noise: float = 1.0,
                churn_limit: float = math.sqrt(2) - 1, generator: torch.Generator | None = None) -> Tensor:
    """EDM stochastic sampler (Karras et al. 2022, Alg. 2) along ``sigmas`` (ending in 0).

    gamma_i = min(S_churn / N, churn_limit) if S_min <= sigma_i <= S_max else 0;
    sigma_hat = (1 + gamma_i) sigma_i; x_hat = x + sqrt(sigma_hat^2 - sigma_i^2) S_noise n; then a
    Heun step sigma_hat -> sigma_{i+1} (:func:`pipeline.diffusion.steps.heun_step`, Euler when
    sigma_{i+1} = 0). S_churn = 0 is Alg. 1.
    """
    n_steps = len(sigmas) - 1

    def denoise(x: Tensor, sigma: float) -> Tensor:
        return denoiser(x, _sigma_batch(x, sigma), class_labels)

    x = latents * float(sigmas[0])
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        s, s_next = float(s), float(s_next)
        gamma = min(S_churn / n_steps, churn_limit) if S_min <= s <= S_max else 0.0
        s_hat = s * (1 + gamma)
        if gamma > 0:
            x = x + math.sqrt(s_hat ** 2 - s ** 2) * S_noise * _randn_like(x, generator)
        x = heun_step(x, denoise, s_hat, s_next)
    return x


def sample(denoiser: Denoiser, latents: Tensor, class_labels: Tensor | None, config: SamplerConfig, *,
           num_classes: int = 0, generator: torch.Generator | None = None) -> Tensor:
    """Run ``config``'s sampler (with its guidance) from unit-variance ``latents``; returns x0 in data scale."""
    d = guided(denoiser, config.guidance, num_classes)
    sigmas = config.sigmas()
    if config.name == "ddim":
        return ddim_sampler(d, latents, class_labels, sigmas, eta=config.eta, generator=generator)
    if config.name == "stochastic_ddim":
        return stochastic_ddim_sampler(d, latents, class_labels, sigmas, generator=generator)
    return edm_sampler(d, latents, class_labels, sigmas, S_churn=config.S_churn, S_min=config.S_min,
                       S_max=config.S_max, S_noise=config.S_noise, churn_limit=config.churn_limit,
                       generator=generator)


# --------------------------------------------------------------------------------------------
# batched generation


def balanced_labels(n: int, num_classes: int) -> np.ndarray:
    """0, 1, ..., C-1, 0, 1, ...: every class count within one of n / C (-1s when unconditional)."""
    if num_classes < 1:
        return np.full(n, -1, dtype=np.int64)
    return np.arange(n, dtype=np.int64) % num_classes


def generate(denoiser: Denoiser, n: int, *, shape: tuple[int, int, int], config: SamplerConfig, num_classes: int,
             seed: int, batch_size: int = 256, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32,
             progress: Callable[[int], None] | None = None) -> tuple[Tensor, np.ndarray]:
    """n samples [n, C, H, W] (float, data scale, on the CPU) with balanced class labels.

    One CPU generator seeded with ``seed`` draws every latent and sampler noise in batch order,
    so (seed, batch_size) fixes the output. ``progress`` is called with each finished batch's size.
    """
    if n < 1 or batch_size < 1:
        raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    if config.guidance != 0 and num_classes < 1:
        raise ValueError(f"guidance scale {config.guidance} needs a class-conditional denoiser")
    labels = balanced_labels(n, num_classes)
    generator = seeds.torch_generator("dpdm.sampling", seed)
    out = []
    for start in range(0, n, batch_size):
        b = min(batch_size, n - start)
        latents = torch.randn((b, *shape), generator=generator, dtype=dtype).to(device)
        y = torch.as_tensor(labels[start:start + b], device=device) if num_classes > 0 else None
        out.append(sample(denoiser, latents, y, config, num_classes=num_classes, generator=generator).cpu())
        if progress is not None:
            progress(b)
    return torch.cat(out), labels


def to_uint8(x: Tensor) -> np.ndarray:
    """Data-scale images in [-1, 1] -> uint8 [0, 255] (the split format), clipping what the sampler overshoots."""
    return images.to_uint8(x, torch.float32)

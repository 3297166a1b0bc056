"""The denoiser interface every model file holds, and the conventions a file may store.

A trained network is saved with the *convention* its forward pass speaks
(:mod:`pipeline.models.checkpoint`), so a sampler never guesses what the time argument means:

* ``ve_sigma`` -- ``D(x, sigma, class_labels=None) -> y_hat`` on x = y + sigma n, the
  variance-exploding convention in which Karras et al. 2022 (Table 1) write VP, VE,
  v-prediction and EDM alike. Every :class:`Preconditioned` module speaks it, so DPDM's and
  EMPDEN's samplers are written once against it.
* ``rectified_flow_t`` -- ``v(x, t, class_labels=None) -> velocity`` on the straight path
  x_t = (1 - t) n + t y, t in [0, 1], t = 0 the NOISE end (rectified flow in STRAIGHTDP's
  convention, its eq. 1; :mod:`pipeline.flow.rectified`). Its samplers integrate dx/dt = v from
  0 to 1; it cannot be handed to a ``ve_sigma`` sampler.

A model class declares its convention with the class attribute ``convention``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

#: convention name -> what the module's forward computes (the value a denoiser file records)
CONVENTIONS: dict[str, str] = {
    "ve_sigma": "D(x, sigma, class_labels) -> y_hat, x = y + sigma n (Karras et al. 2022, Table 1)",
    "rectified_flow_t": "v(x, t, class_labels) -> dx/dt, x_t = (1 - t) n + t y, t in [0, 1], t = 0 the noise end "
                        "(rectified flow, STRAIGHTDP eq. 1)",
}
#: the convention of every preconditioner; also what a file written before conventions were recorded holds
VE_SIGMA = "ve_sigma"


@dataclass(frozen=True)
class EDMCoefficients:
    """c_skip, c_out, c_in, c_noise of D = c_skip x + c_out F(c_in x; c_noise) (Karras et al. 2022, Table 1)."""

    c_skip: Tensor
    c_out: Tensor
    c_in: Tensor
    c_noise: Tensor


def vmap_friendly_attention(module: nn.Module) -> nn.Module:
    """Give every diffusers ``Attention`` the classic matmul processor (same mathematics).

    The default processor calls ``F.scaled_dot_product_attention``, whose CPU flash kernel
    has no ``torch.func`` batching rule: under DP-SGD's ``vmap`` it falls back to a slow
    per-example loop. ``UNet2DModel`` has no ``set_attn_processor``, so each module is set.
    """
    from diffusers.models.attention_processor import AttnProcessor

    for sub in module.modules():
        if hasattr(sub, "set_processor"):
            sub.set_processor(AttnProcessor())
    return module


class Preconditioned(nn.Module, abc.ABC):
    """D(x; sigma, y) = c_skip x + c_out F(c_in x; c_noise, y) for the coefficients of a subclass.

    ``x`` is ``[B, C, H, W]`` in the data scale (images in [-1, 1]), ``sigma`` ``[B]`` (or a
    scalar), ``class_labels`` ``[B]`` int64 for a UNet built with ``num_class_embeds``.
    """

    convention: ClassVar[str] = VE_SIGMA

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = vmap_friendly_attention(unet)

    @abc.abstractmethod
    def coefficients(self, sigma: Tensor) -> EDMCoefficients:
        """c_skip, c_out, c_in, c_noise of this configuration (Karras et al. 2022, Table 1); each subclass defines it."""

    def forward(self, x: Tensor, sigma: Tensor, class_labels: Tensor | None = None) -> Tensor:
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
        if sigma.ndim == 0:
            sigma = sigma.expand(x.shape[0])
        c = self.coefficients(sigma)
        view = (-1,) + (1,) * (x.ndim - 1)
        f = self.unet(c.c_in.reshape(view) * x, c.c_noise, class_labels=class_labels).sample
        return c.c_skip.reshape(view) * x + c.c_out.reshape(view) * f

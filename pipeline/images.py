"""Image scales and shape adaptation shared by the data stage, the models and the evaluation networks.

Two scales: the split format stores uint8 pixels 0..255, every denoiser works on [-1, 1]
(the scale EDM's sigma_data = 0.5 assumes; Karras et al. 2022, Sec. 5). :func:`to_unit_scale`
and :func:`to_uint8` are the one conversion each way; the float dtype is a parameter because
callers differ on purpose (float64 for EMPDEN's exact empirical denoiser, float32 for networks)
and each call site's numbers depend on it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

#: a [-1, 1] image is (pixels / PIXEL_HALF_RANGE) - 1, pixels in 0..255
PIXEL_HALF_RANGE = 127.5


def to_unit_scale(images: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 pixels 0..255 (any shape) -> ``dtype`` in [-1, 1]: x = p / 127.5 - 1 (on the input's device)."""
    return torch.as_tensor(images).to(dtype) / PIXEL_HALF_RANGE - 1.0


def to_pixel_scale(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[-1, 1] -> the pixel grid a released image would have, as ``dtype`` 0., 1., ..., 255.

    Clipped to [-1, 1] first (a sampler overshoots, and a state still at sigma_min > 0 leaves
    [-1, 1]), then p = round((x + 1) 127.5), half to even. Clipping before or after rounding gives
    the same pixels, so this one order serves every caller.
    """
    return ((x.detach().to(dtype).clamp(-1.0, 1.0) + 1.0) * PIXEL_HALF_RANGE).round()


def to_uint8(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """[-1, 1] -> uint8 pixels (the split format) on the CPU, computed in ``dtype`` (:func:`to_pixel_scale`)."""
    return to_pixel_scale(x, dtype).to(torch.uint8).cpu().numpy()

#: ITU-R BT.601 luma weights for RGB → grey.
LUMA_BT601 = (0.299, 0.587, 0.114)


def adapt_images(x: torch.Tensor, in_shape: tuple[int, int, int]) -> torch.Tensor:
    """Bring uint8-scale images ``[B, C, H, W]`` to ``in_shape`` ``(C', H', W')``.

    Grey → RGB repeats the channel, RGB → grey takes the BT.601 luma; a different side
    length is resized bilinearly with antialiasing (what a downsampled training split
    looks like). Images already of the right shape pass through untouched.
    """
    c, h, w = in_shape
    if x.shape[1] != c:
        if x.shape[1] == 1 and c == 3:
            x = x.expand(-1, 3, -1, -1)
        elif x.shape[1] == 3 and c == 1:
            luma = torch.tensor(LUMA_BT601, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
            x = (x.float() * luma).sum(1, keepdim=True)
        else:
            raise ValueError(f"cannot convert {x.shape[1]}-channel images to {c} channels")
    if tuple(x.shape[2:]) != (h, w):
        x = F.interpolate(x.float(), size=(h, w), mode="bilinear", antialias=True, align_corners=False)
        x = x.round().clamp(0, 255)
    return x

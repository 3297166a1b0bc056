"""Image shape adaptation shared by the data stage and the evaluation networks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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

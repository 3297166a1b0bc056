"""Augmentation multiplicity's views: random translations and, optionally, horizontal flips of an image batch.

DP-Diffusion (Ghalebikesabi et al. 2023, after De et al. 2022's augmentation multiplicity) trains each
example on K augmented views, each with its own diffusion draw, averaging the K losses BEFORE the example's gradient
is clipped: the mechanism, its sensitivity C and its ledger line are those of plain DP-SGD
(:class:`pipeline.privacy.dpsgd.NoiseMultiplicity` with ``augment``). The views' parameters are drawn from the
engine's generator (public randomness), and a view is a function of its own example only.

Assumed (the paper's code is not public): random crops are translations by up to ``max_shift`` pixels each way with
edge-replicate padding (a crop of the padded image); flips are left-right and off by default (a flipped digit is not
a digit; CIFAR-10's presets may switch them on). The views are formed with two 0/1 selection matrices per view
(``rows @ x @ cols^T``), so they run under ``torch.func.vmap`` and on any device; written by hand because
torchvision's random transforms draw from torch's global generator, not the run's stream, one view at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _selection(source: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    """0/1 matrices ``[..., n, n]`` whose row i picks entry ``source[..., i]``."""
    return (source.unsqueeze(-1) == torch.arange(n, device=source.device)).to(dtype)


@dataclass(frozen=True)
class RandomShiftFlip:
    """Views translated by integers in [-max_shift, max_shift] (rows and columns) and, with ``flip``, mirrored
    left-right with probability 1/2 (an :class:`pipeline.privacy.dpsgd.Augmentation`)."""

    max_shift: int = 2
    flip: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.max_shift, int) and self.max_shift >= 0):
            raise ValueError(f"augmentation max_shift must be an integer >= 0, got {self.max_shift!r}")

    def draw(self, b: int, k: int, generator: torch.Generator | None) -> Tensor:
        """``[b, k, 3]``: row shift, column shift, flip (0 or 1) of each view."""
        s = self.max_shift
        shifts = torch.randint(-s, s + 1, (b, k, 2), generator=generator)
        flips = (torch.randint(0, 2, (b, k, 1), generator=generator) if self.flip
                 else torch.zeros((b, k, 1), dtype=shifts.dtype))
        return torch.cat([shifts, flips], dim=-1)

    def apply(self, x: Tensor, params: Tensor) -> Tensor:
        """The views ``[b, k, C, H, W]`` of ``x [b, C, H, W]``: pixel (i, j) of a view is x's pixel
        (clamp(i - dy), clamp(c(j) - dx)) with c(j) = W - 1 - j when flipped, else j."""
        h, w = x.shape[-2:]
        dy, dx, flip = params[..., 0:1], params[..., 1:2], params[..., 2:3]
        rows = torch.arange(h, device=x.device)
        cols = torch.arange(w, device=x.device)
        src_rows = (rows - dy).clamp(0, h - 1)                               # [b, k, H]
        src_cols = (torch.where(flip.bool(), w - 1 - cols, cols) - dx).clamp(0, w - 1)  # [b, k, W]
        r, c = _selection(src_rows, h, x.dtype), _selection(src_cols, w, x.dtype)  # [b, k, H, H], [b, k, W, W]
        # [b, k, 1, H, H] @ [b, 1, C, H, W] @ [b, k, 1, W, W]^T
        return r.unsqueeze(2) @ x.unsqueeze(1) @ c.unsqueeze(2).transpose(-1, -2)

"""The denoiser backbone: a diffusers ``UNet2DModel`` described by a small JSON-able spec.

Every trained network in the pipeline (public EDM pretraining for EMPDEN, DPDM's DP-SGD
training) is built from a :class:`UNetSpec`, so a checkpoint carries the exact spec it needs
to be rebuilt (:mod:`pipeline.models.checkpoint`). diffusers is used rather than a hand-written
UNet: it is the field's maintained implementation (DPDM and EDM use the same block types).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch stays unimported: config validation checks a UNetSpec before any job runs
    from torch import nn


@dataclass(frozen=True)
class UNetSpec:
    """Architecture of a ``UNet2DModel``; defaults are the embedded 16x16 grey model (~177k parameters).

    ``attention`` marks, per resolution level, whether the level has self-attention blocks
    (DPDM uses attention at 16x16 and 8x8 for 32x32 images). ``num_classes`` > 0 adds a class
    embedding (class-conditional model, DPDM Sec. 4; classifier-free guidance drops labels to
    the extra index ``num_classes``, so the embedding has ``num_classes + 1`` rows).
    """

    image_size: int = 16
    channels: int = 1
    block_out_channels: tuple[int, ...] = (16, 32)
    attention: tuple[bool, ...] = (False, True)
    layers_per_block: int = 1
    norm_num_groups: int = 8
    num_classes: int = 0
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if len(self.block_out_channels) != len(self.attention):
            raise ValueError(f"unet: block_out_channels {self.block_out_channels} and attention {self.attention} "
                             "need one entry per resolution level")
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ValueError(f"unet: every block_out_channels entry must be divisible by norm_num_groups="
                             f"{self.norm_num_groups}, got {self.block_out_channels}")
        if self.image_size % 2 ** (len(self.block_out_channels) - 1):
            raise ValueError(f"unet: image_size {self.image_size} is not divisible by 2^(levels-1) "
                             f"for {len(self.block_out_channels)} levels")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["block_out_channels"] = list(self.block_out_channels)
        d["attention"] = list(self.attention)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "UNetSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unet: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        d = dict(d)
        for k in ("block_out_channels", "attention"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


def build_unet(spec: UNetSpec) -> nn.Module:
    """A ``UNet2DModel`` for ``spec`` (weights initialised from torch's global RNG: seed it first)."""
    from diffusers import UNet2DModel

    down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in spec.attention)
    up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(spec.attention))
    kwargs: dict[str, Any] = dict(
        sample_size=spec.image_size, in_channels=spec.channels, out_channels=spec.channels,
        block_out_channels=spec.block_out_channels, layers_per_block=spec.layers_per_block,
        down_block_types=down, up_block_types=up, norm_num_groups=spec.norm_num_groups, dropout=spec.dropout,
    )
    if spec.num_classes > 0:
        kwargs["num_class_embeds"] = spec.num_classes + 1
    return UNet2DModel(**kwargs)


@dataclass(frozen=True)
class DiffusersUNetSpec:
    """A ``UNet2DModel`` of any architecture, described by its own diffusers config (``config.json``).

    The spec of a public denoiser the user brings (``pretrain.source: diffusers``,
    :mod:`pipeline.training.public`): its block types, widths and attention heads need not fit
    :class:`UNetSpec`, so the denoiser file keeps diffusers' whole config and rebuilds the network
    with ``UNet2DModel.from_config``.
    """

    config: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.config)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DiffusersUNetSpec":
        return cls(dict(d))


def build_diffusers_unet(spec: DiffusersUNetSpec) -> nn.Module:
    """The ``UNet2DModel`` of ``spec.config`` (fresh weights: a denoiser file loads its own over them)."""
    from diffusers import UNet2DModel

    return UNet2DModel.from_config(spec.config)

"""Tiny public models in the formats users bring, written by the libraries' own ``save_pretrained`` (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_unet(folder: Path, *, sample_size: int = 8, channels: int = 1, num_class_embeds: int | None = 4,
              block_out_channels: tuple[int, ...] = (8, 16), norm_num_groups: int = 4, seed: int = 0):
    """A small diffusers ``UNet2DModel`` (attention at the second level, as the pipeline's own UNets) saved to
    ``folder``; class-conditional with ``num_class_embeds`` rows (classes + the null label) unless None."""
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(sample_size=sample_size, in_channels=channels, out_channels=channels,
                       block_out_channels=block_out_channels, layers_per_block=1, norm_num_groups=norm_num_groups,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                       num_class_embeds=num_class_embeds)
    unet.save_pretrained(folder)
    return unet

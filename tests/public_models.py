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


def save_sd3(folder: Path, *, sample_size: int = 8, channels: int = 1, patch_size: int = 2, num_layers: int = 2,
             heads: int = 2, head_dim: int = 8, joint_attention_dim: int = 8, pooled_projection_dim: int = 6,
             pos_embed_max_size: int | None = 8, qk_norm: str | None = None,
             dual_attention_layers: tuple[int, ...] = (), seed: int = 0):
    """A small diffusers ``SD3Transformer2DModel`` (the class of SD3-medium's ``transformer/`` folder) saved to
    ``folder``; ``qk_norm``/``dual_attention_layers`` make it an SD3.5-style one."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(sample_size=sample_size, patch_size=patch_size, in_channels=channels,
                                  out_channels=channels, num_layers=num_layers, attention_head_dim=head_dim,
                                  num_attention_heads=heads, joint_attention_dim=joint_attention_dim,
                                  caption_projection_dim=heads * head_dim, pooled_projection_dim=pooled_projection_dim,
                                  pos_embed_max_size=pos_embed_max_size, qk_norm=qk_norm,
                                  dual_attention_layers=dual_attention_layers)
    model.save_pretrained(folder)
    return model


def save_label_tables(path: Path, *, n_classes: int, tokens: int = 3, joint_attention_dim: int = 8,
                      pooled_projection_dim: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random stand-ins for a text encoder's caption and pooled outputs, one row per class and the null row last."""
    from pipeline.flow.public import save_label_embeddings

    g = torch.Generator().manual_seed(seed)
    caption = torch.randn(n_classes + 1, tokens, joint_attention_dim, generator=g)
    pooled = torch.randn(n_classes + 1, pooled_projection_dim, generator=g)
    save_label_embeddings(path, caption, pooled)
    return caption, pooled

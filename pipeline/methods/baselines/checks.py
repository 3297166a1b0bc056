"""The baselines' checks of a whole configuration (:attr:`pipeline.plugins.Method.config_checks`): DP-LDM's latent
denoiser builds on its autoencoder's codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import ConfigError, check_unet


def config_checks(cfg: Mapping[str, Any]) -> None:
    """With DP-LDM chosen, ``baselines.dp_ldm.unet`` on its autoencoder's codes: H/4 x W/4
    (pipeline/flow/autoencoder.py), so the images' side must be a multiple of 4."""
    baselines = cfg["baselines"]
    if "dp_ldm" not in baselines.get("methods", ()):
        return
    image_size = int(cfg["data"]["image_size"])
    own, size = baselines["dp_ldm"], image_size // 4
    if image_size % 4:
        raise ConfigError(f"config error at baselines.dp_ldm: its autoencoder codes at H/4, so data.image_size "
                          f"must be a multiple of 4, got {image_size}")
    check_unet(cfg, "baselines.dp_ldm", own["unet"], size=size, channels=own["autoencoder"]["code_channels"],
               note=f" (codes of {size} x {size})")

"""DPDM's checks of a whole configuration (:attr:`pipeline.plugins.Method.config_checks`): its UNet builds at the
data's resolution and its Poisson sampling rate is at most 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import ConfigError, check_unet


def config_checks(cfg: Mapping[str, Any]) -> None:
    """``dpdm.unet`` at the data's size; ``dpdm.batch_size`` at most the declared private set (q = B / N <= 1)."""
    dpdm, n = cfg["dpdm"], cfg["data"]["private"]["n_private_train"]
    check_unet(cfg, "dpdm", dpdm.get("unet"))
    if n and dpdm["batch_size"] > n:
        raise ConfigError(f"config error at dpdm.batch_size: expected at most data.private.n_private_train={n} (the "
                          f"sampling rate q = batch_size / N must be <= 1), got {dpdm['batch_size']}")

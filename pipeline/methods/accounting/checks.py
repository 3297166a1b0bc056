"""The accounting's checks of a whole configuration (:attr:`pipeline.plugins.Method.config_checks`): every subsample
size it accounts for fits the private set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import ConfigError


def private_records(cfg: Mapping[str, Any]) -> int | None:
    """The n an EMPDEN block subsamples from: ``accounting.n``, else ``data.private.n_private_train`` (None: the whole
    train split of a dataset on disk, whose size only the data stage knows)."""
    return cfg["accounting"].get("n") or cfg["data"]["private"]["n_private_train"]


def check_subset_sizes(cfg: Mapping[str, Any], sizes: list[tuple[str, int]]) -> None:
    """Each (config key, B) of ``sizes`` is at most the private set's n; a one-line error naming the key otherwise."""
    n = private_records(cfg)
    if n is None:
        return
    for where, B in sizes:
        if B > n:
            raise ConfigError(f"config error at {where}: subset size B={B} exceeds the private set size n={n}")


def config_checks(cfg: Mapping[str, Any]) -> None:
    """``accounting.B``: every subsample size of the accounting grid fits the private set."""
    check_subset_sizes(cfg, [("accounting.B", int(b)) for b in cfg["accounting"].get("B") or []])

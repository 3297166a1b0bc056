"""EMPDEN's checks of a whole configuration (:attr:`pipeline.plugins.Method.config_checks`): its subsample sizes fit
the private set, and its sampling shards split a cell into whole batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import ConfigError
from pipeline.methods.accounting.checks import check_subset_sizes
from pipeline.shards import check_shards


def subset_sizes(cfg: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(config key, B) of every subsample size the sampling grids ask for."""
    emp = cfg["empden"]
    out = [(f"empden.grid[{i}].B", int(b)) for i, grid in enumerate(emp.get("grid") or []) for b in grid["B"]]
    for key in ("beta_ablation", "repeated_seeds", "figure2"):
        if emp.get(key):
            out.append((f"empden.{key}.B", int(emp[key]["B"])))
    return out


def config_checks(cfg: Mapping[str, Any]) -> None:
    """Every B of the grids is at most the private set's n; ``sampling.shards`` against a cell's batches (a shard
    samples whole batches)."""
    check_subset_sizes(cfg, subset_sizes(cfg))
    if cfg["sampling"]["shards"] == 1:
        return
    empden = cfg["empden"]
    try:
        check_shards(cfg["sampling"]["shards"], empden["n_out"] or cfg["accounting"]["N_out"], empden["batch_size"])
    except ValueError as exc:
        raise ConfigError(f"config error at sampling.shards: {exc}") from None

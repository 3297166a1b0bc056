"""STRAIGHTDP's inputs from outside the results tree (:attr:`pipeline.plugins.Method.input_checks`): its public set,
and the public flow a user brings, checked before any job is scheduled (:mod:`pipeline.inputs`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.data import layout


def input_checks(cfg: Mapping[str, Any]) -> list[tuple[str, Callable[[], object]]]:
    """(config key, check) of ``straightdp.public`` and, when it is imported (``straightdp.pretrain.source``
    diffusers), the public flow's folder."""
    checks = [layout.public_section_check("straightdp.public", cfg["straightdp"]["public"], cfg["data"]["data_root"])]
    if cfg["straightdp"]["pretrain"].get("source") == "diffusers":
        checks.append(("straightdp.pretrain.path", lambda: _public_flow(cfg)))
    return checks


def _public_flow(cfg: Mapping[str, Any]) -> None:
    from pipeline.config import declared_private
    from pipeline.flow.public import check_public_flow  # torch: only when a public flow is imported
    from pipeline.methods.straightdp.wiring import sample_shape

    c, side, _ = sample_shape(cfg, cfg["straightdp"])
    check_public_flow(cfg["straightdp"]["pretrain"], shape=(c, side, side),
                      n_classes=declared_private(cfg)["n_classes"])


def prepare_config(config: dict[str, Any]) -> None:
    """Remove the arms set to null: a later config file switches an arm of an earlier one off this way, because files
    merge key by key (an empty ``arms: {}`` cannot remove what config.yaml set)."""
    arms = (config.get("straightdp") or {}).get("arms")
    if isinstance(arms, dict):
        for name in [name for name, arm in arms.items() if arm is None]:
            del arms[name]

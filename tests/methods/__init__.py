"""Specifications of every method's wiring (pipeline/methods/<method>/wiring.py) over the House of config.yaml."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import validate_config
from pipeline.wiring import House

ROOT = Path(__file__).parents[2]


def house(tmp_path: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> House:
    """The House of config.yaml with its results under ``tmp_path``, edited in place by ``edit`` first."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "r")
    if edit:
        edit(cfg)
    return House.from_config(validate_config(cfg))

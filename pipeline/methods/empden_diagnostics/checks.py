"""The proxy diagnostics' inputs from outside the results tree (:attr:`pipeline.plugins.Method.input_checks`): the
zero-shot CLIP checkpoint of EMPDEN's detector, when one is configured (:mod:`pipeline.inputs`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def input_checks(cfg: Mapping[str, Any]) -> list[tuple[str, Callable[[], object]]]:
    """(config key, check) of ``empden_diagnostics.clip.checkpoint``: used only when both its model and its
    checkpoint are set."""
    zero_shot = cfg["empden_diagnostics"]["clip"]
    if zero_shot["model"] and zero_shot["checkpoint"]:
        return [("empden_diagnostics.clip.checkpoint", lambda: _zero_shot_checkpoint(zero_shot))]
    return []


def _zero_shot_checkpoint(clip: Mapping[str, Any]) -> None:
    from pipeline.diagnostics.classifiers import zero_shot_checkpoint  # torch: only when CLIP is configured

    zero_shot_checkpoint(clip["checkpoint"], clip["class_names"] or [])

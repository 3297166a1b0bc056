"""The methods, each a plug-in: ``pipeline/methods/<method>.py`` lists the stages the method owns.

A method module holds one dict, ``STAGES``: stage name -> ``"module:attribute"`` of the stage
object (:func:`pipeline.stage.stage`), the command ``python -m pipeline <stage>`` that its rules
in ``rules/<method>.smk`` run. :mod:`pipeline.cli` finds every module here by itself, so a new
method adds a module and edits no list. The modules hold strings only: stages are imported when
run, and ``python -m pipeline --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil

#: stage name -> "module:attribute"
Stages = dict[str, str]


def method_names() -> list[str]:
    """Every method module of this package, sorted by name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def method_stages() -> dict[str, Stages]:
    """Method -> the stages it registers, from each module's ``STAGES``."""
    return {name: dict(importlib.import_module(f"{__name__}.{name}").STAGES) for name in method_names()}


def merge_stages(core: Stages, methods: dict[str, Stages]) -> Stages:
    """``core`` followed by every method's stages; a stage name claimed twice is a programming error."""
    merged = dict(core)
    owner = {name: "core" for name in core}
    for method, stages in methods.items():
        for name, target in stages.items():
            if name in merged:
                raise RuntimeError(f"stage {name!r} of method {method!r} is already registered by {owner[name]!r}")
            merged[name], owner[name] = target, method
    return merged

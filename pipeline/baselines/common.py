"""What every baseline stage starts with: its config section, its run, its device."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.baselines.runs import BaselineRun
from pipeline.device import resolve_device
from pipeline.io import Split, load_split
from pipeline.stage import PipelineError


def baseline_section(params: Mapping[str, Any], method: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the baselines section, its ``method`` subsection) of a stage's params, schema defaults filled."""
    from pipeline.config import deep_merge, schema_defaults

    section = deep_merge(schema_defaults("baselines"), dict(params.get("baselines", {})))
    return section, dict(section[method])


def baseline_run(params: Mapping[str, Any], method: str) -> BaselineRun:
    """The run of ``params.run``; a missing name, a bad one or another method's is a one-line error."""
    try:
        run = BaselineRun.from_name(str(params["run"]))
    except KeyError:
        raise PipelineError(f"param run (the run's name, e.g. {method}_eps1_seed0) is required") from None
    except ValueError as exc:
        raise PipelineError(f"param run: {exc}") from None
    if run.method != method:
        raise PipelineError(f"param run: {run.name} is a {run.method} run, this stage runs {method}")
    return run


def stage_device(params: Mapping[str, Any]) -> torch.device:
    """The device of params ``device``; on the CPU, torch's threads set from params ``threads``."""
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    return device


def baseline_setup(params: Mapping[str, Any], method: str
                   ) -> tuple[dict[str, Any], dict[str, Any], BaselineRun, torch.device]:
    """(section, method subsection, run, device) of a baseline stage; CPU threads set from params."""
    section, cfg = baseline_section(params, method)
    return section, cfg, baseline_run(params, method), stage_device(params)


def load_public_like(path: str | Path, private: Split) -> Split:
    """The public split at ``path``; a missing file or images of another shape than the private ones is one line."""
    try:
        public = load_split(path)
    except (FileNotFoundError, ValueError) as exc:
        raise PipelineError(f"input public: {exc}") from None
    if public.images.shape[1:] != private.images.shape[1:]:
        raise PipelineError(f"input public: images {list(public.images.shape[1:])} differ from the private "
                            f"{list(private.images.shape[1:])}")
    return public

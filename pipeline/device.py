"""Where tensors live: the config's ``device`` string turned into a ``torch.device``.

``device: auto`` (the default) runs on the first visible GPU and falls back to the CPU, so
one config serves laptops and clusters; an explicit ``cuda``/``cuda:N`` on a machine
without that GPU is a user error (one line), never a silent fallback that would make a
paper-scale run take days on the CPU.
"""

from __future__ import annotations

import re

import torch

from pipeline.stage import PipelineError

_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` if available else ``cpu``; ``"cpu"``; ``"cuda"``/``"cuda:N"``.

    Raises :class:`PipelineError` when a CUDA device is asked for but is not there.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA.fullmatch(name)
    if match is None:
        raise PipelineError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise PipelineError(f"device {name!r}: CUDA is not available on this machine (use device: auto or cpu)")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise PipelineError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device(name)

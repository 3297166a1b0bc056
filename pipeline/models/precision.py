"""Mixed precision for public (non-private) training and for sampling: config ``precision: fp32 | bf16``.

``bf16`` runs the networks' forward passes under :func:`torch.autocast` in bfloat16 (Micikevicius et al. 2018's
mixed precision; bfloat16 keeps float32's exponent range, so no loss scaling is needed): the weights, their
gradients, the optimiser's moments, the EMA and every sampler's state stay float32, the matmuls and convolutions run
in bfloat16 (the tensor cores' 2x over TF32), the losses are reduced in float32. ``fp32`` (the default) runs exactly
the code as before, no autocast context at all, so its numbers and config ids do not move.

DP-SGD never runs under it: a per-example norm computed in bfloat16 (8 bits of mantissa) can come out below the true
norm, and the clipped contribution then above C, which the noise is not calibrated for. The private stages take no
``precision`` param (:func:`refuse_in_private_training`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ContextManager

import torch

from pipeline.stage import PipelineError

PRECISIONS = ("fp32", "bf16")
PARAM_DOC = "optional: fp32 (default) | bf16, torch.autocast for the network's forward passes (config precision)"


def precision_of(params: Mapping[str, Any], stage: str) -> str:
    """The ``precision`` param of ``stage`` (default fp32), checked."""
    value = str(params.get("precision", "fp32"))
    if value not in PRECISIONS:
        raise PipelineError(f"{stage}: param precision must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


def recorded(precision: str) -> dict[str, str]:
    """What a run records of its precision in its resume hash and model meta: nothing for fp32 (a float32 run resumes
    and writes what it did before mixed precision existed), ``{"precision": ...}`` otherwise."""
    return {} if precision == "fp32" else {"precision": precision}


def autocast(device: torch.device | str, precision: str) -> ContextManager[Any]:
    """The forward passes' context: bfloat16 autocast on ``device``'s type for ``bf16``, nothing for ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    raise PipelineError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def in_precision(fn: Callable[..., torch.Tensor], device: torch.device | str,
                 precision: str) -> Callable[..., torch.Tensor]:
    """``fn`` (a network call) run under :func:`autocast`, its output back in float32 (a sampler's state stays
    float32); ``fn`` itself for fp32."""
    if precision == "fp32":
        return fn

    def call(*args: Any, **kwargs: Any) -> torch.Tensor:
        with autocast(device, precision):
            out = fn(*args, **kwargs)
        return out.float()

    return call


def refuse_in_private_training(params: Mapping[str, Any], stage: str) -> None:
    """A DP-SGD stage given ``precision`` stops in one line (the module docstring says why)."""
    if params.get("precision", "fp32") != "fp32":
        raise PipelineError(f"{stage}: DP-SGD runs in float32 only (a bfloat16 per-example norm can fall below the "
                            f"true norm and a clipped contribution exceed C); got precision={params['precision']!r}")

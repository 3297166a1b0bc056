"""Gradient accumulation: a configured batch reached over micro-batches that fit the GPU, as EDM's ``batch_gpu``.

A training step's gradient is that of the batch's mean loss. When the batch's activations do not fit
(the plan's micro-batch, :func:`pipeline.resources.memory_plan`), the batch is split into near-equal
micro-batches and each one's summed loss, divided by the whole batch's size, is back-propagated in turn:
the gradients add up to the one-pass gradient (up to float rounding), and only one micro-batch's
activations are held at a time. Every random draw of the step (noise levels, noise, label dropout) is
made for the whole batch before the split, so the draws do not depend on the micro-batch. Random draws
*inside* the network (dropout) are made per micro-batch from the global generator, so with dropout the
masks differ from a one-pass step's (equally distributed; the result is not bit-identical).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def micro_slices(batch: int, micro_batch: int | None) -> list[slice]:
    """``batch`` examples in near-equal consecutive slices of at most ``micro_batch`` (one slice when None)."""
    if micro_batch is None or micro_batch >= batch:
        return [slice(0, batch)]
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    parts = -(-batch // micro_batch)
    bounds = [round(i * batch / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def accumulate_backward(losses_of: Callable[[slice], Tensor], batch: int, micro_batch: int | None) -> float:
    """Back-propagate the mean over ``batch`` examples of ``losses_of(s)`` (the per-example losses of slice ``s``),
    one micro-batch at a time; returns the mean loss. Gradients are added to ``.grad`` (zero them before).

    One slice keeps the one-pass expression (``losses.mean().backward()``), so a batch that fits runs exactly
    the computation it ran before accumulation existed.
    """
    if len(micro_slices(batch, micro_batch)) == 1:
        loss = losses_of(slice(0, batch)).mean()
        loss.backward()
        return loss.item()
    return backward_in_parts(losses_of, batch, micro_batch, divisor=batch) / batch


def backward_in_parts(losses_of: Callable[[slice], Tensor], n: int, micro_batch: int | None, *,
                      divisor: float) -> float:
    """Back-propagate ``sum(losses_of(s)) / divisor`` over the micro-batches of ``n`` examples, one at a time; returns
    the summed loss. For a step whose batch has several parts with losses of their own (a distillation's field rows
    and replay rows), each part is passed in turn with the whole batch's size as ``divisor``."""
    total = 0.0
    for s in micro_slices(n, micro_batch):
        part = losses_of(s).sum()
        (part / divisor).backward()
        total += part.item()
    return total

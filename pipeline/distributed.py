"""Data-parallel processes for DP-SGD: one process per GPU (NCCL), or per CPU slot (gloo), launched by torchrun.

A training rule whose ``gpu`` resource is N > 1 calls its stage as ``python -m pipeline --nproc N STAGE ...``;
the command line replaces itself with ``python -m torch.distributed.run --standalone --nproc-per-node N -m
pipeline STAGE ...`` (:func:`pipeline.launch.launch_argv`), which starts N copies of the stage with ``RANK``, ``WORLD_SIZE``
and ``LOCAL_RANK`` in their environment. The stage joins the process group with :func:`data_parallel`:
NCCL and ``cuda:LOCAL_RANK`` when the stage's device is CUDA, gloo on the CPU (how the tests run two
processes on a machine without a GPU).

What each rank does in DP-SGD (:class:`pipeline.privacy.dpsgd.DPSGD`): every rank draws the SAME logical batch
and the same diffusion draws from the run's one named stream (so the sample is the one Poisson sample over
the global dataset that the ledger line accounts for), computes the clipped sums of its share of the
micro-batches, and the shares are summed by one all-reduce; rank 0 adds the Gaussian noise once, before the
sum. Only rank 0 writes checkpoints and outputs (:func:`is_main`); a stop signal seen by any rank stops
every rank after the same step (:func:`any_rank`).

torch.distributed does the communication; what is written here is only the glue the stages share.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipeline.device import resolve_device
from pipeline.launch import launched_size
from pipeline.stage import PipelineError


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel processes (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def current() -> World:
    """The world of the initialised default process group, else a single process."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def is_main() -> bool:
    """Whether this process writes checkpoints and outputs (rank 0, or the only process)."""
    return current().main


def _collective_device() -> torch.device:
    """Where a collective's tensors must live: this rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def data_parallel(device_name: str) -> Iterator[tuple[World, torch.device]]:
    """Join the process group torchrun describes and yield (world, this rank's device).

    Outside torchrun (``WORLD_SIZE`` unset or 1) nothing is initialised: (rank 0 of 1, the resolved device).
    Under torchrun a CUDA device becomes ``cuda:LOCAL_RANK`` with NCCL (a one-line error when the node has
    fewer GPUs than processes), a CPU device stays the CPU with gloo. The group is destroyed on the way out.
    """
    size = launched_size()
    device = resolve_device(device_name)
    if size <= 1:
        yield World(), device
        return
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise PipelineError(f"{size} data-parallel processes but only {torch.cuda.device_count()} CUDA "
                                f"device(s) visible (gpus must not exceed the node's GPUs)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    try:
        yield current(), device
    finally:
        dist.destroy_process_group()


def all_reduce_sum(tensors: Sequence[Tensor]) -> None:
    """Sum ``tensors`` over the ranks, in place, with ONE collective (flattened into one buffer)."""
    if current().size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank must call it; a single process returns ``flag``)."""
    if current().size == 1:
        return flag
    t = torch.tensor([int(flag)], device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_module(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (the ranks must start DP-SGD from the same weights)."""
    if current().size == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


#: what :func:`gather_ordered` gathers per index: a tensor or a tuple of tensors
Part = TypeVar("Part", Tensor, tuple[Tensor, ...])


def _on_cpu(part: Part) -> Part:
    return tuple(t.detach().cpu() for t in part) if isinstance(part, tuple) else part.detach().cpu()


def gather_ordered(parts: Mapping[int, Part]) -> list[Part]:
    """Every rank's ``{index: part}`` gathered on every rank (ONE collective), as one list in index order
    (diagnostics; on the CPU when gathered from several ranks)."""
    if current().size == 1:
        return [parts[k] for k in sorted(parts)]
    gathered: list[dict[int, Part] | None] = [None] * current().size
    dist.all_gather_object(gathered, {k: _on_cpu(v) for k, v in parts.items()})
    merged = {k: v for g in gathered for k, v in (g or {}).items()}
    return [merged[k] for k in sorted(merged)]

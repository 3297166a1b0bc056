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
every rank after the same step (:func:`any_rank`). What a stage chooses by itself before its first private step
(a plan picked from public gradients, a horizon) is rank 0's on every rank, and every rank's own choice is
checked against it (:func:`agree_with_rank0`), so the mechanism every rank runs is the one rank 0's ledger line
certifies.

torch.distributed does the communication; what is written here is only the glue the stages share.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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


def _field_texts(decision: Mapping[str, Any], what: str) -> dict[str, str]:
    """Each field of ``decision`` as canonical JSON text (the form :func:`agree_with_rank0` compares)."""
    texts = {}
    for field, value in decision.items():
        try:
            # allow_nan=False: NaN equals nothing, so a decision holding one could never be found equal
            texts[str(field)] = json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PipelineError(f"{what}: field {field} = {value!r} is not a finite JSON value ({exc})") from None
    return texts


def agree_with_rank0(decision: Mapping[str, Any], *, what: str) -> Mapping[str, Any]:
    """Rank 0's ``decision`` on every rank, after checking every rank's own ``decision`` against it field by field.

    For what a data-parallel stage chooses by itself before its first private step (a plan picked from public
    gradients, a horizon, a hyperparameter): every rank computes its own, but the noise rank 0 adds and the
    ledger line rank 0 writes describe rank 0's, so a rank that used another (a clip C_k of its own) would break
    the certificate. On CUDA, nondeterministic kernels can make ranks that ran the same code on the same inputs
    choose differently; the gloo tests on the CPU cannot, so the check must be in the run itself.

    ``decision`` maps field names to JSON values (numbers, strings, lists, dicts; no NaN or inf). Fields are
    compared as canonical JSON text: exactly (Python writes a float as the shortest text that reads back to the
    same bits, so equal text is equal bits) and with their types (3 and 3.0 differ). A rank whose decision
    differs from rank 0's stops EVERY rank: one ``all_gather_object`` brings every rank's fields to every rank,
    each rank makes the same comparison and raises the same one-line :class:`PipelineError`, naming the first
    differing rank, its first differing field (in rank 0's order) and both values; no rank is left waiting in a
    later collective for one that stopped. A decision that is not JSON-able stops every rank the same way. Every
    rank must call it, at the same point of the stage.

    Returns rank 0's decision as rank 0 passed it (on rank 0, ``decision`` itself). In one process nothing is
    communicated and ``decision`` itself is returned; it is still checked to be JSON-able, so a single-process
    test catches a decision that several processes could not compare.
    """
    world = current()
    try:
        mine, error = _field_texts(decision, what), None
    except PipelineError as exc:
        if world.size == 1:
            raise
        mine, error = {}, f"rank {world.rank}'s {exc}"
    if world.size == 1:
        return decision
    # a rank's JSON texts always pickle; rank 0 also sends its decision itself, which the others return
    payload = (mine, error, dict(decision) if world.main and error is None else None)
    gathered: list[Any] = [None] * world.size
    dist.all_gather_object(gathered, payload)
    errors = [e for _, e, _ in gathered if e is not None]
    if errors:
        raise PipelineError(errors[0])
    ref = gathered[0][0]
    for rank in range(1, world.size):
        theirs = gathered[rank][0]
        differ = [f for f in [*ref, *(f for f in theirs if f not in ref)] if ref.get(f) != theirs.get(f)]
        if differ:
            first, missing = differ[0], "(missing)"
            also = f" (also differ: {', '.join(differ[1:])})" if len(differ) > 1 else ""
            raise PipelineError(f"{what}: rank {rank}'s {first} = {theirs.get(first, missing)} differs from rank "
                                f"0's {first} = {ref.get(first, missing)}{also}; every data-parallel rank must use "
                                f"rank 0's, so every rank stops here")
    return decision if world.main else gathered[0][2]


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

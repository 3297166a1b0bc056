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
from typing import Any

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


def gather_ordered(parts: Mapping[int, Tensor], *, n_parts: int, width: int, dtype: torch.dtype) -> Tensor:
    """Every rank's rows, on every rank, as one ``[rows, width]`` tensor in index order (diagnostics).

    ``parts`` is this rank's ``{index: rows [n, width] of dtype}``, each index in ``range(n_parts)`` and held by at
    most one rank (DP-SGD: micro-batch j's per-example norms and losses, j on rank j mod N). The result is the
    parts in ascending index, each part's rows in their own order (the single process's order); an index no rank
    holds is absent. Every rank must call it with the same ``n_parts``, ``width`` and ``dtype`` (a rank that holds
    nothing cannot read them off its parts).

    Two tensor collectives on the collective device (the rank's GPU under NCCL, the CPU under gloo), no pickling:
    one ``all_gather`` of each rank's row count per index (``n_parts + 1`` integers, -1 where it holds none, the
    last one flagging a malformed ``parts``), then one ``all_gather`` of each rank's rows, concatenated in its index
    order and padded to the largest rank's count. Every rank sees the same counts, so a malformed ``parts`` on any
    rank, or an index held by two, raises a one-line :class:`PipelineError` on every rank before the rows are sent
    (naming the rank; that rank's own line also says what was wrong). In one process nothing is communicated: the
    parts concatenated in index order where they are (a ``[0, width]`` tensor on the CPU if none).
    """
    bad = next((f"index {k}: rows of shape {tuple(v.shape)}, dtype {v.dtype}" for k, v in parts.items()
                if not 0 <= k < n_parts or v.dim() != 2 or v.shape[1] != width or v.dtype != dtype), None)
    world = current()
    if world.size == 1:
        if bad is not None:
            raise PipelineError(f"gather_ordered: {bad} (expected indices in range({n_parts}), [n, {width}] {dtype})")
        return torch.cat([parts[k] for k in sorted(parts)]) if parts else torch.zeros(0, width, dtype=dtype)
    device = _collective_device()
    counts = torch.full((n_parts + 1,), -1, dtype=torch.int64)
    counts[n_parts] = int(bad is not None)
    if bad is None:
        for k, v in parts.items():
            counts[k] = v.shape[0]
    counts = counts.to(device)
    every = [torch.empty_like(counts) for _ in range(world.size)]
    dist.all_gather(every, counts)
    table = torch.stack(every).cpu()  # [ranks, n_parts + 1]
    if bool(table[:, n_parts].any()):
        rank = int(table[:, n_parts].nonzero()[0])
        raise PipelineError(f"gather_ordered: rank {rank}'s parts are not indices in range({n_parts}) with "
                            f"[n, {width}] rows of {dtype}" + (f" ({bad})" if rank == world.rank else ""))
    held = (table[:, :n_parts] >= 0).sum(0)
    if bool((held > 1).any()):
        k = int((held > 1).nonzero()[0])
        raise PipelineError(f"gather_ordered: index {k} is held by ranks "
                            f"{(table[:, k] >= 0).nonzero().flatten().tolist()}")
    sizes = table[:, :n_parts].clamp(min=0)
    starts = (sizes.cumsum(1) - sizes).tolist()  # rank r's rows: its parts in ascending index, back to back
    longest = int(sizes.sum(1).max())
    if longest == 0:
        return torch.zeros(0, width, dtype=dtype, device=device)
    padded = torch.zeros(longest, width, dtype=dtype, device=device)
    if parts:
        mine = torch.cat([parts[k] for k in sorted(parts)]).to(device)
        padded[:mine.shape[0]] = mine
    gathered = [torch.empty_like(padded) for _ in range(world.size)]
    dist.all_gather(gathered, padded)
    owner, count = (table[:, :n_parts] >= 0).int().argmax(0).tolist(), table[:, :n_parts].max(0).values.tolist()
    return torch.cat([gathered[r][starts[r][k]:starts[r][k] + count[k]]
                      for k, r in enumerate(owner) if count[k] >= 0])

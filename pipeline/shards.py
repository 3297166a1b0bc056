"""``sampling.shards``: a run's outputs split over S jobs (scatter), joined again by one job (gather).

The unit is a *chunk*: a batch of ``batch_size`` outputs, sampled at once and drawing from its own
generator keyed by the chunk's index in the run (``seeds`` stream ``empden.chunk``). Shard ``k`` of
``S`` samples chunks ``[floor(k C / S), floor((k + 1) C / S))`` of the run's ``C = ceil(n_out /
batch_size)``, so a chunk's inputs and draws are the same whichever job samples it, and S = 1 and
S = 3 write bit-equal samples (on one kind of device: a batch of the same inputs takes the same
kernels). Chunks rather than single outputs are the unit because a batched network call is not
bit-for-bit the same as the same rows called alone.

Plain arithmetic; which stages read it: :mod:`pipeline.methods.empden.sample_stage` (EMPDEN's cells).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def n_chunks(n_out: int, batch_size: int) -> int:
    """Chunks of a run of ``n_out`` outputs at ``batch_size`` outputs per chunk."""
    if n_out < 1 or batch_size < 1:
        raise ValueError(f"need n_out >= 1 and batch_size >= 1, got {n_out}, {batch_size}")
    return math.ceil(n_out / batch_size)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``of`` shards of one run."""

    index: int
    of: int

    def __post_init__(self) -> None:
        for name in ("index", "of"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"shard {name} must be an integer, got {value!r}")
        if self.of < 1 or not 0 <= self.index < self.of:
            raise ValueError(f"shard index must be in [0, {self.of}) of {self.of} >= 1 shards, got {self.index}")

    def chunks(self, n_out: int, batch_size: int) -> range:
        """The run's chunks this shard samples; refused when a shard would get none."""
        c = n_chunks(n_out, batch_size)
        check_shards(self.of, n_out, batch_size)
        return range(self.index * c // self.of, (self.index + 1) * c // self.of)

    def outputs(self, n_out: int, batch_size: int) -> tuple[int, int]:
        """``[start, stop)``: the run's outputs this shard samples."""
        chunks = self.chunks(n_out, batch_size)
        return chunks.start * batch_size, min(chunks.stop * batch_size, n_out)

    def as_dict(self) -> dict[str, int]:
        return {"index": self.index, "of": self.of}


def check_shards(shards: int, n_out: int, batch_size: int) -> None:
    """``sampling.shards`` against a run: at least 1, and at most one shard per chunk."""
    c = n_chunks(n_out, batch_size)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"sampling.shards must be an integer >= 1, got {shards!r}")
    if shards > c:
        raise ValueError(f"sampling.shards = {shards} exceeds the {c} batch(es) of {batch_size} outputs a run of "
                         f"{n_out} draws: a shard samples whole batches (lower shards or the batch size)")


def shard_of(value: Any) -> Shard | None:
    """A stage's ``shard`` param ({index, of}) as a :class:`Shard`; None when absent (the whole run)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"index", "of"}:
        raise ValueError(f"params.shard must be {{index, of}}, got {value!r}")
    return Shard(index=value["index"], of=value["of"])

"""What an EMPDEN run releases, from its configuration alone (no torch): a cell's schedule and private block, Figure 2's
two blocks, and the outputs each of a cell's jobs draws.

The sampling stages (:mod:`pipeline.methods.empden.sample_stage`) run these blocks
and write each one's ledger line from it
(:func:`pipeline.privacy.empirical_denoiser.record_block`); EMPDEN's wiring (:mod:`pipeline.methods.empden.wiring`)
registers the same blocks' parameters for the replay, which holds every line to them. One function per fact, so the
run and its registration cannot drift apart. The private set's size ``n`` is an argument: the stages take the split's,
the wiring the configuration's declared N (:func:`pipeline.config.declared_private`), which the split must have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import shards
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.privacy.empden_block import CELL_METHOD_SCHEMES, EmpdenBlock
from pipeline.methods.empden.grid import Cell

#: trajectories Figure 2 shows when its section does not say (``empden.figure2.n_rows``)
FIGURE2_ROWS = 4
#: Figure 2's two runs, in the order of its ledger lines: output-wise (the hybrid cell's block), then per-step
FIGURE2_METHODS = ("hybrid", "per_step")


def schedule_of(cell: Cell, accounting: Mapping[str, Any]) -> EDMSchedule:
    """EDM grid of the cell: N_full_batch steps to the cell's sigma_min for full batch, else N steps."""
    if cell.method == "full_batch":
        return EDMSchedule(sigma_min=float(cell.sigma_min), sigma_max=float(accounting["sigma_max"]),
                           rho=float(accounting["rho"]), N=int(accounting["N_full_batch"]))
    return EDMSchedule(sigma_min=float(accounting["sigma_min"]), sigma_max=float(accounting["sigma_max"]),
                       rho=float(accounting["rho"]), N=int(accounting["N"]))


def cell_block(cell: Cell, accounting: Mapping[str, Any], *, n: int, n_out: int) -> EmpdenBlock:
    """The private block of a cell over n records, n_out outputs: what its samples and ledger line derive from.

    Full batch: the N_full_batch - 1 steps down to the cell's sigma_min over all n records
    (Sec. 3.2); hybrid / per_step: the first k = ceil(p N / 100) steps over B records
    (Algorithm 1 / Prop. C.1). C, its scaling and beta are the accounting section's (beta the cell's).
    """
    if not cell.private:
        raise ValueError(f"a {cell.method} cell reads no private data and has no private block")
    sched = schedule_of(cell, accounting)
    if cell.method == "full_batch":
        return EmpdenBlock.from_accounting(accounting, schedule=sched, B=n, n=n, N_out=n_out, k=sched.N - 1,
                                           scheme="full_batch", beta=cell.beta)
    return EmpdenBlock.from_accounting(accounting, schedule=sched, B=cell.B, n=n, N_out=n_out, p_percent=cell.p_percent,
                                       scheme=CELL_METHOD_SCHEMES[cell.method], beta=cell.beta)


def job_outputs(n_out: int, batch_size: int, shards_per_cell: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of the cell's ``n_out`` outputs each of its ``shards_per_cell`` jobs samples (one job:
    all of them), in shard order: job k's ledger line is line k of the cell's transcript and counts stop - start
    outputs (:mod:`pipeline.shards`)."""
    return [shards.Shard(index=k, of=shards_per_cell).outputs(n_out, batch_size) for k in range(shards_per_cell)]


def figure2_rows(figure2: Mapping[str, Any]) -> int:
    """Trajectories Figure 2 shows (its section's ``n_rows``): the outputs each of its two lines releases."""
    return int(figure2.get("n_rows", FIGURE2_ROWS))


def figure2_blocks(figure2: Mapping[str, Any], accounting: Mapping[str, Any], *, beta: float, seed: int,
                   n: int) -> dict[str, EmpdenBlock]:
    """Figure 2's two private blocks by scheme (``per_output``, then ``per_step``: its ledger lines' order): the
    hybrid and per-step cells of its (p, B, T) at ``beta`` over n records, released for :func:`figure2_rows`
    trajectories."""
    cells = [Cell(method, int(seed), float(beta), float(figure2["p"]), int(figure2["B"]), int(figure2["T"]))
             for method in FIGURE2_METHODS]
    return {CELL_METHOD_SCHEMES[c.method]: cell_block(c, accounting, n=n, n_out=figure2_rows(figure2)) for c in cells}

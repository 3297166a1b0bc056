"""What EMPDEN's jobs cost: a cell's counted FLOPs per output and the runtime a sampling job asks for on a device
entry, a cell's memory, and each of its rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.empden.wiring.Wiring.resources`).

A cell's output runs two kinds of work (EMPDEN Algorithm 1; Sec. 3.2 for full batch):

* the private block: k steps of the clipped empirical denoiser (eq. 38) over S records each (S = B for the
  subsampled cells, n for full batch), in float64 (the precision note of pipeline.privacy.empirical_denoiser),
  plus, with the public-marginal normaliser, one kernel row over m public records per step (eq. 37's Z);
* the public denoiser: EDM Heun (Karras et al. 2022, Alg. 1) from t1 = t_{k-T} down to 0, two network
  evaluations per step and one for the last (Euler) step, in float32 (TF32 on a GPU's convolutions).

The FLOPs per (output x record x dimension) of a private step and per (output x public record x dimension) of the
normaliser are counted by ``torch.utils.flop_counter`` on a tiny step of the real code (4 and 2: the kernel matmul and
the weighted sum; the normaliser's kernel matmul; :data:`PRIVATE_FLOPS_PER_ENTRY`), the public UNet's forward by
pipeline/footprint.py; nothing here is a rate. At paper scale the public evaluations are most of a subsampled cell's FLOPs (cifar10, p 65,
B 50: 99.9%), the private block all of a full-batch cell's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import rates
from pipeline import resources as cost
from pipeline.methods.accounting import costs as accounting_costs
from pipeline.privacy.empden_block import GATHER_MAX_FRACTION
from pipeline.privacy.schedule import k_private_steps
from pipeline.resources import LIGHT_JOB, Request, Requested
from pipeline.methods.empden.grid import Cell, cell_from_wildcards

Config = Mapping[str, Any]


def n_out(config: Config) -> int:
    """Samples per EMPDEN cell: empden.n_out, else the N_out of the accounting section."""
    return config["empden"]["n_out"] or config["accounting"]["N_out"]


def outputs_per_job(config: Config) -> int:
    """Outputs of one EMPDEN sampling job: the cell's n_out, or its shard's share (sampling.shards)."""
    return math.ceil(n_out(config) / config["sampling"]["shards"])


@dataclass(frozen=True)
class CellWork:
    """One output's work in a cell: private steps over ``records`` records each, public-normaliser rows over
    ``normaliser_records`` public records, and ``public_evaluations`` of the public denoiser."""

    private_steps: int
    records: int
    normaliser_records: int
    public_evaluations: int


def heun_evaluations(steps: int) -> int:
    """Network evaluations of EDM Heun over ``steps`` steps ending at t = 0: two per step, one for the last
    (pipeline.diffusion.steps.heun_step takes an Euler step into 0)."""
    return max(0, 2 * steps - 1)


def private_records(config: Config) -> int:
    """n, the private records an empirical denoiser reads (accounting.n, else the private split's declared size)."""
    return int(config["accounting"]["n"] or config["data"]["private"]["n_private_train"] or 50000)


def normaliser_records(config: Config) -> int:
    """m, the public records of the public-marginal normaliser (empden.normaliser_n, else the public split); 0 for
    eq. 38's constant normaliser."""
    e = config["empden"]
    if e["normaliser"] != "public_marginal":
        return 0
    return int(e["normaliser_n"] or config["data"]["public"]["n"])


def cell_work(config: Config, cell: Cell) -> CellWork:
    """Per-output work of ``cell`` on the accounting section's grids (pipeline.methods.empden.plan.schedule_of)."""
    a = config["accounting"]
    n, m = private_records(config), normaliser_records(config)
    if cell.method == "full_batch":
        return CellWork(int(a["N_full_batch"]) - 1, n, m, 0)
    N = int(a["N"])
    if cell.method == "public_only":
        return CellWork(0, 0, 0, heun_evaluations(N))
    k, B = k_private_steps(N, float(cell.p_percent)), int(cell.B)
    # a subset above GATHER_MAX_FRACTION of n runs the masked matmul over all n records (same result)
    records = B if B <= GATHER_MAX_FRACTION * n else n
    return CellWork(k, records, m, heun_evaluations(N - (k - int(cell.T))))


#: FLOPs per (output x record x dimension) of one private step and per (output x public record x dimension) of the
#: public-marginal normaliser: counted by :func:`count_private_flops_per_entry` (tests/methods/empden/test_costs.py
#: recounts them, so a change to the step's code cannot leave them stale); kept as numbers because the runtime of
#: every cell is asked whenever Snakemake builds the DAG, and a count there costs ~2 s
PRIVATE_FLOPS_PER_ENTRY = (4.0, 2.0)


def count_private_flops_per_entry() -> tuple[float, float]:
    """:data:`PRIVATE_FLOPS_PER_ENTRY`, counted by ``torch.utils.flop_counter`` on a tiny float64 step of the real code
    (the kernel matmul and the weighted sum; the normaliser's kernel matmul)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.privacy import empirical_denoiser as emp

    gen = torch.Generator().manual_seed(0)
    b, n, d = 4, 128, 8
    data = emp.prepare_records(torch.randn(n, d, generator=gen))
    x = torch.randn(b, d, generator=gen, dtype=torch.float64)
    with FlopCounterMode(display=False) as step:
        emp.private_step(x, data, 1.0, 0.5, C=1.0, beta=1.0, generator=gen)
    with FlopCounterMode(display=False) as norm:
        emp.log_public_marginal(x, data, 1.0)
    return step.get_total_flops() / (b * n * d), norm.get_total_flops() / (b * n * d)


def cell_flops(config: Config, cell: Cell) -> tuple[float, float]:
    """(float64 FLOPs of the private block, float32 FLOPs of the public denoiser) for one output of ``cell``."""
    work = cell_work(config, cell)
    per_record, per_public = PRIVATE_FLOPS_PER_ENTRY
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    private = work.private_steps * d * (per_record * work.records + per_public * work.normaliser_records)
    public = 0.0
    if work.public_evaluations:
        public = work.public_evaluations * cost.counted_forward_flops("edm_unet", cost.pretrain_network(config))
    return float(private), float(public)


def sample_runtime_min(config: Config, cell: Cell, *, counts_public_network: bool = True) -> int:
    """Minutes one sampling job of ``cell`` asks for.

    On a device entry with peaks (:attr:`pipeline.rates.DeviceRates.counts_flops`): its outputs x the cell's counted
    FLOPs, the private block at the entry's FP64 peak (workload ``empden_sample``) and the public denoiser at TF32
    (workload ``unet_sample``), each / its efficiency on the entry, x headroom, with a 15-minute floor. Else (or
    when the public denoiser is a folder the user brings, whose network is not counted: ``counts_public_network``
    False) the device rate ``empden_sample`` per output, as before
    (:func:`rate_sample_runtime_min`).
    """
    entry = rates.device_rates(config)
    if not entry.counts_flops or (not counts_public_network and cell.method != "full_batch"):
        return rate_sample_runtime_min(config)
    private, public = cell_flops(config, cell)
    n_job = outputs_per_job(config)
    seconds = entry.workload_seconds(n_job * private, "empden_sample") + entry.workload_seconds(n_job * public,
                                                                                                  "unet_sample")
    return max(15, int(entry.headroom * seconds / 60) + 10)


def rate_sample_runtime_min(config: Config) -> int:
    """One EMPDEN sampling job: its outputs at the device rate ``empden_sample`` per 16x16 output (all its
    private steps), x4 headroom; sharded (sampling.shards), its shard's share of the cell's outputs."""
    n_job = outputs_per_job(config)
    return max(15, int(n_job * (cost.image_side(config) / 16) ** 2 * cost.rate(config, "empden_sample") / 60 * 4) + 10)


def cell_runtime_min(config: Config, method: str | None = None, *,
                     counts_public_network: bool = True) -> Callable[[Mapping[str, str]], int]:
    """The runtime resource of a sampling rule: each job its own cell's minutes (:func:`sample_runtime_min`), the cell
    read from the job's wildcards; ``method`` for the rules whose paths do not name it."""

    def minutes(wildcards: Mapping[str, str]) -> int:
        cell = cell_from_wildcards(method or wildcards.get("method"), wildcards)
        return sample_runtime_min(config, cell, counts_public_network=counts_public_network)

    return minutes


def private_block_bytes(config: Config, batch: int | None = None) -> float:
    """The private block's arrays: the private set in float64 (three copies: the records and their prepared forms) and
    eight [batch, n] float64 work matrices (the kernel's distances, weights and their reductions) for ``batch``
    outputs at a time (default ``empden.batch_size``)."""
    n = private_records(config)
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    b = int(config["empden"]["batch_size"] if batch is None else batch)
    return 3 * n * d * 8 + 8 * b * n * 8


def sample_mem_mb(config: Config) -> int:
    """One EMPDEN cell's host memory: :func:`private_block_bytes`, at least 4 GB."""
    return max(4000, int(private_block_bytes(config) / 2**20))


def sample_gpu_memory(config: Config, method: str) -> cost.MemoryPlan:
    """One sampling job's GPU memory (``method`` its cell's): the private block (:func:`private_block_bytes` and the
    public normaliser's m records in float64) where it runs one, and the public UNet's forward over
    ``empden.batch_size`` outputs where the cell hands off to it (not full batch)."""
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    held = 0.0 if method == "public_only" else private_block_bytes(config) + 8 * normaliser_records(config) * d
    if method == "full_batch":
        return cost.MemoryPlan(1, 1, held + cost.GPU_RESERVE_BYTES, held, 0.0)
    return cost.forward_memory(f"empden_sample_{method}", "edm_unet", cost.pretrain_network(config),
                               int(config["empden"]["batch_size"]), held_bytes=held)


def figure2_gpu_memory(config: Config) -> cost.MemoryPlan:
    """EMPDEN Fig. 2's GPU memory (rule empden_figure2_trajectories): the private block for its rows
    (:func:`private_block_bytes`,
    pipeline/methods/empden/sample_stage.py ``trajectories``), the public normaliser's records,
    and the public UNet's forward over those rows."""
    from pipeline.methods.empden.plan import figure2_rows

    rows = figure2_rows(config["empden"]["figure2"])
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    held = private_block_bytes(config, rows) + 8 * normaliser_records(config) * d
    return cost.forward_memory("empden_figure2_trajectories", "edm_unet", cost.pretrain_network(config), rows,
                               held_bytes=held)


def gather_mem_mb(config: Config) -> int:
    """Joining a sharded EMPDEN cell (sampling.shards): its uint8 samples about twice (the shards and their
    concatenation), and the interpreter."""
    return 1000 + int(2 * n_out(config) * cost.image_channels(config) * cost.image_side(config) ** 2 / 2**20)


def _gpu_mem_mb(c: Config, w: Any, method: str | None) -> cost.Value | None:
    """A sampling job's predicted GPU memory (:func:`sample_gpu_memory`, its cell's method read from its wildcards);
    None where it runs a public denoiser the user brings, whose network is not counted."""
    def plan(wildcards: Mapping[str, str]) -> cost.MemoryPlan:
        return sample_gpu_memory(c, method or wildcards.get("method"))

    if method == "full_batch":  # runs no public denoiser: always counted
        return lambda wildcards: plan(wildcards).predicted_mb
    return cost.public_denoiser_gpu_mem_mb(w, plan)


def _sampling(c: Config, w: Any, method: str | None) -> Request:
    """A private sampling job of one cell (or of one shard of it): its cell's minutes, the private set's memory."""
    counts = not w.house.imports_public_denoiser
    return Request(gpu=1, gpu_mem_mb=_gpu_mem_mb(c, w, method), mem_mb=sample_mem_mb(c),
                   runtime=cell_runtime_min(c, method, counts_public_network=counts))


#: each rule of rules/empden.smk -> its request (``w`` the asking wiring,
#: :class:`pipeline.methods.empden.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    "empden_sample_subsampled": lambda c, w: _sampling(c, w, None),
    "empden_sample_full_batch": lambda c, w: _sampling(c, w, "full_batch"),
    "empden_sample_public_only": lambda c, w: Request(
        gpu=1, gpu_mem_mb=_gpu_mem_mb(c, w, "public_only"), mem_mb=4000,
        runtime=cell_runtime_min(c, "public_only", counts_public_network=not w.house.imports_public_denoiser)),
    # sharded cells (sampling.shards): the join, and each shard's features in the evaluation's feature space
    "empden_gather": lambda c, w: Request(mem_mb=gather_mem_mb(c), runtime=10),
    "empden_features": lambda c, w: cost.evaluation_request(c, outputs_per_job(c), features_only=True),
    "empden_evaluate": lambda c, w: cost.evaluation_request(c, n_out(c)),
    # each sampled cell's eps columns accounted (PLD, Edgeworth): as the accounting's jobs that account every block
    "empden_table8_grid": lambda c, w: accounting_costs.blocks_request(c),
    "empden_table2_comparison": LIGHT_JOB,
    "empden_table3_beta": LIGHT_JOB,
    "empden_table10_seeds": LIGHT_JOB,
    "empden_figure3_tradeoffs": LIGHT_JOB,
    "empden_figure4_samples": LIGHT_JOB,
    "empden_figure2_trajectories": lambda c, w: Request(
        gpu=1, gpu_mem_mb=cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: figure2_gpu_memory(c)),
        mem_mb=sample_mem_mb(c), runtime=15),
}

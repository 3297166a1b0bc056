"""EMPDEN's cost model (pipeline/methods/empden/costs.py): a cell's work is what the sampler runs, counted on the
sampler itself, and a job on a named GPU asks for its own cell's FLOPs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import pipeline.resources as cost
from pipeline.config import load_config, validate_config
from pipeline.diffusion.steps import heun_sampler
from pipeline.methods.empden import costs
from pipeline.privacy import accountants as acc
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.schedule import EDMSchedule
from pipeline.sampling import empirical as empden
from pipeline.methods.empden.grid import Cell
from tests.conftest import REPO


class CountingDenoiser:
    """A public denoiser that answers 0 and counts the outputs it was asked to denoise."""

    def __init__(self) -> None:
        self.outputs = 0

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        self.outputs += x.shape[0]
        return torch.zeros_like(x)


@pytest.mark.parametrize("steps", [2, 3, 7])
def test_heun_evaluates_the_network_twice_a_step_and_once_on_the_last(steps):
    counter = CountingDenoiser()
    heun_sampler(torch.ones(3, 2), counter, EDMSchedule(N=steps).times())
    assert counter.outputs == 3 * costs.heun_evaluations(steps)


@pytest.mark.parametrize(("n", "B", "m"), [(40, 8, 0), (640, 8, 0), (640, 8, 30)])
def test_a_subsampled_cell_s_work_is_what_the_sampler_runs(tmp_path, n, B, m):
    """The sampler's own FLOPs (torch's counter over the whole call, the public network's aside) and its network
    evaluations are n_out x the cell's per-output work: masked (B > n/64, all n records) or gathered, with or without
    the public normaliser's m records."""
    gen = torch.Generator().manual_seed(0)
    data = torch.rand(n, 1, 4, 4, generator=gen) * 2 - 1
    public_data = torch.rand(m, 1, 4, 4, generator=gen) * 2 - 1 if m else None
    config = validate_config({})  # set after validation: the default grids' B exceed these tiny sets
    config["accounting"].update(N=39, n=n)
    config["empden"].update(normaliser="public_marginal" if m else "constant", normaliser_n=m or None)
    cell = Cell("hybrid", 0, beta=1.0, p_percent=55, B=B, T=3)
    sink = emp.LedgerSink(path=tmp_path / "l.jsonl", stage="t", config_id="t", seed=0, delta=1e-5,
                          pld=acc.PLDSettings(1e-3, -50.0))
    counter, n_out = CountingDenoiser(), 5
    with FlopCounterMode(display=False) as flops:
        empden.sample_hybrid(data, n_out=n_out, B=B, p_percent=55, T=3, public_denoiser=counter, C=1.0, beta=1.0,
                             sink=sink, generator=gen, schedule=EDMSchedule(N=39), public_data=public_data,
                             batch_size=2)
    work = costs.cell_work(config, cell)
    assert work.records == (n if B > n / 64 else B) and work.normaliser_records == m
    assert counter.outputs == n_out * work.public_evaluations
    per_record, per_public = costs.PRIVATE_FLOPS_PER_ENTRY
    assert flops.get_total_flops() == n_out * work.private_steps * 16 * (per_record * work.records
                                                                          + per_public * work.normaliser_records)


def test_the_private_steps_flops_per_entry_are_the_counted_ones():
    """Gathered (B << n) and masked subsets and the full batch cost the same per record read (the sampler test above
    runs both paths against the constants)."""
    assert costs.count_private_flops_per_entry() == costs.PRIVATE_FLOPS_PER_ENTRY


def test_full_batch_and_public_only_cells_run_one_kind_of_work():
    config = validate_config({"accounting": {"N": 39, "N_full_batch": 50, "n": 1000}})
    full = costs.cell_work(config, Cell("full_batch", 0, beta=1.0, sigma_min=0.002))
    assert (full.private_steps, full.records, full.public_evaluations) == (49, 1000, 0)
    public = costs.cell_work(config, Cell("public_only", 0))
    assert (public.private_steps, public.public_evaluations) == (0, 77)


@pytest.fixture
def cifar10():
    cfg = load_config(REPO / "config.yaml", REPO / "configs" / "cifar10.yaml")
    cfg["slurm"]["device_rates"] = "h100-80gb"
    return cfg


def test_a_cifar10_cell_on_a_named_gpu_asks_for_1_to_4_times_its_flop_estimate(cifar10):
    cell = Cell("hybrid", 0, beta=1.0, p_percent=65, B=50, T=3)
    private, public = costs.cell_flops(cifar10, cell)
    # the public UNet's evaluations are nearly all of a subsampled cell's FLOPs (the issue counted 99.9%)
    assert public / (private + public) > 0.99
    n_out = costs.n_out(cifar10)
    estimate_min = n_out * (private / (67e12 * 0.3) + public / (494.7e12 * 0.3)) / 60
    asked = costs.sample_runtime_min(cifar10, cell)
    assert 1 <= asked / estimate_min <= 4
    # the rate model asked for ~11x as much (276 minutes)
    estimate_entry = copy.deepcopy(cifar10)
    estimate_entry["slurm"]["device_rates"] = "estimate"
    assert costs.sample_runtime_min(estimate_entry, cell) == costs.rate_sample_runtime_min(estimate_entry) > 8 * asked


def test_each_job_asks_for_its_own_cell_and_a_shard_for_its_share(cifar10):
    small = costs.sample_runtime_min(cifar10, Cell("hybrid", 0, beta=1.0, p_percent=70, B=25, T=1))
    large = costs.sample_runtime_min(cifar10, Cell("hybrid", 0, beta=1.0, p_percent=55, B=25, T=9))
    assert large > small  # more public evaluations after a shorter private block and a longer re-noise
    public_only = costs.sample_runtime_min(cifar10, Cell("public_only", 0))
    assert public_only > large
    sharded = copy.deepcopy(cifar10)
    sharded["sampling"]["shards"] = 4
    assert costs.sample_runtime_min(sharded, Cell("public_only", 0)) < public_only / 2


def test_a_public_denoiser_the_user_brings_is_not_counted_and_keeps_the_rate(cifar10, monkeypatch):
    monkeypatch.setattr(cost, "counted_forward_flops", lambda *a: pytest.fail("an uncounted network was counted"))
    cell = Cell("hybrid", 0, beta=1.0, p_percent=65, B=50, T=3)
    assert costs.sample_runtime_min(cifar10, cell, counts_public_network=False) == costs.rate_sample_runtime_min(
        cifar10)


@pytest.mark.parametrize(("fn", "small", "large"), [
    (costs.rate_sample_runtime_min, {"empden": {"n_out": 100}}, {"empden": {"n_out": 100000}}),
    # a shard asks for its share of the cell's time (100,000 outputs in batches of 256: 391 batches)
    (costs.rate_sample_runtime_min, {"empden": {"n_out": 100000}, "sampling": {"shards": 8}},
     {"empden": {"n_out": 100000}, "sampling": {"shards": 2}}),
    (costs.gather_mem_mb, {"empden": {"n_out": 1000}}, {"empden": {"n_out": 1000000}}),
])
@pytest.mark.parametrize("entry", ["estimate", "a100-40gb"])  # rates only; the default, from counted FLOPs
def test_a_bigger_job_asks_for_more(fn, small, large, entry):
    slurm = {"slurm": {"device_rates": entry}}
    assert fn(validate_config({**large, **slurm})) > fn(validate_config({**small, **slurm}))


def test_a_cells_gpu_memory_holds_its_private_block_and_the_public_unets_batch_where_it_runs_them(cifar10):
    from pipeline import footprint

    d = 3 * 32 * 32
    n, m, batch = costs.private_records(cifar10), costs.normaliser_records(cifar10), cifar10["empden"]["batch_size"]
    private = 3 * n * d * 8 + 8 * batch * n * 8 + 8 * m * d  # the records thrice, eight [batch, n] matrices, Z's m
    full = costs.sample_gpu_memory(cifar10, "full_batch")
    assert full.predicted_bytes == pytest.approx(private + cost.GPU_RESERVE_BYTES)
    unet = footprint.footprint("edm_unet", cost.pretrain_network(cifar10))
    hybrid, public = costs.sample_gpu_memory(cifar10, "hybrid"), costs.sample_gpu_memory(cifar10, "public_only")
    assert hybrid.predicted_bytes == pytest.approx(public.predicted_bytes + private)
    assert public.predicted_bytes == pytest.approx(
        4 * unet.params + cost.TRANSIENT_FACTOR * unet.forward_peak_bytes(batch) + cost.GPU_RESERVE_BYTES)
    # the preset's cells fit the 40 GB it declares
    assert hybrid.predicted_bytes < cost.gpu_mem_bytes(cifar10)


def test_figure2s_gpu_memory_is_the_private_block_and_the_public_unet_at_its_rows(cifar10):
    from pipeline import footprint

    from pipeline.methods.empden.plan import figure2_rows

    d, rows = 3 * 32 * 32, figure2_rows(cifar10["empden"]["figure2"])
    n, m = costs.private_records(cifar10), costs.normaliser_records(cifar10)
    unet = footprint.footprint("edm_unet", cost.pretrain_network(cifar10))
    assert costs.figure2_gpu_memory(cifar10).predicted_bytes == pytest.approx(
        3 * n * d * 8 + 8 * rows * n * 8 + 8 * m * d + 4 * unet.params
        + cost.TRANSIENT_FACTOR * unet.forward_peak_bytes(rows) + cost.GPU_RESERVE_BYTES)
    # its block is at its own rows, not at a cell's batch
    assert costs.private_block_bytes(cifar10, rows) < costs.private_block_bytes(cifar10)

"""EMPDEN's workload: the private steps of its sampler, the rate its cost model reads
(``costs.rate_sample_runtime_min``) and the FP64 work it counts, and how ``make gpu-check`` measures it
(:class:`pipeline.rates.MeasuredWorkload`), declared here so the house keeps no list of the methods' workloads
(``METHOD.workloads``). Its work is no network pass: its FLOPs are its own count (pass ``own``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.rates import MeasuredWorkload, Workload

#: --tiny: a batch, a normaliser and a private set a CPU steps through in seconds (the tests' mode)
TINY = {"empden": {"batch_size": 8, "normaliser_n": 64}, "accounting": {"n": 256, "N": 4}}


def private_flops(config: Mapping[str, Any]) -> float:
    """FLOPs of one output's private steps: accounting.N steps over the n private records and the m normaliser records
    (:data:`pipeline.methods.empden.costs.PRIVATE_FLOPS_PER_ENTRY` per entry of d = channels x side^2)."""
    from pipeline.methods.empden import costs
    from pipeline.resources import image_channels

    per_record, per_public = costs.PRIVATE_FLOPS_PER_ENTRY
    e, acc = config["empden"], config["accounting"]
    n = costs.private_records(config)
    d = image_channels(config) * int(config["data"]["image_size"]) ** 2
    return float(acc["N"]) * d * (per_record * n + per_public * int(e["normaliser_n"] or 10000))


def measure_sample(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], float]:
    """One private step of the clipped empirical denoiser (:func:`pipeline.privacy.empirical_denoiser.private_step`,
    eq. 38 with the public normaliser of ``empden.normaliser_n`` records) for ``empden.batch_size`` outputs over the
    declared private set size, times ``accounting.N`` steps per output: rules empden_sample_*'s private block."""
    import torch

    from pipeline.methods.empden import costs
    from pipeline.privacy import empirical_denoiser as emp
    from pipeline.resources import image_channels

    e, acc = config["empden"], config["accounting"]
    n = costs.private_records(config)
    side, ch = int(config["data"]["image_size"]), image_channels(config)
    d, b, m = ch * side * side, int(e["batch_size"]), int(e["normaliser_n"] or 10000)
    gen = torch.Generator(device=device).manual_seed(0)
    records = emp.prepare_records(torch.rand((n, d), generator=gen, device=device, dtype=torch.float64) * 2 - 1)
    public = emp.prepare_records(torch.rand((m, d), generator=gen, device=device, dtype=torch.float64) * 2 - 1)
    x = torch.randn((b, d), generator=gen, device=device, dtype=torch.float64)
    steps_per_output = int(acc["N"])

    def step() -> None:
        # one step of every output of the batch; the per-output figure multiplies by the N steps each takes
        t, t_next = 1.0, 0.9
        log_z = emp.log_public_marginal(x, public, t)
        emp.private_step(x, records, t, t_next, C=1.0, beta=1.0, generator=gen, log_normaliser=log_z)

    return step, b / steps_per_output  # a timed step is 1/N of the work of each of its b outputs


WORKLOADS = {
    "empden_sample": MeasuredWorkload(
        Workload("output: every private step of EMPDEN's sampler (accounting.N of them) for one output", 16,
                 "pipeline.methods.empden.costs:rate_sample_runtime_min", "fp64", None, "own"),
        preset="cifar10", measure=measure_sample, tiny=TINY, flops=private_flops),
}

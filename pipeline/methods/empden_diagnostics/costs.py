"""What EMPDEN's proxy diagnostics cost: a diagnostics job's runtime (from its trajectory count and the image size)
and memory (copies of the private set), and each of its rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.empden_diagnostics.wiring.Wiring.resources`). Pure functions of the validated config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.resources import Request, Requested

Config = Mapping[str, Any]


def runtime_min(config: Config) -> int:
    """One proxy-diagnostics rule, from the trajectory count and image size.

    ~1 ms per 16x16 image and denoiser call on one CPU core (x4 headroom); the window swap runs
    ~(1 + 2 * windows) N calls per trajectory, the proxy grid N per seed and trajectory.
    """
    d = config["empden_diagnostics"]
    calls = d["n_trajectories"] * max(d["proxy_seeds"] * d["proxy_N"], (1 + 2 * len(d["windows"])) * d["swap_N"])
    return max(10, int(4 * calls * (cost.image_side(config) / 16) ** 2 * 1e-3 / 60) + 10)


def mem_mb(config: Config) -> int:
    """A diagnostics job holds about 3 float64 copies of the private set (the split as float, the
    records and their unit vectors, pipeline.privacy.empirical_denoiser)."""
    n = config["data"]["private"]["n_private_train"] or config["accounting"]["n"] or 50000
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    return 3000 + int(3 * n * d * 8 / 2**20)


def gpu_memory(config: Config, rule: str) -> cost.MemoryPlan:
    """A diagnostics job's GPU memory (pipeline/methods/empden_diagnostics/proxy.py),
    ``batch_size`` trajectories at a time:
    the public UNet's forward over them, the trajectories' arrays in float32 (the step noises, the all-neural
    states, a window's redrawn and mixed noises: 4 N + 2 states of the batch, N the rule's grid), and, for the
    rules that read the private set (Tables 4 and 1), EMPDEN's private block at that batch and the public
    normaliser's records (:func:`pipeline.methods.empden.costs.private_block_bytes`). The evaluation net's and a
    configured CLIP's forwards run after the UNet's on the finished states and are not added."""
    from pipeline.methods.empden import costs as empden_costs

    diag = config["empden_diagnostics"]
    b = int(diag["batch_size"])
    d = cost.image_channels(config) * cost.image_side(config) ** 2
    N = int({"empden_table4_proxy": diag["proxy_N"], "empden_table1_window_swap": diag["swap_N"],
             "empden_figure6_critical_window": diag["critical_window_N"]}[rule])
    held = (4 * N + 2) * b * d * 4
    if rule != "empden_figure6_critical_window":
        held += empden_costs.private_block_bytes(config, b) + 8 * empden_costs.normaliser_records(config) * d
    return cost.forward_memory(rule, "edm_unet", cost.pretrain_network(config), b, held_bytes=held)


def _gpu_mem_mb(config: Config, w: Any, rule: str) -> cost.Value | None:
    """:func:`gpu_memory` of ``rule``, a function so that it is counted only for a DAG that runs it; None where the
    public denoiser is a folder the user brings, whose network is not counted."""
    return cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: gpu_memory(config, rule))


#: each rule of rules/empden_diagnostics.smk -> its request
REQUESTS: dict[str, Requested] = {
    "empden_table4_proxy": lambda c, w: Request(gpu=1, gpu_mem_mb=_gpu_mem_mb(c, w, "empden_table4_proxy"),
                                                mem_mb=mem_mb(c), runtime=runtime_min(c)),
    "empden_table1_window_swap": lambda c, w: Request(gpu=1, gpu_mem_mb=_gpu_mem_mb(c, w, "empden_table1_window_swap"),
                                                      mem_mb=mem_mb(c), runtime=runtime_min(c)),
    "empden_figure6_critical_window": lambda c, w: Request(
        gpu=1, gpu_mem_mb=_gpu_mem_mb(c, w, "empden_figure6_critical_window"), mem_mb=4000, runtime=runtime_min(c)),
}

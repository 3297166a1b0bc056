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


#: each rule of rules/empden_diagnostics.smk -> its request
REQUESTS: dict[str, Requested] = {
    "empden_table4_proxy": lambda c, w: Request(gpu=1, mem_mb=mem_mb(c), runtime=runtime_min(c)),
    "empden_table1_window_swap": lambda c, w: Request(gpu=1, mem_mb=mem_mb(c), runtime=runtime_min(c)),
    "empden_figure6_critical_window": lambda c, w: Request(gpu=1, mem_mb=4000, runtime=runtime_min(c)),
}

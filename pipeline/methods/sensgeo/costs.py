"""What SENSGEO's jobs cost (analytic, CPU, no data): the covariance SDPs' runtime and each of its rules' request
(:data:`REQUESTS`, read by :meth:`pipeline.methods.sensgeo.wiring.Wiring.resources`). Pure functions of the validated
config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.resources import Request, Requested

Config = Mapping[str, Any]


def sdp_runtime_min(config: Config) -> int:
    """The covariance SDPs of sensgeo.sdp: one minute per 100 of sum(m^2) over the dimensions m, at least 10."""
    return max(10, sum(m * m for m in config["sensgeo"]["sdp"]["m"]) // 100)


#: each rule of rules/sensgeo.smk -> its request (each computed on one core from its config section alone)
REQUESTS: dict[str, Requested] = {
    "sensgeo_fig1_naive_vs_exact": Request(mem_mb=1000, runtime=10),
    "sensgeo_table_guarantees": Request(mem_mb=2000, runtime=10),
    "sensgeo_table_sdp": lambda c, w: Request(mem_mb=3000, runtime=sdp_runtime_min(c)),
    "sensgeo_fig_mi_snr": Request(mem_mb=1000, runtime=5),
    "sensgeo_table_bridge": Request(mem_mb=1000, runtime=5),
}

"""SENSGEO's wiring (``rules/sensgeo.smk``): its targets, each rule's params and ``resources:``.

SENSGEO is analytic (CPU, no data): every public domain K and random covariance is drawn from ``sensgeo.seed``,
so a rule's params are its config section and that seed. Plain Python (no Snakemake):
``tests/methods/sensgeo/test_wiring.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.methods.sensgeo import costs
from pipeline.wiring import House, stage_params

#: the config's sensgeo sections, one per rule: sensgeo_fig1_naive_vs_exact, sensgeo_table_guarantees,
#: sensgeo_table_sdp, sensgeo_fig_mi_snr, sensgeo_table_bridge
SECTIONS = ("fig1", "guarantees", "sdp", "mi", "bridge")


class Wiring:
    """SENSGEO's tables and figures of one configuration."""

    def __init__(self, house: House) -> None:
        self.house = house

    def targets(self) -> list[Path]:
        """SENSGEO's figures and tables: Figure 1 (naive diameter bound over the exact Mahalanobis diameter) and its
        summary table, the guarantees table (exact eps(delta) vs RDP conversions), the covariance SDP table, the
        MI-DP figure (capacity vs SNR) and the bridge table (exact rho_* next to EMPDEN's 2C/(beta|D|))."""
        t, f = self.house.layout.tables, self.house.layout.figures
        return [f / "sensgeo_fig1_naive_vs_exact.png", t / "sensgeo_fig1_naive_vs_exact.parquet",
                t / "sensgeo_table_guarantees.parquet", t / "sensgeo_table_sdp.parquet", f / "sensgeo_fig_mi_snr.png",
                t / "sensgeo_table_bridge.parquet"]

    def params(self, section: str) -> str:
        """The params of the rule of ``section`` (one of :data:`SECTIONS`): that section, its config id and
        sensgeo.seed; another section's edit reruns nothing of this one."""
        if section not in SECTIONS:
            raise KeyError(f"SENSGEO has no section {section!r} (one of {', '.join(SECTIONS)})")
        sg = self.house.config["sensgeo"]
        return stage_params(seed=sg["seed"], **{section: sg[section]})

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/sensgeo.smk) asks the cluster for, its whole ``resources:``: its
        request in :data:`pipeline.methods.sensgeo.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

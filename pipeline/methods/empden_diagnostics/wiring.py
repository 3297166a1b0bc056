"""EMPDEN's proxy diagnostics' wiring (``rules/empden_diagnostics.smk``): their targets, params and ``resources:``.

The diagnostics read the private set without DP (as the paper's do): descriptive tables, not private releases, so
no ledger transcript and no all_runs record. Tables 1/4/5/6 use the sampler's empirical denoiser, normaliser
included, so its inputs and settings are EMPDEN's (:class:`pipeline.methods.empden.wiring.Wiring`). Plain Python (no
Snakemake): ``tests/methods/empden_diagnostics/test_wiring.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.methods.accounting.wiring import mechanism
from pipeline.methods.empden_diagnostics import costs
from pipeline.methods.empden.wiring import Wiring as EmpdenWiring
from pipeline.wiring import House, stage_params


class Wiring:
    """The proxy diagnostics (EMPDEN Sec. 3.3, 6.3, App. F) of one configuration."""

    def __init__(self, house: House, empden: EmpdenWiring | None = None) -> None:
        self.house = house
        self.empden = empden or EmpdenWiring(house)

    def targets(self) -> list[Path]:
        """Table 4 and Figure 1 (proxy cosine and distance along the trajectory), Tables 1, 5, 6 (window swap:
        FID, endpoint and image agreement), Figure 6a and its table (the critical window)."""
        t, f = self.house.layout.tables, self.house.layout.figures
        return [t / "empden_table4_proxy.parquet", f / "empden_figure1_proxy_cosine.png",
                t / "empden_table1_window_swap.parquet", t / "empden_table5_endpoint_agreement.parquet",
                t / "empden_table6_image_agreement.parquet", t / "empden_figure6_critical_window.parquet",
                f / "empden_figure6_critical_window.png"]

    def params(self) -> str:
        """Params of every proxy-diagnostics rule: the diagnostics section, the accounting mechanism (the schedule,
        C and beta; not its table grids), the seed, device, threads and the sampler's normaliser settings."""
        h = self.house
        return stage_params(diagnostics=h.config["empden_diagnostics"], accounting=mechanism(h.config["accounting"]),
                            seed=h.config["seed"], device=h.config["device"], threads=h.torch_threads,
                            **self.empden.normaliser_params)

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/empden_diagnostics.smk) asks the cluster for, its whole
        ``resources:``: its request in :data:`pipeline.methods.empden_diagnostics.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

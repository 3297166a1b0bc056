"""The accounting method's wiring (``rules/account.smk``): EMPDEN's sampling-time accounting (the block file, its
ledger transcript, Tables 7, 8/9 eps, 11, 12, 13, Figures 4 left/middle, 5, 7) and the ledger replay's inputs.

What part of the ``accounting`` section a job depends on is decided here: the EMPDEN mechanism (schedule, C, beta,
delta, PLD settings) reaches the samplers, the table grids only the accounting tables. Plain Python (no Snakemake):
``tests/methods/accounting/test_wiring.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.config import ConfigError
from pipeline.methods.accounting import costs
from pipeline.registry import LineParams, TranscriptSpec
from pipeline.methods.accounting.blocks import AccountingConfig, block_plan, claim_parameters
from pipeline.wiring import House, stage_params

#: accounting keys that only list the accounting tables' grids; the EMPDEN mechanism itself
#: (schedule, C, beta, delta, PLD settings) is the rest, and only that reaches the samplers
GRID_KEYS = ("p", "B", "mu_bar_B", "sigma_min_sweep", "asr_q", "asr_N", "rdp_orders", "N_out")
#: what a sampled cell's eps columns read (rule empden_table8_grid): delta, the PLD grid, RDP orders
EPS_KEYS = ("delta", "discretisation", "log_mass_truncation", "rdp_orders")
#: the methods whose jobs need the accounting's private set size n
NEEDS_N = ("accounting", "empden", "empden_diagnostics")


def mechanism(accounting: Mapping[str, Any]) -> dict[str, Any]:
    """The ``accounting`` section without its table grids: what an EMPDEN cell's noise and claim depend on (adding a
    p or B to the accounting tables' grid reruns no sampler)."""
    return {k: v for k, v in accounting.items() if k not in GRID_KEYS}


def line_params(fields: Mapping[str, Any]) -> LineParams:
    """A ledger line's configured fields (``mechanism``, ``count``, ``sampling``, ``extra``: a mapping's keys one level
    down) as the replay reads them, dotted line paths (:data:`pipeline.registry.LineParams`):
    ``{"sampling": {"n": 2500}}`` -> ``{"sampling.n": 2500}``."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, Mapping):
            out.update({f"{name}.{key}": v for key, v in value.items()})
        else:
            out[name] = value
    return out


class Wiring:
    """The accounting tables and figures of one configuration and the ledger replay's params.

    Raises :class:`pipeline.config.ConfigError` when a method that needs the private set size n is chosen and
    neither accounting.n nor data.private.n_private_train gives it.
    """

    def __init__(self, house: House) -> None:
        self.house = house
        if self.n is None and any(house.method_on(m) for m in NEEDS_N):
            raise ConfigError("config error at accounting.n: set it when data.private.n_private_train is null")

    @property
    def section(self) -> dict[str, Any]:
        return self.house.config["accounting"]

    @property
    def n(self) -> int | None:
        """Private set size n of the accounting: accounting.n, else data.private.n_private_train."""
        return self.section["n"] or self.house.config["data"]["private"]["n_private_train"]

    @property
    def mechanism(self) -> dict[str, Any]:
        """:func:`mechanism` of this config's accounting section."""
        return mechanism(self.section)

    def eps_settings(self) -> dict[str, Any]:
        """The accounting keys a sampled cell's eps columns read (:data:`EPS_KEYS`; Tables 8/9 of the grid)."""
        return {k: self.section[k] for k in EPS_KEYS}

    @property
    def n_blocks(self) -> int:
        """Private blocks accounted: the p x B grid and one per mu_bar_B (each one claim of the block ledger)."""
        return costs.n_blocks(self.house.config)

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/account.smk) asks the cluster for, its whole ``resources:``: its
        request in :data:`pipeline.methods.accounting.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

    def params(self) -> str:
        """Params of the accounting tables and figures that account themselves (Table 13, Figures 4 left/middle, 5,
        7): the whole accounting section, n and the seed."""
        return stage_params(accounting=self.section, n=self.n, seed=self.house.config["seed"])

    def blocks_params(self) -> str:
        """Params of rule empden_blocks: :meth:`params` and the ledger binding of its transcript."""
        return stage_params(accounting=self.section, n=self.n, seed=self.house.config["seed"],
                            ledger_binding=self.house.ledger_binding("empden_blocks"))

    @property
    def blocks(self) -> Path:
        """Every EMPDEN private block accounted once (rule empden_blocks): the tables select columns from it."""
        return self.house.layout.expdir / "accounting" / "empden_blocks.json"

    @property
    def ledger(self) -> Path:
        """The block ledger: one configuration claim per block."""
        return self.house.layout.ledger("empden_blocks")

    def targets(self) -> list[Path]:
        """EMPDEN's accounting outputs: Table 7 (accountants per block), Tables 8/9 eps columns, Table 11 (Edgeworth
        and CLT vs PLD), Table 12 (RDP), Table 13 (theoretical ASR), Figure 4 left/middle (full batch), Figure 5
        (mu_t vs log SNR), Figure 7 (stopping traces)."""
        t, f = self.house.layout.tables, self.house.layout.figures
        return [t / "empden_table7_accountants.parquet", t / "empden_table8_9_eps.parquet",
                t / "empden_table11_edgeworth_clt_pld.parquet", t / "empden_table12_rdp.parquet",
                t / "empden_table13_theoretical_asr.parquet", f / "empden_figure4_full_batch.png",
                f / "empden_figure5_mu_vs_logsnr.png", f / "empden_figure7_stopping_traces.png"]

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        """One claim per accounted block: configuration claims, which read no private data, each registered with its
        block as the configuration gives it (the stage's own plan: :func:`~pipeline.methods.accounting.blocks.
        block_plan` over the section and n, each row's :func:`~pipeline.methods.accounting.blocks.claim_parameters`):
        the (p, B) grid's blocks with their schedule, k, C, beta, B, n and N_out (``extra.source = "schedule"``),
        then one per ``mu_bar_B`` given directly with that mu_bar_B (``"given"``: only these may say so)."""
        cfg = AccountingConfig.from_params({"accounting": self.section, "n": self.n})
        params = [line_params(claim_parameters(cfg, row)) for row in block_plan(cfg)]
        return {self.ledger: TranscriptSpec(claims=self.n_blocks, run="empden_blocks", stage="empden_blocks",
                                            delta=self.section["delta"], configuration=True, params=params)}

    @staticmethod
    def replay_inputs(transcripts: Iterable[Any]) -> dict[str, Any]:
        """The replay's inputs keyed by transcript stem (stems are unique and valid input names: no dots)."""
        return {Path(p).stem: p for p in transcripts}

    def replay_params(self, claims: Mapping[Any, TranscriptSpec]) -> str:
        """The replay's params: what each private stage writes, as its method registered it (TranscriptSpec), by
        transcript stem, and the experiment every line must be bound to."""
        return stage_params(expected={Path(t).stem: spec.as_dict() for t, spec in claims.items()},
                            experiment=self.house.config["experiment"])

"""What the accounting's jobs cost: a job that accounts every EMPDEN private block with the PLD accountant (the block
file, Table 13's theoretical rows, the replay, which recomputes them) and each of its rules' request
(:data:`REQUESTS`, read by :meth:`pipeline.methods.accounting.wiring.Wiring.resources`). Pure functions of the
validated config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.resources import LIGHT_JOB, Request, Requested

Config = Mapping[str, Any]


def _fine_pld(config: Config) -> bool:
    """PLD cost grows ~10x per decade of the discretisation h (EMPDEN's h = 1e-5 takes ~1 min and GBs per strong
    block)."""
    return config["accounting"]["discretisation"] < 1e-4


def n_blocks(config: Config) -> int:
    """Private blocks accounted: the p x B grid and one per mu_bar_B (each one claim of the block ledger)."""
    a = config["accounting"]
    return len(a["p"]) * len(a["B"]) + len(a["mu_bar_B"] or [])


def runtime_min(config: Config, n_blocks: int) -> int:
    """Accounting ``n_blocks`` EMPDEN blocks with the PLD accountant (also the replay's, which recomputes them)."""
    return 30 + n_blocks * (10 if _fine_pld(config) else 1)


def mem_mb(config: Config) -> int:
    return 16000 if _fine_pld(config) else 4000


def blocks_request(config: Config) -> Request:
    """A job that accounts every block (rules empden_blocks, empden_table13_theoretical_asr, replay; EMPDEN's
    empden_table8_grid)."""
    return Request(mem_mb=mem_mb(config), runtime=runtime_min(config, n_blocks(config)))


#: each rule of rules/account.smk -> its request: the jobs that account every block by their count, the rest light
#: (Tables 7, 8/9, 11, 12 select columns from the block file)
REQUESTS: dict[str, Requested] = {
    "empden_blocks": lambda c, w: blocks_request(c),
    "empden_table7_accountants": LIGHT_JOB,
    "empden_table8_9_eps": LIGHT_JOB,
    "empden_table11_edgeworth_clt_pld": LIGHT_JOB,
    "empden_table12_rdp": LIGHT_JOB,
    "empden_table13_theoretical_asr": lambda c, w: blocks_request(c),
    "empden_figure4_full_batch": LIGHT_JOB,
    "empden_figure5_mu_vs_logsnr": LIGHT_JOB,
    "empden_figure7_stopping_traces": LIGHT_JOB,
    "replay": lambda c, w: blocks_request(c),
}

"""EMPDEN sampling-time accounting: every private block, and Tables 7, 8/9, 11, 12, 13.

``empden_blocks`` is the one expensive stage: for each private block of the config -- the
(p, B) grid of Appendix J on the N-step EDM schedule, plus any mu_bar_B given directly --
it takes mu_bar_B (eq. 9) and q_B = B/n from the block's
:class:`~pipeline.privacy.empden_block.EmpdenBlock` (the value the sampler and the replay
derive from too) and computes eps from every accountant (App. G): certified
PLD eps_u, optimistic PLD eps_l (NOT a bound), Edgeworth with its App. D diagnostics, the
GDP CLT estimate, RDP at delta and at 1/n^2. Each certified eps_u is also written as a
claim to the ledger, so ``replay`` can recompute every number in the tables. The table
stages only select and rename columns, so the same block is never accounted twice.

These tables are the paper's own grid (``accounting.p`` x ``accounting.B`` at
``accounting.N_out``, or ``accounting.mu_bar_B`` given directly), not the sampled cells, and
say so in their ``grid`` column; the eps of the runs actually sampled (``empden.grid`` at
``empden.n_out``) is Table 8's join, :func:`pipeline.methods.empden.results.empden_table8_grid`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from pipeline.diffusion.schedule import EDMSchedule
from pipeline.io import atomic_path, read_json, write_json
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.edgeworth import Block, edgeworth_epsilon
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.privacy.mia import STOPPING_POINTS, asr_bound, stop_index
from pipeline.reporting import write_table
from pipeline.stage import PipelineError, stage

BLOCKS_FORMAT = "dpgen-empden-blocks/1"
RDP_INTEGER_ORDERS = tuple(range(2, 256))

PARAMS_DOC = {
    "accounting": "the config's `accounting` section (schema defaults filled)",
    "n": "private set size n (the config's accounting.n or data.private.n_private_train)",
    "config_id": "id of the configuration",
    "seed": "seed of the run",
    "ledger_binding": "{run, experiment} the claims are bound to (empden_blocks; configuration claims read no data)",
}


@dataclass(frozen=True)
class AccountingConfig:
    """The `accounting` config section with n resolved; symbols as in EMPDEN."""

    sigma_min: float
    sigma_max: float
    rho: float
    N: int
    N_full_batch: int
    C: float
    C_scales_with_subset: bool
    beta: float
    n: int
    B: tuple[int, ...]
    p: tuple[float, ...]
    mu_bar_B: tuple[float, ...] | None
    N_out: int
    delta: float
    discretisation: float
    log_mass_truncation: float
    sigma_min_sweep: tuple[float, ...]
    asr_q: tuple[float, ...]
    asr_N: int
    rdp_orders: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AccountingConfig:
        if "accounting" not in params:
            raise PipelineError("accounting stage: params need the config's `accounting` section")
        a = dict(params["accounting"])
        n = a.get("n") or params.get("n")
        if not isinstance(n, int) or n < 1:
            raise PipelineError(f"accounting stage: private set size n must be a positive integer, got {n!r}")
        too_big = [b for b in a["B"] if b > n]
        if too_big:
            raise PipelineError(f"accounting.B: subsample size {too_big[0]} exceeds the private set size n={n}")
        mu_bar = a.get("mu_bar_B")
        return cls(
            sigma_min=float(a["sigma_min"]), sigma_max=float(a["sigma_max"]), rho=float(a["rho"]),
            N=int(a["N"]), N_full_batch=int(a["N_full_batch"]), C=float(a["C"]),
            C_scales_with_subset=bool(a["C_scales_with_subset"]), beta=float(a["beta"]), n=n,
            B=tuple(int(b) for b in a["B"]), p=tuple(float(p) for p in a["p"]),
            mu_bar_B=tuple(float(m) for m in mu_bar) if mu_bar else None, N_out=int(a["N_out"]),
            delta=float(a["delta"]), discretisation=float(a["discretisation"]),
            log_mass_truncation=float(a["log_mass_truncation"]),
            sigma_min_sweep=tuple(float(s) for s in a["sigma_min_sweep"]),
            asr_q=tuple(float(q) for q in a["asr_q"]), asr_N=int(a["asr_N"]), rdp_orders=str(a["rdp_orders"]))

    def schedule(self, *, N: int | None = None, sigma_min: float | None = None) -> EDMSchedule:
        return EDMSchedule(sigma_min=sigma_min or self.sigma_min, sigma_max=self.sigma_max, rho=self.rho,
                           N=N or self.N)

    def block(self, B: int, *, k: int | None = None, p_percent: float | None = None, N: int | None = None,
              sigma_min: float | None = None) -> EmpdenBlock:
        """The output-wise block over B of n records on the (N-step, sigma_min) grid, k steps or p% of them."""
        return EmpdenBlock.from_accounting({"C": self.C, "C_scales_with_subset": self.C_scales_with_subset,
                                            "beta": self.beta}, schedule=self.schedule(N=N, sigma_min=sigma_min),
                                           B=B, n=self.n, N_out=self.N_out, k=k, p_percent=p_percent)

    def mu_t(self, subset_size: int, *, N: int | None = None, sigma_min: float | None = None) -> np.ndarray:
        """Per-step mu_t of eq. 39 at every step of the grid over ``subset_size`` records (B, or n for full batch)."""
        return self.block(subset_size, k=N or self.N, N=N, sigma_min=sigma_min).mu_t

    @property
    def pld(self) -> acc.PLDSettings:
        return acc.PLDSettings(self.discretisation, self.log_mass_truncation)

    @property
    def orders(self) -> tuple[float, ...] | None:
        return RDP_INTEGER_ORDERS if self.rdp_orders == "integer" else None

    @property
    def delta_strict(self) -> float:
        """delta = 1/n^2, the stricter choice of EMPDEN App. K (Table 12)."""
        return 1.0 / self.n**2


def block_plan(cfg: AccountingConfig) -> list[dict[str, Any]]:
    """Every private block to account: the (p, B) grid, then any mu_bar_B given directly."""
    plan: list[dict[str, Any]] = []
    for p in cfg.p:
        for B in cfg.B:
            block = cfg.block(B, p_percent=p)
            plan.append({"source": "schedule", "p_percent": p, "k_steps": block.k, "t0": block.t0, "B": B,
                         "q_B": block.q_B, "mu_bar_B": block.mu_bar_B})
    if cfg.mu_bar_B:
        B = min(cfg.B)
        paired = len(cfg.mu_bar_B) == len(cfg.p)
        for i, mu in enumerate(cfg.mu_bar_B):
            plan.append({"source": "given", "p_percent": cfg.p[i] if paired else math.nan, "k_steps": -1,
                         "t0": math.nan, "B": B, "q_B": B / cfg.n, "mu_bar_B": mu})
    return plan


def account_block(cfg: AccountingConfig, mu_bar: float, q: float) -> dict[str, Any]:
    """eps of one output-wise block (Prop. 4.1) from every accountant of App. G."""
    event = acc.outputwise_event(mu_bar, q, cfg.N_out)
    ew = edgeworth_epsilon([Block(mu_bar, q, cfg.N_out)], cfg.delta)
    return {
        "eps_upper_bound": acc.pld_epsilon(event, cfg.delta, settings=cfg.pld),
        "eps_lower_estimate": acc.pld_epsilon(event, cfg.delta, pessimistic=False, settings=cfg.pld),
        "eps_edgeworth_estimate": ew.eps,
        "edgeworth_valid": ew.valid,
        "edgeworth_reason": ew.reason,
        "edgeworth_rho_ok": ew.rho_ok,
        "rho3_P": ew.rho3_P, "rho4_P": ew.rho4_P, "rho3_Q": ew.rho3_Q, "rho4_Q": ew.rho4_Q,
        "edgeworth_dominance": ew.dominance,
        "eps_clt_estimate": acc.clt_epsilon([(mu_bar, q, cfg.N_out)], cfg.delta),
        "eps_rdp_bound": acc.rdp_epsilon(event, cfg.delta, orders=cfg.orders),
        "eps_rdp_bound_strict_delta": acc.rdp_epsilon(event, cfg.delta_strict, orders=cfg.orders),
    }


#: the mechanism every block's claim states (Algorithm 1's output-wise block, Prop. 4.1)
CLAIM_MECHANISM = "empden_outputwise_block"


def claim_parameters(cfg: AccountingConfig, row: Mapping[str, Any]) -> dict[str, Any]:
    """What the configuration says one block's claim is: its line's ``mechanism``, ``count``, ``sampling`` and
    ``extra`` (every field but the event, its noise and the eps). :func:`claim_entry` writes them, and the accounting
    wiring registers them, so the replay holds each line to the block of the configuration it claims.

    A grid block also records its schedule, C (the effective clip) and beta, so the replay can
    rebuild mu_bar_B (eq. 9) and the event from them; a block with mu_bar_B given directly
    records only that.
    """
    mechanism = {}
    if row["source"] == "schedule":
        block = cfg.block(row["B"], k=row["k_steps"])
        mechanism = {k: v for k, v in block.schedule_extra().items() if k not in ("k_steps", "t_end")}
    return {"mechanism": CLAIM_MECHANISM, "count": cfg.N_out,
            "sampling": {"scheme": "fixed_size_per_output", "probability": row["q_B"], "B": row["B"], "n": cfg.n},
            "extra": {"kind": "configuration_claim", "p_percent": _json_num(row["p_percent"]),
                      "k_steps": row["k_steps"], "source": row["source"], "mu_bar_B": row["mu_bar_B"],
                      "proposition": "EMPDEN Prop. 4.1", **mechanism}}


def claim_entry(cfg: AccountingConfig, row: Mapping[str, Any], *, stage_name: str, config_id: str,
                seed: int) -> ledger.LedgerEntry:
    """The ledger line for one block (:func:`claim_parameters`): its event and its certified eps_u (PLD,
    pessimistic)."""
    event = (cfg.block(row["B"], k=row["k_steps"]).event if row["source"] == "schedule"
             else acc.outputwise_event(row["mu_bar_B"], row["q_B"], cfg.N_out))
    return ledger.LedgerEntry(
        stage=stage_name, event=ledger.event_to_dict(event), sensitivity=1.0, noise_std=1.0 / row["mu_bar_B"],
        adjacency="add_or_remove_one", delta=cfg.delta, claimed_epsilon=row["eps_upper_bound"],
        accountant={"name": "pld_pessimistic", **acc.describe(cfg.pld)}, config_id=config_id, seed=seed,
        **claim_parameters(cfg, row))


def _json_num(x: float) -> float | None:
    return None if isinstance(x, float) and not math.isfinite(x) else x


@stage("empden_blocks", outputs=("blocks", "ledger"), params=PARAMS_DOC)
def empden_blocks(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Account every EMPDEN private block of the config (App. G); write them and their ledger claims."""
    cfg = AccountingConfig.from_params(params)
    rows = []
    for row in tqdm(block_plan(cfg), desc="empden blocks", unit="block"):
        rows.append({**row, **account_block(cfg, row["mu_bar_B"], row["q_B"])})
    config_id, seed = str(params.get("config_id", "unknown")), int(params.get("seed", 0))
    binding = ledger.binding_of(params, data_sha256="", stage="empden_blocks")  # configuration claims: no data read
    with atomic_path(outputs["ledger"]) as tmp:
        for row in rows:
            ledger.append_entry(tmp, claim_entry(cfg, row, stage_name="empden_blocks", config_id=config_id, seed=seed),
                                binding)
    write_json(outputs["blocks"], {
        "format": BLOCKS_FORMAT, "n": cfg.n, "N": cfg.N, "N_out": cfg.N_out, "delta": cfg.delta,
        "delta_strict": cfg.delta_strict, "pld": acc.describe(cfg.pld), "rdp_orders": cfg.rdp_orders,
        "config_id": config_id, "seed": seed, "versions": ledger.package_versions(),
        "blocks": [{k: _json_num(v) for k, v in r.items()} for r in rows]})


def read_blocks(path: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    data = read_json(path)
    if data.get("format") != BLOCKS_FORMAT:
        raise PipelineError(f"{path}: not an empden_blocks file (format {data.get('format')!r})")
    df = pd.DataFrame(data["blocks"]).astype({"p_percent": "float64", "t0": "float64"})
    return data, df


#: the ``grid`` column: which grid a row belongs to. These tables are the paper's grid (App. J /
#: Table 7's given mu_bar_B), not the sampled cells (those are Table 8's join, empden_results).
GRID_LABELS = {"schedule": "paper: accounting.p x accounting.B",
               "given": "paper: accounting.mu_bar_B given directly"}
ASR_GRID_LABEL = "paper: accounting.asr_q x Table 13 stopping points"


def _write(df: pd.DataFrame, meta: Mapping[str, Any], out: Path, columns: list[str]) -> None:
    df = df[columns].reset_index(drop=True).copy()
    df["grid"] = df["source"].map(GRID_LABELS)
    for col in ("n", "N_out", "delta"):
        if col in meta and col not in df:
            df[col] = meta[col]
    df["discretisation"] = meta["pld"]["value_discretization_interval"]
    df["log_mass_truncation"] = meta["pld"]["log_mass_truncation_bound"]
    write_table(df, out, config_id=meta["config_id"], seed=meta["seed"])


def _reference_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of Tables 7, 11, 12: mu_bar_B given directly if any, else the grid at the smallest B."""
    given = df[df["source"] == "given"]
    if len(given):
        return given
    return df[(df["source"] == "schedule") & (df["B"] == df["B"].min())]


TABLE_DOC = {"config_id": "id of the configuration (provenance column)"}
BLOCK_COLUMNS = ["source", "p_percent", "k_steps", "t0", "B", "q_B", "mu_bar_B"]


@stage("empden_table7_accountants", inputs=("blocks",), outputs=("table",), params=TABLE_DOC)
def empden_table7_accountants(inputs, outputs, params) -> None:
    """EMPDEN Table 7: Edgeworth estimate, PLD lower estimate, certified PLD upper, RDP bound per block."""
    meta, df = read_blocks(inputs["blocks"])
    _write(_reference_rows(df), meta, outputs["table"], BLOCK_COLUMNS + [
        "eps_edgeworth_estimate", "edgeworth_valid", "edgeworth_rho_ok", "edgeworth_reason", "eps_lower_estimate",
        "eps_upper_bound", "eps_rdp_bound"])


@stage("empden_table8_9_eps", inputs=("blocks",), outputs=("table",), params=TABLE_DOC)
def empden_table8_9_eps(inputs, outputs, params) -> None:
    """EMPDEN Tables 8/9, eps columns: PLD [eps_l, eps_u] and Edgeworth over the p x B grid.

    The re-noising steps T are public post-processing and do not change eps, so one row per
    (p, B) stands for every T.
    """
    meta, df = read_blocks(inputs["blocks"])
    _write(df[df["source"] == "schedule"], meta, outputs["table"], BLOCK_COLUMNS + [
        "eps_lower_estimate", "eps_upper_bound", "eps_edgeworth_estimate", "edgeworth_valid",
        "edgeworth_rho_ok", "edgeworth_reason", "rho3_P", "rho4_P", "rho3_Q", "rho4_Q", "edgeworth_dominance"])


@stage("empden_table11_edgeworth_clt_pld", inputs=("blocks",), outputs=("table",), params=TABLE_DOC)
def empden_table11_edgeworth_clt_pld(inputs, outputs, params) -> None:
    """EMPDEN Table 11: Edgeworth and CLT estimates against the certified PLD upper bound."""
    meta, df = read_blocks(inputs["blocks"])
    _write(_reference_rows(df), meta, outputs["table"], BLOCK_COLUMNS + [
        "eps_edgeworth_estimate", "edgeworth_valid", "eps_clt_estimate", "eps_upper_bound"])


@stage("empden_table12_rdp", inputs=("blocks",), outputs=("table",), params=TABLE_DOC)
def empden_table12_rdp(inputs, outputs, params) -> None:
    """EMPDEN Table 12: certified RDP eps at delta and at the stricter delta = 1/n^2 (App. K)."""
    meta, df = read_blocks(inputs["blocks"])
    rows = _reference_rows(df).copy()
    rows["delta_strict"] = meta["delta_strict"]
    rows["rdp_orders"] = meta["rdp_orders"]
    _write(rows, meta, outputs["table"], BLOCK_COLUMNS + [
        "eps_rdp_bound", "delta_strict", "eps_rdp_bound_strict_delta", "rdp_orders"])


def asr_rows(cfg: AccountingConfig) -> list[dict[str, Any]]:
    """EMPDEN Table 13 (theoretical rows): ASR bound from eps_u for each q and stopping point.

    Stopping at t = sT on a T = asr_N step EDM grid means the private block covers the first
    max(1, round((1 - s) T)) steps (at t = T the sampler has taken one private step). The
    subset size is q n (only used when C does not scale with the subset).
    """
    rows = []
    for q in cfg.asr_q:
        subset = max(1, round(q * cfg.n))
        for label, s in STOPPING_POINTS.items():
            block = cfg.block(subset, k=stop_index(s, cfg.asr_N), N=cfg.asr_N)
            # the theoretical rows amplify by the q asked for, not by the rounded subset's B/n
            event = acc.outputwise_event(block.mu_bar_B, q, cfg.N_out)
            eps = acc.pld_epsilon(event, cfg.delta, settings=cfg.pld)
            rows.append({"q": q, "stopping_point": label, "k_steps": block.k, "t_stop": block.t0,
                         "mu_bar_B": block.mu_bar_B, "eps_upper_bound": eps,
                         "asr_upper_bound": asr_bound(eps, cfg.delta), "N_out": cfg.N_out, "delta": cfg.delta})
    return rows


@stage("empden_table13_theoretical_asr", outputs=("table",), params=PARAMS_DOC)
def empden_table13_theoretical_asr(inputs, outputs, params) -> None:
    """EMPDEN Table 13 (theoretical rows): ASR <= (e^eps + delta)/(1 + e^eps) from certified eps_u."""
    cfg = AccountingConfig.from_params(params)
    rows = asr_rows(cfg)
    df = pd.DataFrame(rows)
    df["grid"] = ASR_GRID_LABEL
    df["n"] = cfg.n
    df["discretisation"] = cfg.discretisation
    df["log_mass_truncation"] = cfg.log_mass_truncation
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")),
                seed=int(params.get("seed", 0)))

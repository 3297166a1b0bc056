"""One EMPDEN private block as one frozen value: every privacy fact of a run derives from it.

A block is what the EMPDEN sampler releases about the private set: k private EDM steps
(the handoff t0 = t_k of a p% block, k = ceil(p N / 100)), each the Gaussian mechanism of
eq. 6 over |S| records with clip norm C and public normaliser beta, repeated for N_out outputs.
From those symbols alone follow

* the effective clip norm C_eff (``C_scales_with_subset``: C |S|, see the config schema);
* the sensitivity 2 C_eff / (beta |S|) of the clipped average (Sec. 3.1, eq. 6);
* the per-step mu_t = (2 C_eff / (beta |S|)) sqrt(2 dt / t^3) (eq. 39);
* mu_bar_B = sqrt(sum_{t in block} mu_t^2) (eq. 9 / eq. 22), the block reused with one subset;
* q_B = |S| / n, and the ``dp_accounting`` event of the scheme: one subset per output reused
  over the block (Algorithm 1, Prop. 4.1), a fresh subset per step (Prop. C.1), or every
  record at every step, composed exactly in GDP (Sec. 3.2).

The sampler's clip norm, the ledger line, the accounting tables (Tables 7, 8/9, 11, 12, 13),
the Table 8 join, the replay's rebuild and the diagnostics all read these properties, so the
scaling rule and eq. 9 are written here once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from dp_accounting import dp_event

from pipeline.diffusion.schedule import EDMSchedule
from pipeline.privacy import accountants as acc
from pipeline.privacy.schedule import block_mu, k_private_steps, step_mu

#: the subsampled sum gathers each output's B records instead of masking all n when B/n is at
#: most this (the masked matmul wastes n/B of its FLOPs; the gather is bandwidth-bound: on one
#: CPU core it was 2x slower than the mask at B/n = 1/30, see benchmarks/bench_empirical_denoiser.py).
#: Here, not in pipeline.privacy.empirical_denoiser, so that the cost model reads it without torch.
GATHER_MAX_FRACTION = 1 / 64
#: how the block's subsets are drawn: ``per_output`` (Algorithm 1, one B-subset per output reused
#: over the block), ``per_step`` (a fresh B-subset at every private step), ``full_batch`` (S = D).
Scheme = Literal["per_output", "per_step", "full_batch"]
SCHEMES: tuple[str, ...] = ("per_output", "per_step", "full_batch")

#: the ledger line's mechanism name and sampling scheme of each block scheme
MECHANISM_NAMES = {"per_output": "empden_outputwise_block", "per_step": "empden_per_step_subsampled",
                   "full_batch": "empden_full_batch"}
SAMPLING_SCHEMES = {"per_output": "fixed_size_per_output", "per_step": "fixed_size_per_step", "full_batch": "none"}
#: the block scheme of each private EMPDEN cell method (pipeline.methods.empden.grid.METHODS)
CELL_METHOD_SCHEMES: dict[str, Scheme] = {"hybrid": "per_output", "per_step": "per_step", "full_batch": "full_batch"}


def sensitivity(*, C: float, beta: float, subset_size: int) -> float:
    """L2 sensitivity of the clipped average, 2C/(beta |S|) (EMPDEN Sec. 3.1, eq. 6)."""
    if not (C > 0 and beta > 0 and subset_size >= 1):
        raise ValueError(f"sensitivity needs C > 0, beta > 0, |S| >= 1; got C={C}, beta={beta}, |S|={subset_size}")
    return 2.0 * C / (beta * subset_size)


@dataclass(frozen=True)
class SamplerMechanism:
    """A block's mechanism as the ledger line states it.

    ``mu_core`` is the largest per-step GDP parameter of the event (for an output-wise block,
    mu_bar_B), so the line's noise multiplier is 1/mu_core; ``q`` is the sampling rate (1 for
    full batch).
    """

    event: dp_event.DpEvent
    sensitivity: float
    mu_core: float
    q: float


@dataclass(frozen=True)
class EmpdenBlock:
    """k private steps of the clipped empirical denoiser over |S| = B of n records, N_out outputs.

    ``C`` is the configured clip norm; with ``C_scales_with_subset`` the mechanism clips at
    C |S| (:attr:`C_eff`). A block rebuilt from a ledger line or a manifest carries the clip
    already scaled (``C_scales_with_subset=False``). For ``full_batch``, B = n. ``p_percent``
    is provenance only (k is what the mechanism runs).
    """

    schedule: EDMSchedule
    k: int
    C: float
    beta: float
    B: int
    n: int
    N_out: int
    scheme: Scheme = "per_output"
    C_scales_with_subset: bool = False
    p_percent: float | None = None

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"EMPDEN block scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if not 0 <= self.k <= self.schedule.N:
            raise ValueError(f"block of {self.k} steps does not fit a grid of {self.schedule.N} steps")
        if not (self.C > 0 and self.beta > 0):
            raise ValueError(f"EMPDEN block needs C > 0 and beta > 0, got C={self.C}, beta={self.beta}")
        if not 1 <= self.B <= self.n:
            raise ValueError(f"subsample size B must be in [1, n={self.n}], got {self.B}")
        if self.scheme == "full_batch" and self.B != self.n:
            raise ValueError(f"a full-batch block runs over all n={self.n} records, got B={self.B}")
        if self.N_out < 1:
            raise ValueError(f"number of outputs N_out must be >= 1, got {self.N_out}")

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_accounting(cls, accounting: Mapping[str, Any], *, schedule: EDMSchedule, B: int, n: int, N_out: int,
                        k: int | None = None, p_percent: float | None = None, scheme: Scheme = "per_output",
                        beta: float | None = None) -> EmpdenBlock:
        """The block of the config's ``accounting`` section (C, C_scales_with_subset, beta) on ``schedule``.

        Give the block's length as ``k`` or as the private share ``p_percent`` (k = ceil(p N / 100),
        :func:`~pipeline.privacy.schedule.k_private_steps`); ``beta`` overrides the section's
        (a cell of the beta ablation).
        """
        if k is None:
            if p_percent is None:
                raise ValueError("an EMPDEN block needs its length: k or p_percent")
            k = k_private_steps(schedule.N, p_percent)
        return cls(schedule=schedule, k=int(k), C=float(accounting["C"]),
                   beta=float(accounting["beta"] if beta is None else beta), B=int(B), n=int(n), N_out=int(N_out),
                   scheme=scheme, C_scales_with_subset=bool(accounting["C_scales_with_subset"]),
                   p_percent=None if p_percent is None else float(p_percent))

    def with_outputs(self, N_out: int) -> EmpdenBlock:
        """The same block released for ``N_out`` outputs."""
        return replace(self, N_out=int(N_out))

    # ----------------------------------------------------------------- the facts

    @property
    def C_eff(self) -> float:
        """The clip norm the mechanism applies: C |S| when ``C_scales_with_subset``, else C.

        With the scaling, the 1/|S| of the sensitivity 2C/(beta |S|) cancels and mu_t does not
        depend on |S| (the convention that reproduces EMPDEN's released mu_bar_B, Tables 7-9).
        """
        return self.C * self.B if self.C_scales_with_subset else self.C

    @property
    def sensitivity(self) -> float:
        """2 C_eff / (beta |S|) (Sec. 3.1, eq. 6)."""
        return sensitivity(C=self.C_eff, beta=self.beta, subset_size=self.B)

    @property
    def mu_t(self) -> np.ndarray:
        """mu_t of the block's k steps, eq. 39 with |S| = B (n for full batch)."""
        return step_mu(self.schedule, C=self.C_eff, beta=self.beta, batch_size=self.B)[: self.k]

    @property
    def mu_bar_B(self) -> float:
        """mu_bar_B = sqrt(sum_{t in block} mu_t^2), the block composed exactly (eq. 9)."""
        return block_mu(self.mu_t, self.k)

    @property
    def q_B(self) -> float:
        """q_B = B / n (1 for full batch)."""
        return self.B / self.n

    @property
    def t0(self) -> float:
        """The handoff t0 = t_k, where the private block ends."""
        return float(self.schedule.times()[self.k])

    @property
    def mu_total(self) -> float:
        """sqrt(N_out) mu_bar_B: the GDP parameter of a full-batch run's N_out outputs (Sec. 3.2)."""
        return math.sqrt(self.N_out) * self.mu_bar_B

    @property
    def mu_core(self) -> float:
        """The largest per-step GDP parameter of the event: mu_bar_B for an output-wise block, max mu_t else."""
        return self.mu_bar_B if self.scheme == "per_output" else float(np.max(self.mu_t))

    @property
    def event(self) -> dp_event.DpEvent:
        """The ``dp_accounting`` event of the scheme: Prop. 4.1, Prop. C.1 or Sec. 3.2's exact composition."""
        if self.scheme == "per_output":
            return acc.outputwise_event(self.mu_bar_B, self.q_B, self.N_out)
        if self.scheme == "per_step":
            return acc.per_step_event(self.mu_t, self.q_B, self.N_out)
        return acc.full_batch_event(self.mu_t, self.N_out)

    def mechanism(self) -> SamplerMechanism:
        """The event with the sensitivity, mu_core and rate the ledger line states."""
        return SamplerMechanism(self.event, self.sensitivity, self.mu_core, 1.0 if self.scheme == "full_batch"
                                else self.q_B)

    # ----------------------------------------------------------------- the samples' manifest

    def facts(self) -> dict[str, Any]:
        """The block's privacy facts in a sampled cell's manifest (the inverse is :meth:`from_facts`).

        With the schedule's own facts (N, sigma_max, rho, sigma_min_schedule), the cell's method,
        beta, B and n_out, they determine the block again; C_used is :attr:`C_eff`.
        """
        out = {"k_steps": self.k, "n": self.n, "C_used": self.C_eff, "q_B": self.q_B, "mu_bar_B": self.mu_bar_B}
        return {**out, "mu_total": self.mu_total} if self.scheme == "full_batch" else {**out, "t0": self.t0}

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> EmpdenBlock:
        """The private block of a sampled cell, from its manifest facts (``pipeline.methods.empden.sample_stage``).

        The facts carry the clip the sampler applied (``C_used``, already scaled), so the rebuilt
        block's mu_bar_B (eq. 9) is the sampler's to the last bit.
        """
        scheme = CELL_METHOD_SCHEMES.get(facts.get("method"))
        if scheme is None:
            raise ValueError(f"a {facts.get('method')} cell has no private block")
        sched = EDMSchedule(sigma_min=float(facts["sigma_min_schedule"]), sigma_max=float(facts["sigma_max"]),
                            rho=float(facts["rho"]), N=int(facts["N"]))
        n = int(facts["n"])
        return cls(schedule=sched, k=int(facts["k_steps"]), C=float(facts["C_used"]), beta=float(facts["beta"]),
                   B=n if scheme == "full_batch" else int(facts["B"]), n=n, N_out=int(facts["n_out"]),
                   scheme=scheme, p_percent=facts.get("p_percent"))

    # ----------------------------------------------------------------- the ledger line

    @property
    def mechanism_name(self) -> str:
        return MECHANISM_NAMES[self.scheme]

    def sampling(self) -> dict[str, Any]:
        """The ledger line's ``sampling`` field."""
        if self.scheme == "full_batch":
            return {"scheme": "none", "n": self.n}
        return {"scheme": SAMPLING_SCHEMES[self.scheme], "probability": self.q_B, "B": self.B, "n": self.n}

    def schedule_extra(self) -> dict[str, Any]:
        """The mechanism parameters the replay rebuilds the event from (C is :attr:`C_eff`)."""
        s = self.schedule
        return {"sigma_min": s.sigma_min, "sigma_max": s.sigma_max, "rho": s.rho, "N": s.N, "k_steps": self.k,
                "t_end": self.t0, "C": self.C_eff, "beta": self.beta}

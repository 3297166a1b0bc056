"""STRAIGHTDP runs as values: which runs Table 1 needs, what each spends, and the name of each.

A *run* is one row of STRAIGHTDP's Table 1 at one total budget eps and one seed. Its *row* says
which of the pipeline's parts it uses (Sec. 3, Table 1):

========================  ========  =====================  =========  ==========================
row                       Stage 1   where the release goes  Stage 2    samples from
========================  ========  =====================  =========  ==========================
``released_only``         all eps   nowhere else            none       the release, N(mu_y, Sigma)
``public_guidance``       all eps   sampling (start at t0)  none       the public flow, guided
``uniform``               none      -                       uniform    the DP-SGD flow
``tha``                   none      -                       THA plan   the DP-SGD flow
``uniform_moments``       share     distillation (t <= tau) uniform    the DP-SGD flow
``tha_moments``           share     distillation (t <= tau) THA plan   the DP-SGD flow
========================  ========  =====================  =========  ==========================

With both stages active Stage 1 targets ``weight / (weight + sgd_weight)`` of eps (the paper's
rho_mom = 0.2, rho_sgd = 0.65: 0.235 eps, Table 9) and Stage 2's noise is calibrated so that
both compose to eps in one PLD accountant; a row with one stage spends all of eps on it.

A run's name is the path token ``<row>_eps<eps>_seed<seed>`` (e.g. ``tha_moments_eps0p3_seed1``):
:attr:`StraightRun.name` writes it, :meth:`StraightRun.from_name` reads it back and
:data:`RUN_PATTERN` is the Snakemake wildcard constraint. Pure Python (no torch): the rule file
imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.training.dpdm_runs import fmt_num, parse_num

#: every row: Table 1's in the paper's order, then Table 3's LoRA rows (the regex tries the longer names first)
ROWS = ("released_only", "public_guidance", "uniform", "tha", "uniform_moments", "tha_moments", "lora_uniform",
        "lora_moments")
#: rows whose Stage 2 trains a flow with DP-SGD, and their plan (Table 3's LoRA rows: one uniform (C, sigma))
PLANS = {"uniform": "uniform", "tha": "tha", "uniform_moments": "uniform", "tha_moments": "tha",
         "lora_uniform": "uniform", "lora_moments": "uniform"}
#: rows that release moments
RELEASING = ("released_only", "public_guidance", "uniform_moments", "tha_moments", "lora_moments")
#: rows whose DP-SGD trains LoRA adapters of the frozen public flow (Table 3), not every weight
LORA_ROWS = ("lora_uniform", "lora_moments")
#: Table 3's rows (the frozen-model route): guidance by the release, DP-LoRA, the release distilled into LoRA
FROZEN_ROWS = ("public_guidance", "lora_uniform", "lora_moments")
#: what the paper calls each row in Table 1
LABELS = {
    "released_only": "Released moments only",
    "public_guidance": "Public prior + guidance",
    "uniform": "Uniform DP-SGD",
    "tha": "THA-planned DP-SGD",
    "uniform_moments": "Uniform + moments",
    "tha_moments": "THA + moments",
    "lora_uniform": "DP-LoRA (uniform)",
    "lora_moments": "Moments distilled into LoRA + DP-LoRA",
}


def table_rows(table: str) -> tuple[str, ...]:
    """The rows a STRAIGHTDP table shows: Table 3 the frozen-model route's, every other table Table 1's."""
    return FROZEN_ROWS if table == "table3_frozen" else tuple(r for r in ROWS if r not in LORA_ROWS)


_NUM = r"[0-9p]+(?:e-?[0-9]+)?"
_ROW = "|".join(sorted(ROWS, key=len, reverse=True))
#: the run grammar as a Snakemake wildcard constraint (no groups of its own)
RUN_PATTERN = rf"(?:{_ROW})_eps{_NUM}_seed[0-9]+"
_RUN_RE = re.compile(rf"(?P<row>{_ROW})_eps(?P<eps>{_NUM})_seed(?P<seed>[0-9]+)")


@dataclass(frozen=True, order=True)
class StraightRun:
    """One STRAIGHTDP run: Table 1 row, total budget eps, seed."""

    row: str
    epsilon: float
    seed: int

    def __post_init__(self) -> None:
        if self.row not in ROWS:
            raise ValueError(f"STRAIGHTDP row must be one of {', '.join(ROWS)}, got {self.row!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "seed", int(self.seed))
        if not self.epsilon > 0:
            raise ValueError(f"STRAIGHTDP run budget must be > 0, got {self.epsilon}")

    @property
    def name(self) -> str:
        """The run's path token, e.g. ``tha_moments_eps0p3_seed1``."""
        return f"{self.row}_eps{fmt_num(self.epsilon)}_seed{self.seed}"

    @classmethod
    def from_name(cls, name: str) -> StraightRun:
        """The run a path token names (the inverse of :attr:`name`)."""
        m = _RUN_RE.fullmatch(name)
        if m is None:
            raise ValueError(f"STRAIGHTDP run name {name!r} is not <row>_eps<eps>_seed<seed> "
                             f"(rows: {', '.join(ROWS)})")
        return cls(m["row"], parse_num(m["eps"]), int(m["seed"]))

    @property
    def releases(self) -> bool:
        """Stage 1 runs (a moment release with its own ledger line)."""
        return self.row in RELEASING

    @property
    def trains(self) -> bool:
        """Stage 2 runs (DP-SGD of the flow, with its own ledger line)."""
        return self.row in PLANS

    @property
    def plan(self) -> str | None:
        """``uniform`` or ``tha`` for a training row, else None."""
        return PLANS.get(self.row)

    @property
    def lora(self) -> bool:
        """Stage 2 trains LoRA adapters of the frozen public flow (Table 3), not every weight."""
        return self.row in LORA_ROWS

    @property
    def distills(self) -> bool:
        """The release is distilled into the weights before DP-SGD (the ``*_moments`` rows)."""
        return self.releases and self.trains

    @property
    def samples_from(self) -> str:
        """``release`` (sample N(mu_y, Sigma)), ``guided`` (public flow from t0) or ``model``."""
        return {"released_only": "release", "public_guidance": "guided"}.get(self.row, "model")

    def release_epsilon(self, release: Mapping[str, Any]) -> float | None:
        """Stage 1's own target: all of eps alone, the renormalised weight share with Stage 2."""
        if not self.releases:
            return None
        if not self.trains:
            return self.epsilon
        return self.epsilon * release["weight"] / (release["weight"] + release["sgd_weight"])


def runs(straightdp: Mapping[str, Any]) -> list[StraightRun]:
    """Every run of Table 1 (rows x epsilons x seeds), in row, eps, seed order."""
    return [StraightRun(r, e, s) for r in straightdp["rows"] for e in straightdp["epsilons"]
            for s in straightdp["seeds"]]

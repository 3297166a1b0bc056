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
:data:`RUN_PATTERN` is the Snakemake wildcard constraint (the grammar :data:`RUN_NAME` is declared in the
shared run-name grammar of :mod:`pipeline.runs`). A run of an *arm* (``straightdp.arms``: the
same rows on another backbone or in another space, each with its own public flow; Table 1's latent
block, Table 2) carries the arm's name in front: ``<arm>-<row>_eps<eps>_seed<seed>`` (e.g.
``latent-uniform_eps0p3_seed0``); the main configuration's runs have none. Pure Python (no torch): the
rule file imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.runs import NamedRun, RunGrammar, choice, integer, number, word

#: every row: Table 1's in the paper's order, then Table 3's LoRA rows
ROWS = ("released_only", "public_guidance", "uniform", "tha", "uniform_moments", "tha_moments", "lora_uniform",
        "lora_moments")
#: the paper's full method, its headline row: the Stage-1 moment release followed by THA-planned DP-SGD (Section 3,
#: Table 1's "THA + moments"); every other row is a control or an ablation of it
MAIN_ROW = "tha_moments"
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


#: an arm's name (``straightdp.arms``' keys): lower case, digits, underscores; never a hyphen
ARM_PATTERN = r"[a-z][a-z0-9_]*"
#: the run grammar: ``[<arm>-]<row>_eps<eps>_seed<seed>`` (the arm, with its hyphen, only for an arm's runs)
RUN_NAME = RunGrammar("STRAIGHTDP run", (choice("row", ROWS), number("epsilon", "eps"), integer("seed", "seed")),
                      example="tha_moments_eps0p3_seed1", head=word("arm", ARM_PATTERN), head_sep="-",
                      head_optional=True)
#: the run grammar as a Snakemake wildcard constraint (no groups of its own)
RUN_PATTERN = RUN_NAME.pattern


@dataclass(frozen=True, order=True)
class StraightRun(NamedRun):
    """One STRAIGHTDP run: Table 1 row, total budget eps, seed, and its arm ("" = the main configuration).

    Named ``tha_moments_eps0p3_seed1`` or ``latent-uniform_eps0p3_seed0`` (:attr:`name`, :meth:`from_name`)."""

    GRAMMAR = RUN_NAME

    row: str
    epsilon: float
    seed: int
    arm: str = ""

    def __post_init__(self) -> None:
        if self.row not in ROWS:
            raise ValueError(f"STRAIGHTDP row must be one of {', '.join(ROWS)}, got {self.row!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "seed", int(self.seed))
        if not self.epsilon > 0:
            raise ValueError(f"STRAIGHTDP run budget must be > 0, got {self.epsilon}")
        if self.arm and not re.fullmatch(ARM_PATTERN, self.arm):
            raise ValueError(f"STRAIGHTDP arm name must match {ARM_PATTERN} (lower case, digits, underscores), "
                             f"got {self.arm!r}")

    @property
    def main(self) -> StraightRun:
        """The same run in the main configuration (an arm's reference in Table 2)."""
        return StraightRun(self.row, self.epsilon, self.seed)

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


def runs(straightdp: Mapping[str, Any], arm: str = "") -> list[StraightRun]:
    """Every run of the main configuration (rows x epsilons x seeds), in row, eps, seed order, or of
    ``straightdp.arms[arm]`` (its own rows, epsilons and seeds)."""
    section = straightdp["arms"][arm] if arm else straightdp
    return [StraightRun(r, e, s, arm) for r in section["rows"] for e in section["epsilons"]
            for s in section["seeds"]]


def arm_runs(straightdp: Mapping[str, Any], table: str | None = None) -> list[StraightRun]:
    """Every arm's runs (config order), or those of the arms that feed ``table`` (an arm's ``tables``)."""
    return [run for arm, section in (straightdp.get("arms") or {}).items()
            if table is None or table in section["tables"] for run in runs(straightdp, arm)]


#: straightdp.pretrain keys of an imported public flow (pipeline/flow/public.py): the main configuration's only
PUBLIC_IMPORT_KEYS = ("source", "path", "label_embeddings", "prediction")


def arm_section(straightdp: Mapping[str, Any], arm: str) -> dict[str, Any]:
    """The straightdp section an arm's jobs read: the main one with the arm's ``space``, ``autoencoder``
    and ``flow`` switches over it (the flow key by key), less ``arms`` and an imported flow's keys
    (:data:`PUBLIC_IMPORT_KEYS`); its listing keys are the arm's."""
    if not arm:
        return {k: v for k, v in straightdp.items() if k != "arms"}
    try:
        own = straightdp["arms"][arm]
    except KeyError:
        raise ValueError(f"STRAIGHTDP arm {arm!r} is not in straightdp.arms "
                         f"({', '.join(straightdp.get('arms') or {}) or 'none configured'})") from None
    out = {k: v for k, v in straightdp.items() if k != "arms"}
    out["flow"] = {**straightdp["flow"], **own.get("flow", {})}
    # an arm pretrains its own flow (its switches act from pretraining on): the imported flow is the main one's
    if "pretrain" in straightdp:
        out["pretrain"] = {k: v for k, v in straightdp["pretrain"].items() if k not in PUBLIC_IMPORT_KEYS}
    for key in ("space", "autoencoder", "rows", "epsilons", "seeds"):
        if key in own:
            out[key] = own[key]
    return out


# --------------------------------------------------------------------------- what the configuration fixes
# Torch-free, so that the stages plan with these and the wiring registers them (pipeline/methods/straightdp/wiring.py
# ``transcripts``): what a ledger line must say is computed by the code that planned it, never by a copy.


@dataclass(frozen=True)
class Stage2Config:
    """Stage 2's DP-SGD of a training run as the configuration fixes it, before any data, the horizon tau (measured
    on the public set) or the planner's public proxy: ``buckets`` K (1 for a uniform row), the shape family's
    ``betas`` (only 0 for a uniform row), the expected batch B over the declared ``dataset_size`` N, the ``steps`` T
    and the reference clip C_ref (the mean clip over the buckets)."""

    buckets: int
    betas: tuple[float, ...]
    batch_size: int
    dataset_size: int
    steps: int
    clip_ref: float

    @property
    def sampling_rate(self) -> float:
        """The Poisson rate q = B / N (capped at 1)."""
        return min(1.0, self.batch_size / self.dataset_size)

    @property
    def uniform(self) -> bool:
        """Every candidate is the uniform shape: every clip is C_ref, whatever tau and the proxy are."""
        return self.betas == (0.0,)


def stage2_config(run: StraightRun, sgd: Mapping[str, Any], n: int) -> Stage2Config:
    """The :class:`Stage2Config` of training ``run`` under the dpsgd section ``sgd`` and the declared private size
    ``n`` (pipeline/methods/straightdp/stages.py ``stage2_plan`` plans with it; the wiring registers it)."""
    if not run.trains:
        raise ValueError(f"STRAIGHTDP row {run.row} trains no flow")
    tha = run.plan == "tha"
    return Stage2Config(buckets=int(sgd["buckets"]) if tha else 1,
                        betas=tuple(sorted({float(b) for b in sgd["betas"]})) if tha else (0.0,),
                        batch_size=int(sgd["batch_size"]), dataset_size=int(n), steps=int(sgd["steps"]),
                        clip_ref=float(sgd["clip_ref"]))


#: Fig. 6's lines (pipeline/methods/straightdp/toy.py): the Table 1 rows the 2-D toy runs, in the order each point runs them
TOY_ROWS = ("released_only", "uniform", "tha_moments")
#: the toy's release keeps both dimensions of its 2-D points (the public PCA basis is the plane itself)
TOY_RELEASE_P = 2


def toy_sgd(section: Mapping[str, Any]) -> dict[str, Any]:
    """The straightdp.dpsgd section (THA buckets, shapes, clip, multiplicity) with the toy's steps, batch, lr."""
    toy = section["toy"]
    return {**section["dpsgd"], "steps": int(toy["dpsgd_steps"]), "batch_size": int(toy["dpsgd_batch_size"]),
            "lr": float(toy["lr"])}


def toy_points(toy: Mapping[str, Any]) -> list[StraightRun]:
    """Fig. 6's points in the order the stage runs them and writes their ledger lines: seeds, then epsilons, then
    :data:`TOY_ROWS` (each point's release line, if any, before its DP-SGD line)."""
    return [StraightRun(row, float(eps), int(seed)) for seed in toy["seeds"] for eps in toy["epsilons"]
            for row in TOY_ROWS]


def table4_releases(table4: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """Table 4's text releases (featurisation, eps, seed) in the order the stage runs them, one ledger line each."""
    return [(str(kind), float(eps), int(seed)) for kind in table4["featurisations"] for eps in table4["epsilons"]
            for seed in table4["seeds"]]

"""Baseline runs as values: one run is one baseline at one target eps and one seed.

A run's name is the path token ``<method>_eps<eps>_seed<seed>`` (e.g. ``pe_eps0p3_seed0``):
:attr:`BaselineRun.name` writes it, :meth:`BaselineRun.from_name` reads it back and
:data:`RUN_PATTERN` is the Snakemake wildcard constraint (the grammar :data:`RUN_NAME` is declared in
the shared run-name grammar of :mod:`pipeline.runs`). Pure Python (no torch): the rule file
imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.runs import NamedRun, RunGrammar, choice, integer, number

#: the baselines, as written in run names and the config's baselines.methods
METHODS = ("dp_merf", "pe", "dp_hp", "dp_ntk", "dp_mepf", "dp_diffusion", "privimage", "dp_ldm",
           "dp_promise")
#: what the tables and the figure call each
LABELS = {"dp_merf": "DP-MERF", "pe": "Private Evolution", "dp_hp": "DP-HP", "dp_ntk": "DP-NTK", "dp_mepf": "DP-MEPF",
          "dp_diffusion": "DP-Diffusion", "privimage": "PrivImage", "dp_ldm": "DP-LDM",
          "dp_promise": "DP-Promise (certified variant)"}
#: DP-MERF's successors: another feature map; DP-MERF's release, generator and loop
#: (pipeline/baselines/embedding_family.py)
EMBEDDING_FAMILY = ("dp_hp", "dp_ntk", "dp_mepf")
#: baselines that fine-tune a public denoiser with the DP-SGD engine (stage train_dpdm), then sample it: DP-Diffusion
#: the shared one, PrivImage its own, pretrained on the public data its semantic query chose, DP-LDM a latent one
#: (its attention and conditioning only, on a public autoencoder's codes), DP-Promise the shared one in two phases
#: (high noise levels, then low; each a DP-SGD release, composed)
DPSGD_FAMILY = ("dp_diffusion", "privimage", "dp_ldm", "dp_promise")
#: DP-SGD baselines whose denoiser works in a public autoencoder's latent space: their samples are codes, decoded
#: by rule dp_ldm_decode (post-processing)
LATENT = ("dp_ldm",)

#: the run grammar: ``<method>_eps<eps>_seed<seed>``
RUN_NAME = RunGrammar("baseline run", (choice("method", METHODS), number("epsilon", "eps"), integer("seed", "seed")),
                      example="pe_eps0p3_seed0")
#: the run grammar as a Snakemake wildcard constraint (no groups of its own)
RUN_PATTERN = RUN_NAME.pattern


def method_pattern(method: str) -> str:
    """The wildcard constraint of one method's runs (the rule that trains them makes no other's)."""
    return methods_pattern((method,))


def methods_pattern(methods: tuple[str, ...]) -> str:
    """The wildcard constraint of the runs of ``methods`` (one rule runs DP-MERF's successors)."""
    return RUN_NAME.narrowed("method", methods).pattern


@dataclass(frozen=True, order=True)
class BaselineRun(NamedRun):
    """One baseline run: method, target eps, seed; named ``pe_eps0p3_seed0`` (:attr:`name`, :meth:`from_name`)."""

    GRAMMAR = RUN_NAME

    method: str
    epsilon: float
    seed: int

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"baseline method must be one of {', '.join(METHODS)}, got {self.method!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "seed", int(self.seed))
        if not self.epsilon > 0:
            raise ValueError(f"baseline run budget must be > 0, got {self.epsilon}")


def epsilons(section: Mapping[str, Any], method: str) -> list[float]:
    """The target eps of ``method``'s runs: its subsection's ``epsilons`` when set, else the section's."""
    own = section.get(method, {}).get("epsilons")
    return list(section["epsilons"] if own is None else own)


def runs(section: Mapping[str, Any]) -> list[BaselineRun]:
    """Every run of the baselines section: methods x their epsilons x seeds."""
    return [BaselineRun(m, e, s) for m in section["methods"] for e in epsilons(section, m) for s in section["seeds"]]

"""Baseline runs as values: one run is one baseline at one target eps and one seed.

A run's name is the path token ``<method>_eps<eps>_seed<seed>`` (e.g. ``pe_eps0p3_seed0``):
:attr:`BaselineRun.name` writes it, :meth:`BaselineRun.from_name` reads it back and
:data:`RUN_PATTERN` is the Snakemake wildcard constraint. Pure Python (no torch): the rule file
imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.training.dpdm_runs import fmt_num, parse_num

#: the baselines, as written in run names and the config's baselines.methods
METHODS = ("dp_merf", "pe")
#: what the tables and the figure call each
LABELS = {"dp_merf": "DP-MERF", "pe": "Private Evolution"}

_NUM = r"[0-9p]+(?:e-?[0-9]+)?"
_METHOD = "|".join(METHODS)
RUN_PATTERN = rf"(?:{_METHOD})_eps{_NUM}_seed[0-9]+"
_RUN_RE = re.compile(rf"(?P<method>{_METHOD})_eps(?P<eps>{_NUM})_seed(?P<seed>[0-9]+)")


@dataclass(frozen=True, order=True)
class BaselineRun:
    """One baseline run: method, target eps, seed."""

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

    @property
    def name(self) -> str:
        return f"{self.method}_eps{fmt_num(self.epsilon)}_seed{self.seed}"

    @classmethod
    def from_name(cls, name: str) -> BaselineRun:
        m = _RUN_RE.fullmatch(name)
        if m is None:
            raise ValueError(f"{name!r} is not a baseline run name (<method>_eps<eps>_seed<seed>, method one of "
                             f"{', '.join(METHODS)}, e.g. pe_eps0p3_seed0)")
        return cls(m["method"], parse_num(m["eps"]), int(m["seed"]))


def runs(section: Mapping[str, Any]) -> list[BaselineRun]:
    """Every run of the baselines section: methods x epsilons x seeds."""
    return [BaselineRun(m, e, s) for m in section["methods"] for e in section["epsilons"] for s in section["seeds"]]

"""Where bundles go and what their jobs read: rules ``export_bundle`` and ``export_bundles`` (``rules/bundles.smk``).

A method registers its private runs' bundles (its wiring's ``bundle_runs``/``bundle``,
:class:`pipeline.registry.BundleSpec`); this turns them into paths (``results/bundles/<method>/<run>/``, every one of them in ``all``) and the export job's
inputs and params. Nothing here imports Snakemake: ``tests/bundles/test_wiring.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pipeline.registry import BundleSpec, MethodRegistry
from pipeline.wiring import House, params_json


class Wildcards(Protocol):
    method: str
    run: str


class Wiring:
    """The bundles of one configuration's chosen methods."""

    def __init__(self, house: House, registry: MethodRegistry) -> None:
        self.house = house
        self.registry = registry

    @property
    def root(self) -> Path:
        return self.house.layout.bundles

    def path(self, method: str, run: str) -> Path:
        return self.root / method / run

    def runs(self) -> list[tuple[str, str]]:
        return self.registry.bundle_runs(list(self.house.config["methods"]))

    def paths(self) -> list[Path]:
        """Every bundle folder of the chosen methods (rule export_bundles)."""
        return [self.path(m, r) for m, r in self.runs()]

    def targets(self) -> list[Path]:
        """What ``all`` asks for: every bundle folder, unless config ``bundles`` is false."""
        return self.paths() if self.house.config["bundles"] else []

    def spec(self, wildcards: Wildcards) -> BundleSpec:
        return self.registry.bundle(wildcards.method, wildcards.run)

    def inputs(self, wildcards: Wildcards) -> dict[str, Path]:
        """export_bundle's inputs: the run's samples, their metrics, its transcripts (``ledger_<stem>``), its model
        and the other files its sampler reads (``moments``, ``public_flow``, ``autoencoder``)."""
        b = self.spec(wildcards)
        out = {"samples": Path(b.samples), "metrics": Path(b.metrics),
               **{f"ledger_{Path(t).stem}": Path(t) for t in b.transcripts},
               **{name: Path(path) for name, path in b.parts.items()}}
        return out | ({"model": Path(b.model)} if b.model else {})

    def params(self, wildcards: Wildcards) -> str:
        """export_bundle's params: what the run is, each transcript's registration, how it samples, what its eps
        covers."""
        b = self.spec(wildcards)
        registered = self.registry.transcripts(list(self.house.config["methods"]))
        missing = [t for t in b.transcripts if Path(t) not in registered]
        if missing:
            raise ValueError(f"bundle {wildcards.method}/{wildcards.run}: transcript {missing[0]} is not registered "
                             f"(its wiring's transcripts())")
        expected = {Path(t).stem: registered[Path(t)].as_dict() for t in b.transcripts}
        return params_json(method=wildcards.method, run=wildcards.run, experiment=self.house.config["experiment"],
                           kind=b.kind, dataset=self.dataset, epsilon_target=b.epsilon_target, expected=expected,
                           sampling=dict(b.sampling) if b.sampling else None, covers=list(b.covers),
                           not_covered=list(b.not_covered))

    @property
    def dataset(self) -> str:
        """The private data's name on the cards: its source (data.private.source)."""
        return str(self.house.config["data"]["private"]["source"])

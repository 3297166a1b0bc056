"""The toy method's wiring (``rules/toymean.smk``): its one run's files and params, its targets, its ledger
transcript, its all_runs record, its bundle and each rule's resources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.methods.toymean import costs
from pipeline.registry import BundleSpec, RunRecord, TranscriptSpec
from pipeline.wiring import House, stage_params

#: the toy's delta, a constant of the method
DELTA = 1e-5


class Wiring:
    """The toy's one run of one configuration."""

    def __init__(self, house: House) -> None:
        self.house = house

    @property
    def sigma(self) -> float:
        return float(self.house.config["toymean"]["sigma"])

    @property
    def run(self) -> str:
        return f"toymean_sigma{self.sigma:g}_seed{self.house.seed}".replace(".", "p")

    @property
    def samples(self) -> Path:
        return self.house.layout.expdir / "samples" / "toymean" / f"{self.run}.npz"

    @property
    def ledger(self) -> Path:
        return self.house.layout.expdir / "ledger" / f"{self.run}.jsonl"

    @property
    def metrics(self) -> Path:
        return self.house.layout.expdir / "eval" / "toymean" / self.run / "metrics.json"

    @property
    def table(self) -> Path:
        return self.house.layout.tables / "toymean_table.parquet"

    @property
    def data(self) -> Path:
        return self.house.layout.data / "private_train.npz"

    def release_params(self) -> str:
        return stage_params(sigma=self.sigma, delta=DELTA, seed=self.house.seed, private=self.house.private,
                            ledger_binding=self.house.ledger_binding(self.run))

    def targets(self) -> list[Path]:
        return [self.table]

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        # what the configuration ran: sigma (configured, not calibrated) and the declared N, on its one line
        return {self.ledger: TranscriptSpec(claims=1, run=self.run, stage="toymean_release", delta=DELTA,
                                            data=self.data, params={"extra.toymean_sigma": self.sigma,
                                                                    "extra.N": self.house.private["N"]})}

    def records(self) -> list[RunRecord]:
        return [RunRecord(method="toymean", config=self.run, seed=self.house.seed, metrics=str(self.metrics),
                          ledgers=(str(self.ledger),), label="toy mean",
                          benchmarks=(str(self.house.layout.benchmark("toymean_release")),))]

    def bundle_runs(self) -> list[str]:
        return [self.run]

    def bundle(self, run: str) -> BundleSpec:
        """The run's synthetic set: the noisy class means are the private output."""
        if run != self.run:
            raise KeyError(f"toymean has no run {run!r} (its run: {self.run})")
        return BundleSpec(run=run, samples=str(self.samples), metrics=str(self.metrics),
                          transcripts=(str(self.ledger),),
                          covers=("the per-class sums of the clipped private images, noised once",),
                          not_covered=("the declared size of the private set (a public constant)",))

    def resources(self, rule: str) -> dict[str, Any]:
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

"""EMPDEN's wiring (``rules/empden.smk``): its cells' paths and params, the tables' inputs, its targets, the ledger
transcripts the replay checks and the runs all_runs.parquet reads. Cells and their names:
:mod:`pipeline.methods.empden.grid`.

Plain Python over one :class:`~pipeline.wiring.House` (no Snakemake): ``tests/methods/empden/test_wiring.py``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.methods.empden import costs
from pipeline.methods.accounting.wiring import EPS_KEYS, line_params, mechanism
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.registry import BundleSpec, LineParams, RunRecord, TranscriptSpec
from pipeline.methods.empden.grid import Cell, cell_from_wildcards, grid_cells
from pipeline.methods.empden.plan import cell_block, figure2_blocks, job_outputs
from pipeline.wiring import House, io_args, stage_params

#: the empirical denoiser's normaliser settings (empden.normaliser, empden.normaliser_n): params of every job that
#: builds it (public_only cells ignore them)
NORMALISER_KEYS = ("normaliser", "normaliser_n")
#: what all_runs.parquet and the privacy-utility figure call each sampler
LABELS = {"hybrid": "EMPDEN hybrid (p, B, T grid)", "per_step": "EMPDEN per-step (p, B, T grid)",
          "full_batch": "EMPDEN full batch", "public_only": "public denoiser only (EMPDEN)"}
#: the sampler the paper reports (Section 4: output-wise subsampled private block, public refinement after
#: the handoff); per-step and full-batch cells are its ablations, the public-only cell a reference
MAIN_SAMPLER = "hybrid"
#: the prior methods whose main tables give Table 2 its rows, when they are chosen
PRIOR_METHODS = ("baselines", "dpdm")
#: the run (and stage) Figure 2's own transcript is bound to
FIGURE2 = "empden_figure2_trajectories"


class Wiring:
    """EMPDEN's sampling grid (Sec. 6, App. J) of one configuration: the cells, Tables 2, 3, 8/9, 10, Figures 2, 3,
    4 right."""

    def __init__(self, house: House) -> None:
        self.house = house

    @property
    def section(self) -> dict[str, Any]:
        return self.house.config["empden"]

    # ---------------------------------------------------------------- paths

    @property
    def samples(self) -> Path:
        """samples/empden/: a cell's samples are ``<cell.name>.npz`` below it (and its manifest ``.json``)."""
        return self.house.layout.expdir / "samples" / "empden"

    @property
    def table8(self) -> Path:
        """Tables 8/9: every cell with FID, PLD [eps_l, eps_u] and Edgeworth eps_ew (the other tables read it)."""
        return self.house.layout.tables / "empden_table8_grid.parquet"

    @property
    def figure2_ledger(self) -> Path:
        """Figure 2's own transcript (its trajectories read the private set)."""
        return self.house.layout.ledger(FIGURE2)

    def sample_path(self, cell: Cell) -> Path:
        return self.samples / f"{cell.name}.npz"

    def metrics_path(self, cell: Cell) -> Path:
        """The evaluation core's metrics of the cell's samples (rule empden_evaluate)."""
        return self.house.layout.expdir / "eval" / "empden" / cell.name / "metrics.json"

    def ledger_path(self, cell: Cell) -> Path:
        """The cell's own transcript (parallel jobs never append to the same file)."""
        return self.house.layout.ledger(cell.ledger_stem)

    # ---------------------------------------------------------------- sharded cells (sampling.shards)

    @property
    def shards(self) -> int:
        """Jobs per cell (``sampling.shards``, :mod:`pipeline.shards`); 1 samples each cell in one job."""
        return int(self.house.config["sampling"]["shards"])

    @property
    def sharded(self) -> bool:
        """Whether each cell is sampled by several jobs and joined by ``empden_gather``."""
        return self.shards > 1

    def sample_outputs(self, name: str, *, private: bool = True) -> dict[str, Path]:
        """A sampling rule's outputs for the cell name pattern ``name`` (``{method}/p{p}_..._s{seed}``): the
        cell's samples, manifest and (``private``) transcript; sharded, one shard's (wildcard ``shard``) below
        ``shards/``, which ``empden_gather`` joins into the cell's."""
        stem = "empden_sample_" + name.replace("/", "_")
        if self.sharded:
            part = self.samples / "shards" / name / "{shard,[0-9]+}"
            out = {"samples": Path(f"{part}.npz"), "manifest": Path(f"{part}.json")}
            ledger = self.house.layout.expdir / "ledger" / "shards" / stem / "{shard,[0-9]+}.jsonl"
        else:
            out = {"samples": self.samples / f"{name}.npz", "manifest": self.samples / f"{name}.json"}
            ledger = self.house.layout.ledger(stem)
        return {**out, "ledger": ledger} if private else out

    def sample_job(self, name: str) -> str:
        """The name of one sampling job of the cell pattern ``name`` (its benchmark file's): the cell's, or sharded
        one shard's (``<cell>/shard{shard}``)."""
        return f"{name}/shard{{shard}}" if self.sharded else name

    def sample_log(self, logs: Path, stem: str) -> Path:
        """The log of one sampling job (one shard's, sharded)."""
        return logs / "empden_sample" / (f"{stem}_shard{{shard}}.log" if self.sharded else f"{stem}.log")

    def shard_path(self, cell: Cell, shard: int) -> Path:
        return self.samples / "shards" / cell.name / f"{shard}.npz"

    def shard_ledger(self, cell: Cell, shard: int) -> Path:
        return self.house.layout.expdir / "ledger" / "shards" / cell.ledger_stem / f"{shard}.jsonl"

    def benchmarks(self, cell: Cell) -> tuple[Path, ...]:
        """The benchmark files of every job that made ``cell``'s row (its cost columns): its sampling job and its
        evaluation, or sharded its shards', their gather's and features' and its evaluation's."""
        bench = self.house.layout.benchmark
        if not self.sharded:
            return bench("empden_sample", cell.name), bench("empden_evaluate", cell.name)
        shards = range(self.shards)
        return (*(bench("empden_sample", self.sample_job(cell.name).format(shard=k)) for k in shards),
                bench("empden_gather", cell.name),
                *(bench("empden_features", f"{cell.name}/shard{k}") for k in shards),
                bench("empden_evaluate", cell.name))

    def gather_inputs(self, wildcards: Mapping[str, str]) -> dict[str, Path]:
        """``empden_gather``'s inputs for the cell ``{method}/{rest}``: shard_k (samples) and, for a private cell,
        ledger_k (transcripts), k = 0 .. S-1."""
        cell = Cell.from_name(f"{wildcards['method']}/{wildcards['rest']}")
        out = {f"shard_{k}": self.shard_path(cell, k) for k in range(self.shards)}
        if cell.private:
            out.update({f"ledger_{k}": self.shard_ledger(cell, k) for k in range(self.shards)})
        return out

    def gather_params(self, wildcards: Mapping[str, str]) -> str:
        """``empden_gather``'s params: the cell, the accounting mechanism (its claim), the run's size."""
        cell = Cell.from_name(f"{wildcards['method']}/{wildcards['rest']}")
        h = self.house
        return stage_params(cell=cell.as_dict(), accounting=mechanism(h.config["accounting"]),
                            n_out=costs.n_out(h.config), batch_size=self.section["batch_size"])

    def features_path(self, cell: Cell, shard: int) -> Path:
        """One shard's features (rule empden_features), merged by the cell's evaluation."""
        return self.house.layout.expdir / "eval" / "empden" / "shards" / cell.name / f"{shard}.features.npz"

    def features_inputs(self, wildcards: Mapping[str, str]) -> dict[str, Path]:
        """empden_evaluate's shard features (``features_k``) for the cell ``wildcards.cell``; none unsharded (the
        evaluation extracts the samples' own)."""
        if not self.sharded:
            return {}
        cell = Cell.from_name(wildcards["cell"])
        return {f"features_{k}": self.features_path(cell, k) for k in range(self.shards)}

    @staticmethod
    def features_args(wildcards: Any, input: Mapping[str, Any]) -> str:  # noqa: A002 - Snakemake's name
        """`` features_0=<path> ...`` of the evaluation's stage call (empty unsharded)."""
        keys = sorted((k for k in input.keys() if k.startswith("features_")), key=lambda k: int(k.split("_")[1]))
        return "".join(f" {k}={shlex.quote(str(input[k]))}" for k in keys)

    # ---------------------------------------------------------------- the grid and its inputs

    def cells(self) -> list[Cell]:
        """Every EMPDEN sampling cell of the config (:func:`pipeline.methods.empden.grid.grid_cells`)."""
        return grid_cells(self.section, self.house.config["accounting"])

    @property
    def normaliser_input(self) -> dict[str, Path]:
        """The public split behind the public-marginal normaliser of the empirical denoiser (empden.normaliser;
        pipeline/privacy/empirical_denoiser.py): an input of every private cell (and of the proxy diagnostics), none
        for "constant"."""
        return {"public_data": self.house.layout.split("public")} if self.section["normaliser"] == "public_marginal" \
            else {}

    @property
    def normaliser_params(self) -> dict[str, Any]:
        """The empirical denoiser's normaliser settings (:data:`NORMALISER_KEYS`)."""
        return {k: self.section[k] for k in NORMALISER_KEYS}

    def normaliser_args(self, wildcards: Any, input: Mapping[str, Any]) -> str:  # noqa: A002 - Snakemake's name
        """The normaliser's inputs as ``key=path`` words of the stage call (a space when there are none)."""
        return io_args("", {k: input[k] for k in self.normaliser_input})

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/empden.smk) asks the cluster for, its whole ``resources:``: its
        request in :data:`pipeline.methods.empden.costs.REQUESTS` (a sampling job's runtime: its own cell's)."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

    # ---------------------------------------------------------------- params

    def sample_params(self, method: str, wildcards: Mapping[str, str]) -> str:
        """Stage params of one cell (or one shard of it), parsed from its target path's wildcards: the cell, the
        accounting mechanism (not its table grids), the number of images, batch size, device, threads, the ledger
        binding, the normaliser settings and, sharded, the shard."""
        cell = cell_from_wildcards(method, wildcards)
        h = self.house
        shard = {"shard": {"index": int(wildcards["shard"]), "of": self.shards}} if self.sharded else {}
        return stage_params(cell=cell.as_dict(), accounting=mechanism(h.config["accounting"]),
                            n_out=costs.n_out(h.config), batch_size=self.section["batch_size"],
                            device=h.config["device"], threads=h.torch_threads,
                            ledger_binding=h.ledger_binding(cell.ledger_stem), **self.normaliser_params,
                            **h.public_model(), **shard, **(h.precision if cell.method != "full_batch" else {}))

    def table8_params(self) -> str:
        """Tables 8/9 (rule empden_table8_grid): the accounting keys its eps columns read, nothing of the grid."""
        return stage_params(accounting={k: self.house.config["accounting"][k] for k in EPS_KEYS})

    def table2_params(self) -> str:
        """Table 2 (rule empden_table2_comparison): the main grid's beta."""
        return stage_params(beta=self.house.config["accounting"]["beta"])

    def table3_params(self) -> str:
        """Table 3 (the normaliser beta against eps and FID): the beta ablation at the first seed."""
        return stage_params(beta_ablation=self.section["beta_ablation"], seed=self.section["seeds"][0])

    def table10_params(self) -> str:
        """Table 10 (FID mean +- std over generation seeds): the repeated-seeds section at the main beta."""
        return stage_params(repeated_seeds=self.section["repeated_seeds"], beta=self.house.config["accounting"]["beta"])

    def figure3_params(self) -> str:
        """Figure 3 (FID against certified eps_u varying t0, T and q): the main beta and the first seed."""
        return stage_params(beta=self.house.config["accounting"]["beta"], seed=self.section["seeds"][0])

    def figure4_params(self) -> str:
        """Figure 4 right (full-batch samples along the sigma_min sweep): how many images it shows."""
        return stage_params(n_images=self.section["figure_images"])

    def figure2_params(self) -> str:
        """Figure 2 (output-wise vs per-step trajectories from identical noise): its section, the accounting
        mechanism, beta, the first seed, device, threads, its ledger binding and the normaliser settings."""
        h = self.house
        return stage_params(figure2=self.section["figure2"], accounting=mechanism(h.config["accounting"]),
                            beta=h.config["accounting"]["beta"], seed=self.section["seeds"][0],
                            device=h.config["device"], threads=h.torch_threads,
                            ledger_binding=h.ledger_binding(FIGURE2), **self.normaliser_params,
                            **h.public_model())

    # ---------------------------------------------------------------- tables' inputs

    def table8_inputs(self) -> dict[str, Path]:
        """samples_<i> / metrics_<i> of every cell: the inputs of the Table 8 join."""
        out = {}
        for i, cell in enumerate(self.cells()):
            out[f"samples_{i}"] = self.sample_path(cell)
            out[f"metrics_{i}"] = self.metrics_path(cell)
        return out

    def figure4_inputs(self) -> dict[str, Path]:
        """The full-batch cells (Figure 4 right)."""
        cells = [c for c in self.cells() if c.method == "full_batch"]
        return {f"samples_{i}": self.sample_path(c) for i, c in enumerate(cells)}

    def table2_prior_inputs(self, wildcards: Any = None) -> dict[str, Path]:
        """Table 2's prior-method rows read the baselines' and DPDM's main tables, when those methods are chosen."""
        tables = self.house.layout.tables
        out = {}
        if self.house.method_on("baselines"):
            out["baselines"] = tables / "baselines.parquet"
        if self.house.method_on("dpdm"):
            out["dpdm"] = tables / "dpdm_table_main.parquet"
        return out

    @staticmethod
    def table2_prior_args(wildcards: Any, input: Mapping[str, Any]) -> str:  # noqa: A002 - Snakemake's name
        """`` baselines=<path> dpdm=<path>`` of Table 2's stage call, for the prior tables among its inputs."""
        return "".join(f" {k}={shlex.quote(str(input[k]))}" for k in PRIOR_METHODS if k in input.keys())

    # ---------------------------------------------------------------- what the registry reads

    def targets(self) -> list[Path]:
        """EMPDEN grid tables and figures: Tables 8/9, Table 2 and Figure 3 always; Table 3 (beta ablation),
        Table 10 (repeated seeds), Figure 4 right (full-batch sigma_min sweep) and Figure 2 (trajectories) as the
        empden section asks."""
        e, t, f = self.section, self.house.layout.tables, self.house.layout.figures
        out = [self.table8, t / "empden_table2_comparison.parquet", f / "empden_figure3_tradeoffs.png"]
        if e["beta_ablation"]:
            out.append(t / "empden_table3_beta.parquet")
        if e["repeated_seeds"]:
            out.append(t / "empden_table10_seeds.parquet")
        if e["full_batch"]["sigma_min"]:
            out.append(f / "empden_figure4_samples.png")
        if e["figure2"]:
            out.append(f / "empden_figure2_trajectories.png")
        return out

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        """Each cell that reads private data writes its own transcript (parallel jobs never append to the same
        file) with one claim per shard (one unsharded), bound to the cell (its ledger stem); Figure 2 writes two
        (output-wise and per-step). Every line at the accounting delta, on the private split, and with the
        parameters of the block the configuration runs (:mod:`pipeline.methods.empden.plan`, as the stages build
        it): its mechanism, schedule, k, C (as applied), beta, B, n (the declared N) and outputs. EMPDEN's noise is
        configured, not calibrated: those parameters fix every line's event."""
        common = dict(delta=self.house.config["accounting"]["delta"], data=self.house.layout.split("private_train"))
        claims = {self.ledger_path(c): TranscriptSpec(claims=self.shards, run=c.ledger_stem, stage="empden_sample",
                                                      params=self._cell_lines(c), **common)
                  for c in self.cells() if c.private}
        if self.section["figure2"]:
            blocks = figure2_blocks(self.section["figure2"], mechanism(self.house.config["accounting"]),
                                    beta=self.house.config["accounting"]["beta"], seed=self.section["seeds"][0],
                                    n=self.house.private["N"])
            claims[self.figure2_ledger] = TranscriptSpec(claims=2, run=FIGURE2, stage=FIGURE2,
                                                         params=[_block_line(b) for b in blocks.values()], **common)
        return claims

    def _cell_lines(self, cell: Cell) -> list[LineParams]:
        """The configured parameters of each line of a private cell's transcript: one per job (shard), the cell's
        block over the declared N for that job's share of the cell's outputs (the params :meth:`sample_params`
        gives the stage)."""
        h = self.house
        jobs = job_outputs(costs.n_out(h.config), self.section["batch_size"], self.shards)
        return [_block_line(cell_block(cell, mechanism(h.config["accounting"]), n=h.private["N"], n_out=stop - start))
                for start, stop in jobs]

    def bundle_runs(self) -> list[str]:
        """Every private cell (its name with '/' -> '_': one folder)."""
        return list(self._private_cells())

    def bundle(self, run: str) -> BundleSpec:
        """A cell's synthetic set: the samples are EMPDEN's private output (more would be a new release)."""
        cell = self._private_cells()[run]
        return BundleSpec(run=run, samples=self.sample_path(cell), metrics=self.metrics_path(cell),
                          transcripts=(self.ledger_path(cell),),
                          covers=("every private sampling step of the cell: the empirical denoiser's outputs on the "
                                  "private set, noised as the cell's mechanism declares (EMPDEN Sec. 4), composed over "
                                  "its steps and samples",),
                          not_covered=("the public denoiser the hybrid sampler hands over to, and its pretraining "
                                       "(public data)", "the grid's settings, set in the configuration",
                                       "the declared size of the private set (a public constant)"))

    def _private_cells(self) -> dict[str, Cell]:
        return {c.name.replace("/", "_"): c for c in self.cells() if c.private}

    def records(self) -> list[RunRecord]:
        """all_runs records: every evaluated cell; the figure draws the subsampled cells (hybrid, per-step) as
        points and the public-only cell as a reference (full-batch eps ~1e3-1e4 stay in the table only); the
        hybrid cells are the headline's candidates."""
        return [RunRecord(method="empden", config=c.name, seed=c.seed, private=c.private, metrics=self.metrics_path(c),
                          ledgers=(self.ledger_path(c),) if c.private else (), label=LABELS[c.method],
                          in_figure=c.method != "full_batch", headline=c.method == MAIN_SAMPLER,
                          benchmarks=self.benchmarks(c))
                for c in self.cells()]


def _block_line(block: EmpdenBlock) -> LineParams:
    """What an EMPDEN sampler's ledger line states of its block (:func:`pipeline.privacy.empirical_denoiser.
    record_block`): its mechanism, outputs, sampling and schedule parameters (k, C as applied, beta)."""
    return line_params({"mechanism": block.mechanism_name, "count": block.N_out, "sampling": block.sampling(),
                        "extra": block.schedule_extra()})

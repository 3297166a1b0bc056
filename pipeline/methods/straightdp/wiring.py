"""STRAIGHTDP's wiring: a run's files and params, the tables' inputs, its targets, transcripts and all_runs records.

``rules/straightdp.smk`` builds one :class:`Wiring` over the Snakemake run's :class:`~pipeline.wiring.House`
(``STRAIGHTDP``) and only wires its paths and params into rules. Runs and their names:
:mod:`pipeline.methods.straightdp.runs`; costs: :mod:`pipeline.methods.straightdp.costs` (each rule's
``resources:``, :meth:`Wiring.resources`). Nothing here imports Snakemake.

The paper's outputs (Che, Xu & Wu 2026): Tables 1 (main), 2 (noise sweep, ablation), 3 (frozen-model route),
4 (text-conditional release), 5 (per class), 6 (FID vs eps), 7 (precision/recall); Figures 2a (horizon),
3 (accuracy vs eps), 5 (samples), 6 (the 2-D toy).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import pipeline.resources as cost
from pipeline.config import ConfigError, schema_defaults
from pipeline.methods.straightdp import costs
from pipeline.registry import BundleSpec, RunRecord, TranscriptSpec
from pipeline.methods.straightdp import runs as straightdp_runs
from pipeline.methods.straightdp.runs import StraightRun
from pipeline.wiring import House, params_json, stage_params

#: the tables of rule straightdp_table, each written to TABLES / "straightdp_<name>.parquet"
#: (pipeline/methods/straightdp/table.py TABLE_METRICS): Tables 1, 5, 6, 7 and 3
TABLES = ("table1_main", "table5_per_class", "table6_fid_vs_eps", "table7_precision_recall", "table3_frozen")
#: Table 2's panels (rule straightdp_table2): the noise sweep and the single-factor ablation
TABLE2_PANELS = ("noise_sweep", "ablation")
#: the figures every configuration draws: 2a (horizon), 3 (accuracy vs eps), 5 (samples)
FIGURES = ("figure2_horizon", "figure3_accuracy", "figure5_samples")
#: keys that list which runs exist, not how one is made: left out of a job's params so that adding
#: an eps, a seed or an arm reruns nothing already built
LISTING = ("epsilons", "seeds", "rows", "arms")
#: how a job runs, not what it computes: in no job's params (a changed value reruns nothing)
LAUNCH = ("gpus",)
#: subsections only some rules read (the toy's, Table 4's, LoRA's): left out of every other job's params
OWN_SECTIONS = ("toy", "table4", "lora")
#: data.toy keys the Fig. 6 toy reads (the mixture it was drawn from)
TOY_DATA_KEYS = ("n", "n_modes", "radius", "std")
#: straightdp keys Table 4's release reads: a flow or DP-SGD setting does not rerun it
TABLE4_KEYS = ("delta", "release", "table4")
#: images per class in Figure 5's sample grid
GRID_PER_CLASS = 8


def sample_shape(config: Mapping[str, Any], section: Mapping[str, Any]) -> list[int]:
    """[C, H, W] of what a straightdp ``section``'s flow and release model: the images, or in latent space the
    codes (code_channels x side/4 x side/4)."""
    side = cost.image_side(config)
    if section.get("space", "pixel") == "latent":
        from pipeline.config import schema_defaults

        ae = {**schema_defaults("straightdp", "autoencoder"), **(section.get("autoencoder") or {})}
        return [ae["code_channels"], side // 4, side // 4]
    return [cost.image_channels(config), side, side]


def stage2_line_params(run: StraightRun, sgd: Mapping[str, Any], n: int) -> dict[str, Any]:
    """What a training run's ``tha_dpsgd`` line must say, as the configuration fixes it (dpsgd section ``sgd``,
    declared private size ``n``): :func:`pipeline.methods.straightdp.runs.stage2_config`, the settings
    ``stage2_plan`` plans with, on the line's paths (:func:`pipeline.privacy.tha.configured_params`): N, q and the
    expected batch, T and T_k over K buckets; for a row without a release (tau = 0) the bucket edges and tau; for a
    plan whose every candidate is uniform the clips (C_ref) and beta 0. Not tau where the release is distilled (the
    knee of a cosine curve measured on the PUBLIC set by straightdp_geometry), a THA plan's clips and beta (shaped
    by the released or public spectrum, picked by the public proxy), nor the noise s (calibrated: the transcript's
    ``epsilon_target``)."""
    from pipeline.privacy import tha

    st = straightdp_runs.stage2_config(run, sgd, n)
    tau = None if run.distills else 0.0
    out = tha.configured_params(dataset_size=st.dataset_size, sampling_rate=st.sampling_rate, steps=st.steps,
                                buckets=st.buckets, tau=tau, uniform_clip=st.clip_ref if st.uniform else None)
    return out if tau is None else {**out, "extra.tau": tau}


class Wildcards(Protocol):
    """A run rule's wildcards (Snakemake's, or any object with the run name)."""

    run: str


class Wiring:
    """STRAIGHTDP's files, params, targets, transcripts and run records for one configuration.

    ``arm`` arguments name a ``straightdp.arms`` entry ("" = the main configuration); path methods also take
    the rule wildcard ``"{arm}"`` (they only format it into a path).
    """

    def __init__(self, house: House) -> None:
        self.house = house
        self.config = house.config
        self.layout = house.layout

    # ------------------------------------------------------------------ the method's directories and public files

    @property
    def root(self) -> Path:
        """results/<experiment>/straightdp: the release, geometry, latent and arm files."""
        return self.layout.expdir / "straightdp"

    @property
    def public_split(self) -> Path:
        """The wrong-domain public set (rule straightdp_public; straightdp.public), disjoint from every real split."""
        return self.layout.data / "straightdp_public.npz"

    @property
    def arms_dir(self) -> Path:
        """An arm's own files (straightdp.arms: in another space its autoencoder, codes, geometry; its public flow
        is under models/, :meth:`public_flow`)."""
        return self.root / "arms"

    @property
    def code_sources(self) -> dict[str, Path]:
        """Code split name -> the image split it encodes (rule encode_split; straightdp.space: latent)."""
        return {"private_train": self.layout.split("private_train"), "straightdp_public": self.public_split}

    @property
    def toy_ledger(self) -> Path:
        """The Fig. 6 toy's own transcript (rule straightdp_figure6_toy)."""
        return self.layout.ledger("straightdp_toy")

    @property
    def table4_ledger(self) -> Path:
        """Table 4's own transcript (composed-MNIST, the text-conditional release): one line per release."""
        return self.layout.ledger("straightdp_table4_text")

    def table_path(self, table: str) -> Path:
        """results/tables/straightdp_<table>.parquet (``table`` may be a rule wildcard)."""
        return self.layout.tables / f"straightdp_{table}.parquet"

    def figure_path(self, figure: str, suffix: str = ".png") -> Path:
        """results/figures/straightdp_<figure>.png (or its PDF beside it)."""
        return self.layout.figures / f"straightdp_{figure}{suffix}"

    # ------------------------------------------------------------------ one run's files

    def release_path(self, run: str) -> Path:
        """Stage 1's noisy class moments of a run."""
        return self.root / "release" / f"{run}.npz"

    def release_ledger(self, run: str) -> Path:
        """Stage 1's own transcript per run: parallel jobs never append to the same file."""
        return self.layout.ledger(f"straightdp_release_{run}")

    def model_path(self, run: str) -> Path:
        """Stage 2's trained flow of a run."""
        return self.layout.expdir / "models" / "straightdp" / f"{run}.pt"

    def train_ledger(self, run: str) -> Path:
        """Stage 2's own transcript per run."""
        return self.layout.ledger(f"straightdp_train_{run}")

    def samples_path(self, run: str) -> Path:
        """A run's labelled samples (rule sample_straightdp)."""
        return self.layout.expdir / "samples" / "straightdp" / f"{run}.npz"

    def samples_manifest(self, run: str) -> Path:
        """The manifest written beside a run's samples."""
        return self.samples_path(run).with_suffix(".json")

    def metrics_path(self, run: str) -> Path:
        """A run's evaluation (rule evaluate_straightdp): a row of the tables and of all_runs."""
        return self.layout.expdir / "eval" / "straightdp" / run / "metrics.json"

    def train_metrics(self, run: str) -> Path:
        """The training run's metrics JSON (its gradient-norm log: Table 2's tail ratio)."""
        return self.layout.expdir / "train" / "straightdp" / f"{run}.json"

    # ------------------------------------------------------------------ runs

    def runs(self) -> list[StraightRun]:
        """Every run of Table 1 in the config: rows x epsilons x seeds."""
        return straightdp_runs.runs(self.config["straightdp"])

    def arm_runs(self, table: str | None = None) -> list[StraightRun]:
        """Every arm's runs (straightdp.arms), or those of the arms that feed ``table``."""
        return straightdp_runs.arm_runs(self.config["straightdp"], table)

    def table2_runs(self, panel: str) -> list[StraightRun]:
        """Table 2's runs: the arms of table2_<panel>, then each arm run's main-configuration twin (the reference)."""
        arm = self.arm_runs(f"table2_{panel}")
        return [*arm, *dict.fromkeys(run.main for run in arm)]

    def table2_panels(self) -> list[str]:
        """The Table 2 panels some arm feeds (the noise sweep needs exactly one constrained arm: the stage says so)."""
        return [p for p in TABLE2_PANELS if self.arm_runs(f"table2_{p}")]

    def run(self, wildcards: Wildcards) -> StraightRun:
        """The run a rule's ``{run}`` wildcard names; a name outside the grammar is one line, not a traceback."""
        try:
            return StraightRun.from_name(wildcards.run)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def all_runs(self) -> list[StraightRun]:
        """Every run ``all`` builds: the main grid, the arms', Table 2's references (main twins) not in the grid."""
        twins = [run.main for panel in self.table2_panels() for run in self.arm_runs(f"table2_{panel}")]
        return list(dict.fromkeys([*self.runs(), *self.arm_runs(), *twins]))

    # ------------------------------------------------------------------ switches and claim counts

    def toy_enabled(self) -> bool:
        """Fig. 6 runs on data.toy: it exists only when the data stage writes the toy."""
        return bool(self.config["data"]["toy"]["enabled"])

    def table4_enabled(self) -> bool:
        """Table 4 composes grey digits: on when straightdp.table4.enabled and the images are grey."""
        return bool(self.config["straightdp"]["table4"]["enabled"]) and cost.image_channels(self.config) == 1

    def table4_claims(self) -> int:
        """One text release per (featurisation, eps, seed)."""
        return len(straightdp_runs.table4_releases(self.config["straightdp"]["table4"]))

    def toy_claims(self) -> int:
        """Ledger lines of the toy (straightdp_runs.toy_points): per (eps, seed), one release (moments only), one
        DP-SGD (uniform), both (StraightDP)."""
        return sum(run.releases + run.trains for run in straightdp_runs.toy_points(self.config["straightdp"]["toy"]))

    # ------------------------------------------------------------------ an arm's section, space and public files

    def arm_section(self, arm: str = "") -> dict[str, Any]:
        """The straightdp section an arm's jobs read (straightdp_runs.arm_section; "" = the main configuration)."""
        try:
            return straightdp_runs.arm_section(self.config["straightdp"], arm)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def latent(self, arm: str = "") -> bool:
        """STRAIGHTDP's latent variant: the flow, the release and DP-SGD run on the public autoencoder's codes."""
        return self.arm_section(arm).get("space", "pixel") == "latent"

    def own_geometry(self, arm: str) -> bool:
        """An arm in latent space (its own autoencoder), or a pixel arm of a latent configuration, has its own
        release geometry and horizon; any other arm shares the main one's (they read the same public split)."""
        return bool(arm) and (self.latent(arm) or self.latent())

    def latent_dir(self, arm: str = "") -> Path:
        """The latent variant's public autoencoder and code splits: the main one's, or the arm's."""
        return self.arms_dir / arm / "latent" if arm else self.root / "latent"

    def arm_geometry(self, arm: str) -> tuple[Path, Path]:
        """An arm's own release geometry and horizon (``arm`` may be the rule wildcard "{arm}")."""
        return self.arms_dir / arm / "geometry.npz", self.arms_dir / arm / "horizon.json"

    def autoencoder(self, arm: str = "") -> Path:
        """The frozen public autoencoder (straightdp.space: latent) of the main configuration or an arm."""
        return self.latent_dir(arm) / "autoencoder.pt"

    def autoencoder_metrics(self, arm: str = "") -> Path:
        """The autoencoder's training metrics, beside it."""
        return self.latent_dir(arm) / "autoencoder.json"

    def codes_path(self, name: str, arm: str = "") -> Path:
        """A split's codes under the frozen autoencoder (``name`` may be the rule wildcard "{name}")."""
        return self.latent_dir(arm) / f"{name}_codes.npz"

    def geometry(self, arm: str = "") -> Path:
        """The release's public PCA basis + clip R that an arm's runs read (Fig. 2a's geometry)."""
        return self.arm_geometry(arm)[0] if self.own_geometry(arm) else self.root / "geometry.npz"

    def horizon(self, arm: str = "") -> Path:
        """The horizon tau (and Fig. 2a's cosine curve) an arm's runs read."""
        return self.arm_geometry(arm)[1] if self.own_geometry(arm) else self.root / "horizon.json"

    @property
    def imports_public_flow(self) -> bool:
        """straightdp.pretrain.source diffusers: rule import_straightdp loads the main public flow from the user's
        SD3Transformer2DModel folder (pipeline/flow/public.py) instead of pretrain_straightdp training it."""
        return self.config["straightdp"]["pretrain"].get("source") == "diffusers"

    def public_model(self) -> dict[str, Any]:
        """``{"public_model": {source, sha256, label_embeddings_sha256}}`` when the main public flow is imported,
        else ``{}``: spread into the params of import_straightdp and of every main run that reads the flow, so a
        changed model reruns exactly those; a trained flow's readers keep their config ids."""
        return self._public_model

    @cached_property
    def _public_model(self) -> dict[str, Any]:
        # once per Wiring: Snakemake asks every reading job's params, and hashing reads the whole folder
        if not self.imports_public_flow:
            return {}
        from pipeline.flow.public import public_model

        return {"public_model": public_model(self.config["straightdp"]["pretrain"])}

    def import_params(self) -> str:
        """rule import_straightdp's params: the pretrain keys it reads, the files' hashes, the declared classes."""
        pretrain = {k: v for k, v in self.config["straightdp"]["pretrain"].items()
                    if k in straightdp_runs.PUBLIC_IMPORT_KEYS}
        return stage_params(straightdp={"pretrain": pretrain}, n_classes=self.house.private["n_classes"],
                            **self.public_model())

    def public_flow(self, arm: str = "") -> Path:
        """The public flow a run starts from (or is guided on): the main one, or the arm's (its backbone, its
        space); ``arm`` may be the rule wildcard "{arm}"."""
        models = self.layout.expdir / "models" / "straightdp"
        return models / "arms" / arm / "public_flow.pt" if arm else models / "public_flow.pt"

    def private_data(self, arm: str = "") -> Path:
        """The private split the runs see: the images, or their codes in the latent variant."""
        return self.codes_path("private_train", arm) if self.latent(arm) else self.layout.split("private_train")

    def public_data(self, arm: str = "") -> Path:
        """The public split the runs see: the images, or their codes in the latent variant."""
        return self.codes_path("straightdp_public", arm) if self.latent(arm) else self.public_split

    def sample_shape(self, arm: str = "") -> list[int]:
        """[C, H, W] of what the release models: the images, or the codes (code_channels x side/4 x side/4)."""
        return sample_shape(self.config, self.arm_section(arm))

    # ------------------------------------------------------------------ Stage 2's training jobs

    @property
    def train_gpus(self) -> int:
        """straightdp.gpus: a train_straightdp job's data-parallel processes (its ``gpu`` resource and ``--nproc``)."""
        return int(self.config["straightdp"]["gpus"])

    @property
    def train_threads(self) -> int:
        """A train_straightdp job's cores: each process's torch threads."""
        return self.house.torch_threads * self.train_gpus

    @property
    def pretrain_runtime_min(self) -> int:
        """A pretrain_straightdp job's predicted minutes, whatever the time limit (its rule's ``retries``)."""
        return costs.pretrain_runtime_min(self.config, self.flow_network)

    @property
    def train_runtime_min(self) -> int:
        """A train_straightdp job's predicted minutes, whatever the time limit (its rule's ``retries``)."""
        return costs.train_runtime_min(self.config, self.flow_network)

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/straightdp.smk) asks the cluster for, its whole ``resources:``:
        its request in :data:`pipeline.methods.straightdp.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.config, self)

    # ------------------------------------------------------------------ GPU memory (pipeline/resources.py)

    def flow_network(self, arm: str = "") -> dict[str, Any]:
        """The footprint spec of the main section's or an arm's MM-DiT (pipeline/footprint.py ``flow_mmdit``), on its
        space's examples, with the declared classes (a public set's own labels, at most as many rows, weigh alike)."""
        return {"flow": dict(self.arm_section(arm)["flow"]), "shape": [int(v) for v in self.sample_shape(arm)],
                "num_classes": int(self.house.private["n_classes"])}

    def pretrain_memory(self, arm: str = "") -> cost.MemoryPlan:
        """pretrain_straightdp's micro-batch and GPU memory (its batch by accumulation when it does not fit)."""
        return cost.memory_plan(self.config, "pretrain_straightdp", self.flow_network(arm),
                                int(self.arm_section(arm)["pretrain"]["batch_size"]), kind="flow_mmdit")

    def distill_memory(self, arm: str = "") -> cost.MemoryPlan:
        """train_straightdp's distillation (the public part of Stage 2): its micro-batch and GPU memory."""
        return cost.memory_plan(self.config, "train_straightdp", self.flow_network(arm),
                                int(self.arm_section(arm)["distill"]["batch_size"]), kind="flow_mmdit")

    def pretrain_params(self, arm: str = "") -> str:
        """pretrain_straightdp's params: :meth:`params` of the arm, the configuration's seed, the precision when not
        fp32, and ``batch_gpu`` when the batch is split."""
        return self.params(arm=arm, seed=self.house.seed, **self.house.precision,
                           **cost.accumulation_params(self.pretrain_memory(arm)))

    def pretrain_gpu_mem_mb(self, arm: str = "") -> int:
        return self.pretrain_memory(arm).predicted_mb

    def train_gpu_mem_mb(self, wildcards: Wildcards) -> int:
        """A train_straightdp job's predicted GPU memory per process: the larger of its distillation (rows with a
        release) and its DP-SGD micro-batch of dpsgd.micro_batch examples x noise_multiplicity time draws."""
        run = self.run(wildcards)
        sgd = self.arm_section(run.arm)["dpsgd"]
        dpsgd = cost.dpsgd_memory(self.flow_network(run.arm), int(sgd["micro_batch"]), int(sgd["noise_multiplicity"]),
                                  kind="flow_mmdit")
        return max(dpsgd.predicted_mb, self.distill_memory(run.arm).predicted_mb if run.distills else 0)

    # ------------------------------------------------------------------ params

    def section(self, *, keep: tuple[str, ...] = (), arm: str = "") -> dict[str, Any]:
        """The straightdp section (an arm's: :meth:`arm_section`) less its listing keys and the subsections
        of OWN_SECTIONS not in ``keep``."""
        dropped = set(LISTING + LAUNCH + OWN_SECTIONS) - set(keep)
        return {k: v for k, v in self.arm_section(arm).items() if k not in dropped}

    def params(self, *, keep: tuple[str, ...] = (), arm: str = "", **extra: Any) -> str:
        """Stage params: :meth:`section` (``keep`` of its own subsections), the runtime keys, ``extra``."""
        return stage_params(straightdp=self.section(keep=keep, arm=arm), device=self.config["device"],
                            threads=self.house.torch_threads, **extra)

    def run_params(self, wildcards: Wildcards, *, train: bool = False, reads_flow: bool = False, **extra: Any) -> str:
        """A run's job params: its arm's section; a LoRA row's training (Table 3) also reads straightdp.lora (no
        other job's id moves with it); a job that reads the main public flow (``train`` or ``reads_flow``) the
        imported flow's hashes (:meth:`public_model`)."""
        run = self.run(wildcards)
        if (train or reads_flow) and not run.arm:
            extra = {**self.public_model(), **extra}
        return self.params(keep=("lora",) if train and run.lora else (), arm=run.arm, run=run.name, **extra)

    def private_run_params(self, wildcards: Wildcards, *, train: bool = False) -> str:
        """A private stage's params (release_moments, train_straightdp): :meth:`run_params` with the declared
        private set and the ledger binding of the run."""
        run = self.run(wildcards)
        split = cost.accumulation_params(self.distill_memory(run.arm)) if train and run.distills else {}
        return self.run_params(wildcards, train=train, private=self.house.private,
                               ledger_binding=self.house.ledger_binding(wildcards.run), **split)

    def sample_params(self, wildcards: Wildcards) -> str:
        """rule sample_straightdp's params: the run's, with the shape of what its release models, and the precision of
        a flow's evaluations when not fp32 (the release's own samples run no network)."""
        run = self.run(wildcards)
        reads_flow = run.samples_from != "release"
        return self.run_params(wildcards, reads_flow=reads_flow, shape=self.sample_shape(run.arm),
                               **(self.house.precision if reads_flow else {}))

    def public_params(self) -> str:
        """rule straightdp_public's params: the data section, straightdp.public, its seed and random stream."""
        return params_json(data=self.config["data"], public=self.config["straightdp"]["public"],
                           seed=self.config["seed"], stream="straightdp.public")

    def autoencoder_params(self, arm: str = "") -> str:
        """rule train_autoencoder's params: the (arm's) straightdp.autoencoder section only, as configured (an
        unset section is {}, the stage fills its defaults), the seed."""
        return stage_params(autoencoder=self.arm_section(arm).get("autoencoder") or {}, seed=self.config["seed"],
                            threads=self.house.torch_threads)

    @staticmethod
    def codes_params(name: str) -> str:
        """rule encode_split's params: the code split's name."""
        return params_json(name=f"{name}_codes")

    def evaluate_params(self, run: str, evaluation: Mapping[str, Any]) -> str:
        """rule evaluate_straightdp's params: the evaluation core's (``evaluation``: pipeline/methods/_evaluation.py)
        and the run's name."""
        return params_json(evaluation=evaluation, seed=self.config["seed"], device=self.config["device"],
                           threads=self.house.torch_threads, name=f"straightdp/{run}")

    def toy_params(self) -> str:
        """Fig. 6's params: the section with its own toy subsection, the toy mixture, the ledger binding."""
        return stage_params(straightdp=self.section(keep=("toy",)),
                            toy_data={k: self.config["data"]["toy"][k] for k in TOY_DATA_KEYS}, threads=1,
                            ledger_binding=self.house.ledger_binding("straightdp_figure6_toy"))

    def table4_params(self) -> str:
        """Table 4's params: only what the release reads (TABLE4_KEYS), the declared private set, the binding."""
        return stage_params(straightdp={k: self.config["straightdp"][k] for k in TABLE4_KEYS},
                            private=self.house.private, threads=1,
                            ledger_binding=self.house.ledger_binding("straightdp_table4_text"))

    # ------------------------------------------------------------------ one run's job inputs

    def release_inputs(self, wildcards: Wildcards) -> dict[str, Path]:
        """rule release_moments' inputs: the private split (or codes) and the release geometry of the run's arm."""
        arm = self.run(wildcards).arm
        return {"data": self.private_data(arm), "geometry": self.geometry(arm)}

    def train_inputs(self, wildcards: Wildcards) -> dict[str, Path]:
        """rule train_straightdp's inputs: data, public data, the public flow it starts from, geometry, horizon;
        a distilling row also its release and that release's transcript."""
        run = self.run(wildcards)
        inputs = {"data": self.private_data(run.arm), "public": self.public_data(run.arm),
                  "init": self.public_flow(run.arm), "geometry": self.geometry(run.arm),
                  "horizon": self.horizon(run.arm)}
        if run.distills:
            inputs |= {"moments": self.release_path(run.name), "release_ledger": self.release_ledger(run.name)}
        return inputs

    def sample_inputs(self, wildcards: Wildcards) -> dict[str, Path]:
        """rule sample_straightdp's inputs: the release, the release and the public flow (guidance), or the trained
        flow; in latent space also the autoencoder that decodes the codes."""
        return self.sampler_reads(self.run(wildcards))

    def sampler_reads(self, run: StraightRun) -> dict[str, Path]:
        """What a run's sampler reads (rule sample_straightdp's inputs, and its bundle's)."""
        inputs = {"release": {"moments": self.release_path(run.name)},
                  "guided": {"moments": self.release_path(run.name), "model": self.public_flow(run.arm)},
                  "model": {"model": self.model_path(run.name)}}[run.samples_from]
        return inputs | ({"autoencoder": self.autoencoder(run.arm)} if self.latent(run.arm) else {})

    # ------------------------------------------------------------------ tables and figures

    def table_runs(self, table: str | None = None) -> list[StraightRun]:
        """The runs a table reads (its rows: straightdp_runs.table_rows), every run for Figure 3 (table None);
        Table 1 also the runs of the arms that feed it (its latent block, its low-B0 row)."""
        rows = straightdp_runs.table_rows(table) if table else straightdp_runs.ROWS
        arms = self.arm_runs(table) if table == "table1_main" else []
        return [run for run in self.runs() if run.row in rows] + arms

    def run_inputs(self, runs: list[StraightRun], *, grad: bool = False) -> dict[str, Path]:
        """metrics_RUN, release_RUN, train_RUN of each run (and grad_RUN, its training metrics, when ``grad``)."""
        out = {}
        for run in runs:
            out[f"metrics_{run.name}"] = self.metrics_path(run.name)
            if run.releases:
                out[f"release_{run.name}"] = self.release_ledger(run.name)
            if run.trains:
                out[f"train_{run.name}"] = self.train_ledger(run.name)
                if grad:
                    out[f"grad_{run.name}"] = self.train_metrics(run.name)
        return out

    def table_inputs(self, table: str | None = None) -> dict[str, Path]:
        """The inputs of a table (or of Figure 3): :meth:`run_inputs` of its runs."""
        return self.run_inputs(self.table_runs(table))

    def table_params(self, table: str | None = None, **extra: Any) -> str:
        """A table's (or Figure 3's) params: its runs' names, the budgets, the seed."""
        runs = self.table_runs(table)
        extra = {**extra, "table": table} if table else extra
        # the main grid's budgets in its order, then any only an arm ran
        epsilons = list(dict.fromkeys([*self.config["straightdp"]["epsilons"], *(r.epsilon for r in runs)]))
        return stage_params(runs=[r.name for r in runs], epsilons=epsilons, seed=self.config["seed"], **extra)

    def table2_inputs(self, panel: str) -> dict[str, Path]:
        """Table 2's inputs: :meth:`run_inputs` of its runs, the noise sweep with their gradient-norm logs."""
        return self.run_inputs(self.table2_runs(panel), grad=panel == "noise_sweep")

    def table2_params(self, panel: str) -> str:
        """Table 2's params: the panel and its runs' names."""
        return stage_params(panel=panel, runs=[r.name for r in self.table2_runs(panel)], seed=self.config["seed"])

    def grid_inputs(self) -> dict[str, Path]:
        """Figure 5: one panel per Table 1 row at the largest eps, first seed."""
        s = self.config["straightdp"]
        eps, seed = max(s["epsilons"]), s["seeds"][0]
        return {row: self.samples_path(StraightRun(row, eps, seed).name) for row in s["rows"]}

    def grid_titles(self) -> dict[str, str]:
        """Figure 5's panel titles: each row's label."""
        return {row: straightdp_runs.LABELS[row] for row in self.config["straightdp"]["rows"]}

    def grid_params(self) -> str:
        """Figure 5's params (the dpdm_sample_grid stage): images per class, the panels' titles, the figure's."""
        return params_json(per_class=GRID_PER_CLASS, titles=self.grid_titles(),
                           title=f"STRAIGHTDP samples at eps = {max(self.config['straightdp']['epsilons']):g}")

    # ------------------------------------------------------------------ what the method registers

    def targets(self) -> list[Path]:
        """Tables 1, 2, 3, 5, 6, 7 and Figures 2a, 3, 5; Figure 6 (the 2-D toy) when data.toy is on; Table 4 when
        on."""
        toy = ([self.table_path("figure6_toy"), self.figure_path("figure6_toy")] if self.toy_enabled() else [])
        table4 = [self.table_path("table4_text")] if self.table4_enabled() else []
        # a table whose rows are not configured is left out (Table 3 needs a LoRA row: guidance alone is Table 1's)
        tables = [t for t in TABLES
                  if (runs := self.table_runs(t)) and (t != "table3_frozen" or any(r.lora for r in runs))]
        tables += [f"table2_{panel}" for panel in self.table2_panels()]
        return [*(self.table_path(t) for t in tables), *(self.figure_path(f) for f in FIGURES), *toy, *table4]

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        """One claim per transcript: each releasing run's Stage 1 line, each training run's Stage 2 line (bound to
        the run, its arm's delta and the private split it reads); the toy's and Table 4's lines bound to their
        table job. Every line carries what the configuration says ran (:meth:`release_params`,
        :meth:`train_params`, :meth:`toy_line_specs`, :meth:`table4_line_specs`) and the eps its noise was
        calibrated to; a Stage 2 line composed after its run's release is calibrated after that transcript."""
        delta = self.config["straightdp"]["delta"]
        out = {}
        for run in self.all_runs():
            common = dict(claims=1, run=run.name, delta=self.arm_section(run.arm)["delta"],
                          data=self.private_data(run.arm))
            if run.releases:
                out[self.release_ledger(run.name)] = TranscriptSpec(
                    stage="release_moments", params=self.release_params(run),
                    epsilon_target=run.release_epsilon(self.arm_section(run.arm)["release"]), **common)
            if run.trains:
                out[self.train_ledger(run.name)] = TranscriptSpec(
                    stage="train_straightdp", params=self.train_params(run), epsilon_target=run.epsilon,
                    after=(str(self.release_ledger(run.name)),) if run.distills else (), **common)
        if self.toy_enabled():
            params, targets, priors = zip(*self.toy_line_specs())
            out[self.toy_ledger] = TranscriptSpec(claims=self.toy_claims(), run="straightdp_figure6_toy",
                                                  stage="straightdp_figure6_toy", delta=delta,
                                                  data=self.layout.split("toy"), params=params,
                                                  epsilon_target=targets, prior_lines=priors)
        if self.table4_enabled():
            params, targets = zip(*self.table4_line_specs())
            out[self.table4_ledger] = TranscriptSpec(claims=self.table4_claims(), run="straightdp_table4_text",
                                                     stage="straightdp_table4_text", delta=delta,
                                                     data=self.layout.split("private_train"), params=params,
                                                     epsilon_target=targets)
        return out

    # ------------------------------------------------------------------ what each ledger line must say it ran

    def release_params(self, run: StraightRun) -> dict[str, Any]:
        """A run's Stage 1 line (``moment_release``) as configured: the declared N and classes, the release's PCA
        rank p, one release, and the run's Stage-1 target and total eps. Not R (a quantile of the PUBLIC features,
        measured by straightdp_geometry) nor sigma (calibrated: the transcript's ``epsilon_target``)."""
        from pipeline.privacy import moments

        private = self.house.private
        rel = self.arm_section(run.arm)["release"]
        return {**moments.configured_params(N=private["N"], n_classes=private["n_classes"], p=int(rel["p"])),
                "extra.target_epsilon": run.release_epsilon(rel), "extra.total_epsilon": run.epsilon}

    def train_params(self, run: StraightRun) -> dict[str, Any]:
        """A run's Stage 2 line (``tha_dpsgd``) as configured: :func:`stage2_line_params` of its arm's dpsgd section
        and the declared N, its total target and whether it composes after the run's release."""
        return {**stage2_line_params(run, self.arm_section(run.arm)["dpsgd"], self.house.private["N"]),
                "extra.total_target_epsilon": run.epsilon, "extra.composed_with_release": run.distills}

    def toy_line_specs(self) -> list[tuple[dict[str, Any], float | None, tuple[int, ...]]]:
        """(params, calibration target, earlier lines composed before it) of each line of the toy's transcript, in
        the order the stage writes them (straightdp_runs.toy_points): per point its release (data.toy's N and modes,
        p = 2, its Stage-1 target), then its DP-SGD (the toy's steps and batch: straightdp_runs.toy_sgd), calibrated
        to the point's eps after the release line just before it when the point releases."""
        from pipeline.privacy import moments

        section = self.arm_section()
        toy_data, rel = self.config["data"]["toy"], section["release"]
        N, sgd = int(toy_data["n"]), straightdp_runs.toy_sgd(section)
        out: list[tuple[dict[str, Any], float | None, tuple[int, ...]]] = []
        for run in straightdp_runs.toy_points(section["toy"]):
            point = {"seed": run.seed, "extra.run": run.name}
            if run.releases:
                out.append(({**moments.configured_params(N=N, n_classes=int(toy_data["n_modes"]),
                                                         p=straightdp_runs.TOY_RELEASE_P), **point},
                            run.release_epsilon(rel), ()))
            if run.trains:
                out.append(({**stage2_line_params(run, sgd, N), **point, "extra.row": run.row,
                             "extra.total_target_epsilon": run.epsilon, "extra.composed_with_release": run.releases},
                            run.epsilon, (len(out) - 1,) if run.releases else ()))
        return out

    def table4_line_specs(self) -> list[tuple[dict[str, Any], float]]:
        """(params, calibration target) of each Table 4 release (straightdp_runs.table4_releases' order): the
        declared N, the release's p, the featurisation's width q and radius R_txt (public: text_moments.CaptionCoding),
        one release, its featurisation, seed and eps. Not R (measured on the PUBLIC composed images)."""
        from pipeline.privacy import text_moments

        s = self.config["straightdp"]
        N, p = self.house.private["N"], int(s["release"]["p"])
        codings = {kind: text_moments.CaptionCoding.of(kind) for kind in s["table4"]["featurisations"]}
        return [({**text_moments.configured_params(N=N, p=p, q=codings[kind].q, R_txt=codings[kind].R_txt),
                  "seed": seed, "extra.featurisation": kind, "extra.target_epsilon": eps}, eps)
                for kind, eps, seed in straightdp_runs.table4_releases(s["table4"])]

    def bundle_runs(self) -> list[str]:
        """Every run ``all`` builds (each releases, trains or both)."""
        return [run.name for run in self.all_runs()]

    def bundle(self, name: str) -> BundleSpec:
        """One run's bundle: what its sampler reads, so ``sample_bundle`` redraws the run's samples: the trained
        flow's weights (``model``), the released moments (released_only, public_guidance), the public flow the
        guidance steers, and in latent space the public autoencoder that decodes the codes (the same inputs as rule
        sample_straightdp's)."""
        run = StraightRun.from_name(name)
        ledgers = ((self.release_ledger(name),) if run.releases else ()) + \
                  ((self.train_ledger(name),) if run.trains else ())
        sample_inputs = self.sampler_reads(run)
        section = self.arm_section(run.arm)
        smp = section["sampling"]
        sampling = {"sampler": "straightdp_flow", "samples_from": run.samples_from, "steps": smp["steps"],
                    "guidance": smp["guidance"], "batch_size": smp["batch_size"], "n_samples": smp["n_samples"],
                    "seed": run.seed, "threads": self.house.torch_threads}
        if run.samples_from == "release":
            sampling["shape"] = list(self.sample_shape(run.arm))
        if run.samples_from == "guided":
            sampling["t0"] = {**schema_defaults("straightdp", "guidance"), **(section.get("guidance") or {})}["t0"]
        parts = {"moments": sample_inputs["moments"]} if "moments" in sample_inputs else {}
        if run.samples_from == "guided":
            parts["public_flow"] = sample_inputs["model"]
        if "autoencoder" in sample_inputs:
            parts["autoencoder"] = sample_inputs["autoencoder"]
        covers = (*(("Stage 1: the noisy release of the private class moments",) if run.releases else ()),
                  *((f"Stage 2: every DP-SGD step of the flow's training ({'LoRA adapters' if run.lora else 'all weights'}"
                     ", Poisson-subsampled, clipped, Gaussian noise)",) if run.trains else ()),
                  *(("the two stages composed in one accountant",) if run.releases and run.trains else ()))
        return BundleSpec(
            run=name, samples=self.samples_path(name), metrics=self.metrics_path(name), transcripts=ledgers,
            epsilon_target=run.epsilon, model=sample_inputs["model"] if run.samples_from == "model" else None,
            parts=parts, sampling=sampling, covers=covers,
            not_covered=("the public flow the runs start from or are guided by, and its pretraining (public data)",
                         *(("the public autoencoder of the latent variant (public data)",) if self.latent(run.arm)
                           else ()),
                         "the release geometry and training horizon, computed from public data",
                         "the hyperparameters, set in the configuration (not tuned on the private data here)",
                         "the declared size and classes of the private set (public constants)"))

    def records(self) -> list[RunRecord]:
        """all_runs records: every run ``all`` builds, its release and/or train transcript; the main grid's runs
        are the figure's lines (one per row), an arm's stay in the table (ablations); the main grid's MAIN_ROW runs
        are the headline's candidates."""
        out = []
        for run in self.all_runs():
            ledgers = ((self.release_ledger(run.name),) if run.releases else ()) + \
                      ((self.train_ledger(run.name),) if run.trains else ())
            rules = (("release_moments",) if run.releases else ()) + (("train_straightdp",) if run.trains else ()) + \
                    ("sample_straightdp", "evaluate_straightdp")
            arm = f" [{run.arm}]" if run.arm else ""
            out.append(RunRecord(method="straightdp", config=run.name, seed=run.seed, epsilon_target=run.epsilon,
                                 metrics=self.metrics_path(run.name), ledgers=ledgers,
                                 label=f"STRAIGHTDP{arm}: {straightdp_runs.LABELS[run.row]}", in_figure=not run.arm,
                                 headline=not run.arm and run.row == straightdp_runs.MAIN_ROW,
                                 benchmarks=tuple(self.layout.benchmark(rule, run.name) for rule in rules)))
        return out

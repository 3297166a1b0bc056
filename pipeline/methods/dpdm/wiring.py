"""DPDM's wiring (``rules/dpdm.smk``): a run's files and params, the tables' rows and inputs, the main sampler chosen
on val, the sample grids, its targets, the ledger transcripts the replay checks and the runs all_runs.parquet reads.
Runs, their names and the tables' rows: :mod:`pipeline.methods.dpdm.runs`.

Plain Python over one :class:`~pipeline.wiring.House` (no Snakemake): ``tests/methods/dpdm/test_wiring.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pipeline.resources as cost
from pipeline.config import schema_defaults
from pipeline.methods._evaluation import Wiring as EvaluationWiring
from pipeline.methods.dpdm import costs
from pipeline.privacy import dpsgd_plan
from pipeline.registry import BundleSpec, RunRecord, TranscriptSpec
from pipeline.methods.dpdm import runs as dpdm_runs
from pipeline.methods.dpdm.runs import ClassifierRun, DpdmRun, fmt_num
from pipeline.wiring import House, params_json, stage_params

#: the dpdm keys a training run depends on besides its run name (parameterisation, eps, K, seed) and ``trainable``
TRAIN_KEYS = ("delta", "clip", "batch_size", "epochs", "lr", "ema_decay", "label_dropout", "class_conditional",
              "unet", "checkpoint_every_s", "micro_batch")
#: dpdm keys with no schema default (absent: the stage's own), passed only when set: configs without them keep their ids
OPTIONAL_TRAIN_KEYS = ("clipping", "draws")
#: the table whose val columns choose the main sampler (it never waits for the choice it feeds)
SAMPLER_TABLE = "dpdm_table_samplers"
#: the table whose rows are the privacy-utility figure's DPDM line
MAIN_TABLE = "dpdm_table_main"
#: DPDM's synthetic-data classifiers beside the task-specific DP-SGD classifiers (rule dpdm_classifier_table)
CLASSIFIER_TABLE = "dpdm_table_dpsgd_classifier"
#: DPDM Fig. 3 / Theorem 1: gradient variance vs noise multiplicity K (a table and a figure of this name)
VARIANCE_FIGURE = "dpdm_figure3_gradient_variance"
#: the stage of the task-specific DP-SGD classifier runs (their ledger lines name it)
CLASSIFIER_STAGE = "train_dpsgd_classifier"
#: all_runs' method of the task-specific DP-SGD classifier (its own line in the privacy-utility figure)
CLASSIFIER_METHOD = "dpsgd_classifier"

#: where a finished checkpoint dpdm_select_sampler wrote its choice: called only once the choice is needed
Selection = Callable[[], "str | Path"]


class Wiring:
    """DPDM (Dockhorn et al. 2023) of one configuration: training runs, their samplers, Tables 1, 3, 4, 5 and the
    sample grids.

    ``selection`` returns the path of the sampler choice once the checkpoint that writes it has run (in the rule
    file: Snakemake's ``checkpoints.dpdm_select_sampler.get().output.selection``); it is asked only when
    ``dpdm.sampling.main`` is ``auto`` and a table or figure needs the main sampler.
    """

    def __init__(self, house: House, evaluation: EvaluationWiring | None = None,
                 selection: Selection | None = None) -> None:
        self.house = house
        self.evaluation = evaluation or EvaluationWiring(house)
        self._selection = selection

    @property
    def section(self) -> dict[str, Any]:
        return self.house.config["dpdm"]

    # ---------------------------------------------------------------- one run's files

    def ledger_path(self, run: str) -> Path:
        """The run's own transcript: parallel training jobs never append to the same file."""
        return self.house.layout.ledger(f"train_dpdm_{run}")

    def model_path(self, run: str) -> Path:
        """The run's EMA denoiser (rule train_dpdm)."""
        return self.house.layout.expdir / "models" / "dpdm" / f"{run}.pt"

    def train_metrics(self, run: str) -> Path:
        """The training run's metrics JSON (sigma, steps, losses)."""
        return self.house.layout.expdir / "train" / "dpdm" / f"{run}.json"

    def samples_path(self, run: str, sampler: str) -> Path:
        """The run's labelled samples with one named sampler (rule sample_dpdm)."""
        return self.house.layout.expdir / "samples" / "dpdm" / run / f"{sampler}.npz"

    def samples_manifest(self, run: str, sampler: str) -> Path:
        return self.samples_path(run, sampler).with_suffix(".json")

    def metrics_path(self, run: str, sampler: str) -> Path:
        """The evaluation core's metrics of one sample set (rule evaluate_dpdm): a table row and an all_runs row."""
        return self.house.layout.expdir / "eval" / "dpdm" / run / sampler / "metrics.json"

    @property
    def selection(self) -> Path:
        """The main sampler chosen on the validation split (checkpoint dpdm_select_sampler), under ``auto``."""
        return self.house.layout.expdir / "dpdm" / "sampler_selection.json"

    def table_path(self, table: str) -> Path:
        return self.house.layout.tables / f"{table}.parquet"

    def figure_path(self, figure: str, suffix: str = ".png") -> Path:
        return self.house.layout.figures / f"{figure}{suffix}"

    # ---------------------------------------------------------------- samplers and rows

    def check_sampler_names(self) -> None:
        """A sampler name the tables use but the config lacks is a one-line ConfigError before any job."""
        dpdm_runs.check_sampler_names(self.section)

    def sampler_settings(self, name: str) -> dict[str, Any]:
        """The settings of the sampler ``name`` (dpdm.sampling.samplers); a one-line ConfigError when absent."""
        return dpdm_runs.sampler_settings(self.section, name)

    def main_sampler(self) -> str:
        """dpdm.sampling.main, or under ``auto`` the sampler the checkpoint dpdm_select_sampler chose on val."""
        main = self.section["sampling"]["main"]
        if main != dpdm_runs.AUTO:
            return str(main)
        if self._selection is None:
            raise RuntimeError("dpdm.sampling.main is auto: this Wiring needs the selection checkpoint's output")
        with open(self._selection()) as f:
            return str(json.load(f)["sampler"])

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The rows of one DPDM table (:data:`pipeline.methods.dpdm.runs.TABLES`); the sampler ablation never waits
        for the choice it feeds, the other tables use the chosen main sampler."""
        build, _ = dpdm_runs.TABLES[table]
        d = self.section
        if table != SAMPLER_TABLE and d["sampling"]["main"] == dpdm_runs.AUTO:
            d = dpdm_runs.with_main_sampler(d, self.main_sampler())
        return build(d)

    def runs(self) -> list[DpdmRun]:
        """Every training run the config's tables use."""
        return dpdm_runs.runs(self.section)

    # ---------------------------------------------------------------- targets, transcripts, all_runs

    def targets(self) -> list[Path]:
        """DPDM's tables and figures: the main table and the epsilon grid always, the ablations the dpdm section asks
        for."""
        tables = dpdm_runs.table_rows(self.section)
        out = [self.table_path(MAIN_TABLE), self.figure_path("dpdm_samples_by_epsilon")]
        if "dpdm_table_noise_multiplicity" in tables:
            out.append(self.table_path("dpdm_table_noise_multiplicity"))
        if SAMPLER_TABLE in tables:
            out += [self.table_path(SAMPLER_TABLE), self.figure_path("dpdm_samples_by_sampler")]
        if "dpdm_table_configurations" in tables:
            out.append(self.table_path("dpdm_table_configurations"))
        if self.classifier_runs():
            out.append(self.table_path(CLASSIFIER_TABLE))
        if self.variance_enabled:
            out += [self.table_path(VARIANCE_FIGURE), self.figure_path(VARIANCE_FIGURE)]
        return out

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        """One claim per training run's own transcript, bound to the run, DPDM's delta and the private split, held to
        the DP-SGD the configuration ran (N, batch, T, clip; sigma to the run's eps); the same for every task-specific
        DP-SGD classifier run."""
        d = self.section
        data, delta = self.house.layout.split("private_train"), d["delta"]
        out = {self.ledger_path(r.name): TranscriptSpec(claims=1, run=r.name, stage="train_dpdm", delta=delta,
                                                        data=data, params=self._dpsgd_line(d), epsilon_target=r.epsilon)
               for r in self.runs()}
        chosen = dpdm_runs.subsection(d, "dpsgd_classifier") or schema_defaults("dpdm", "dpsgd_classifier")
        out.update({self.classifier_ledger_path(r.name): TranscriptSpec(
            claims=1, run=r.name, stage=CLASSIFIER_STAGE, delta=delta, data=data, params=self._dpsgd_line(chosen),
            epsilon_target=r.epsilon) for r in self.classifier_runs()})
        return out

    def _dpsgd_line(self, section: Any) -> dict[str, Any]:
        """What a DP-SGD line trained by ``section``'s batch, epochs and clip on the declared private set must say."""
        N = self.house.private["N"]
        steps = dpsgd_plan.dpsgd_steps(dataset_size=N, batch_size=section["batch_size"], epochs=section["epochs"])
        return dpsgd_plan.configured_line(dataset_size=N, batch_size=section["batch_size"], steps=steps,
                                          max_grad_norm=section["clip"])

    def records(self) -> list[RunRecord]:
        """all_runs records: every evaluated (run, sampler) of the DPDM tables; the main table's rows are the
        figure's DPDM line and the headline's candidates (the main sampler, chosen on val), the ablations' rows stay
        in the table."""
        bench = self.house.layout.benchmark
        out = []
        for table in dpdm_runs.table_rows(self.section):
            main = table == MAIN_TABLE
            for r in self.rows(table):
                run, sampler = r["run"], r["sampler"]
                out.append(RunRecord(method="dpdm", config=f"{run}/{sampler}", seed=r["seed"],
                                     epsilon_target=r["eps_target"], metrics=self.metrics_path(run, sampler),
                                     ledgers=(self.ledger_path(run),), label="DPDM" if main else "DPDM (ablations)",
                                     in_figure=main, headline=main,
                                     benchmarks=(bench("train_dpdm", run),
                                                 *(bench(rule, f"{run}/{sampler}")
                                                   for rule in ("sample_dpdm", "evaluate_dpdm")))))
        return out + self.classifier_records()

    def classifier_records(self) -> list[RunRecord]:
        """all_runs records of the task-specific DP-SGD classifiers (method ``dpsgd_classifier``, one label per
        classifier): the CNN's are drawn in the privacy-utility figure (its accuracy panel is the CNN's) and head the
        summary; the logistic regression's stay in the table."""
        bench = self.house.layout.benchmark
        return [RunRecord(method=CLASSIFIER_METHOD, config=r.name, seed=r.seed, epsilon_target=r.epsilon,
                          metrics=self.classifier_metrics_path(r.name), ledgers=(self.classifier_ledger_path(r.name),),
                          label=f"DP-SGD {r.classifier.upper()} on private data (DPDM task-specific baseline)",
                          in_figure=r.classifier == "cnn", headline=r.classifier == "cnn",
                          benchmarks=(bench(CLASSIFIER_STAGE, r.name),))
                for r in self.classifier_runs()]

    # ---------------------------------------------------------------- the task-specific DP-SGD classifier

    def classifier_runs(self) -> list[ClassifierRun]:
        """Every classifier of ``dpdm.dpsgd_classifier`` at DPDM's epsilons and seeds (none when it is null)."""
        return dpdm_runs.classifier_runs(self.section)

    def classifier_model_path(self, run: str) -> Path:
        """The run's classifier weights (rule train_dpsgd_classifier)."""
        return self.house.layout.expdir / "models" / "dpsgd_classifier" / f"{run}.pt"

    def classifier_ledger_path(self, run: str) -> Path:
        """The run's own transcript (one line: its DP-SGD event)."""
        return self.house.layout.ledger(f"{CLASSIFIER_STAGE}_{run}")

    def classifier_metrics_path(self, run: str) -> Path:
        """The run's test and validation accuracy and its privacy summary: a table row and an all_runs row."""
        return self.house.layout.expdir / "eval" / "dpsgd_classifier" / run / "metrics.json"

    @property
    def classifier_inputs(self) -> dict[str, Path]:
        """What a run reads: the private split (through DP-SGD only), and test and val, which score the release."""
        return {k: self.house.layout.split(s) for k, s in (("data", "private_train"), ("test", "test"),
                                                             ("val", "val"))}

    def classifier_params(self, wildcards: Any) -> str:
        """train_dpsgd_classifier params of one run: classifier, eps and seed from its name, DPDM's delta, the
        section's hyper-parameters, the downstream CNN's architecture (evaluation.evalnet)."""
        d, h = self.section, self.house
        run = ClassifierRun.from_name(wildcards.run)
        # a null section still lets a run be asked for by path, at the schema's hyper-parameters
        chosen = dpdm_runs.subsection(d, "dpsgd_classifier") or schema_defaults("dpdm", "dpsgd_classifier")
        section = {k: v for k, v in chosen.items() if k != "classifiers"}
        evalnet = h.config["evaluation"]["evalnet"]
        return stage_params(classifier=run.classifier, epsilon=run.epsilon, seed=run.seed, delta=d["delta"],
                            width=evalnet["width"], feature_dim=evalnet["feature_dim"], **section,
                            private=h.private, ledger_binding=h.ledger_binding(run.name), device=h.device,
                            threads=h.torch_threads)

    def classifier_rows(self) -> list[dict[str, Any]]:
        """The rows of the classifier table: one per run."""
        return [{"row": r.name, "run": r.name, "classifier": r.classifier, "eps_target": r.epsilon, "seed": r.seed}
                for r in self.classifier_runs()]

    def classifier_table_inputs(self) -> dict[str, Path]:
        """metrics_<run> / ledger_<run> of every run, and DPDM's main table (the synthetic-data accuracy beside)."""
        out = {"dpdm_main": self.table_path(MAIN_TABLE)}
        for r in self.classifier_runs():
            out[f"metrics_{r.name}"] = self.classifier_metrics_path(r.name)
            out[f"ledger_{r.name}"] = self.classifier_ledger_path(r.name)
        return out

    def classifier_table_params(self) -> str:
        return stage_params(rows=self.classifier_rows())

    # ---------------------------------------------------------------- DPDM Fig. 3: gradient variance vs K

    @property
    def variance_enabled(self) -> bool:
        """Whether ``dpdm.gradient_variance`` asks for the figure and there is a public split to measure it on (a
        config without one, e.g. CelebA's, leaves the figure out: it is never measured on the private split)."""
        return (dpdm_runs.subsection(self.section, "gradient_variance") is not None
                and "public" in self.house.data_splits())

    @property
    def variance_inputs(self) -> dict[str, Path]:
        """The public denoiser and the public split: the diagnostic reads per-example gradients, so never private
        data."""
        return {"denoiser": self.house.layout.public_denoiser, "public": self.house.layout.split("public")}

    def variance_params(self) -> str:
        """dpdm_gradient_variance params: the section's K, repeats, images and bootstrap, DPDM's clip norm."""
        d, h = self.section, self.house
        # a null section leaves the figure out of `all`; asked for by path it is measured at the schema's settings
        chosen = dpdm_runs.subsection(d, "gradient_variance") or schema_defaults("dpdm", "gradient_variance")
        return stage_params(**chosen, clip=d["clip"], seed=h.seed, device=h.device,
                            threads=h.torch_threads)

    # ---------------------------------------------------------------- certified bundles (pipeline/bundles)

    def bundle_runs(self) -> list[str]:
        """Every training run: each gets a bundle of its weights."""
        return [r.name for r in self.runs()]

    def bundle(self, run: str) -> BundleSpec:
        """One run's bundle: its EMA weights, and its samples with the main sampler (chosen on val under auto)."""
        r, s = DpdmRun.from_name(run), self.section["sampling"]
        sampler = self.main_sampler()
        public = self.init_of(r.parameterisation) == "public"
        return BundleSpec(
            run=run, samples=self.samples_path(run, sampler), metrics=self.metrics_path(run, sampler),
            transcripts=(self.ledger_path(run),), epsilon_target=r.epsilon, model=self.model_path(run),
            sampling={"sampler": "dpdm", "sampler_name": sampler, "settings": self.sampler_settings(sampler),
                      "seed": r.seed, "batch_size": s["batch_size"], "n_samples": s["n_samples"],
                      "threads": self.house.torch_threads},
            covers=("every DP-SGD step of the denoiser's training on the private split: Poisson-subsampled, "
                    f"per-example clipped gradients (the K = {r.K} noise draws of an example clipped together), "
                    "Gaussian noise (DPDM Alg. 1), composed over all steps",),
            not_covered=(*(("the public pretraining of the initial denoiser (public data only)",) if public else ()),
                         "the choice of the main sampler among the configured ones, made on the validation split",
                         "the hyperparameters, set in the configuration (not tuned on the private data here)",
                         "the declared size of the private set (a public constant)"))

    # ---------------------------------------------------------------- training and sampling jobs

    def init_of(self, parameterisation: str) -> str:
        """Where a run of ``parameterisation`` starts: ``public`` (the public denoiser's weights) or ``scratch``."""
        return dpdm_runs.init_of(self.section, parameterisation)

    def train_inputs(self, wildcards: Any) -> dict[str, Path]:
        """The private split, and the public denoiser when the run starts from it (dpdm.init)."""
        inputs = {"data": self.house.layout.split("private_train")}
        if self.init_of(DpdmRun.from_name(wildcards.run).parameterisation) == "public":
            inputs["init"] = self.house.layout.public_denoiser
        return inputs

    def train_params(self, wildcards: Any) -> str:
        """train_dpdm params of one run: the dpdm section, with configuration, eps, K and seed from the run name."""
        d, h = self.section, self.house
        run = DpdmRun.from_name(wildcards.run)
        # partial fine-tuning only makes sense on top of the public weights (a scratch run trains all)
        from_public = self.init_of(run.parameterisation) == "public"
        trainable = d["trainable"] if from_public else None
        return stage_params(parameterisation=run.parameterisation, epsilon=run.epsilon, K=run.K, seed=run.seed,
                            device=h.device, threads=h.torch_threads, trainable=trainable,
                            ledger_binding=h.ledger_binding(run.name), private=h.private,
                            **{k: d[k] for k in TRAIN_KEYS}, **{k: d[k] for k in OPTIONAL_TRAIN_KEYS if k in d},
                            **(h.public_model() if from_public else {}))

    def sample_params(self, wildcards: Any) -> str:
        """sample_dpdm params of one (run, sampler): the named sampler, generated with the run's seed."""
        s, h = self.section["sampling"], self.house
        return params_json(sampler=self.sampler_settings(wildcards.sampler), n_samples=s["n_samples"],
                           seed=DpdmRun.from_name(wildcards.run).seed, batch_size=s["batch_size"],
                           per_class=s["per_class"], device=h.device, threads=h.torch_threads, **h.precision,
                           name=f"dpdm/{wildcards.run}/{wildcards.sampler}")

    def evaluate_params(self, wildcards: Any) -> str:
        """evaluate_dpdm params: the evaluation core's, naming the sample set."""
        return self.evaluation.evaluate_params(f"dpdm/{wildcards.run}/{wildcards.sampler}")

    @property
    def train_gpus(self) -> int:
        """dpdm.gpus: a training job's data-parallel processes (its ``gpu`` resource and the stage's ``--nproc``)."""
        return int(self.section["gpus"])

    @property
    def train_threads(self) -> int:
        """A training job's cores: each process's torch threads."""
        return self.house.torch_threads * self.train_gpus

    @property
    def train_runtime_min(self) -> int:
        """A training job's predicted minutes at dpdm.K, whatever the time limit (its rule's ``retries``)."""
        return costs.train_runtime_min(self.house.config)

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/dpdm.smk) asks the cluster for, its whole ``resources:``: its
        request in :data:`pipeline.methods.dpdm.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

    # ---------------------------------------------------------------- the tables and the choice of sampler

    def table_inputs(self, table: str) -> dict[str, Path]:
        """metrics_<row> / ledger_<row> of every row of ``table``: the inputs of its dpdm_table rule."""
        out = {}
        for r in self.rows(table):
            out[f"metrics_{r['row']}"] = self.metrics_path(r["run"], r["sampler"])
            out[f"ledger_{r['row']}"] = self.ledger_path(r["run"])
        return out

    def table_params(self, table: str) -> str:
        return stage_params(rows=self.rows(table), seed=self.house.seed)

    def selection_inputs(self) -> dict[str, Path]:
        """metrics_<row> of the sampler ablation: what the choice of the main sampler reads (their val columns)."""
        return {f"metrics_{r['row']}": self.metrics_path(r["run"], r["sampler"]) for r in self.rows(SAMPLER_TABLE)}

    def selection_params(self) -> str:
        return stage_params(rows=self.rows(SAMPLER_TABLE))

    # ---------------------------------------------------------------- the sample grids

    def grid_inputs(self) -> dict[str, Path]:
        """Figure dpdm_samples_by_epsilon: the main sampler's samples of each epsilon (first seed)."""
        d, sampler = self.section, self.main_sampler()
        return {f"eps_{fmt_num(e)}": self.samples_path(dpdm_runs.main_run(d, e).name, sampler) for e in d["epsilons"]}

    def grid_params(self) -> str:
        """One panel per epsilon, titled by it; the title names dpdm.sampling.main as configured (``auto`` too)."""
        d = self.section
        return params_json(per_class=d["sampling"]["per_class"],
                           titles={f"eps_{fmt_num(e)}": f"eps = {e:g}" for e in d["epsilons"]},
                           title=f"DPDM samples ({d['sampling']['main']}) by target eps")

    @property
    def sampler_grid_eps(self) -> float:
        """The epsilon figure dpdm_samples_by_sampler shows: the largest of the sampler ablation."""
        return max(self.section["sampler_ablation"]["epsilons"])

    def sampler_grid_inputs(self) -> dict[str, Path]:
        """Figure dpdm_samples_by_sampler: the sampler ablation's samples at :attr:`sampler_grid_eps`."""
        return {r["sampler"]: self.samples_path(r["run"], r["sampler"]) for r in self.rows(SAMPLER_TABLE)
                if r["eps_target"] == float(self.sampler_grid_eps)}

    def sampler_grid_params(self) -> str:
        return params_json(per_class=self.section["sampling"]["per_class"],
                           title=f"DPDM samplers at eps = {self.sampler_grid_eps:g}")

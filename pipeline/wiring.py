"""The house every method's wiring stands on: where a configuration's files go and how a stage's params are written.

A method's wiring (``pipeline/methods/<method>/wiring.py``: its runs, their paths and params, its targets,
transcripts, all_runs records and bundles; a :class:`pipeline.registry.MethodWiring`) is plain Python over one
:class:`House`, so it is unit-tested like any other code; ``rules/common.smk`` builds the one House of a Snakemake
run from the validated config, and the rule files only wire its paths and params into rules and register the
wiring (``register(WIRING)``). Nothing here imports Snakemake.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.config import config_id, declared_private

#: params that change how a job runs, never what it computes: left out of a stage's config id (the ledger
#: binding names where a line belongs, not what its mechanism is; batch_gpu, a public training's micro-batch of
#: gradient accumulation, changes float rounding only)
RUNTIME_PARAMS = ("device", "threads", "checkpoint_every_s", "ledger_binding", "batch_gpu")
#: the splits the data stage writes for every configuration (pipeline/data)
CORE_SPLITS = ("private_train", "eval_train", "reference", "val", "test")


@dataclass(frozen=True)
class Layout:
    """The results tree of one configuration: ``results/<experiment>/...`` for jobs' files, ``results/tables``
    and ``results/figures`` for what a reader opens."""

    results: Path
    experiment: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", Path(self.results))

    @property
    def expdir(self) -> Path:
        return self.results / self.experiment

    @property
    def data(self) -> Path:
        return self.expdir / "data"

    @property
    def logs(self) -> Path:
        return self.expdir / "logs"

    @property
    def tables(self) -> Path:
        return self.results / "tables"

    @property
    def figures(self) -> Path:
        return self.results / "figures"

    @property
    def benchmarks(self) -> Path:
        """Snakemake benchmark files (wall, CPU, max RSS per job): runtime.parquet, all_runs.parquet's cost columns."""
        return self.expdir / "benchmarks"

    @property
    def public_denoiser(self) -> Path:
        """The public EDM denoiser (rule pretrain_public, or import_public): the methods' samplers that hand off to a
        public model finish with it, diagnostics compare against it, DP-SGD runs may start from it."""
        return self.expdir / "models" / "public_edm.pt"

    @property
    def replay_report(self) -> Path:
        """The ledger replay's verdict (rule replay), the first thing results/index.html shows."""
        return self.expdir / "ledger" / "replay.json"

    @property
    def bundles(self) -> Path:
        """Every private run's certified bundle, ``bundles/<method>/<run>/`` (rule export_bundle, pipeline/bundles)."""
        return self.results / "bundles"

    @property
    def report_dir(self) -> Path:
        """Where the report's readable table views go (rule report_tables)."""
        return self.results / "report"

    def split(self, name: str) -> Path:
        """The .npz of one data split."""
        return self.data / f"{name}.npz"

    def ledger(self, stem: str) -> Path:
        """A ledger transcript: one per private job, so parallel jobs never append to the same file."""
        return self.expdir / "ledger" / f"{stem}.jsonl"

    def benchmark(self, rule: str, name: str = "job") -> Path:
        """The benchmark file of ``rule``'s job ``name`` (its wildcards, or ``job`` where there is one job),
        ``benchmarks/<rule>/<name>.tsv``: one row of runtime.parquet (pipeline/results/runtime.py)."""
        return self.benchmarks / rule / f"{name}.tsv"


def params_json(**sections: Any) -> str:
    """Stage params as one JSON string (quote in shell with ``{params.p:q}``)."""
    return json.dumps(sections, sort_keys=True)


def stage_params(**params: Any) -> str:
    """Stage params as JSON, with ``config_id`` the id of exactly these settings (runtime keys aside).

    A rule's params hold what its output depends on and nothing more: Snakemake reruns a job
    whose params changed, so an id of the whole config would rerun every job on any edit.
    The id a table row carries therefore names the settings of the stage that made it.
    """
    settings = {k: v for k, v in params.items() if k not in RUNTIME_PARAMS}
    return params_json(config_id=config_id(settings), **params)


def io_args(flag: str, mapping: Mapping[str, Any]) -> str:
    """``--in key=path ...`` for a stage call from a dict of named paths (each path shell-quoted)."""
    pairs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in mapping.items())
    return f"{flag} {pairs}"


@dataclass(frozen=True)
class House:
    """One validated configuration and its results tree: what every method's wiring reads.

    ``config`` is the validated config (defaults filled, :func:`pipeline.config.validate_config`);
    ``torch_threads`` the threads of a job that runs a small torch model (:mod:`pipeline.resources`).
    """

    config: Mapping[str, Any]
    layout: Layout
    torch_threads: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> House:
        from pipeline.resources import torch_threads  # the cost models import nothing of the house

        return cls(config, Layout(Path(config["results_dir"]), config["experiment"]), torch_threads(config))

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (one of the house's own rules: data, evaluation, public pretraining, report,
        review, bundles) asks the cluster for, its whole ``resources:``: its request in
        :data:`pipeline.resources.HOUSE_REQUESTS`."""
        from pipeline import resources as cost

        return cost.resources(cost.HOUSE_REQUESTS, rule, self.config)

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def device(self) -> str:
        return str(self.config["device"])

    @property
    def precision(self) -> dict[str, str]:
        """``{"precision": "bf16"}`` for the public training and sampling stages of a config that asks for it, ``{}``
        for fp32: spread into their params, so a float32 run's params and config ids are what they were
        (pipeline/models/precision.py)."""
        value = str(self.config.get("precision", "fp32"))
        return {} if value == "fp32" else {"precision": value}

    @property
    def private(self) -> dict[str, int]:
        """The private set's declared size N and number of classes (public constants): the ``private`` param of
        every stage whose release normalises or shapes by them (:func:`pipeline.config.declared_private`)."""
        return declared_private(self.config)

    def method_on(self, method: str) -> bool:
        """Whether config ``methods`` chooses ``method`` (its rules exist either way: any output can be asked for
        by path)."""
        return method in self.config["methods"]

    def ledger_binding(self, run: str, phase: str = "") -> dict[str, str]:
        """A private stage's ``ledger_binding`` param: the run its lines are bound to, the name its method registers
        the transcript under (TranscriptSpec.run), the experiment, and for a stage that releases more than once per
        run which release this is (``phase``: TranscriptSpec.phase; pipeline.privacy.ledger.Binding). A stage that
        releases once passes no phase, so its params (and config id) are what they were."""
        return {"run": str(run), "experiment": self.config["experiment"], **({"phase": phase} if phase else {})}

    @property
    def imports_public_denoiser(self) -> bool:
        """Whether the public denoiser is the user's diffusers model (rule import_public) rather than trained here
        (rule pretrain_public): config ``pretrain.source``."""
        return self.config["pretrain"].get("source") == "diffusers"

    def public_model(self) -> dict[str, Any]:
        """``{"public_model": {source, sha256}}`` when the public denoiser is the user's diffusers folder, else ``{}``.

        Spread into the params of import_public and of every run that reads the denoiser, so the folder's content
        hash is in their config ids and a changed model reruns them; empty for a trained denoiser, whose readers'
        config ids stay as they were.
        """
        return self._public_model

    @cached_property
    def _public_model(self) -> dict[str, Any]:
        # once per House: Snakemake asks every reading job's params, and hashing walks the whole folder
        if not self.imports_public_denoiser:
            return {}
        from pipeline.training.public import folder_sha256, resolve_folder

        folder = resolve_folder(self.config["pretrain"].get("path"))
        return {"public_model": {"source": "diffusers", "sha256": folder_sha256(folder)}}

    def public_denoiser_params(self) -> str:
        """import_public's params: the pretrain keys it reads (not the training recipe, which it does not run) and
        the folder's hash."""
        pretrain = {k: v for k, v in self.config["pretrain"].items() if k in ("source", "path", "precond", "sigma_data")}
        return stage_params(pretrain=pretrain, **self.public_model())

    def data_splits(self) -> dict[str, Path]:
        """Split name -> .npz path of every split the data stage writes for this config."""
        splits = {s: self.layout.split(s) for s in CORE_SPLITS}
        if self.config["data"]["public"]["source"] != "none":
            splits["public"] = self.layout.split("public")
        if self.config["data"]["toy"]["enabled"]:
            splits["toy"] = self.layout.split("toy")
        return splits

"""The baselines' wiring (``rules/baselines.smk``): a run's files and params, the table's inputs, the transcripts the
replay checks, the runs all_runs.parquet reads and each rule's ``resources:`` (:mod:`pipeline.methods.baselines.costs`).
Runs and their names: :mod:`pipeline.baselines.runs`.

Plain Python over one :class:`~pipeline.wiring.House` (no Snakemake): ``tests/methods/baselines/test_wiring.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import resources as cost
from pipeline.baselines import runs as baseline_runs
from pipeline.baselines.runs import BaselineRun
from pipeline.config import schema_defaults
from pipeline.methods._evaluation import Wiring as EvaluationWiring
from pipeline.methods.baselines import costs
from pipeline.privacy import dpsgd_plan
from pipeline.registry import BundleSpec, RunRecord, TranscriptSpec
from pipeline.training import UNET_FROM_INIT
from pipeline.wiring import House, params_json, stage_params

#: keys that list which runs exist, not how one is made: left out of a run's params, so adding an eps or a seed
#: reruns nothing already built
LISTING = ("methods", "epsilons", "seeds")
#: a baseline's private stage (and its rule, its benchmark folder), by the method token of its run names
STAGES = {"dp_merf": "dp_merf", "pe": "private_evolution", "dp_hp": "dp_hp", "dp_ntk": "dp_ntk", "dp_mepf": "dp_mepf",
          "dp_diffusion": "train_dpdm", "privimage": "train_dpdm", "dp_ldm": "train_dpdm",
          "dp_promise": "train_dpdm"}
#: the rule (and benchmark folder) of a method's private stage: one rule runs DP-MERF's successors, one the DP-SGD
#: fine-tuning of the public denoiser
RULES = {**STAGES, **{m: "embedding_baseline" for m in baseline_runs.EMBEDDING_FAMILY},
         **{m: "dpsgd_baseline" for m in baseline_runs.DPSGD_FAMILY}}
#: the rule that samples a DP-SGD baseline's denoiser (its benchmark folder)
SAMPLE_RULE = "sample_baseline"
#: the DP-SGD baselines sampled in pixel space (rule sample_baseline)
PIXEL_DPSGD = tuple(m for m in baseline_runs.DPSGD_FAMILY if m not in baseline_runs.LATENT)
#: a latent baseline's (DP-LDM's) rules after its DP-SGD fine-tuning: its codes sampled, then decoded
LATENT_SAMPLE_RULES = ("sample_dp_ldm", "dp_ldm_decode")
#: the splits DP-LDM encodes with its public autoencoder (rule dp_ldm_encode): the public one its latent denoiser
#: is pretrained on, the private one DP-SGD fine-tunes it on
DP_LDM_CODES = ("public", "private_train")
#: PrivImage's own rules before its DP-SGD fine-tuning (their benchmark folders): the semantic query and the
#: pretraining on the public images it chose (the query net, shared by every run, is rule privimage_query_net)
PRIVIMAGE_RULES = ("privimage_select", "privimage_pretrain")
#: DP-Promise's first phase (its benchmark folder): stage train_dpdm on the high noise levels
PHASE1_RULE = "dp_promise_phase1"
#: DP-Promise's two releases by stage train_dpdm in one run: each line's phase (its identity in the replay)
PHASE1, PHASE2 = "phase1", "phase2"
#: the settings of PrivImage's query (privimage_select's params carry only these: retuning its DP-SGD reruns no query)
PRIVIMAGE_QUERY_KEYS = ("k", "query_share", "second_domain")
#: a method's own subsections of the section (its params carry these and the shared keys, so adding or tuning one
#: method reruns no other); DP-MERF's successors also read its generator settings
SUBSECTIONS = {"dp_merf": ("dp_merf",), "pe": ("pe",), **{m: (m, "dp_merf") for m in baseline_runs.EMBEDDING_FAMILY},
               **{m: (m,) for m in baseline_runs.DPSGD_FAMILY}}


class Wiring:
    """DP-MERF, DP-HP, DP-NTK, DP-MEPF and Private Evolution runs of one configuration (config ``baselines``)."""

    def __init__(self, house: House, evaluation: EvaluationWiring | None = None) -> None:
        self.house = house
        self.evaluation = evaluation or EvaluationWiring(house)

    @property
    def section(self) -> dict[str, Any]:
        return self.house.config["baselines"]

    @property
    def table(self) -> Path:
        """baselines.parquet (rule baselines_table): every run's metrics, certified eps and cost; Table 2's prior
        rows (rules/empden.smk) read it too."""
        return self.house.layout.tables / "baselines.parquet"

    def targets(self) -> list[Path]:
        """What the baselines add to rule all: their table."""
        return [self.table]

    def runs(self) -> list[BaselineRun]:
        """Every run of the config: methods x epsilons x seeds."""
        return baseline_runs.runs(self.section)

    def _dir(self, kind: str) -> Path:
        """The baselines' folder of one kind of output (samples, models, train, eval, public, latent)."""
        return self.house.layout.expdir / kind / "baselines"

    def samples_path(self, run: str) -> Path:
        return self._dir("samples") / f"{run}.npz"

    def manifest_path(self, run: str) -> Path:
        return self._dir("samples") / f"{run}.json"

    def train_metrics_path(self, run: str) -> Path:
        """What the private stage reports of its own run (noise, steps, time), beside the samples."""
        return self._dir("train") / f"{run}.json"

    def generator_path(self, run: str) -> Path:
        """The trained generator of DP-MERF or a successor (safetensors): its bundle's weights."""
        return self._dir("models") / f"{run}.safetensors"

    def denoiser_path(self, run: str) -> Path:
        """The fine-tuned EMA denoiser of a DP-SGD baseline (rule dpsgd_baseline): what its samples are drawn from."""
        return self._dir("models") / f"{run}.pt"

    # ---------------------------------------------------------------- PrivImage's semantic query and pretraining

    @property
    def query_net_path(self) -> Path:
        """PrivImage's semantic query classifier (rule privimage_query_net; public pool only, one per configuration)."""
        return self._dir("models") / "privimage_query_net.pt"

    @property
    def query_net_metrics_path(self) -> Path:
        return self._dir("train") / "privimage_query_net.json"

    def query_ledger_path(self, run: str) -> Path:
        """The transcript of a PrivImage run's semantic query (rule privimage_select): its first line."""
        return self.house.layout.ledger(f"baselines_{run}_query")

    def query_metrics_path(self, run: str) -> Path:
        """The query's release (the noisy histogram) and the semantics each class chose."""
        return self._dir("train") / f"{run}_query.json"

    def selected_path(self, run: str) -> Path:
        """The public images a PrivImage run's query chose, labelled by the class that chose them."""
        return self._dir("public") / f"{run}.npz"

    def pretrained_path(self, run: str) -> Path:
        """The public denoiser a PrivImage run pretrains on its selected images (rule privimage_pretrain)."""
        return self._dir("models") / f"{run}_public.pt"

    def pretrain_metrics_path(self, run: str) -> Path:
        return self._dir("train") / f"{run}_public.json"

    def pool_inputs(self, wildcards: Any = None) -> dict[str, Path]:
        """PrivImage's public pool: the public split, and the second public domain (straightdp.public) unless
        baselines.privimage.second_domain is false."""
        split = self.house.layout.split
        second = self.section["privimage"]["second_domain"]
        return {"public": split("public"), **({"other": split("straightdp_public")} if second else {})}

    def query_net_params(self) -> str:
        """privimage_query_net's params: the classifier's settings, the configuration's seed."""
        h = self.house
        return stage_params(baselines={"privimage": {"query_net": self.section["privimage"]["query_net"]}},
                            seed=h.seed, device=h.device, threads=h.torch_threads)

    def select_inputs(self, wildcards: Any) -> dict[str, Path]:
        """What privimage_select reads: the private split, the query net and the public pool."""
        return {"data": self.house.layout.split("private_train"), "query_net": self.query_net_path,
                **self.pool_inputs()}

    def select_params(self, wildcards: Any) -> str:
        """privimage_select's params: the query's settings and delta, the run, the declared private set, the binding."""
        run, h, own = BaselineRun.from_name(wildcards.run), self.house, self.section["privimage"]
        return stage_params(baselines={"delta": self.section["delta"],
                                       "privimage": {k: own[k] for k in PRIVIMAGE_QUERY_KEYS}},
                            run=run.name, private=h.private, device=h.device, threads=h.torch_threads,
                            ledger_binding=h.ledger_binding(run.name))

    def pretrain_params(self, wildcards: Any) -> str:
        """privimage_pretrain's params (stage pretrain_public): the pretrain section, its steps PrivImage's own when
        set, the run's seed."""
        run, h = BaselineRun.from_name(wildcards.run), self.house
        return stage_params(pretrain=self._pretrain_recipe(self.section["privimage"]["pretrain_steps"]),
                            seed=run.seed, device=h.device, threads=h.torch_threads, **h.precision,
                            **cost.accumulation_params(cost.pretrain_memory(h.config, "privimage_pretrain")))

    def _pretrain_recipe(self, steps: int | None, **changes: Any) -> dict[str, Any]:
        """The pretrain section as stage pretrain_public's recipe (less the public model's source, which no baseline's
        own pretraining reads), with a baseline's own ``steps`` when set and its other ``changes``."""
        pretrain = {k: v for k, v in self.house.config["pretrain"].items() if k not in ("source", "path", "precond")}
        return {**pretrain, **changes, **({"steps": steps} if steps else {})}

    # ---------------------------------------------------------------- DP-LDM's public autoencoder and latent denoiser

    @property
    def ldm_dir(self) -> Path:
        """DP-LDM's code splits (one per configuration: the public split's, and the private split's)."""
        return self._dir("latent") / "dp_ldm"

    @property
    def ldm_autoencoder_path(self) -> Path:
        """DP-LDM's autoencoder (rule dp_ldm_autoencoder, stage train_autoencoder: the public split only)."""
        return self._dir("models") / "dp_ldm_autoencoder.pt"

    @property
    def ldm_autoencoder_metrics_path(self) -> Path:
        return self._dir("train") / "dp_ldm_autoencoder.json"

    def ldm_codes_path(self, name: str) -> Path:
        """A split's codes under DP-LDM's autoencoder (rule dp_ldm_encode; ``name`` may be the wildcard "{name}")."""
        return self.ldm_dir / f"{name}_codes.npz"

    def ldm_code_source(self, wildcards: Any) -> Path:
        """The split rule dp_ldm_encode encodes for ``wildcards.name`` (one of :data:`DP_LDM_CODES`)."""
        return self.house.layout.split(wildcards.name)

    @property
    def ldm_denoiser_path(self) -> Path:
        """DP-LDM's latent denoiser pretrained on the public codes (rule dp_ldm_pretrain)."""
        return self._dir("models") / "dp_ldm_public.pt"

    @property
    def ldm_denoiser_metrics_path(self) -> Path:
        return self._dir("train") / "dp_ldm_public.json"

    def latent_samples_path(self, run: str) -> Path:
        """A latent baseline's sampled codes (rule sample_dp_ldm), before rule dp_ldm_decode decodes them."""
        return self._dir("samples") / "latent" / f"{run}.npz"

    def latent_manifest_path(self, run: str) -> Path:
        return self.latent_samples_path(run).with_suffix(".json")

    def ldm_autoencoder_params(self) -> str:
        """dp_ldm_autoencoder's params: baselines.dp_ldm.autoencoder, the configuration's seed."""
        h = self.house
        return stage_params(autoencoder=self.section["dp_ldm"]["autoencoder"], seed=h.seed, threads=h.torch_threads)

    @staticmethod
    def ldm_codes_params(wildcards: Any) -> str:
        """dp_ldm_encode's params: the code split's name."""
        return stage_params(name=f"dp_ldm_{wildcards.name}_codes")

    def ldm_pretrain_params(self) -> str:
        """dp_ldm_pretrain's params (stage pretrain_public): the pretrain section's recipe with baselines.dp_ldm's
        latent unet (and its steps when set), the configuration's seed."""
        h, own = self.house, self.section["dp_ldm"]
        return stage_params(pretrain=self._pretrain_recipe(own["pretrain_steps"], unet=own["unet"]), seed=h.seed,
                            device=h.device, threads=h.torch_threads, **h.precision,
                            **cost.accumulation_params(self.ldm_pretrain_memory))

    @property
    def ldm_code_shape(self) -> tuple[int, int]:
        """(channels, side) of DP-LDM's codes: the autoencoder's code_channels at H/4 x W/4
        (pipeline/flow/autoencoder.py)."""
        ae = {**schema_defaults("baselines", "dp_ldm", "autoencoder"), **self.section["dp_ldm"]["autoencoder"]}
        return int(ae["code_channels"]), cost.image_side(self.house.config) // 4

    @property
    def ldm_pretrain_memory(self) -> cost.MemoryPlan:
        """dp_ldm_pretrain's micro-batch and GPU memory: baselines.dp_ldm.unet on the autoencoder's codes."""
        return cost.pretrain_memory(self.house.config, "dp_ldm_pretrain", unet=self.section["dp_ldm"]["unet"],
                                    shape=self.ldm_code_shape)

    def dpsgd_network(self, method: str) -> dict[str, Any]:
        """The footprint spec of a DP-SGD baseline's denoiser: DP-LDM's latent UNet on its codes; the others fine-tune
        the public denoiser's architecture (``unet: init``)."""
        if method in baseline_runs.LATENT:
            return cost.pretrain_network(self.house.config, unet=self.section["dp_ldm"]["unet"],
                                         shape=self.ldm_code_shape)
        return cost.pretrain_network(self.house.config)

    def dpsgd_memory(self, run: str) -> cost.MemoryPlan:
        """A DP-SGD baseline run's GPU memory (``run`` its name; DP-Promise's phase I too): the DP-SGD engine's plan
        (:func:`pipeline.resources.dpsgd_memory`) of its denoiser at its section's micro_batch and K. Every weight's
        per-example gradient is counted, also for DP-LDM, which trains only its attention (an upper bound)."""
        method = BaselineRun.from_name(run).method
        own = self.section[method]
        return cost.dpsgd_memory(self.dpsgd_network(method), int(own["micro_batch"]), int(own["K"]))

    def resources(self, rule: str) -> dict[str, Any]:
        """What each job of ``rule`` (a rule of rules/baselines.smk) asks the cluster for, its whole ``resources:``:
        its request in :data:`pipeline.methods.baselines.costs.REQUESTS`."""
        return cost.resources(costs.REQUESTS, rule, self.house.config, self)

    def ldm_decode_params(self, wildcards: Any) -> str:
        """dp_ldm_decode's params: the sample set's name (the evaluation's)."""
        return stage_params(name=f"baselines/{wildcards.run}", threads=self.house.torch_threads)

    def ledger_path(self, run: str) -> Path:
        """The run's own transcript: parallel jobs never append to the same file."""
        return self.house.layout.ledger(f"baselines_{run}")

    def metrics_path(self, run: str) -> Path:
        """The evaluation core's metrics of the run's samples (rule evaluate_baseline)."""
        return self._dir("eval") / run / "metrics.json"

    def params(self, wildcards: Any) -> str:
        """Stage params of the run ``wildcards.run``: the section's shared keys and the method's own subsections
        (:data:`SUBSECTIONS`), the run name (method, eps and seed are read from it), the declared private set,
        device, threads and the ledger binding."""
        method = BaselineRun.from_name(wildcards.run).method
        own = SUBSECTIONS[method]
        section = {k: ({kk: vv for kk, vv in v.items() if kk not in LISTING} if k in own else v)
                   for k, v in self.section.items() if k not in LISTING and (k not in STAGES or k in own)}
        h = self.house
        # Private Evolution's variations come from the public denoiser: the user's model, when it is one, is in its id
        return stage_params(baselines=section, run=wildcards.run, private=h.private, device=h.config["device"],
                            threads=h.torch_threads, ledger_binding=h.ledger_binding(wildcards.run),
                            **(h.public_model() if method == "pe" else {}))

    def pe_inputs(self, wildcards: Any = None) -> dict[str, Path]:
        """Private Evolution's embedding model: the CLIP file when baselines.pe.embedding is clip, else nothing."""
        return {"clip": self.evaluation.clip_model} if self.section["pe"]["embedding"] == "clip" else {}

    @staticmethod
    def stage(wildcards: Any) -> str:
        """The stage rule embedding_baseline calls for ``wildcards.run``: its method (dp_hp, dp_ntk, dp_mepf)."""
        return BaselineRun.from_name(wildcards.run).method

    def embedding_inputs(self, wildcards: Any) -> dict[str, Path]:
        """What a successor of DP-MERF reads: the private and public splits; DP-MEPF also the public CLIP."""
        split = self.house.layout.split
        inputs = {"data": split("private_train"), "public": split("public")}
        if BaselineRun.from_name(wildcards.run).method == "dp_mepf":
            inputs["clip"] = self.evaluation.clip_model
        return inputs

    # ---------------------------------------------------------------- the DP-SGD family (DP-Diffusion)

    def dpsgd_inputs(self, wildcards: Any) -> dict[str, Path]:
        """What a DP-SGD baseline reads: the private split (through DP-SGD only) and the public denoiser it starts
        from: DP-Diffusion the shared one, PrivImage its own, with its query's transcript as ``prior`` (sigma is
        calibrated to the composition), DP-LDM its latent one, on the private split's codes, DP-Promise's phase II
        its phase I's model, with that phase's transcript as ``prior``."""
        run = BaselineRun.from_name(wildcards.run)
        data = self.private_data(run)
        if run.method == "privimage":
            return {"data": data, "init": self.pretrained_path(run.name), "prior": self.query_ledger_path(run.name)}
        if run.method == "dp_ldm":
            return {"data": data, "init": self.ldm_denoiser_path}
        if run.method == "dp_promise":
            return {"data": data, "init": self.phase1_path(run.name), "prior": self.phase1_ledger_path(run.name)}
        return {"data": data, "init": self.house.layout.public_denoiser}

    def private_data(self, run: BaselineRun) -> Path:
        """The private file a baseline's last mechanism reads (its line's data binding): the private split, or in
        latent space (DP-LDM) its codes."""
        if run.method in baseline_runs.LATENT:
            return self.ldm_codes_path("private_train")
        return self.house.layout.split("private_train")

    def dpsgd_params(self, wildcards: Any) -> str:
        """train_dpdm params of a DP-SGD baseline run: its subsection's DP-SGD settings, eps and seed from its name, the
        baselines' delta, the public denoiser's own architecture and conditioning (``unet: init``: every tensor is
        copied from it, a trained or an imported one), pretrain's label dropout, EDM preconditioning (the public
        denoiser's), its views (``augment``)."""
        run = BaselineRun.from_name(wildcards.run)
        if run.method == "dp_promise":  # phase II: the low noise levels, calibrated to both phases composed
            return self._dpsgd_params(run, run.epsilon, sigma_range=[0.0, self.section["dp_promise"]["sigma_split"]],
                                      public_start=False, phase=PHASE2)
        return self._dpsgd_params(run, run.epsilon)

    def _dpsgd_params(self, run: BaselineRun, epsilon: float, sigma_range: list[float | None] | None = None,
                      public_start: bool = True, phase: str = "") -> str:
        own, pretrain, h = self.section[run.method], self.house.config["pretrain"], self.house
        keys = ("clip", "batch_size", "epochs", "lr", "K", "ema_decay", "micro_batch", "checkpoint_every_s")
        # DP-Diffusion's views; PrivImage and DP-LDM fine-tune with noise multiplicity alone (DPDM's recipe)
        augment = {"max_shift": own["max_shift"], "flip": own["flip"]} if "max_shift" in own else None
        # DP-LDM fine-tunes its attention and conditioning only; the others every weight
        trainable = own.get("trainable")
        # the user's imported model is in the id of a run that starts from it (DP-Diffusion, DP-Promise's phase I);
        # PrivImage and DP-LDM pretrain their own, DP-Promise's phase II starts from its phase I
        public_model = h.public_model() if public_start and run.method in ("dp_diffusion", "dp_promise") else {}
        return stage_params(parameterisation="edm", epsilon=epsilon, seed=run.seed, delta=self.section["delta"],
                            **{k: own[k] for k in keys}, augment=augment,
                            unet=UNET_FROM_INIT, label_dropout=pretrain["label_dropout"], trainable=trainable,
                            private=h.private,
                            ledger_binding=h.ledger_binding(run.name, phase), device=h.device,
                            threads=h.torch_threads, **({"sigma_range": sigma_range} if sigma_range else {}),
                            **public_model)

    # ---------------------------------------------------------------- DP-Promise's first phase

    def phase1_path(self, run: str) -> Path:
        """DP-Promise's phase-I denoiser (rule dp_promise_phase1): phase II's initialisation, a private release."""
        return self._dir("models") / f"{run}_phase1.pt"

    def phase1_ledger_path(self, run: str) -> Path:
        """The transcript of DP-Promise's phase I: its run's first line (phase II composes it in)."""
        return self.house.layout.ledger(f"baselines_{run}_phase1")

    def phase1_metrics_path(self, run: str) -> Path:
        return self._dir("train") / f"{run}_phase1.json"

    def phase1_inputs(self, wildcards: Any = None) -> dict[str, Path]:
        """What DP-Promise's phase I reads: the private split and the shared public denoiser."""
        return {"data": self.house.layout.split("private_train"), "init": self.house.layout.public_denoiser}

    def phase1_params(self, wildcards: Any) -> str:
        """train_dpdm params of DP-Promise's phase I: the noise levels sigma >= sigma_split, phase1_share x eps."""
        run, own = BaselineRun.from_name(wildcards.run), self.section["dp_promise"]
        return self._dpsgd_params(run, own["phase1_share"] * run.epsilon, sigma_range=[own["sigma_split"], None],
                                  phase=PHASE1)

    def dpsgd_sample_params(self, wildcards: Any) -> str:
        """sample_dpdm params of a DP-SGD baseline run (rule sample_baseline, or sample_dp_ldm for its codes): its
        subsection's sampler, baselines.n_samples, the run's seed."""
        run, h = BaselineRun.from_name(wildcards.run), self.house
        n = int(self.section["n_samples"])
        return params_json(sampler=self.section[run.method]["sampler"], n_samples=n, seed=run.seed,
                           batch_size=n, device=h.device, threads=h.torch_threads, **h.precision,
                           name=f"baselines/{run.name}")

    def evaluate_params(self, wildcards: Any) -> str:
        """Params of evaluate_baseline for ``wildcards.run`` (the evaluation core's, named baselines/<run>)."""
        return self.evaluation.evaluate_params(f"baselines/{wildcards.run}")

    def ledgers(self, run: BaselineRun) -> tuple[Path, ...]:
        """A run's transcripts in the order they were written: PrivImage's query, then its DP-SGD line (the
        composition certifies under the last line's accountant); one for every other baseline."""
        first = {"privimage": (self.query_ledger_path(run.name),),
                 "dp_promise": (self.phase1_ledger_path(run.name),)}.get(run.method, ())
        return (*first, self.ledger_path(run.name))

    def transcripts(self) -> dict[Path, TranscriptSpec]:
        """Each run's lines (one per transcript), bound to the run, its stage, the baselines' delta and the private
        split, and held to what the configuration ran (:meth:`line_params`; every baseline's noise is calibrated to
        its eps, composed after its run's earlier release where it has one: PrivImage's query, DP-Promise's phase I)."""
        data, delta = self.house.layout.split("private_train"), self.section["delta"]
        out = {}
        for r in self.runs():
            last: dict[str, Any] = {"epsilon_target": r.epsilon}
            if r.method == "privimage":
                query_share = self.section["privimage"]["query_share"]
                out[self.query_ledger_path(r.name)] = TranscriptSpec(
                    claims=1, run=r.name, stage="privimage_select", delta=delta, data=data,
                    params={"extra.k": self.section["privimage"]["k"]}, epsilon_target=query_share * r.epsilon)
                last["after"] = (self.query_ledger_path(r.name),)
            if r.method == "dp_promise":
                own = self.section["dp_promise"]
                out[self.phase1_ledger_path(r.name)] = TranscriptSpec(
                    claims=1, run=r.name, stage="train_dpdm", delta=delta, data=data, phase=PHASE1,
                    params=self.line_params(r), epsilon_target=own["phase1_share"] * r.epsilon)
                last.update(after=(self.phase1_ledger_path(r.name),), phase=PHASE2)
            out[self.ledger_path(r.name)] = TranscriptSpec(claims=1, run=r.name, stage=STAGES[r.method], delta=delta,
                                                           data=self.private_data(r), params=self.line_params(r),
                                                           **last)
        return out

    def line_params(self, run: BaselineRun) -> dict[str, Any]:
        """What the configuration fixes of a run's private release (its last one; DP-Promise's two phases share
        them), as dotted paths of its ledger line: the DP-SGD family's N, batch, T and clip; the embedding family's
        N (the mean's divisor, a declared constant), classes and DP-MERF's features; Private Evolution's T
        releases. Every noise is calibrated (TranscriptSpec.epsilon_target), so no sigma is here."""
        N, n_classes = self.house.private["N"], self.house.private["n_classes"]
        own = self.section[run.method]
        if run.method in baseline_runs.DPSGD_FAMILY:
            steps = dpsgd_plan.dpsgd_steps(dataset_size=N, batch_size=own["batch_size"], epochs=own["epochs"])
            return dpsgd_plan.configured_line(dataset_size=N, batch_size=own["batch_size"], steps=steps,
                                              max_grad_norm=own["clip"])
        if run.method == "pe":
            return {"extra.iterations": own["iterations"], "count": own["iterations"]}
        out = {"extra.m": N, "extra.n_classes": n_classes, "count": 1}
        return {**out, "extra.n_features": own["n_features"]} if run.method == "dp_merf" else out

    def bundle_runs(self) -> list[str]:
        return [run.name for run in self.runs()]

    def bundle(self, run: str) -> BundleSpec:
        """A run's bundle: DP-MERF's generator (trained on the released embedding: post-processing), Private
        Evolution's synthetic set (its samples are its release)."""
        r = next((x for x in self.runs() if x.name == run), None)
        if r is None:
            raise ValueError(f"baselines: no run {run!r} in the configuration")
        if r.method in baseline_runs.DPSGD_FAMILY:
            return self._dpsgd_bundle(r)
        trained = r.method != "pe"  # a generator fitted to the release (DP-MERF and its successors)
        released = {"dp_merf": "random-feature", "dp_hp": "Hermite-feature", "dp_ntk": "e-NTK-feature",
                    "dp_mepf": "perceptual-feature (1st and 2nd moment)"}
        mechanism = (f"the noisy mean embedding of the private set ({baseline_runs.LABELS[r.method]}: one Gaussian "
                     f"release of its {released[r.method]} mean)" if trained else
                     "every Private Evolution iteration's noisy nearest-neighbour histogram of the private set")
        public = ("the public data and features the method starts from",) + (
            ("the public CLIP image tower whose features are matched",) if r.method == "dp_mepf" else ())
        n = int(self.section["n_samples"])
        return BundleSpec(run=run, samples=self.samples_path(run), metrics=self.metrics_path(run),
                          transcripts=(self.ledger_path(run),), epsilon_target=r.epsilon,
                          model=self.generator_path(run) if trained else None,
                          sampling={"sampler": "dp_merf", "stream": f"{r.method}.generator", "seed": r.seed,
                                    "n_samples": n, "batch_size": n,
                                    "threads": self.house.torch_threads} if trained else None,
                          covers=(mechanism,),
                          not_covered=public + ("the hyperparameters, set in the configuration",
                                                "the declared size of the private set (a public constant)"))

    def _dpsgd_bundle(self, r: BaselineRun) -> BundleSpec:
        """A DP-SGD baseline's bundle: its fine-tuned EMA denoiser, drawn from by its sampler (post-processing)."""
        n, own = int(self.section["n_samples"]), self.section[r.method]
        draws = (f"an example's K = {own['K']} augmented views clipped together" if r.method == "dp_diffusion" else
                 f"an example's K = {own['K']} diffusion draws averaged before the clip")
        # the run's release before its last DP-SGD, composed in: PrivImage's query, DP-Promise's phase I
        earlier = (("PrivImage's semantic query: the noisy class-by-semantics histogram of the private split (one "
                  "Gaussian release) that chose the public pretraining data",) if r.method == "privimage" else ())
        if r.method == "dp_promise":
            earlier = (f"DP-Promise's phase I: DP-SGD on the noise levels sigma >= {own['sigma_split']} (Poisson-"
                     "subsampled, clipped, Gaussian gradient noise; the forward process's noise is not counted)",)
        # a latent denoiser's samples are codes: its bundle is the decoded synthetic set (sample_bundle draws images
        # from a pixel denoiser only)
        latent = r.method in baseline_runs.LATENT
        phase = ("phase II (sigma < the split, from phase I's model): "
                 if r.method == "dp_promise" else "public denoiser's ")
        subset, data = ((" (its attention and class-embedding parameters only)", "split's codes") if latent
                        else ("", "split"))
        return BundleSpec(
            run=r.name, samples=self.samples_path(r.name), metrics=self.metrics_path(r.name),
            transcripts=self.ledgers(r), epsilon_target=r.epsilon,
            model=None if latent else self.denoiser_path(r.name),
            sampling=None if latent else {"sampler": "dpdm", "sampler_name": r.method, "settings": own["sampler"],
                                          "seed": r.seed, "batch_size": n, "n_samples": n,
                                          "threads": self.house.torch_threads},
            covers=(*earlier, f"every DP-SGD step of the {phase}fine-tuning{subset} on the private {data}: "
                    "Poisson-subsampled, per-example clipped "
                    f"gradients ({draws}), Gaussian noise, composed over all steps"),
            not_covered=("the public pretraining of the initial denoiser (public data only"
                         + ("; which public images, post-processing of the query" if r.method == "privimage"
                            else "") + ")",
                         *(("the public autoencoder (public data only) whose encoder made the codes and whose "
                            "decoder made the samples (post-processing)",) if latent else ()),
                         "the hyperparameters, set in the configuration",
                         "the declared size of the private set (a public constant)"))

    @staticmethod
    def sample_rules(method: str) -> tuple[str, ...]:
        """The rules that turn a DP-SGD baseline's denoiser into its samples (their benchmark folders): sample_baseline,
        or a latent one's sampling and decoding; none for the others (their private stage writes the samples)."""
        if method in baseline_runs.LATENT:
            return LATENT_SAMPLE_RULES
        return (SAMPLE_RULE,) if method in baseline_runs.DPSGD_FAMILY else ()

    def records(self) -> list[RunRecord]:
        """One all_runs record per baseline run: its metrics, its transcripts, its jobs' benchmarks."""
        bench = self.house.layout.benchmark
        return [RunRecord(method=run.method, config=run.name, seed=run.seed, epsilon_target=run.epsilon,
                          metrics=self.metrics_path(run.name), ledgers=self.ledgers(run),
                          benchmarks=(*(bench(rule, run.name) for rule in PRIVIMAGE_RULES if run.method == "privimage"),
                                      *((bench(PHASE1_RULE, run.name),) if run.method == "dp_promise" else ()),
                                      bench(RULES[run.method], run.name),
                                      *(bench(rule, run.name) for rule in self.sample_rules(run.method)),
                                      bench("evaluate_baseline", run.name)),
                          label=baseline_runs.LABELS[run.method])
                for run in self.runs()]

"""Stage ``train_dpdm``: DP-SGD training of a class-conditional denoiser (DPDM, Dockhorn et al. 2023), the engine
DPDM and the DP-SGD baselines (DP-Diffusion, PrivImage, DP-LDM, DP-Promise) train with.

The private split is read by exactly one mechanism, DP-SGD (:mod:`pipeline.privacy.dpsgd`):
Poisson sampling with rate q = batch_size / N, per-example gradients clipped to C, Gaussian
noise sigma C on the sum, T steps. Before any private record is touched, sigma is calibrated
so that the certified (pessimistic PLD) eps of the whole run's event is <= the target
(:func:`pipeline.privacy.dpsgd.plan_for_budget`); that event is the run's ledger line
(:func:`pipeline.privacy.dpsgd.ledger_entry`), written to the ``ledger`` output.

DPDM's ingredients (Sec. 3, App. C):

* **configuration** (``parameterisation``): EDM, v-prediction, VP or VE, each a denoiser
  D(x, sigma, y) in the VE convention with its per-draw loss and sigma distribution
  (:mod:`pipeline.models.edm`, :mod:`pipeline.models.precond`).
* **noise multiplicity** K: each example's loss averages K (sigma, noise) draws BEFORE its
  gradient is clipped, so the mechanism and the ledger line are the same for every K.
* **class conditioning with label dropout** for classifier-free guidance: every step each
  label is replaced by the null class with probability ``label_dropout``, from a generator
  independent of the data.
* **EMA** of the weights; the EMA is what the model file holds (sampling uses it).
* optional **initialisation from the public denoiser** (input ``init``, the output of
  ``pretrain_public``), as public pretraining in DPDM's follow-ups; parameters whose shapes
  match are copied, the rest keep their fresh initialisation (logged).
* optional **partial fine-tuning** (``trainable``): only parameters whose names match one of
  the glob patterns get per-example gradients, clipping and noise; the rest stay frozen at
  their (public) values. The Gaussian noise grows with the number of noised coordinates while
  the clipped signal does not, so fine-tuning a small subset (DP-LDM, Liu et al. 2024: the
  attention modules and the conditioning embedder) keeps more signal per step at the same eps.
  The mechanism and its ledger line do not depend on the subset.
* optional **augmentation multiplicity** (``augment``; DP-Diffusion, Ghalebikesabi et al. 2023): each of an
  example's K draws is on its own random view of it (:mod:`pipeline.training.augment`), averaged before the clip,
  so again the same mechanism; with ``unet: init`` the network is the public denoiser's own (trained or imported).

Nothing computed from the private data other than the DP-SGD updates leaves this stage: the
training losses are not logged, shown or written (they would be an unaccounted release).
Resumable after a kill through :mod:`pipeline.training.loop` (the mechanism's noise generator
is checkpointed with the rest, so a resumed run releases exactly the run that was accounted).

Data parallel: launched as N processes (``python -m pipeline --nproc N train_dpdm ...``, the rule's ``gpu``
resource from ``dpdm.gpus``), every rank runs this stage; the engine splits each logical batch's micro-batches
over the ranks (:mod:`pipeline.distributed`) and rank 0 alone writes the state, the model, the ledger line and
the metrics. The run is the single process's (same sample, draws and noise; weights equal to float summation
order), so the number of processes is not part of the run's identity (its params hash or config id).
"""

from __future__ import annotations

import fnmatch
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline import distributed, seeds
from pipeline.config import schema_defaults, schema_descriptions
from pipeline.io import atomic_path, read_json, write_json
from pipeline.models.checkpoint import BACKBONES, read_denoiser_backbone, read_denoiser_meta, save_denoiser
from pipeline.models.edm import edm_sigma_sampler
from pipeline.models.precision import refuse_in_private_training
from pipeline.models.precond import parameterisation as get_parameterisation
from pipeline.privacy import dpsgd, ledger, rebuild
from pipeline.stage import PipelineError, stage
from pipeline.training import loop
from pipeline.training.augment import RandomShiftFlip
from pipeline.training import UNET_FROM_INIT
from pipeline.training.data import (PRIVATE_DOC, check_declared, declared_private, drop_labels, load_training_split,
                                    to_model_scale, unet_spec_for)

log = logging.getLogger(__name__)

STAGE = "train_dpdm"
RESUME_INSENSITIVE = ("checkpoint_every_s", "device", "threads", "micro_batch", "clipping", "config_id")

#: the config section the stage's params mirror: the one source of their defaults and descriptions
SCHEMA_SECTION = "dpdm"
#: the stage's params that are keys of :data:`SCHEMA_SECTION`
SCHEMA_KEYS = ("delta", "clip", "batch_size", "epochs", "lr", "K", "ema_decay", "label_dropout", "class_conditional",
               "checkpoint_every_s", "micro_batch", "clipping", "draws", "trainable")
PARAMS_DOC = {
    # the keys of the dpdm section: described once, in its schema (their defaults come from there too)
    **schema_descriptions(SCHEMA_SECTION, SCHEMA_KEYS),
    "parameterisation": "edm | vpred | vp | ve: the diffusion configuration (DPDM App. C)",
    "epsilon": "target eps (required): sigma is calibrated so the certified PLD eps of the run is <= it",
    "steps": "number of DP-SGD steps T (optional; overrides epochs)",
    "unet": "UNetSpec architecture keys (block_out_channels, attention, layers_per_block, norm_num_groups, "
            "dropout); image size, channels and classes come from the data. 'init': the public denoiser's own "
            "architecture and conditioning (input init; every tensor is copied, class_conditional is the file's)",
    "augment": "optional augmentation multiplicity {max_shift, flip}: each of an example's K draws sees its own random "
               "view (translation by up to max_shift pixels, a left-right flip when flip) (DP-Diffusion, Ghalebikesabi "
               "et al. 2023); null = none",
    "sigma_range": "optional [lo, hi] (hi null: no upper end): the noise levels drawn, EDM's log-normal conditioned on "
                   "lo <= sigma < hi (edm only; DP-Promise's phases); null = every level",
    "seed": "integer seed (initialisation, sampling, diffusion draws, label dropout, the mechanism's noise; default 0)",
    "config_id": "id of the configuration (recorded on the ledger line and in the model's meta)",
    "device": "auto | cpu | cuda[:N] (default auto)",
    "threads": "torch CPU threads (default 1)",
    "private": PRIVATE_DOC,
    "ledger_binding": "{run, experiment} the ledger line is bound to (the replay checks them against the registry)",
    "checkpoint_dir": "optional: folder of the resumable state (default results/<exp>/checkpoints/train_dpdm/<model name>)",
    "public_model": "optional: {source, sha256} of the user's public model the run starts from (pretrain.source "
                    "diffusers; only in the config id)",
}
_KNOWN = set(PARAMS_DOC)


@dataclass(frozen=True)
class DPDenoiserConfig:
    """The stage's params (see ``PARAMS_DOC``).

    The fields that mirror the schema's ``dpdm`` section carry no defaults: :meth:`from_params`
    fills absent ones from the schema (:func:`pipeline.config.schema_defaults`), so a default
    lives in one place. Only ``steps`` and ``seed``, which the section does not have, default here.
    """

    epsilon: float
    parameterisation: str
    delta: float
    clip: float
    batch_size: int
    epochs: float
    lr: float
    K: int
    ema_decay: float
    label_dropout: float
    class_conditional: bool
    unet: dict[str, Any] | str
    checkpoint_every_s: float
    micro_batch: int
    trainable: tuple[str, ...] | None
    steps: int | None = None
    seed: int = 0
    clipping: str = "auto"
    draws: str = "stream"
    augment: dict[str, Any] | None = None
    sigma_range: tuple[float, float | None] | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DPDenoiserConfig:
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise PipelineError(f"stage {STAGE}: unknown param {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
        if params.get("epsilon") is None:
            raise PipelineError(f"stage {STAGE}: param epsilon (the target eps) is required")
        given = {k: params[k] for k in cls.__dataclass_fields__ if k in params and params[k] is not None}
        # an absent (or null) param takes the schema's default, as validate_config fills a config
        section = schema_defaults(SCHEMA_SECTION)
        kept = {k: section[k] for k in cls.__dataclass_fields__ if k in section} | given
        if kept["unet"] != UNET_FROM_INIT:
            if not isinstance(kept["unet"], Mapping):
                raise PipelineError(f"stage {STAGE}: param unet must be a mapping of architecture keys or "
                                    f"{UNET_FROM_INIT!r}, got {kept['unet']!r}")
            kept["unet"] = {**section["unet"], **kept["unet"]}  # nested keys too, as validate_config fills them
        if kept["trainable"] is not None:
            pats = kept["trainable"]
            if isinstance(pats, str) or not all(isinstance(x, str) and x for x in pats):
                raise PipelineError(f"stage {STAGE}: param trainable must be a list of glob patterns, got {pats!r}")
            kept["trainable"] = tuple(pats)
        if kept.get("sigma_range") is not None:
            r = kept["sigma_range"]
            if isinstance(r, (str, Mapping)) or not hasattr(r, "__len__") or len(r) != 2:
                raise PipelineError(f"stage {STAGE}: param sigma_range must be [lo, hi] (hi may be null), got {r!r}")
            kept["sigma_range"] = tuple(r)
        cfg = cls(**kept)
        cfg.check()
        return cfg

    def check(self) -> None:
        def bad(key: str, want: str) -> PipelineError:
            return PipelineError(f"stage {STAGE}: param {key} must be {want}, got {getattr(self, key)!r}")

        if self.parameterisation not in ("edm", "vpred", "vp", "ve"):
            raise bad("parameterisation", "one of edm, vpred, vp, ve")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise bad("epsilon", "> 0 and finite")
        if not 0 < self.delta < 1:
            raise bad("delta", "in (0, 1)")
        if not self.clip > 0:
            raise bad("clip", "> 0")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise bad("batch_size", "an integer >= 1")
        if self.steps is None and not self.epochs > 0:
            raise bad("epochs", "> 0")
        if self.steps is not None and not (isinstance(self.steps, int) and self.steps >= 1):
            raise bad("steps", "an integer >= 1")
        if not (isinstance(self.K, int) and self.K >= 1):
            raise bad("K", "an integer >= 1")
        if not self.lr > 0:
            raise bad("lr", "> 0")
        if not 0 <= self.ema_decay < 1:
            raise bad("ema_decay", "in [0, 1)")
        if not 0 <= self.label_dropout <= 1:
            raise bad("label_dropout", "in [0, 1]")
        if not (isinstance(self.micro_batch, int) and self.micro_batch >= 1):
            raise bad("micro_batch", "an integer >= 1")
        if not self.checkpoint_every_s > 0:
            raise bad("checkpoint_every_s", "> 0")
        if self.clipping not in dpsgd.CLIPPING:
            raise bad("clipping", f"one of {', '.join(dpsgd.CLIPPING)}")
        if self.draws not in dpsgd.DRAWS:
            raise bad("draws", f"one of {', '.join(dpsgd.DRAWS)}")
        a = self.augment
        if a is not None and not (isinstance(a, Mapping) and set(a) <= {"max_shift", "flip"}
                                  and isinstance(a.get("flip", False), bool)
                                  and type(a.get("max_shift", 0)) is int and a.get("max_shift", 0) >= 0):
            raise bad("augment", "null or {max_shift: integer >= 0, flip: true|false}")
        r = self.sigma_range
        if r is not None:
            lo, hi = r
            if self.parameterisation != "edm":
                raise bad("sigma_range", "null unless parameterisation is edm (a range of EDM's log-normal levels)")
            if not (isinstance(lo, (int, float)) and not isinstance(lo, bool) and 0 <= lo < math.inf
                    and (hi is None or (isinstance(hi, (int, float)) and not isinstance(hi, bool) and hi > lo))):
                raise bad("sigma_range", "[lo, hi] with 0 <= lo < hi (hi null: no upper end)")

    def sigma_sampler(self, default: Any) -> Any:
        """The run's noise-level sampler: the parameterisation's ``default``, or EDM's restricted to ``sigma_range``."""
        return default if self.sigma_range is None else edm_sigma_sampler(sigma_range=self.sigma_range)

    def augmentation(self) -> RandomShiftFlip | None:
        """Augmentation multiplicity's views (``augment``, checked by :meth:`check`), or None."""
        return None if self.augment is None else RandomShiftFlip(**self.augment)

    def n_steps(self, n: int) -> int:
        return dpsgd.dpsgd_steps(dataset_size=n, batch_size=self.batch_size, epochs=self.epochs, steps=self.steps)


def freeze_all_but(model: nn.Module, patterns: tuple[str, ...] | None) -> int:
    """Leave ``requires_grad`` only on parameters whose names match a glob in ``patterns``
    (None: all); the DP-SGD engine noises exactly those. Returns how many scalars train."""
    if patterns is not None:
        names = [n for n, _ in model.named_parameters()]
        for pat in patterns:
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                raise PipelineError(f"stage {STAGE}: param trainable pattern {pat!r} matches no parameter "
                                    f"(names look like {names[0]!r}, {names[-1]!r})")
        for n, p in model.named_parameters():
            p.requires_grad_(any(fnmatch.fnmatchcase(n, pat) for pat in patterns))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def init_from_public(model: nn.Module, path: Path) -> dict[str, Any]:
    """Copy the public denoiser's weights into ``model`` where names and shapes match.

    Public data only, so no privacy cost. Returns a summary (copied / skipped names) for the meta.
    """
    blob = torch.load(path, map_location="cpu", weights_only=True) if Path(path).is_file() else None
    if not isinstance(blob, dict) or "state_dict" not in blob:
        read_denoiser_meta(path)  # raises the one-line error for a missing or foreign file
        raise PipelineError(f"{path}: no state_dict in the denoiser file")
    own = model.state_dict()
    copied, skipped = [], []
    for k, v in blob["state_dict"].items():
        if k in own and own[k].shape == v.shape:
            own[k] = v
            copied.append(k)
        else:
            skipped.append(k)
    if not copied:
        raise PipelineError(f"input init {path}: no parameter matches this model (different UNet architecture?)")
    model.load_state_dict(own)
    fresh = sorted(set(own) - set(copied))
    log.info("init from %s (%s): copied %d tensors, %d skipped, %d left fresh", path, blob.get("precond"),
             len(copied), len(skipped), len(fresh))
    return {"path": str(path), "precond": blob.get("precond"), "copied": len(copied), "skipped": skipped,
            "fresh": fresh, "meta": blob.get("meta", {})}


@dataclass(frozen=True)
class Backbone:
    """The run's network: a registered backbone ``kind`` and its ``spec`` (``unet``: a :class:`UNetSpec`; ``unet:
    init`` of an imported model: ``diffusers_unet``), and the classes it is conditioned on (0: unconditional)."""

    kind: str
    spec: Any
    num_classes: int

    def build(self) -> nn.Module:
        return BACKBONES[self.kind].build(self.spec)


def _shape_and_classes(kind: str, spec: Any) -> tuple[int, int, int]:
    """(channels, image size, classes) of a UNet spec of either kind."""
    if kind == "unet":
        return spec.channels, spec.image_size, spec.num_classes
    config = spec.config
    size = config.get("sample_size")
    embeds = config.get("num_class_embeds")
    return int(config.get("in_channels", 0)), int(size if isinstance(size, int) else size[0]), (
        int(embeds) - 1 if embeds else 0)


def model_backbone(cfg: DPDenoiserConfig, inputs: Mapping[str, Path], split: Any, n_classes: int) -> Backbone:
    """The run's UNet: from ``cfg.unet`` and the data, or (``unet: init``) the public denoiser's own (a trained or an
    imported UNet), checked against the private split's image shape and declared classes."""
    if cfg.unet != UNET_FROM_INIT:
        spec = unet_spec_for(cfg.unet, split, class_conditional=cfg.class_conditional, num_classes=n_classes)
        return Backbone("unet", spec, spec.num_classes)
    if not inputs.get("init"):
        raise PipelineError(f"stage {STAGE}: param unet 'init' needs --in init=PUBLIC_DENOISER")
    kind, spec = read_denoiser_backbone(inputs["init"])
    if kind not in ("unet", "diffusers_unet"):
        raise PipelineError(f"input init {inputs['init']}: a {kind} backbone, not a UNet denoiser")
    channels, size, classes = _shape_and_classes(kind, spec)
    _, c, h, _ = split.images.shape
    if (channels, size) != (c, h) or classes not in (0, n_classes):
        raise PipelineError(f"input init {inputs['init']}: a {channels}x{size}^2 model with {classes} classes, the "
                            f"private split is {c}x{h}^2 with {n_classes}")
    return Backbone(kind, spec, classes)


def prior_releases(path: Path | None, *, run: str, data_sha256: str) -> list[ledger.LedgerEntry]:
    """The lines of input ``prior``: releases the same run made earlier on the same private split (PrivImage's
    semantic query), composed into this run's calibration. A line bound to another run or other data is refused:
    composing with it would certify the wrong thing."""
    if path is None:
        return []
    try:
        lines = [e for _, e in ledger.read_ledger(path)]
        for e in lines:  # an event edited away from its line's parameters would calibrate too little noise
            rebuild.check(e)
    except (FileNotFoundError, ledger.LedgerError) as exc:
        raise PipelineError(f"stage {STAGE}: input prior: {exc}") from None
    if not lines:
        raise PipelineError(f"stage {STAGE}: input prior {path} holds no ledger line")
    for e in lines:
        if e.run != run or e.data_sha256 != data_sha256:
            raise PipelineError(f"stage {STAGE}: input prior {path}: its {e.mechanism} line is bound to run "
                                f"{e.run!r} on data {e.data_sha256[:12]}, this run is {run!r} on {data_sha256[:12]}")
    return lines


#: what a private init's checkpoint meta records of the DP-SGD that trained it, and where a ledger line states it
#: (the meta key -> the line's value); the line's own fields are bound to its event by :func:`rebuild.check`
INIT_LINE_FIELDS: dict[str, Callable[[ledger.LedgerEntry], Any]] = {
    "stage": lambda e: e.stage, "data_sha256": lambda e: e.data_sha256, "seed": lambda e: e.seed,
    "config_id": lambda e: e.config_id, "noise_multiplier": lambda e: e.extra.get("dpsgd_noise_multiplier"),
    "clip": lambda e: e.extra.get("max_grad_norm"), "sampling_rate": lambda e: e.sampling.get("probability"),
    "n_train": lambda e: e.sampling.get("n"), "steps": lambda e: e.count, "delta": lambda e: e.delta}


def is_init_line(init_meta: Mapping[str, Any], e: ledger.LedgerEntry) -> bool:
    """Whether ``e`` is the line of the DP-SGD that trained the init: the mechanism, stage, split, seed and config the
    init's checkpoint records. Any other DP-SGD line on the same data (another run's, another eps's) would compose a
    release that did not produce these weights and leave the one that did out of the eps."""
    return e.mechanism == "dpsgd" and all(rebuild.same(init_meta.get(k), line(e))
                                          for k, line in INIT_LINE_FIELDS.items())


def _recorded(init_meta: Mapping[str, Any]) -> str:
    """The init's own training as its checkpoint records it, for the one-line refusal."""
    return ", ".join(f"{k}={str(init_meta.get(k))[:12]}" for k in INIT_LINE_FIELDS)


def check_private_init(init_meta: Mapping[str, Any] | None, path: Path | None,
                       prior: list[ledger.LedgerEntry], prior_path: Path | None = None) -> None:
    """A private model as ``init`` (DP-Promise's second phase starts from its first) is a release of the private
    data: its own transcript line (:func:`is_init_line`) must be composed into this run (input ``prior``, lines of
    this run on the same split), or the run's eps would leave it out."""
    if not init_meta or not init_meta.get("private"):
        return
    if not prior:
        raise PipelineError(f"stage {STAGE}: input init {path} is a private model (trained on data "
                            f"{str(init_meta.get('data_sha256'))[:12]}): give its transcript as input prior so its "
                            "release is composed into this run's eps")
    if not any(is_init_line(init_meta, e) for e in prior):
        raise PipelineError(f"stage {STAGE}: input prior {prior_path} holds no line of input init {path}'s own "
                            f"training ({_recorded(init_meta)}): composing another line would leave its release out "
                            "of this run's eps")


def calibrated_plan(cfg: DPDenoiserConfig, n: int, steps: int, cache: Path, run_hash: str, *,
                    write: bool = True, prior: list[Any] | None = None) -> dpsgd.DPSGDPlan:
    """The run's DP-SGD plan with sigma calibrated to ``cfg.epsilon`` (certified PLD, before training); with
    ``prior`` events (earlier releases of the run), to their composition with this run's DP-SGD.

    The calibrated sigma is kept beside the resumable state (``plan.json``, keyed by the run's
    params hash) so a resumed run continues with the SAME mechanism it started with, without
    repeating the bisection (minutes at paper scale); its eps is recomputed by the caller. ``write=False``
    (data-parallel ranks other than 0, which calibrate the same sigma) leaves the file to rank 0.
    """
    plan_kw = dict(max_grad_norm=cfg.clip, sampling_rate=cfg.batch_size / n, dataset_size=n, steps=steps,
                   delta=cfg.delta)
    if cache.is_file():
        cached = read_json(cache)
        if cached.get("params_hash") == run_hash:
            log.info("%s: sigma %.6g from %s (resumed run)", STAGE, cached["noise_multiplier"], cache)
            return dpsgd.DPSGDPlan(noise_multiplier=float(cached["noise_multiplier"]), **plan_kw)
    try:
        plan = dpsgd.plan_for_budget(target_epsilon=cfg.epsilon, delta=cfg.delta, max_grad_norm=cfg.clip,
                                     batch_size=cfg.batch_size, dataset_size=n, steps=steps,
                                     prior=prior or ())
    except dpsgd.DPSGDError as exc:
        raise PipelineError(f"stage {STAGE}: {exc}") from None
    if write:
        write_json(cache, {"params_hash": run_hash, "noise_multiplier": plan.noise_multiplier, **plan_kw})
    return plan


@stage(STAGE, inputs=("data",), optional_inputs=("init", "prior"), outputs=("model", "ledger", "metrics"),
       params=PARAMS_DOC)
def train_dp_denoiser(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DP-SGD training of a (class-conditional) diffusion denoiser with noise multiplicity (DPDM).

    Optional input ``prior``: the transcript of releases this run made earlier on the same private split
    (PrivImage's semantic query); sigma is then calibrated so their composition with this DP-SGD meets ``epsilon``.
    """
    refuse_in_private_training(params, "train_dpdm")
    cfg = DPDenoiserConfig.from_params(params)
    with distributed.data_parallel(str(params.get("device", "auto"))) as (world, device):
        _train_dp_denoiser(cfg, inputs, outputs, params, world, device)


def _train_dp_denoiser(cfg: DPDenoiserConfig, inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                       params: Mapping[str, Any], world: distributed.World, device: torch.device) -> None:
    config_id = str(params.get("config_id", "unknown"))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    n, n_classes = declared_private(params, STAGE)
    split, data_sha = load_training_split(inputs["data"], "data")
    # q = batch_size / N with N the declared size: a sampling rate read off the data would differ between
    # add/remove neighbours (every record's inclusion probability would move with one record)
    check_declared(split, N=n, n_classes=n_classes, stage=STAGE)
    binding = ledger.binding_of(params, data_sha256=data_sha, stage=STAGE)
    if cfg.batch_size > n:
        raise PipelineError(f"stage {STAGE}: batch_size {cfg.batch_size} exceeds the {n} private records")
    net = model_backbone(cfg, inputs, split, n_classes)
    config = get_parameterisation(cfg.parameterisation)

    # a run without augmentation or a sigma range keeps the hash it had before the option existed (its checkpoints
    # still resume)
    fields = {k: v for k, v in asdict(cfg).items() if not (k in ("augment", "sigma_range") and v is None)}
    run_params = {**fields, "data_sha256": data_sha, "unet_spec": net.spec.to_json(),
                  "init": read_denoiser_meta(inputs["init"]) if inputs.get("init") else None}
    prior = prior_releases(inputs.get("prior"), run=binding.run, data_sha256=data_sha)
    if prior:  # a run without one keeps its hash
        run_params["prior"] = [e.event for e in prior]
    check_private_init(run_params["init"], inputs.get("init"), prior, inputs.get("prior"))
    run_hash = loop.params_hash(run_params, ignore=RESUME_INSENSITIVE)
    ck_dir = Path(params["checkpoint_dir"]) if params.get("checkpoint_dir") else loop.checkpoint_dir_for(
        outputs["model"], STAGE)

    # 1. the mechanism, fixed before any private record is used
    total_steps = cfg.n_steps(n)
    t0 = time.perf_counter()
    prior_events = [e.dp_event() for e in prior]
    plan = calibrated_plan(cfg, n, total_steps, ck_dir / "plan.json", run_hash, write=world.main, prior=prior_events)
    # the run's eps: its DP-SGD composed with the prior releases, certified as the tables certify it
    certified = dpsgd.composed_epsilon(prior_events, plan) if prior else plan.epsilon()
    if certified > cfg.epsilon:  # cannot happen for a fresh calibration; guards an edited plan.json
        raise PipelineError(f"stage {STAGE}: plan certifies eps {certified:.6g} > target {cfg.epsilon}")
    calibration_s = time.perf_counter() - t0
    log.info("%s: q=%.5f, T=%d, sigma=%.4f calibrated in %.1f s: certified eps %.4f <= target %.4f at delta %g",
             STAGE, plan.sampling_rate, total_steps, plan.noise_multiplier, calibration_s, certified,
             cfg.epsilon, cfg.delta)

    # 2. the model (public initialisation is post-processing of public data)
    seeds.seed_globals("dpdm.init", cfg.seed)
    model = config.build(net.build()).to(device)
    init_info = init_from_public(model, inputs["init"]) if inputs.get("init") else None
    n_trainable = freeze_all_but(model, cfg.trainable)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    gen = seeds.torch_generator("dpdm.draws", cfg.seed)  # Poisson sampling, diffusion draws, label dropout
    noise_gen = seeds.torch_generator("dpdm.mechanism_noise", cfg.seed, device=device)  # the Gaussian mechanism
    engine = dpsgd.DPSGD(model, dpsgd.multiplicity_loss(config.draw_loss), plan, microbatch_size=cfg.micro_batch,
                         multiplicity=dpsgd.NoiseMultiplicity(cfg.K, cfg.sigma_sampler(config.sigma_sampler),
                                                              augment=cfg.augmentation()),
                         generator=gen, noise_generator=noise_gen, clipping=cfg.clipping, world=world,
                         draws=cfg.draws)
    log.info("%s: clipped sums by %s (dpdm.clipping %s), process %d of %d", STAGE, engine.clipping, cfg.clipping,
             world.rank + 1, world.size)
    images = to_model_scale(split.images).to(device)
    labels = torch.from_numpy(split.labels.astype(np.int64)).to(device) if net.num_classes else None

    def step(i: int) -> float:
        engine.steps_taken = i  # the engine refuses to run past the accounted T
        data = (images,) if labels is None else (images, drop_labels(labels, cfg.label_dropout, net.num_classes, gen))
        engine.step(optimizer, data)
        return float("nan")  # the private loss is deliberately not recorded

    res = loop.run_training(model=model, optimizer=optimizer, step_fn=step, total_steps=total_steps,
                            state_path=ck_dir / loop.STATE_FILE, run_hash=run_hash, ema_decay=cfg.ema_decay,
                            checkpoint_every_s=cfg.checkpoint_every_s,
                            generators={"draws": gen, "mechanism": noise_gen}, desc=STAGE, show_loss=False)
    if not world.main:
        return  # rank 0 writes the release

    # 3. the release: weights + the ledger line of the mechanism that produced them
    entry = dpsgd.ledger_entry(plan, stage=STAGE, config_id=config_id, seed=cfg.seed,
                               extra={"parameterisation": cfg.parameterisation, "data_sha256": data_sha,
                                      **({"composed_with": [e.mechanism for e in prior]} if prior else {})})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    meta = {"stage": STAGE, "private": True, "parameterisation": cfg.parameterisation, "epsilon": certified,
            "target_epsilon": cfg.epsilon, "delta": cfg.delta, "noise_multiplier": plan.noise_multiplier,
            "clip": cfg.clip, "sampling_rate": plan.sampling_rate, "expected_batch_size": plan.expected_batch_size,
            "K": cfg.K, "augment": cfg.augment, **({"sigma_range": list(cfg.sigma_range)} if cfg.sigma_range else {}),
            "steps": total_steps, "lr": cfg.lr, "ema_decay": cfg.ema_decay,
            "weights": "ema",
            "label_dropout": cfg.label_dropout, "class_conditional": bool(net.num_classes) if cfg.unet == UNET_FROM_INIT
            else cfg.class_conditional, "n_train": n,
            "trainable": None if cfg.trainable is None else list(cfg.trainable), "n_trainable": n_trainable,
            "data_sha256": data_sha, "init": None if init_info is None else init_info["path"],
            "config_id": config_id, "seed": cfg.seed, "accountant": "pld_pessimistic"}
    save_denoiser(outputs["model"], res.ema.cpu(), backbone=net.spec, precond=config.precond, meta=meta)
    write_json(outputs["metrics"], {
        "format": "dpgen-train-metrics/1", "stage": STAGE, **meta, "resumed_from": res.resumed_from,
        "wall_s_this_run": res.wall_s, "calibration_s": calibration_s, "device": str(device),
        "processes": world.size,
        "s_per_step": res.wall_s / max(1, res.steps - res.resumed_from), "unet": net.spec.to_json(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "init_fresh_tensors": None if init_info is None else init_info["fresh"],
        "note": "no training loss is reported: it is a function of the private data"})
    log.info("%s: %d steps (resumed from %d) in %.1f s, eps %.4f (delta %g), K=%d",
             STAGE, total_steps, res.resumed_from, res.wall_s, certified, cfg.delta, cfg.K)

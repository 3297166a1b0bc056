"""Stage ``train_dpsgd_classifier``: DPDM's task-specific baseline, a classifier trained on the private split by DP-SGD.

DPDM (Dockhorn et al. 2023, Sec. 5 "downstream utility" and its comparison table with DP-SGD-trained classifiers)
compares the test accuracy of classifiers trained on a DPDM's synthetic data with the same architectures trained
directly on the private data with DP-SGD at the same (eps, delta). This stage is the second arm: the downstream
evaluation's classifier (:mod:`pipeline.evaluation.downstream`: ``cnn``, the evaluation-net architecture
:class:`pipeline.evaluation.evalnet.EvalNet`; ``logreg``, a linear soft-max on pixels / 255) trained on the private
split with the project's one DP-SGD engine (:class:`pipeline.privacy.dpsgd.DPSGD`, Abadi et al. 2016; DPDM App. A):

* Poisson sampling with rate q = batch_size / N (N the DECLARED private size, a public constant);
* per-example gradients of the cross-entropy (``vmap(grad)``), clipped to C over all parameters;
* Gaussian noise of std sigma C on the clipped sum, divided by the expected batch q N;
* sigma calibrated BEFORE any private record is read so that the certified (pessimistic PLD) eps of the whole run's
  event SelfComposed(PoissonSampled(q, Gaussian(sigma)), T) is <= the target
  (:func:`pipeline.privacy.dpsgd.plan_for_budget`); that event is the run's ledger line
  (:func:`pipeline.privacy.dpsgd.ledger_entry`), bound to the run like train_dpdm's, which the replay recomputes and
  the one-run audit reruns.

The release is the classifier's weights. Its accuracy on the test split (the same metric as the downstream
classifiers': the fraction of test images whose arg-max class is their label) and on the validation split are
post-processing of the release and of public splits. Nothing is chosen here: the hyper-parameters come from the
configuration (``dpdm.dpsgd_classifier``); the validation accuracy is written for a choice made elsewhere, never the
test one. No training loss is logged (a function of the private data outside the mechanism).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from pipeline import seeds
from pipeline.config import schema_defaults, schema_descriptions
from pipeline.device import resolve_device
from pipeline.evaluation.evalnet import EvalNet, load_labelled_split
from pipeline.io import Split, atomic_path, write_json
from pipeline.privacy import dpsgd, ledger
from pipeline.stage import PipelineError, reject_unknown_params, stage
from pipeline.methods.dpdm.runs import CLASSIFIERS
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, load_training_split

log = logging.getLogger(__name__)

STAGE = "train_dpsgd_classifier"
CLASSIFIER_FORMAT = "dpgen-dpsgd-classifier/1"
#: the downstream classifiers this stage can train privately (pipeline.evaluation.downstream's names; the run
#: grammar's, pipeline.methods.dpdm.runs)
KINDS = CLASSIFIERS
#: the dpdm schema section the stage's hyper-parameters mirror (their one source of defaults)
SCHEMA_SECTION = ("dpdm", "dpsgd_classifier")
#: the stage's params that are keys of :data:`SCHEMA_SECTION`
SCHEMA_KEYS = ("clip", "batch_size", "epochs", "lr", "micro_batch")


PARAMS_DOC = {
    # the keys of dpdm.dpsgd_classifier: described once, in its schema (their defaults come from there too)
    **schema_descriptions(SCHEMA_SECTION, SCHEMA_KEYS),
    "classifier": "cnn | logreg: the downstream classifier trained (the evaluation CNN's architecture, or a linear "
                  "soft-max on pixels / 255)",
    "epsilon": "target eps (required): sigma is calibrated so that the certified PLD eps of the run is <= it",
    "delta": "target delta (dpdm.delta)",
    "width": "the CNN's width (evaluation.evalnet.width: the downstream CNN's architecture)",
    "feature_dim": "the CNN's penultimate width (evaluation.evalnet.feature_dim)",
    "seed": "seed of the initialisation, the sampling and the mechanism's noise",
    "private": PRIVATE_DOC,
    "ledger_binding": "{run, experiment} the ledger line is bound to (the replay checks them against the registry)",
    "config_id": "id of the configuration (on the ledger line and in the metrics)",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads",
}


@dataclass(frozen=True)
class ClassifierConfig:
    """The stage's hyper-parameters. Fields of ``dpdm.dpsgd_classifier`` carry no default: :meth:`from_params` fills
    absent ones from the schema (:func:`pipeline.config.schema_defaults`), so a default lives in one place."""

    classifier: str
    epsilon: float
    delta: float
    clip: float
    batch_size: int
    epochs: float
    lr: float
    micro_batch: int
    width: int = 32
    feature_dim: int = 128
    seed: int = 0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ClassifierConfig:
        reject_unknown_params(STAGE, params, PARAMS_DOC)
        for key in ("classifier", "epsilon"):
            if params.get(key) is None:
                raise PipelineError(f"stage {STAGE}: param {key} is required")
        section = schema_defaults(*SCHEMA_SECTION)
        evalnet = schema_defaults("evaluation", "evalnet")
        kept = {k: v for k, v in ({**evalnet, **section}).items() if k in cls.__dataclass_fields__}
        if "delta" not in params:
            kept["delta"] = schema_defaults("dpdm")["delta"]
        kept |= {k: params[k] for k in cls.__dataclass_fields__ if params.get(k) is not None}
        cfg = cls(**kept)
        cfg.check()
        return cfg

    def check(self) -> None:
        def bad(key: str, want: str) -> PipelineError:
            return PipelineError(f"stage {STAGE}: param {key} must be {want}, got {getattr(self, key)!r}")

        if self.classifier not in KINDS:
            raise bad("classifier", f"one of {', '.join(KINDS)}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise bad("epsilon", "> 0 and finite")
        if not 0 < self.delta < 1:
            raise bad("delta", "in (0, 1)")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise bad("clip", "> 0 and finite")
        for key in ("batch_size", "micro_batch", "width", "feature_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "an integer >= 1")
        if not self.epochs > 0:
            raise bad("epochs", "> 0")
        if not self.lr > 0:
            raise bad("lr", "> 0")

    def n_steps(self, n: int) -> int:
        return dpsgd.dpsgd_steps(dataset_size=n, batch_size=self.batch_size, epochs=self.epochs)


class PixelLogReg(nn.Module):
    """Multinomial logistic regression on pixels / 255 (the downstream ``logreg``'s input scale)."""

    def __init__(self, in_shape: tuple[int, int, int], n_classes: int) -> None:
        super().__init__()
        self.in_shape, self.n_classes = tuple(int(s) for s in in_shape), int(n_classes)
        self.linear = nn.Linear(int(np.prod(in_shape)), n_classes)

    @property
    def arch(self) -> dict[str, Any]:
        return {"in_shape": list(self.in_shape), "n_classes": self.n_classes}

    def forward(self, images: Tensor) -> Tensor:
        return self.linear(images.float().flatten(1) / 255.0)


def build_classifier(cfg: ClassifierConfig, in_shape: tuple[int, int, int], n_classes: int) -> nn.Module:
    """The untrained classifier ``cfg.classifier`` for images ``in_shape`` (both take images on the 0..255 scale)."""
    if cfg.classifier == "cnn":
        # EvalNet has no batch norm: an example's gradient depends on that example alone, as per-example clipping needs
        return EvalNet(in_shape, n_classes, width=cfg.width, feature_dim=cfg.feature_dim)
    return PixelLogReg(in_shape, n_classes)


class ExampleCrossEntropy:
    """The engine's example loss: one example's cross-entropy (``loss(model_fn, image, label)``, no batch dimension;
    what ``vmap(grad)`` differentiates) and every example's from one batched forward (:meth:`batched`, what ghost
    clipping differentiates, :mod:`pipeline.privacy.ghost`). Both give the same clipped sum: the same mechanism."""

    def __call__(self, model_fn: Any, image: Tensor, label: Tensor) -> Tensor:
        return F.cross_entropy(model_fn(image.unsqueeze(0)), label.unsqueeze(0))

    def batched(self, model_fn: Any, images: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(model_fn(images), labels, reduction="none")


def dpsgd_engine(model: nn.Module, plan: dpsgd.DPSGDPlan, cfg: ClassifierConfig, device: torch.device) -> dpsgd.DPSGD:
    """The DP-SGD engine of a run: per-example clipped cross-entropy gradients, noise N(0, (sigma C)^2) on their sum
    per step from the run's mechanism stream, Poisson sampling from its draws stream."""
    return dpsgd.DPSGD(model, ExampleCrossEntropy(), plan, microbatch_size=cfg.micro_batch,
                       generator=seeds.torch_generator("dpsgd_classifier.draws", cfg.seed),
                       noise_generator=seeds.torch_generator("dpsgd_classifier.mechanism_noise", cfg.seed,
                                                             device=device),
                       clipping="auto")  # ghost clipping: EvalNet and the linear model are Conv2d / Linear layers


@torch.no_grad()
def accuracy(model: nn.Module, split: Split, *, batch_size: int = 500) -> float:
    """Fraction of ``split`` whose arg-max class is its label (the downstream classifiers' accuracy)."""
    model.eval()
    device = next(model.parameters()).device
    images = torch.from_numpy(split.images)
    preds = torch.cat([model(b.to(device).float()).argmax(1).cpu() for b in images.split(batch_size)])
    return float(np.mean(preds.numpy() == split.labels))


def calibrated_plan(cfg: ClassifierConfig, n: int) -> dpsgd.DPSGDPlan:
    """The run's DP-SGD plan with sigma calibrated to the target eps (certified PLD), before training."""
    try:
        return dpsgd.plan_for_budget(target_epsilon=cfg.epsilon, delta=cfg.delta, max_grad_norm=cfg.clip,
                                     batch_size=cfg.batch_size, dataset_size=n, steps=cfg.n_steps(n))
    except dpsgd.DPSGDError as exc:
        raise PipelineError(f"stage {STAGE}: {exc}") from None


@stage(STAGE, inputs=("data", "test", "val"), outputs=("model", "ledger", "metrics"), params=PARAMS_DOC)
def train_dpsgd_classifier(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DPDM's task-specific baseline: a downstream classifier trained on the private split by DP-SGD, its ledger line,
    and its test and validation accuracy."""
    cfg = ClassifierConfig.from_params(params)
    config_id = str(params.get("config_id", "unknown"))
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    n, n_classes = declared_private(params, STAGE)
    split, data_sha = load_training_split(inputs["data"], "data")
    # q = batch_size / N with the declared N: a rate read off the data would move with one record
    check_declared(split, N=n, n_classes=n_classes, stage=STAGE)
    binding = ledger.binding_of(params, data_sha256=data_sha, stage=STAGE)
    scored = {role: load_labelled_split(inputs[role], role) for role in ("test", "val")}
    for role, s in scored.items():
        if s.images.shape[1:] != split.images.shape[1:]:
            raise PipelineError(f"stage {STAGE}: input {role} images are {list(s.images.shape[1:])} but the private "
                                f"split's are {list(split.images.shape[1:])}")
    if cfg.batch_size > n:
        raise PipelineError(f"stage {STAGE}: batch_size {cfg.batch_size} exceeds the {n} private records")

    # 1. the mechanism, fixed before any private record is used
    t0 = time.perf_counter()
    plan = calibrated_plan(cfg, n)
    certified = plan.epsilon()
    if certified > cfg.epsilon:  # cannot happen for a fresh calibration; guards the calibration's invariant
        raise PipelineError(f"stage {STAGE}: plan certifies eps {certified:.6g} > target {cfg.epsilon}")
    log.info("%s (%s): q=%.4f, T=%d, sigma=%.4f: certified eps %.4f <= target %g at delta %g (pessimistic PLD)",
             STAGE, cfg.classifier, plan.sampling_rate, plan.steps, plan.noise_multiplier, certified, cfg.epsilon,
             cfg.delta)

    # 2. the private training
    seeds.seed_globals("dpsgd_classifier.init", cfg.seed)  # initialisation and dropout masks (not data-dependent)
    model = build_classifier(cfg, tuple(split.images.shape[1:]), n_classes).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    engine = dpsgd_engine(model, plan, cfg, device)
    data = (torch.from_numpy(split.images).float().to(device),
            torch.from_numpy(split.labels.astype(np.int64)).to(device))
    for _ in tqdm(range(plan.steps), desc=f"{STAGE} {cfg.classifier}", mininterval=1.0):
        engine.step(optimizer, data)  # the loss and batch size it returns are private: not logged
    train_s = time.perf_counter() - t0

    # 3. the release and its scores (post-processing of the weights and of public splits)
    acc = {role: accuracy(model, s) for role, s in scored.items()}
    entry = dpsgd.ledger_entry(plan, stage=STAGE, config_id=config_id, seed=cfg.seed,
                               extra={"classifier": cfg.classifier, "data_sha256": data_sha})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    meta = {"stage": STAGE, "private": True, "classifier": cfg.classifier, "epsilon": certified,
            "target_epsilon": cfg.epsilon, "delta": cfg.delta, "noise_multiplier": plan.noise_multiplier,
            "sampling_rate": plan.sampling_rate, "steps": plan.steps, "accountant": "pld_pessimistic",
            "n_train": n, "data_sha256": data_sha, "config_id": config_id, "seed": cfg.seed,
            "hyperparameters": asdict(cfg)}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(outputs["model"], suffix=".pt") as tmp:
        torch.save({"format": CLASSIFIER_FORMAT, "classifier": cfg.classifier, "arch": model.arch,
                    "state_dict": state, "meta": meta}, tmp)
    write_json(outputs["metrics"], {
        "format": "dpgen-dpsgd-classifier-metrics/1", **meta,
        f"acc_{cfg.classifier}": acc["test"], f"acc_{cfg.classifier}_val": acc["val"],
        "n_test": len(scored["test"]), "n_val": len(scored["val"]), "train_s": train_s, "device": str(device),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "note": "test accuracy scores the fixed configuration; nothing was chosen on it"})
    log.info("%s (%s): %d steps in %.1f s; test accuracy %.4f (val %.4f) at certified eps %.4f (delta %g)",
             STAGE, cfg.classifier, plan.steps, train_s, acc["test"], acc["val"], certified, cfg.delta)

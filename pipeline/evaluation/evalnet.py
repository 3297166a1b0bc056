"""The evaluation CNN: a small classifier trained on held-out real data.

The DP image-generation literature on MNIST-scale data measures fidelity in the feature
space of a small classifier trained on real digits rather than Inception-v3 (the "LeNet
FID"), because Inception's ImageNet features say little about 28×28 grey digits. This
module defines that network for any ``[C, H, W]`` input, trains it (stage
``train_evalnet``) on the ``eval_train`` split, which is real data *disjoint from the
private training set*, and reports its accuracy on the ``test`` split. Its penultimate
layer is the feature space of FID/KID/precision-recall (:mod:`pipeline.evaluation.fidelity`)
and its predictions give label consistency; the same architecture, trained on synthetic
pairs, is the downstream "CNN" classifier (:mod:`pipeline.evaluation.downstream`).

Checkpoint format ``dpgen-evalnet/1`` (a ``torch.save`` dict readable with
``weights_only=True``): ``arch`` (everything :class:`EvalNet` needs: ``in_shape``,
``n_classes``, ``width``, ``feature_dim``), ``state_dict``, ``train`` (hyper-parameters,
seed, sizes) and ``test_accuracy``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from pipeline import seeds
from pipeline.config import validate_config
from pipeline.device import resolve_device
from pipeline.images import to_unit_scale
from pipeline.io import Split, atomic_path, load_split, write_json
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "dpgen-evalnet/1"
#: spatial side the last conv block is pooled to, so the head has the same size at any H×W
POOLED_SIDE = 4


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of :func:`fit_classifier` (the ``evaluation.evalnet`` config section)."""

    width: int = 32
    feature_dim: int = 128
    epochs: int = 15
    batch_size: int = 64
    lr: float = 2e-3

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> TrainConfig:
        return cls(**{k: section[k] for k in cls.__dataclass_fields__ if k in section})


class EvalNet(nn.Module):
    """LeNet-style: two (3×3 conv, ReLU, 2×2 max-pool) blocks → pooled ``POOLED_SIDE²`` map
    → linear ``feature_dim`` features → ReLU, dropout → class logits.

    The features are the penultimate layer *before* its ReLU: measured on 16×16 MNIST,
    the rectified features fold uniform-noise images onto the digit clusters (precision of
    noise against real 0.32), the pre-activations keep them apart (0.13), and their FID
    separates real from noise by more.

    Input: images on the uint8 scale (any dtype, values 0..255) ``[B, C, H, W]``; the
    network normalises to [-1, 1] itself so a checkpoint needs no separate preprocessing.
    No batch norm: a sample's features must not depend on the other images in its batch.
    """

    def __init__(self, in_shape: tuple[int, int, int], n_classes: int, *, width: int = 32,
                 feature_dim: int = 128) -> None:
        super().__init__()
        c = in_shape[0]
        self.in_shape = tuple(int(s) for s in in_shape)
        self.n_classes = int(n_classes)
        self.width = int(width)
        self.feature_dim = int(feature_dim)
        self.body = nn.Sequential(
            nn.Conv2d(c, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(POOLED_SIDE),
            nn.Flatten(),
            nn.Linear(2 * width * POOLED_SIDE**2, feature_dim),
        )
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.3), nn.Linear(feature_dim, n_classes))

    @property
    def arch(self) -> dict[str, Any]:
        return {"in_shape": list(self.in_shape), "n_classes": self.n_classes, "width": self.width,
                "feature_dim": self.feature_dim}

    def features_and_logits(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features (the FID feature space) and class logits."""
        feats = self.body(to_unit_scale(images, torch.float32))
        return feats, self.head(feats)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features_and_logits(images)[1]


def fit_classifier(train: Split, config: TrainConfig, *, seed: int, device: torch.device,
                   n_classes: int | None = None, desc: str = "evalnet") -> EvalNet:
    """Train an :class:`EvalNet` with Adam and cross-entropy on ``train``.

    Deterministic given ``seed`` on the CPU: initialisation, shuffling and dropout draw
    from RNGs seeded here, inside ``fork_rng`` so the caller's global RNG state is
    untouched. ``desc`` names the run in progress bars and errors.
    """
    if len(train) == 0:
        raise PipelineError(f"{desc}: cannot train a classifier on an empty split")
    n_classes = int(n_classes if n_classes is not None else train.labels.max() + 1)
    # uint8 on the device once (60k 32×32 RGB images are 184 MB), not one copy per batch
    images = torch.from_numpy(train.images).to(device)
    labels = torch.from_numpy(train.labels.astype(np.int64)).to(device)
    forked = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seeds.seed_of("evalnet.init", seed))
        gen = seeds.torch_generator("evalnet.batches", seed)
        model = EvalNet(tuple(train.images.shape[1:]), n_classes, width=config.width,
                        feature_dim=config.feature_dim).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        # Cosine decay: the last epochs settle instead of bouncing at the peak rate.
        steps_per_epoch = -(-len(train) // config.batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs * steps_per_epoch)
        model.train()
        epochs = tqdm(range(config.epochs), desc=f"{desc} epochs", mininterval=1.0)
        for _ in epochs:
            order = torch.randperm(len(train), generator=gen)
            total, seen = 0.0, 0
            for idx in tqdm(order.split(config.batch_size), desc="batches", leave=False, mininterval=1.0):
                idx = idx.to(device)
                loss = F.cross_entropy(model(images[idx]), labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
            epochs.set_postfix(loss=f"{total / seen:.3f}")
    model.eval()
    return model


@torch.no_grad()
def predict(model: EvalNet, images: np.ndarray | torch.Tensor, *, batch_size: int = 256,
            device: torch.device | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features ``[N, feature_dim]`` and logits ``[N, n_classes]`` (float32 numpy) of ``images``."""
    device = device or next(model.parameters()).device
    x = torch.as_tensor(images)
    model.eval()
    feats, logits = [], []
    for batch in x.split(batch_size):
        f, z = model.features_and_logits(batch.to(device))
        feats.append(f.cpu())
        logits.append(z.cpu())
    return torch.cat(feats).numpy(), torch.cat(logits).numpy()


def accuracy(model: EvalNet, split: Split, *, batch_size: int = 256) -> float:
    """Fraction of ``split`` whose predicted class equals its label."""
    _, logits = predict(model, split.images, batch_size=batch_size)
    return float(np.mean(logits.argmax(1) == split.labels))


def save_evalnet(model: EvalNet, path: str | Path, **meta: Any) -> None:
    """Write a ``dpgen-evalnet/1`` checkpoint (atomic)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save({"format": CHECKPOINT_FORMAT, "arch": model.arch, "state_dict": state, **meta}, tmp)


def load_evalnet(path: str | Path, *, device: torch.device | str = "cpu") -> EvalNet:
    """Rebuild the network a ``dpgen-evalnet/1`` checkpoint describes, in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: evaluation network checkpoint not found (run the train_evalnet stage)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise PipelineError(f"{path}: not a {CHECKPOINT_FORMAT} checkpoint")
    arch = ckpt["arch"]
    model = EvalNet(tuple(arch["in_shape"]), arch["n_classes"], width=arch["width"],
                    feature_dim=arch["feature_dim"])
    model.load_state_dict(ckpt["state_dict"])
    return model.to(device).eval()


def load_labelled_split(path: Path, role: str) -> Split:
    """:func:`pipeline.io.load_split` with a one-line error naming the stage input."""
    try:
        return load_split(path)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise PipelineError(f"input {role}: {exc}") from None


def evaluation_section(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """An ``evaluation`` config section (from stage params) validated, defaults filled.

    Stages are also called outside Snakemake (tests, by hand), so they check their params
    against the same schema as ``config.yaml`` and fail with the same one-line messages.
    """
    return validate_config({"evaluation": dict(section or {})}, source="params")["evaluation"]


@stage(
    "train_evalnet",
    inputs=("train", "test"),
    outputs=("model", "metrics"),
    params={
        "evalnet": "the evaluation.evalnet config section (width, feature_dim, epochs, batch_size, lr)",
        "seed": "integer seed (initialisation, shuffling, dropout)",
        "device": "auto | cpu | cuda[:N]",
    },
)
def train_evalnet(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Train the evaluation CNN on held-out real data (eval_train), report test accuracy."""
    config = TrainConfig.from_mapping(evaluation_section({"evalnet": params.get("evalnet", {})})["evalnet"])
    seed = int(params.get("seed", 0))
    device = resolve_device(params.get("device", "auto"))
    train = load_labelled_split(inputs["train"], "train")
    test = load_labelled_split(inputs["test"], "test")
    if train.images.shape[1:] != test.images.shape[1:]:
        raise PipelineError(f"train images are {list(train.images.shape[1:])} but test images "
                            f"{list(test.images.shape[1:])}: both splits must share [C, H, W]")
    n_classes = int(max(train.labels.max(), test.labels.max()) + 1)
    start = time.perf_counter()
    model = fit_classifier(train, config, seed=seed, device=device, n_classes=n_classes)
    train_s = time.perf_counter() - start
    test_acc = accuracy(model, test)
    train_acc = accuracy(model, train)
    log.info("evalnet: test accuracy %.4f (train %.4f) after %.1f s", test_acc, train_acc, train_s)
    meta = {"train": {**asdict(config), "seed": seed, "n_train": len(train)}, "test_accuracy": test_acc}
    save_evalnet(model.cpu(), outputs["model"], **meta)
    write_json(outputs["metrics"], {
        "test_accuracy": test_acc, "train_accuracy": train_acc, "n_train": len(train), "n_test": len(test),
        "n_classes": n_classes, "in_shape": list(model.in_shape), "train_wall_s": train_s,
        "device": str(device), "seed": seed, **{f"evalnet_{k}": v for k, v in asdict(config).items()},
    })

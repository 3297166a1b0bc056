"""Small pieces the training stages share: images to the model scale, label dropout, the UNet spec."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline.images import to_unit_scale
from pipeline.io import Split, arrays_sha256, load_split, manifest_path, read_json
from pipeline.models.unet import UNetSpec
from pipeline.stage import PipelineError


def load_training_split(path: Path, role: str) -> tuple[Split, str]:
    """The split at ``path`` and the sha256 its manifest records (one-line error naming ``role``)."""
    try:
        split = load_split(path)  # verifies the contents against the manifest's sha256
        mpath = manifest_path(path)
        sha = (str(read_json(mpath)["sha256"]) if mpath.is_file()
               else arrays_sha256({"images": split.images, "labels": split.labels.astype(np.int64)}))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise PipelineError(f"input {role}: {exc}") from None
    if len(split) == 0:
        raise PipelineError(f"input {role}: {path} holds no images")
    return split, sha


def to_model_scale(images: np.ndarray | Tensor) -> Tensor:
    """uint8 ``[N, C, H, W]`` in 0..255 -> float32 in [-1, 1] (the scale every denoiser works in)."""
    return to_unit_scale(images, torch.float32)


def drop_labels(labels: Tensor, p: float, num_classes: int, generator: torch.Generator | None) -> Tensor:
    """Replace each label by the null class ``num_classes`` with probability ``p``.

    Classifier-free guidance (Ho & Salimans 2022; DPDM App. C) trains one network both
    conditionally and unconditionally; the UNet's class embedding has a row for the null class.
    The draw uses only ``generator``, independent of the data (no privacy cost under DP-SGD).
    """
    if p <= 0:
        return labels
    drop = torch.rand(labels.shape, generator=generator) < p
    return torch.where(drop.to(labels.device), torch.full_like(labels, num_classes), labels)


def unet_spec_for(section: Mapping[str, Any], split: Split, *, class_conditional: bool) -> UNetSpec:
    """A :class:`UNetSpec` from an architecture section, with image size, channels and classes from ``split``."""
    _, c, h, w = split.images.shape
    if h != w:
        raise PipelineError(f"images must be square, got {h}x{w}")
    num_classes = int(split.labels.max()) + 1 if class_conditional else 0
    keys = ("block_out_channels", "attention", "layers_per_block", "norm_num_groups", "dropout")
    unknown = sorted(set(section) - set(keys))
    if unknown:
        raise PipelineError(f"unet: unknown key {unknown[0]!r} (known: {', '.join(keys)}; image size, channels "
                            "and classes come from the data)")
    arch = {k: section[k] for k in keys if k in section}
    try:
        return UNetSpec.from_json({**arch, "image_size": int(h), "channels": int(c), "num_classes": num_classes})
    except ValueError as exc:
        raise PipelineError(str(exc)) from None

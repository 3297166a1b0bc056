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


#: the ``private`` param of every stage that reads the private set through a release
PRIVATE_DOC = "the private set's declared {N, n_classes} (pipeline.config.declared_private; public constants)"


def declared_private(params: Mapping[str, Any], stage: str) -> tuple[int, int]:
    """(N, number of classes) of ``params["private"]``: the private set's declared public constants
    (:func:`pipeline.config.declared_private`), which a release normalises and shapes by."""
    declared = params.get("private")
    if not isinstance(declared, Mapping):
        raise PipelineError(f"stage {stage}: param private = {{N, n_classes}} (the declared size and classes of the "
                            f"private set, pipeline.config.declared_private) is required")
    out = []
    for key in ("N", "n_classes"):
        value = declared.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PipelineError(f"stage {stage}: param private.{key} must be an integer >= 1, got {value!r}")
        out.append(value)
    return out[0], out[1]


def check_declared(split: Split, *, N: int, n_classes: int, stage: str, role: str = "data") -> None:
    """Refuse a private split whose size is not the declared N or whose labels leave [0, n_classes).

    The mechanism's noise scale is fixed by N (a config value) before any record is read, so a split
    of another size is a configuration error, not a different release; the message names the two
    sizes (the declared one is public, the realised one is what the config promised) and no label.
    """
    if len(split) != N:
        raise PipelineError(f"stage {stage}: input {role} holds {len(split)} records but the declared private size "
                            f"N is {N} (data.private.n_private_train); a release normalised by N needs exactly N")
    labels = np.asarray(split.labels)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise PipelineError(f"stage {stage}: input {role} has labels outside [0, {n_classes}) (the declared "
                            f"number of classes of the private source)")


def manifest_sha256(path: Path, role: str) -> str:
    """The sha256 the manifest beside the split (or points) file ``path`` records: the hash a ledger line
    binds to (read after the file was loaded, hence verified against it)."""
    try:
        return str(read_json(manifest_path(path))["sha256"])
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise PipelineError(f"input {role}: {path}: no manifest sha256 ({exc})") from None


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


def unet_spec_for(section: Mapping[str, Any], split: Split, *, class_conditional: bool,
                  num_classes: int | None = None) -> UNetSpec:
    """A :class:`UNetSpec` from an architecture section, with image size and channels from ``split`` and the
    classes ``num_classes`` (a private model's: the declared count) or, for public data, ``split``'s labels."""
    _, c, h, w = split.images.shape
    if h != w:
        raise PipelineError(f"images must be square, got {h}x{w}")
    if num_classes is None:
        num_classes = int(split.labels.max()) + 1
    num_classes = num_classes if class_conditional else 0
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

"""The trained-denoiser file (``dpgen-denoiser/1``) every sampler loads.

A training stage (public EDM pretraining, DPDM) ends by writing one ``.pt`` file holding
what is needed to rebuild the network without the training code's config:

* ``format``: ``"dpgen-denoiser/1"``
* ``unet``: the :class:`~pipeline.models.unet.UNetSpec` as JSON
* ``precond``: a key of :data:`PRECONDITIONERS` (``"edm"``, ...), ``precond_kwargs`` its arguments
* ``state_dict``: the weights to sample with (the EMA weights when training kept an EMA)
* ``meta``: free JSON (stage, config_id, seed, steps, data sha256, privacy summary, ...)

Every preconditioner is a module ``D(x, sigma, class_labels=None) -> x0_hat`` in the
variance-exploding convention ``x = y + sigma n`` of Karras et al. 2022 (Table 1 expresses VP,
VE and EDM this way), so samplers are written once against that interface. Resumable *training*
checkpoints (optimizer, EMA, RNG state) are a training concern and live with the training loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.io import atomic_path
from pipeline.models.edm import EDMPrecond
from pipeline.models.precond import VEPrecond, VPPrecond, VPredPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.stage import PipelineError

DENOISER_FORMAT = "dpgen-denoiser/1"

#: name -> class taking ``(unet, **precond_kwargs)``; training code registers its preconditioners here.
PRECONDITIONERS: dict[str, type[nn.Module]] = {"edm": EDMPrecond, "vp": VPPrecond, "ve": VEPrecond,
                                                "vpred": VPredPrecond}


def save_denoiser(path: str | Path, denoiser: nn.Module, *, unet: UNetSpec, precond: str,
                  precond_kwargs: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> None:
    """Write ``denoiser``'s weights with the spec that rebuilds it (atomically)."""
    if precond not in PRECONDITIONERS:
        raise ValueError(f"unknown preconditioner {precond!r} (known: {', '.join(PRECONDITIONERS)})")
    blob = {"format": DENOISER_FORMAT, "unet": unet.to_json(), "precond": precond,
            "precond_kwargs": dict(precond_kwargs or {}), "meta": dict(meta or {}),
            "state_dict": {k: v.detach().cpu() for k, v in denoiser.state_dict().items()}}
    with atomic_path(path) as tmp:
        torch.save(blob, tmp)


def read_denoiser_meta(path: str | Path) -> dict[str, Any]:
    """The ``meta`` block of a denoiser file (without building the network)."""
    return _load_blob(path)["meta"]


def load_denoiser(path: str | Path, device: torch.device | str = "cpu") -> nn.Module:
    """Rebuild the denoiser written by :func:`save_denoiser`, in eval mode on ``device``."""
    blob = _load_blob(path)
    cls = PRECONDITIONERS.get(blob["precond"])
    if cls is None:
        raise PipelineError(f"{path}: preconditioner {blob['precond']!r} is not known to this code "
                            f"(known: {', '.join(PRECONDITIONERS)})")
    model = cls(build_unet(UNetSpec.from_json(blob["unet"])), **blob["precond_kwargs"])
    model.load_state_dict(blob["state_dict"])
    return model.to(device).eval()


def _load_blob(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no denoiser file here (run the training stage that writes it first)")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") != DENOISER_FORMAT:
        raise PipelineError(f"{path}: not a {DENOISER_FORMAT} file")
    return blob

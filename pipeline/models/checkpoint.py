"""The trained-denoiser file (``dpgen-denoiser/1``) every sampler loads.

A training stage (public EDM pretraining, DPDM) ends by writing one ``.pt`` file holding
what is needed to rebuild the network without the training code's config:

* ``format``: ``"dpgen-denoiser/1"``
* ``convention``: what the network's forward computes, a key of
  :data:`pipeline.models.denoiser.CONVENTIONS` (``"ve_sigma"`` for every preconditioner,
  ``"rectified_flow_t"`` for a velocity model); files written before this key existed hold a
  preconditioner and are read as ``"ve_sigma"``
* ``backbone``: the kind of network the file rebuilds, a key of :data:`BACKBONES` (``"unet"``,
  ``"diffusers_unet"`` for a public ``UNet2DModel`` of the user's, or ``"sd3_transformer"`` for
  STRAIGHTDP's MM-DiT, which :mod:`pipeline.flow.backbone` registers);
  files written before this key existed hold a UNet and are read as ``"unet"``
* ``<backbone>``: its spec as JSON under the kind's own name (``unet``: the
  :class:`~pipeline.models.unet.UNetSpec`, the key every file had before; ``sd3_transformer``:
  a :class:`pipeline.flow.backbone.FlowSpec`)
* ``precond``: a key of :data:`DENOISERS` (``"edm"``, ..., ``"rectified_flow"``), ``precond_kwargs``
  its arguments; the model is ``DENOISERS[precond](build(spec), **precond_kwargs)``
* ``state_dict``: the weights to sample with (the EMA weights when training kept an EMA)
* ``meta``: free JSON (stage, config_id, seed, steps, data sha256, privacy summary, ...)

The loader checks that the registered class still speaks the recorded convention and, when the
caller names the convention it needs (a VE-sigma sampler, a flow sampler), that the file holds
it: a flow model handed to an EDM sampler fails with one line instead of sampling noise.
A new model kind (e.g. a rectified-flow velocity network) joins with :func:`register_denoiser`,
a new network with :func:`register_backbone` (both at the import of the module defining them:
this module imports nothing above it, so a flow file loads once :mod:`pipeline.flow` is imported).
Resumable *training* checkpoints (optimizer, EMA, RNG state) are a training concern and live
with the training loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.io import atomic_path
from pipeline.models.denoiser import CONVENTIONS, VE_SIGMA
from pipeline.models.precond import PRECONDITIONERS
from pipeline.models.unet import DiffusersUNetSpec, UNetSpec, build_diffusers_unet, build_unet
from pipeline.stage import PipelineError

DENOISER_FORMAT = "dpgen-denoiser/1"

#: name -> class taking ``(unet, **precond_kwargs)`` with a ``convention`` class attribute;
#: the four DPDM preconditioners, plus whatever :func:`register_denoiser` adds.
DENOISERS: dict[str, type[nn.Module]] = dict(PRECONDITIONERS)


@dataclass(frozen=True)
class Backbone:
    """A network a denoiser file can rebuild: its spec class (``to_json`` / ``from_json``) and builder."""

    spec_cls: type
    build: Callable[[Any], nn.Module]


#: backbone kind -> how to rebuild it; ``unet`` (the pipeline's own UNets) and ``diffusers_unet`` (a public
#: ``UNet2DModel`` the user brings, :mod:`pipeline.training.public`) here, ``sd3_transformer`` from
#: :mod:`pipeline.flow.backbone`
BACKBONES: dict[str, Backbone] = {"unet": Backbone(UNetSpec, build_unet),
                                  "diffusers_unet": Backbone(DiffusersUNetSpec, build_diffusers_unet)}
#: the kind of a file written before the ``backbone`` key existed
LEGACY_BACKBONE = "unet"


def register_backbone(kind: str, spec_cls: type, build: Callable[[Any], nn.Module]) -> None:
    """Let files record ``backbone=kind`` with a ``spec_cls`` spec, rebuilt as ``build(spec)``.

    A kind already taken by another spec class, or a spec class already registered under another
    kind, is refused (a file must name exactly one way to rebuild its network).
    """
    taken = BACKBONES.get(kind)
    if taken is not None and taken.spec_cls is not spec_cls:
        raise ValueError(f"backbone kind {kind!r} is already registered to {taken.spec_cls.__name__}")
    other = [k for k, b in BACKBONES.items() if b.spec_cls is spec_cls and k != kind]
    if other:
        raise ValueError(f"{spec_cls.__name__} is already registered as backbone kind {other[0]!r}")
    BACKBONES[kind] = Backbone(spec_cls, build)


def backbone_kind(spec: Any) -> str:
    """The registered kind of a spec object (``"unet"`` for a :class:`UNetSpec`)."""
    for kind, b in BACKBONES.items():
        if type(spec) is b.spec_cls:
            return kind
    raise ValueError(f"no backbone kind is registered for {type(spec).__name__} (known: {', '.join(BACKBONES)})")


def register_denoiser(name: str, cls: type[nn.Module]) -> None:
    """Let files name ``cls`` as ``precond=name`` (it is built as ``cls(unet, **precond_kwargs)``).

    ``cls.convention`` must be a key of :data:`~pipeline.models.denoiser.CONVENTIONS`; a name
    already taken by another class is refused (two classes behind one name would load silently wrong).
    """
    convention = getattr(cls, "convention", None)
    if convention not in CONVENTIONS:
        raise ValueError(f"{cls.__name__}.convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    if DENOISERS.get(name, cls) is not cls:
        raise ValueError(f"denoiser name {name!r} is already registered to {DENOISERS[name].__name__}")
    DENOISERS[name] = cls


def convention_of(cls: type[nn.Module]) -> str:
    """The convention a registered class speaks (``ve_sigma`` unless it says otherwise)."""
    return getattr(cls, "convention", VE_SIGMA)


def save_denoiser(path: str | Path, denoiser: nn.Module, *, unet: UNetSpec | None = None, backbone: Any = None,
                  precond: str, precond_kwargs: dict[str, Any] | None = None,
                  meta: dict[str, Any] | None = None) -> None:
    """Write ``denoiser``'s weights with the spec that rebuilds it and its convention (atomically).

    The spec is ``unet`` (a :class:`UNetSpec`, as every caller before flows) or ``backbone`` (a
    spec of any registered kind, e.g. a ``FlowSpec``); exactly one of the two.
    """
    if (unet is None) == (backbone is None):
        raise ValueError("save_denoiser needs exactly one of unet= (a UNetSpec) or backbone= (a registered spec)")
    spec = unet if unet is not None else backbone
    kind = backbone_kind(spec)
    if precond not in DENOISERS:
        raise ValueError(f"unknown preconditioner {precond!r} (known: {', '.join(DENOISERS)})")
    blob = {"format": DENOISER_FORMAT, "convention": convention_of(DENOISERS[precond]), "backbone": kind,
            kind: spec.to_json(), "precond": precond, "precond_kwargs": dict(precond_kwargs or {}),
            "meta": dict(meta or {}), "state_dict": {k: v.detach().cpu() for k, v in denoiser.state_dict().items()}}
    with atomic_path(path) as tmp:
        torch.save(blob, tmp)


def read_denoiser_meta(path: str | Path) -> dict[str, Any]:
    """The ``meta`` block of a denoiser file (without building the network)."""
    return _load_blob(path)["meta"]


def read_denoiser_convention(path: str | Path) -> str:
    """The convention a denoiser file holds (``ve_sigma`` for files from before the key existed)."""
    return _convention(_load_blob(path))


def read_denoiser_backbone(path: str | Path) -> tuple[str, Any]:
    """The backbone kind a denoiser file holds and its spec (``("unet", UNetSpec)`` for old files)."""
    blob = _load_blob(path)
    kind, b = _backbone(blob, path)
    return kind, b.spec_cls.from_json(blob[kind])


def load_denoiser(path: str | Path, device: torch.device | str = "cpu", *, convention: str | None = None) -> nn.Module:
    """Rebuild the denoiser written by :func:`save_denoiser`, in eval mode on ``device``.

    ``convention``: the one the caller's sampler needs (None accepts any); a file holding another
    is a one-line error.
    """
    blob = _load_blob(path)
    cls = DENOISERS.get(blob["precond"])
    if cls is None:
        raise PipelineError(f"{path}: preconditioner {blob['precond']!r} is not known to this code "
                            f"(known: {', '.join(DENOISERS)})")
    stored = _convention(blob)
    if stored != convention_of(cls):
        raise PipelineError(f"{path}: holds a {stored} model but {blob['precond']!r} "
                            f"({cls.__name__}) speaks {convention_of(cls)}")
    if convention is not None and stored != convention:
        raise PipelineError(f"{path}: holds a {stored} model ({CONVENTIONS[stored]}); this needs {convention}")
    kind, backbone = _backbone(blob, path)
    model = cls(backbone.build(backbone.spec_cls.from_json(blob[kind])), **blob["precond_kwargs"])
    model.load_state_dict(blob["state_dict"])
    return model.to(device).eval()


def _backbone(blob: dict[str, Any], path: str | Path) -> tuple[str, Backbone]:
    # files written before the key existed hold a UNet under "unet"
    kind = blob.get("backbone", LEGACY_BACKBONE)
    if kind not in BACKBONES:
        raise PipelineError(f"{path}: backbone {kind!r} is not known to this code (known: {', '.join(BACKBONES)}; "
                            "flow backbones register when pipeline.flow is imported)")
    if kind not in blob:
        raise PipelineError(f"{path}: names backbone {kind!r} but holds no {kind!r} spec")
    return kind, BACKBONES[kind]


def _convention(blob: dict[str, Any]) -> str:
    # files written before the key existed hold one of the preconditioners, all VE sigma
    stored = blob.get("convention", VE_SIGMA)
    if stored not in CONVENTIONS:
        raise PipelineError(f"denoiser file: unknown convention {stored!r} (known: {', '.join(CONVENTIONS)})")
    return stored


def _load_blob(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no denoiser file here (run the training stage that writes it first)")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") != DENOISER_FORMAT:
        raise PipelineError(f"{path}: not a {DENOISER_FORMAT} file")
    return blob

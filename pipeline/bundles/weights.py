"""A trained denoiser's weights as safetensors, in the layout diffusers' ``from_pretrained`` reads.

The house's model file (``dpgen-denoiser/1``, :mod:`pipeline.models.checkpoint`) is a torch pickle: the
right format for the pipeline's own jobs, the wrong one to hand a stranger (unpickling runs code). A bundle
holds the same network as

* ``weights/<name>/``: every diffusers model inside the denoiser (a ``UNet2DModel`` at ``unet``, a rectified
  flow's ``SD3Transformer2DModel`` at ``net.transformer``), written by its ``save_pretrained``
  (``config.json`` + ``diffusion_pytorch_model.safetensors``), so ``UNet2DModel.from_pretrained(path,
  local_files_only=True)`` loads it without this code;
* ``weights/house.safetensors``: every other tensor (e.g. a flow's label tables), if any;
* ``weights/denoiser.json``: what rebuilds the whole denoiser here: its convention, backbone kind and spec,
  preconditioner and its arguments, and the training stage's ``meta``.

Loading reads safetensors only (no pickle is ever opened) and rebuilds the network from the JSON, the way
:func:`pipeline.models.checkpoint.load_denoiser` does; the state dict must match key for key.

A model file of another kind (a method's own, e.g. a generator already written as safetensors) is exported by the
function its method declares for its suffix (:attr:`pipeline.plugins.Method.bundle_exports`), which writes it
under ``weights/`` with ``weights/generator.json`` (its format, file and ``meta``: architecture and training facts).

A latent flow decodes with a public autoencoder (:mod:`pipeline.flow.autoencoder`, a house torch
module, not a diffusers one): :func:`export_autoencoder` writes it as ``autoencoder.safetensors`` with
``autoencoder.json`` (its shape and training facts), :func:`load_autoencoder` rebuilds it from those two alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.models.checkpoint import BACKBONES, DENOISERS, _load_blob, convention_of
from pipeline.stage import PipelineError

WEIGHTS_FORMAT = "dpgen-bundle-denoiser/1"
#: the description a method's own export writes beside its weights (format, file, meta)
GENERATOR_DESCRIPTION = "generator.json"
#: the file of the tensors outside every diffusers model
HOUSE_TENSORS = "house.safetensors"


def _register_flows() -> None:
    # the MM-DiT backbone and the rectified-flow velocity register on import (pipeline.flow.backbone)
    import pipeline.flow.backbone  # noqa: F401


def diffusers_parts(model: nn.Module) -> dict[str, nn.Module]:
    """Dotted name -> the outermost diffusers models inside ``model`` (none nested in another)."""
    from diffusers import ModelMixin

    parts: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if name and isinstance(module, ModelMixin) and not any(name.startswith(p + ".") for p in parts):
            parts[name] = module
    return parts


def export_weights(model_file: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Write the denoiser of a ``dpgen-denoiser/1`` file as safetensors under ``out_dir`` (a model file of another
    suffix: the export its method declares, :func:`pipeline.plugins.bundle_exports`); returns the description written
    beside it (denoiser.json / generator.json)."""
    from safetensors.torch import save_file

    from pipeline.plugins import bundle_exports, resolve

    suffix = Path(model_file).suffix
    if suffix != ".pt" and suffix in (declared := bundle_exports()):
        return resolve(declared[suffix])(Path(model_file), Path(out_dir))

    _register_flows()
    blob = _load_blob(model_file)
    kind = blob.get("backbone", "unet")
    if kind not in BACKBONES or blob.get("precond") not in DENOISERS:
        raise PipelineError(f"{model_file}: backbone {kind!r} / preconditioner {blob.get('precond')!r} unknown")
    backbone = BACKBONES[kind]
    model = DENOISERS[blob["precond"]](backbone.build(backbone.spec_cls.from_json(blob[kind])),
                                       **blob["precond_kwargs"])
    model.load_state_dict(blob["state_dict"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = diffusers_parts(model)
    for name, part in parts.items():
        part.save_pretrained(out_dir / name, safe_serialization=True)
    covered = tuple(f"{name}." for name in parts)
    rest = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if not k.startswith(covered)}
    if rest:
        save_file(rest, str(out_dir / HOUSE_TENSORS))
    spec = {"format": WEIGHTS_FORMAT, "convention": blob.get("convention", convention_of(DENOISERS[blob["precond"]])),
            "backbone": kind, "spec": blob[kind], "precond": blob["precond"],
            "precond_kwargs": blob["precond_kwargs"], "diffusers": sorted(parts),
            "house_tensors": HOUSE_TENSORS if rest else None, "meta": blob["meta"]}
    (out_dir / "denoiser.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return spec


def weights_meta(weights_dir: str | Path) -> dict[str, Any]:
    """The training facts of a bundle's weights (a denoiser's, or those a method's own export describes)."""
    weights_dir = Path(weights_dir)
    described = weights_dir / GENERATOR_DESCRIPTION
    if described.is_file():  # written at export from the generator file's own metadata (both are hashed)
        return json.loads(described.read_text())["meta"]
    return read_weights_spec(weights_dir)["meta"]


def _read_described(path: Path, fmt: str) -> dict[str, Any]:
    """A bundle's JSON description of its weights (denoiser.json, autoencoder.json), checked for its format."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(spec, dict) or spec.get("format") != fmt:
        raise PipelineError(f"{path}: not a {fmt} file")
    return spec


def read_weights_spec(weights_dir: str | Path) -> dict[str, Any]:
    """denoiser.json of a bundle's weights, checked for its format."""
    return _read_described(Path(weights_dir) / "denoiser.json", WEIGHTS_FORMAT)


def _safetensors_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))  # one file, or the shards of a large model (disjoint keys)
    if not files:
        raise PipelineError(f"{folder}: no .safetensors weights (bundles hold no pickled weights)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_weights(weights_dir: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a bundle's denoiser from safetensors alone, in eval mode on ``device``; returns it and its spec."""
    _register_flows()
    weights_dir = Path(weights_dir)
    spec = read_weights_spec(weights_dir)
    kind, precond = spec["backbone"], spec["precond"]
    if kind not in BACKBONES or precond not in DENOISERS:
        raise PipelineError(f"{weights_dir}: backbone {kind!r} / preconditioner {precond!r} unknown to this code")
    backbone = BACKBONES[kind]
    model = DENOISERS[precond](backbone.build(backbone.spec_cls.from_json(spec["spec"])), **spec["precond_kwargs"])
    state: dict[str, torch.Tensor] = {}
    for name in spec["diffusers"]:
        state.update({f"{name}.{k}": v for k, v in _safetensors_of(weights_dir / name).items()})
    if spec.get("house_tensors"):
        from safetensors.torch import load_file

        state.update(load_file(str(weights_dir / spec["house_tensors"])))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise PipelineError(f"{weights_dir}: the weights do not fit the network denoiser.json describes ({first})") \
            from None
    return model.to(device).eval(), spec


AUTOENCODER_FILE = "autoencoder.safetensors"
AUTOENCODER_FORMAT = "dpgen-bundle-autoencoder/1"


def export_autoencoder(model_file: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Write the public autoencoder of a ``dpgen-autoencoder/1`` file (read ``weights_only``) as safetensors under
    ``out_dir``; returns the description written beside it (autoencoder.json)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    from pipeline.flow import autoencoder

    blob = autoencoder.load_blob(model_file)
    model = autoencoder.from_blob(blob)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()},
              str(out_dir / AUTOENCODER_FILE))
    spec = {"format": AUTOENCODER_FORMAT, "file": AUTOENCODER_FILE, "spec": asdict(model.spec),
            "meta": dict(blob.get("meta") or {})}
    (out_dir / "autoencoder.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return spec


def load_autoencoder(folder: str | Path) -> nn.Module:
    """The frozen autoencoder of a bundle, from ``autoencoder.json`` and its safetensors alone."""
    from safetensors.torch import load_file

    from pipeline.flow.autoencoder import AutoencoderSpec, ConvAutoencoder

    folder = Path(folder)
    spec = _read_described(folder / "autoencoder.json", AUTOENCODER_FORMAT)
    model = ConvAutoencoder(AutoencoderSpec(**spec["spec"]))
    try:
        model.load_state_dict(load_file(str(folder / spec["file"])), strict=True)
    except RuntimeError as exc:
        raise PipelineError(f"{folder}: the autoencoder's weights do not fit autoencoder.json "
                            f"({str(exc).splitlines()[0]})") from None
    return model.eval().requires_grad_(False)

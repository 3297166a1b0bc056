"""Stage ``import_public``: the public denoiser the user brings, a local diffusers ``UNet2DModel`` folder.

The papers start from public pretrained networks (EMPDEN Sec. 5 hands off to an ImageNet-pretrained
EDM denoiser for CIFAR-10 and an FFHQ one for CelebA-64). With ``pretrain.source: diffusers`` and
``pretrain.path`` the rule ``import_public`` takes the place of ``pretrain_public``: the folder (what
``save_pretrained`` writes, ``config.json`` and the weights) is loaded with
``UNet2DModel.from_pretrained(path, local_files_only=True)`` (nothing is downloaded), wrapped in the
preconditioning the config declares (``pretrain.precond``, a key of
:data:`pipeline.models.precond.PRECONDITIONERS`; EDM with ``pretrain.sigma_data`` when absent) and
written as the same ``dpgen-denoiser/1`` file every consumer reads (EMPDEN's hybrid sampler, DPDM's
``init: public``, the diagnostics, Private Evolution), with the ``diffusers_unet`` backbone
(:class:`pipeline.models.unet.DiffusersUNetSpec`, diffusers' whole config).

What is checked, and when (each a one-line error naming the key):

* before any job is scheduled (:func:`pipeline.inputs.check_inputs_exist`, torch-free, reading
  ``config.json`` only): the folder, its ``config.json``, the class (``UNet2DModel``), its
  resolution and its input/output channels against the data's;
* by the stage, which reads the public split: the label count. A class-conditional model must
  have ``num_class_embeds`` = public classes + 1, the null label last (the classifier-free guidance
  convention of :class:`pipeline.models.unet.UNetSpec`, which EMPDEN's unconditional question and
  DPDM's guidance rely on); an unconditional one has none.

The folder's content hash (:func:`folder_sha256`, over every file) goes into the stage's params, so
into its config id and into the params of every run that reads the denoiser
(:meth:`pipeline.wiring.House.public_model`): a changed model reruns them, and the denoiser file's
``meta`` records it. The stage hashes the folder again before loading it and refuses a folder that
changed since the DAG was planned. No private record is read: no ledger line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.io import write_json
from pipeline.stage import PipelineError, reject_unknown_params, stage

log = logging.getLogger(__name__)

STAGE = "import_public"
#: the diffusers class a public denoiser folder must hold
UNET_CLASS = "UNet2DModel"
#: the preconditioning of a model whose config declares none (EMPDEN's own public denoiser is EDM's)
DEFAULT_PRECOND = "edm"
#: where the config names the folder
PATH_KEY = "pretrain.path"


def resolve_folder(path: str | os.PathLike[str] | None, *, where: str = PATH_KEY,
                   expected_class: str = UNET_CLASS) -> Path:
    """The model folder of ``path`` (``~`` expanded), or a one-line error naming ``where`` (``<section>.path``)."""
    if not path:
        section = where.rpartition(".")[0]
        raise PipelineError(f"config error at {where}: {section}.source diffusers needs the path of a local diffusers "
                            "model folder (what save_pretrained writes: config.json and the weights)")
    folder = Path(os.path.expanduser(str(path)))
    if not folder.is_dir():
        raise PipelineError(f"config error at {where}: {folder} is not a folder: expected a local diffusers "
                            f"{expected_class} folder (config.json and diffusion_pytorch_model.safetensors); nothing "
                            "is downloaded")
    return folder


def read_model_config(folder: Path, *, where: str = PATH_KEY, expected_class: str = UNET_CLASS) -> dict[str, Any]:
    """The diffusers ``config.json`` of ``folder``, checked to describe an ``expected_class``."""
    path = folder / "config.json"
    if not path.is_file():
        raise PipelineError(f"config error at {where}: {folder} has no config.json: expected a diffusers model folder "
                            "written by save_pretrained")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"config error at {where}: {path} is not readable JSON ({exc})") from None
    found = config.get("_class_name") if isinstance(config, dict) else None
    if found != expected_class:
        raise PipelineError(f"config error at {where}: {folder} holds a {found or 'model of no declared class'}, "
                            f"expected a diffusers {expected_class}")
    return config


def sample_size(config: Mapping[str, Any]) -> int:
    """The square resolution of a ``UNet2DModel`` config (``sample_size`` is an int or an (h, w) pair)."""
    size = config.get("sample_size")
    if isinstance(size, (list, tuple)):
        if len(size) != 2 or size[0] != size[1]:
            return -1
        size = size[0]
    return int(size) if isinstance(size, int) else -1


def check_shape(config: Mapping[str, Any], *, image_size: int, channels: int, folder: Path,
                where: str = PATH_KEY) -> None:
    """The model denoises images of the data's resolution and channel count (in and out)."""
    size = sample_size(config)
    if size != image_size:
        raise PipelineError(f"config error at {where}: {folder} is a {config.get('sample_size')}-pixel model, the data "
                            f"are {image_size}x{image_size} (data.image_size)")
    found = (config.get("in_channels"), config.get("out_channels"))
    if found != (channels, channels):
        raise PipelineError(f"config error at {where}: {folder} maps {found[0]} to {found[1]} channels, the data have "
                            f"{channels}")


def check_labels(config: Mapping[str, Any], *, n_classes: int, folder: Path, where: str = PATH_KEY) -> None:
    """A class-conditional model has one label per public class plus the null label (last); or it has none."""
    n_embeds = config.get("num_class_embeds")
    if n_embeds is not None and n_embeds != n_classes + 1:
        raise PipelineError(f"config error at {where}: {folder} has {n_embeds} class embeddings, expected "
                            f"{n_classes + 1} (the public set's {n_classes} classes and the null label last) or none "
                            "(an unconditional model)")


def check_folder(path: str | os.PathLike[str] | None, *, image_size: int, channels: int) -> Path:
    """Everything :func:`import_public` can check from the config alone (torch-free: run before any job)."""
    folder = resolve_folder(path)
    check_shape(read_model_config(folder), image_size=image_size, channels=channels, folder=folder)
    return folder


def folder_sha256(folder: Path) -> str:
    """sha256 over every file of ``folder`` (relative path and content, in sorted order).

    Memoised per process on each file's (size, mtime): Snakemake evaluates a rule's params several
    times while planning, and a paper-scale model is gigabytes.
    """
    stats = ((p, p.stat()) for p in folder.rglob("*") if p.is_file())
    listing = tuple(sorted((str(p.relative_to(folder)), st.st_size, st.st_mtime_ns) for p, st in stats))
    return _hash_listing(str(folder), listing)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of one file's bytes (``~`` expanded), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(os.path.expanduser(str(path)), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def _hash_listing(folder: str, listing: tuple[tuple[str, int, int], ...]) -> str:
    key = (folder, listing)
    if key not in _HASHES:
        outer = hashlib.sha256()
        for rel, _, _ in listing:
            outer.update(f"{rel}\0{file_sha256(Path(folder) / rel)}\n".encode())
        _HASHES[key] = outer.hexdigest()
    return _HASHES[key]


def precond_of(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The declared preconditioning (name, kwargs): EDM takes ``pretrain.sigma_data``, the others their defaults."""
    name = cfg.get("precond") or DEFAULT_PRECOND
    return name, ({"sigma_data": float(cfg["sigma_data"])} if name == "edm" else {})


PARAMS_DOC = {
    "pretrain": "the `pretrain` config section (source diffusers, path, precond, sigma_data)",
    "public_model": "{source, sha256} of the folder as the DAG was planned (pipeline.wiring.House.public_model)",
    "config_id": "id of the configuration (recorded in the model's meta)",
}


@stage(STAGE, inputs=("public",), outputs=("model", "metrics"), params=PARAMS_DOC)
def import_public(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Load the user's diffusers ``UNet2DModel`` (local files only) and write it as the public denoiser file."""
    from diffusers import UNet2DModel

    from pipeline.models.checkpoint import DENOISERS, save_denoiser
    from pipeline.models.unet import DiffusersUNetSpec
    from pipeline.training.data import load_training_split

    reject_unknown_params(STAGE, params, PARAMS_DOC)
    cfg = dict(params["pretrain"])
    folder = resolve_folder(cfg.get("path"))
    config = read_model_config(folder)
    split, data_sha = load_training_split(inputs["public"], "public")
    _, channels, height, _ = split.images.shape  # [N, C, H, W], square (the data stage's layout)
    check_shape(config, image_size=int(height), channels=int(channels), folder=folder)
    n_classes = int(split.labels.max()) + 1  # as pretrain_public counts them (pipeline.training.data.unet_spec_for)
    check_labels(config, n_classes=n_classes, folder=folder)
    sha = folder_sha256(folder)
    planned = (params.get("public_model") or {}).get("sha256")
    if planned is not None and planned != sha:
        raise PipelineError(f"{PATH_KEY}: {folder} changed since the DAG was planned (sha256 {sha[:12]}, planned "
                            f"{planned[:12]}): run Snakemake again")
    precond, precond_kwargs = precond_of(cfg)
    if precond not in DENOISERS:
        raise PipelineError(f"config error at pretrain.precond: unknown {precond!r} (known: {', '.join(DENOISERS)})")
    try:
        unet = UNet2DModel.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:  # missing/corrupt weights, or weights of another shape
        raise PipelineError(f"config error at {PATH_KEY}: diffusers cannot load {folder}: "
                            f"{str(exc).splitlines()[0]}") from None
    model = DENOISERS[precond](unet, **precond_kwargs)
    n_parameters = sum(p.numel() for p in unet.parameters())
    meta = {"stage": STAGE, "source": "diffusers", "path": str(folder), "sha256": sha, "diffusers_class": UNET_CLASS,
            "config_id": str(params.get("config_id", "unknown")), "precond": precond, "data": "public",
            "data_sha256": data_sha, "n_public_classes": n_classes, "weights": "as given", "private": False}
    # the architecture only, as plain JSON (the loaded config also names the local folder, as a Path)
    architecture = {k: v for k, v in json.loads(json.dumps(dict(unet.config), default=str)).items()
                    if k != "_name_or_path"}
    save_denoiser(outputs["model"], model, backbone=DiffusersUNetSpec(architecture), precond=precond,
                  precond_kwargs=precond_kwargs, meta=meta)
    log.info("%s: %s (%s, %d parameters, sha256 %s) as a %s denoiser", STAGE, folder, UNET_CLASS, n_parameters,
             sha[:12], precond)
    write_json(outputs["metrics"], {"format": "dpgen-train-metrics/1", "stage": STAGE, "source": "diffusers",
                                    "path": str(folder), "sha256": sha, "precond": precond,
                                    "n_parameters": n_parameters, "data_sha256": data_sha})


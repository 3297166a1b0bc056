"""Stage ``import_straightdp``: STRAIGHTDP's public flow from the user's diffusers ``SD3Transformer2DModel`` folder.

STRAIGHTDP Table 3 starts from a frozen public prior (SD3-medium, Sec. 4: "DP-LoRA fine-tuning of the frozen
2B-parameter SD3-medium"), and any user may have a flow pretrained elsewhere. With
``straightdp.pretrain.source: diffusers`` the rule ``import_straightdp`` takes the place of ``pretrain_straightdp``
for the main configuration: the transformer folder (what ``save_pretrained`` writes) is loaded with
``SD3Transformer2DModel.from_pretrained(path, local_files_only=True)`` (nothing is downloaded) and written as the
same ``dpgen-denoiser/1`` flow file every reader uses (Table 1's rows, Table 3's DP-LoRA rows on it, the public
guidance row, the MIA audit), with the :class:`~pipeline.flow.backbone.FlowSpec` read off the folder's config.

The label tables. The MM-DiT here is conditioned on a class through two tables
(:class:`~pipeline.flow.backbone.MMDiTBackbone`): caption tokens ``[K + 1, L, joint_attention_dim]`` and a pooled
vector ``[K + 1, pooled_projection_dim]``, row K the null (empty) caption. For SD3 these are its frozen text
encoders' outputs for each class's caption (the paper's "caption encoded by a frozen public text encoder", Sec. 2):
the user computes them once, offline, and names the file at ``straightdp.pretrain.label_embeddings`` (safetensors,
tensors ``caption`` and ``pooled``; :func:`save_label_embeddings`). K is the declared number of private classes
(public knowledge: the class names).

The prediction. A flow trained here outputs the velocity z - xi; SD3 regresses xi - z (Esser et al. 2024).
``straightdp.pretrain.prediction`` declares which the folder's network outputs (absent: SD3's ``noise_minus_data``);
:class:`~pipeline.flow.backbone.RectifiedFlowVelocity` negates it so every consumer sees z - xi, and the file records
it, so a fine-tuned or merged copy keeps it.

Arms (``straightdp.arms``) still pretrain their own flows: Sec. 3.3's constraints act from pretraining on, "which a
frozen checkpoint forecloses" (Sec. 4). What is checked, and when (each a one-line error naming the key): before any
job (:func:`check_public_flow`, reading ``config.json`` and the safetensors header only) the folder, its class, its
channels against the flow's data, the patch grid against the positional table, the label file's tensors and their
shapes; when the stage runs, the weights load and the folder has not changed since the DAG was planned. Both
files' sha256 are in the params of the stage and of every main-configuration run that reads the flow
(:meth:`pipeline.methods.straightdp.wiring.Wiring.public_model`). No private record is read: no ledger line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.flow.backbone import FLOW_PRECOND, PREDICTIONS, FlowSpec, RectifiedFlowVelocity, build_backbone
from pipeline.io import atomic_path
from pipeline.stage import PipelineError, reject_unknown_params, stage
from pipeline.training.public import file_sha256, folder_sha256, read_model_config, resolve_folder

log = logging.getLogger(__name__)

STAGE = "import_straightdp"
#: the diffusers class a public flow folder must hold
TRANSFORMER_CLASS = "SD3Transformer2DModel"
#: where the config names the folder and the label tables
PATH_KEY = "straightdp.pretrain.path"
EMBEDDINGS_KEY = "straightdp.pretrain.label_embeddings"
#: an imported network's output, unless straightdp.pretrain.prediction says otherwise: SD3's
IMPORT_PREDICTION = "noise_minus_data"
#: the tensors of a label-embedding file
CAPTION, POOLED = "caption", "pooled"


# --------------------------------------------------------------------------- checks (torch-free but for the imports)

def check_transformer(config: Mapping[str, Any], *, shape: tuple[int, int, int], folder: Path) -> None:
    """The network maps the flow's ``shape`` = (channels, side, side) to itself: channels in and out, a side the
    patch divides, a patch grid within the positional table (SD3 crops its table to the input's grid)."""
    channels, side, _ = shape
    found = (config.get("in_channels"), config.get("out_channels"))
    if found != (channels, channels):
        raise PipelineError(f"config error at {PATH_KEY}: {folder} maps {found[0]} to {found[1]} channels, the flow's "
                            f"data have {channels}")
    patch, table = config.get("patch_size"), config.get("pos_embed_max_size")
    if not isinstance(patch, int) or side % patch:
        raise PipelineError(f"config error at {PATH_KEY}: {folder} has patch size {patch}, which does not divide the "
                            f"flow's {side}x{side} inputs")
    if not isinstance(table, int):
        raise PipelineError(f"config error at {PATH_KEY}: {folder} has no pos_embed_max_size (every SD3 checkpoint "
                            "sets it): expected an SD3 positional table the input grid is cropped from")
    if side // patch > table:
        raise PipelineError(f"config error at {PATH_KEY}: {folder}'s positional table is {table} patches wide, the "
                            f"flow's {side}x{side} inputs are {side // patch} patches of {patch}")


def embedding_shapes(path: str | os.PathLike[str] | None) -> dict[str, list[int]]:
    """The shapes of the ``caption`` and ``pooled`` tensors of the label file at ``path`` (header only)."""
    from safetensors import SafetensorError, safe_open

    if not path:
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: straightdp.pretrain.source diffusers needs the label "
                            "embeddings (a safetensors file of tensors caption [K+1, L, D] and pooled [K+1, P], row K "
                            "the null caption)")
    file = Path(os.path.expanduser(str(path)))
    if not file.is_file():
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: {file} is not a file: expected a safetensors file of "
                            "tensors caption and pooled")
    try:
        with safe_open(str(file), framework="numpy") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: {file} is not a safetensors file ({exc})") from None
    missing = [k for k in (CAPTION, POOLED) if k not in shapes]
    if missing:
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: {file} has no tensor {missing[0]!r} (found: "
                            f"{', '.join(shapes) or 'none'})")
    return {k: shapes[k] for k in (CAPTION, POOLED)}


def check_embeddings(shapes: Mapping[str, list[int]], *, config: Mapping[str, Any], n_classes: int,
                     path: str | os.PathLike[str]) -> None:
    """caption ``[K+1, L, joint_attention_dim]`` and pooled ``[K+1, pooled_projection_dim]``, K = ``n_classes``."""
    caption, pooled = shapes[CAPTION], shapes[POOLED]
    rows = n_classes + 1
    if len(caption) != 3 or caption[0] != rows or caption[2] != config.get("joint_attention_dim"):
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: {path} has caption {caption}, expected [{rows}, L, "
                            f"{config.get('joint_attention_dim')}] (the {n_classes} declared classes and the null "
                            "caption last, the transformer's joint_attention_dim)")
    if pooled != [rows, config.get("pooled_projection_dim")]:
        raise PipelineError(f"config error at {EMBEDDINGS_KEY}: {path} has pooled {pooled}, expected [{rows}, "
                            f"{config.get('pooled_projection_dim')}] (the transformer's pooled_projection_dim)")


def check_public_flow(pretrain: Mapping[str, Any], *, shape: tuple[int, int, int], n_classes: int
                      ) -> tuple[Path, dict[str, Any]]:
    """Everything :func:`import_straightdp` can check from the config alone (run before any job is scheduled); the
    folder and its diffusers config."""
    folder = resolve_folder(pretrain.get("path"), where=PATH_KEY, expected_class=TRANSFORMER_CLASS)
    config = read_model_config(folder, where=PATH_KEY, expected_class=TRANSFORMER_CLASS)
    check_transformer(config, shape=shape, folder=folder)
    check_embeddings(embedding_shapes(pretrain.get("label_embeddings")), config=config, n_classes=n_classes,
                     path=pretrain["label_embeddings"])
    prediction = pretrain.get("prediction") or IMPORT_PREDICTION
    if prediction not in PREDICTIONS:
        raise PipelineError(f"config error at straightdp.pretrain.prediction: {prediction!r} (known: "
                            f"{', '.join(PREDICTIONS)})")
    return folder, config


def public_model(pretrain: Mapping[str, Any]) -> dict[str, str]:
    """``{source, sha256, label_embeddings_sha256}`` of the configured folder and label file (into config ids)."""
    folder = resolve_folder(pretrain.get("path"), where=PATH_KEY, expected_class=TRANSFORMER_CLASS)
    embeddings = Path(os.path.expanduser(str(pretrain.get("label_embeddings") or "")))
    if not embeddings.is_file():
        embedding_shapes(pretrain.get("label_embeddings"))  # its one-line error
    return {"source": "diffusers", "sha256": folder_sha256(folder), "label_embeddings_sha256": file_sha256(embeddings)}


# --------------------------------------------------------------------------- the spec and the model

def spec_of(config: Mapping[str, Any], *, shape: tuple[int, int, int], caption_tokens: int,
            n_classes: int) -> FlowSpec:
    """The :class:`FlowSpec` of an ``SD3Transformer2DModel`` config run on inputs of ``shape`` (no constraint)."""
    channels, side, _ = shape
    try:
        return FlowSpec(image_size=side, channels=channels, patch_size=int(config["patch_size"]),
                        num_layers=int(config["num_layers"]), attention_head_dim=int(config["attention_head_dim"]),
                        num_attention_heads=int(config["num_attention_heads"]),
                        joint_attention_dim=int(config["joint_attention_dim"]),
                        caption_projection_dim=int(config["caption_projection_dim"]),
                        pooled_projection_dim=int(config["pooled_projection_dim"]),
                        pos_embed_max_size=int(config["pos_embed_max_size"]), caption_tokens=caption_tokens,
                        num_classes=n_classes, qk_norm=config.get("qk_norm"),
                        dual_attention_layers=tuple(config.get("dual_attention_layers") or ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"config error at {PATH_KEY}: its config.json is not an SD3 transformer this pipeline "
                            f"can run ({exc})") from None


def load_public_flow(pretrain: Mapping[str, Any], *, shape: tuple[int, int, int],
                     n_classes: int) -> tuple[RectifiedFlowVelocity, FlowSpec]:
    """The user's transformer and label tables as a class-conditional velocity v(x, t, y) (local files only)."""
    from diffusers import SD3Transformer2DModel
    from safetensors.torch import load_file

    folder, config = check_public_flow(pretrain, shape=shape, n_classes=n_classes)
    tables = load_file(os.path.expanduser(str(pretrain["label_embeddings"])))
    caption, pooled = tables[CAPTION].float(), tables[POOLED].float()
    spec = spec_of(config, shape=shape, caption_tokens=int(caption.shape[1]), n_classes=n_classes)
    try:
        transformer = SD3Transformer2DModel.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:  # missing/corrupt weights, or weights of another shape
        raise PipelineError(f"config error at {PATH_KEY}: diffusers cannot load {folder}: "
                            f"{str(exc).splitlines()[0]}") from None
    net = build_backbone(spec)
    net.transformer.load_state_dict(transformer.state_dict())  # the same architecture: every tensor, strictly
    with torch.no_grad():
        net.caption.weight.copy_(caption.reshape(caption.shape[0], -1))
        net.pooled.weight.copy_(pooled)
    prediction = pretrain.get("prediction") or IMPORT_PREDICTION
    return RectifiedFlowVelocity(net, prediction=prediction), spec


def save_label_embeddings(path: str | os.PathLike[str], caption: torch.Tensor, pooled: torch.Tensor) -> None:
    """Write the label file :func:`import_straightdp` reads: ``caption [K+1, L, D]``, ``pooled [K+1, P]``, row K the
    null caption (for SD3: its text encoders' outputs for each class's caption, then for the empty one)."""
    from safetensors.torch import save_file

    if caption.ndim != 3 or pooled.ndim != 2 or caption.shape[0] != pooled.shape[0]:
        raise ValueError(f"label embeddings: expected caption [K+1, L, D] and pooled [K+1, P], got "
                         f"{list(caption.shape)} and {list(pooled.shape)}")
    with atomic_path(path, suffix=".safetensors") as tmp:
        save_file({CAPTION: caption.contiguous().float().cpu(), POOLED: pooled.contiguous().float().cpu()}, str(tmp))


# --------------------------------------------------------------------------- the stage

PARAMS_DOC = {
    "straightdp": "the straightdp section (its pretrain: source diffusers, path, label_embeddings, prediction)",
    "public_model": "{source, sha256, label_embeddings_sha256} as the DAG was planned (Wiring.public_model)",
    "n_classes": "the declared number of private classes (the label tables' rows less the null one)",
    "config_id": "id of the configuration (recorded in the model's meta)",
}


@stage(STAGE, inputs=("public",), outputs=("model",), params=PARAMS_DOC)
def import_straightdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Load the user's ``SD3Transformer2DModel`` and label tables and write them as STRAIGHTDP's public flow."""
    from pipeline.models.checkpoint import save_denoiser
    from pipeline.training.data import load_training_split

    reject_unknown_params(STAGE, params, PARAMS_DOC)
    pretrain = dict((params.get("straightdp") or {}).get("pretrain") or {})
    if pretrain.get("source") != "diffusers":
        raise PipelineError(f"stage {STAGE}: straightdp.pretrain.source is {pretrain.get('source')!r}, expected "
                            "diffusers (rule pretrain_straightdp trains the flow otherwise)")
    try:
        n_classes = int(params["n_classes"])
    except KeyError:
        raise PipelineError(f"stage {STAGE}: param n_classes (the declared private classes) is required") from None
    public, data_sha = load_training_split(inputs["public"], "public")
    _, channels, side, _ = public.images.shape  # the flow's space: the images, or the latent variant's codes
    shape = (int(channels), int(side), int(side))
    planned = dict(params.get("public_model") or {})
    found = public_model(pretrain)
    for key in ("sha256", "label_embeddings_sha256"):
        if planned.get(key) is not None and planned[key] != found[key]:
            raise PipelineError(f"{PATH_KEY}: the public flow's files changed since the DAG was planned ({key} "
                                f"{found[key][:12]}, planned {planned[key][:12]}): run Snakemake again")
    model, spec = load_public_flow(pretrain, shape=shape, n_classes=n_classes)
    n_parameters = sum(p.numel() for p in model.parameters())
    meta = {"stage": STAGE, "source": "diffusers", "path": str(pretrain["path"]), **found,
            "label_embeddings": str(pretrain["label_embeddings"]), "diffusers_class": TRANSFORMER_CLASS,
            "prediction": model.prediction, "config_id": str(params.get("config_id", "unknown")),
            "public_sha256": data_sha, "n_parameters": n_parameters, "weights": "as given", "private": False}
    save_denoiser(outputs["model"], model, backbone=spec, precond=FLOW_PRECOND, precond_kwargs=model.precond_kwargs(),
                  meta=meta)
    log.info("%s: %s (%s, %d parameters, sha256 %s, %s) as the public flow on %s inputs", STAGE, pretrain["path"],
             TRANSFORMER_CLASS, n_parameters, found["sha256"][:12], model.prediction, "x".join(map(str, shape)))

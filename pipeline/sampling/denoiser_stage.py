"""Stage ``sample_dpdm``: labelled samples of a trained denoiser file, as a split the evaluation scores.

Loads any ``dpgen-denoiser/1`` file (a DPDM run, the public EDM model, ...), generates
``n_samples`` images with balanced class labels using one sampler of :mod:`pipeline.sampling.samplers`
(DPDM Sec. 5 / App. F.4.3: deterministic DDIM, stochastic DDIM, EDM churn; guidance scale w), and
writes them in the split format (uint8 ``[N, C, H, W]``, int64 labels) that ``evaluate_samples``
reads. Sampling a DP-trained model is post-processing: it adds no privacy cost and writes no
ledger line; the manifest carries the denoiser's ``meta`` (with its privacy summary) forward.

Optional output ``figure``: a grid of ``per_class`` samples for each class (PNG + PDF).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.config import schema_defaults
from pipeline.device import resolve_device
from pipeline.io import Split, load_split, save_split
from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta
from pipeline.models.denoiser import VE_SIGMA
from pipeline.models.precision import PARAM_DOC as PRECISION_DOC
from pipeline.models.precision import autocast, precision_of, recorded
from pipeline.sampling.samplers import SamplerConfig, generate, to_uint8
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)


def denoiser_num_classes(denoiser: nn.Module) -> int:
    """Classes of a denoiser's UNet: its class embedding has ``num_classes + 1`` rows (the +1 is 'no class')."""
    unet = getattr(denoiser, "unet", None)
    config = getattr(unet, "config", None)
    if config is None:
        raise PipelineError(f"{type(denoiser).__name__} has no diffusers UNet at .unet: cannot read its classes")
    embeds = config.get("num_class_embeds") if hasattr(config, "get") else getattr(config, "num_class_embeds", None)
    return int(embeds) - 1 if embeds else 0


def denoiser_image_shape(denoiser: nn.Module) -> tuple[int, int, int]:
    """[C, H, W] the denoiser's UNet generates."""
    config = denoiser.unet.config
    size = config["sample_size"]
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(config["in_channels"]), int(h), int(w)


@stage(
    "sample_dpdm",
    inputs=("denoiser",),
    outputs=("samples",),
    optional_outputs=("figure",),
    params={
        "sampler": "SamplerConfig as JSON: name (ddim|stochastic_ddim|edm), steps, sigma_min, sigma_max, rho, grid "
                   "(edm|vp), eta, S_churn, S_min, S_max (null = inf), S_noise, churn_limit, guidance",
        "n_samples": "number of images (labels balanced over the denoiser's classes; default: the schema's "
                     "dpdm.sampling.n_samples)",
        "seed": "generation seed (latents and sampler noise)",
        "batch_size": "images generated at once (with the seed it fixes the output; default: dpdm.sampling's)",
        "device": "auto | cpu | cuda[:N]",
        "threads": "torch CPU threads (default 1)",
        "per_class": "images per class in the optional figure (default: dpdm.sampling's)",
        "name": "label of this sample set (manifest and figure title)",
        "precision": PRECISION_DOC,
    },
)
def sample_denoiser(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Generate labelled samples from a denoiser file with a DPDM sampler; write a split (+ a grid figure)."""
    from pipeline.reporting.figures import sample_grid_figure, save_figure
    from tqdm import tqdm

    try:
        config = SamplerConfig.from_params(params.get("sampler", {}))
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"stage sample_dpdm: {exc}") from None
    sampling = schema_defaults("dpdm", "sampling")  # absent params take the schema's defaults
    n = int(params.get("n_samples", sampling["n_samples"]))
    seed = int(params.get("seed", 0))
    torch.set_num_threads(int(params.get("threads", 1)))
    device = resolve_device(params.get("device", "auto"))
    denoiser = load_denoiser(inputs["denoiser"], device=device, convention=VE_SIGMA)  # the samplers' D(x; sigma)
    meta = read_denoiser_meta(inputs["denoiser"])
    num_classes = denoiser_num_classes(denoiser)
    shape = denoiser_image_shape(denoiser)
    name = str(params.get("name", Path(outputs["samples"]).stem))
    log.info("%s: %d samples of %s (%d classes) with %s, %d network evaluations each", name, n, shape,
             num_classes, config.to_json(), config.denoiser_evaluations())
    precision = precision_of(params, "sample_dpdm")
    start = time.perf_counter()
    with tqdm(total=n, desc=f"sample_dpdm {name}", unit="img") as bar:
        try:
            # autocast turns only the network's matmuls and convolutions to bfloat16: the samplers' state arithmetic
            # is elementwise and stays float32 (a bfloat16 output promotes against a float32 state)
            with autocast(device, precision):
                x, labels = generate(denoiser, n, shape=shape, config=config, num_classes=num_classes, seed=seed,
                                     batch_size=int(params.get("batch_size", sampling["batch_size"])), device=device,
                                     progress=bar.update)
        except ValueError as exc:
            raise PipelineError(f"stage sample_dpdm: {exc}") from None
    wall_s = time.perf_counter() - start
    split = Split(to_uint8(x), labels)
    save_split(outputs["samples"], split, name=name, source="sample_dpdm", seed=seed,
               extra={"sampler": config.to_json(), "nfe": config.denoiser_evaluations(), "wall_s": wall_s,
                      "denoiser": str(inputs["denoiser"]), "denoiser_meta": meta,
                      **recorded(precision)})
    log.info("%s: %d samples in %.1f s", name, n, wall_s)
    if "figure" in outputs:
        fig = sample_grid_figure({name: split}, per_class=int(params.get("per_class", sampling["per_class"])))
        save_figure(fig, outputs["figure"])


@stage(
    "dpdm_sample_grid",
    outputs=("figure",),
    any_inputs=True,
    params={"per_class": "images per class (default 8)", "title": "figure title",
            "titles": "optional {input key: panel title} (default: the key)"},
)
def denoiser_sample_grid(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One figure with a panel of class-by-sample images per input split (the input key is the panel title)."""
    from pipeline.reporting.figures import sample_grid_figure, save_figure

    if not inputs:
        raise PipelineError("stage dpdm_sample_grid: give at least one --in TITLE=samples.npz")
    titles = params.get("titles", {})
    panels = {titles.get(key, key): load_split(path) for key, path in inputs.items()}
    fig = sample_grid_figure(panels, per_class=int(params.get("per_class", 8)), title=params.get("title"))
    save_figure(fig, outputs["figure"])

"""Stage ``dp_ldm_decode``: DP-LDM's samples, decoded from its latent denoiser's codes by the public decoder.

DP-LDM (Liu et al., "Differentially Private Latent Diffusion Models", TMLR 2024) runs in four steps; all but
the last are stages the house already has:

1. an autoencoder trained on PUBLIC images only (stage ``train_autoencoder``, rule ``dp_ldm_autoencoder``:
   the latent variant's convolutional autoencoder of :mod:`pipeline.flow.autoencoder`, codes at H/4 x W/4,
   LDM's downsampling factor f = 4), then the public and the private split encoded by it (stage
   ``encode_split``, rule ``dp_ldm_encode``). Encoding a private record releases nothing: the codes are
   private data, read only by DP-SGD below.
2. a class-conditional latent EDM denoiser pretrained on the public codes (stage ``pretrain_public``, rule
   ``dp_ldm_pretrain``): the paper's public pretraining of the LDM.
3. DP-SGD fine-tuning on the private codes of only the attention modules and the conditioning embedder
   (stage ``train_dpdm`` with ``trainable``: the paper's Sec. 3, "fine-tune only the attention modules";
   everything else stays at its public value). The mechanism is the DP-SGD engine's Poisson-subsampled
   Gaussian mechanism, whatever the subset: its ledger line is the run's only one.
4. codes sampled from the fine-tuned denoiser (stage ``sample_dpdm``, rule ``sample_dp_ldm``) and decoded
   here by the frozen public decoder: post-processing of the DP-SGD release, no ledger line.

What we assume where the paper is not our setting: the paper's LDM uses a KL/VQ autoencoder and a
cross-attention UNet from Rombach et al. pretrained on ImageNet; here the autoencoder is the latent variant's
small convolutional one and the latent UNet the house's (self-attention blocks, a class embedding), both
trained on the embedded default's public split. "Attention modules" is read as every parameter of the UNet's
attention blocks plus the class embedding (the conditioning embedder), as the ``trainable`` default says.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.flow import autoencoder as ae
from pipeline.io import Split, load_split, read_manifest, save_split
from pipeline.stage import PipelineError, stage
from pipeline.training.data import to_model_scale

log = logging.getLogger(__name__)

STAGE = "dp_ldm_decode"


def decode_codes(model: ae.ConvAutoencoder, codes: Split) -> Split:
    """The images of a split of codes (uint8 in the pipeline's image scale, as ``encode_split`` writes them) under
    the public decoder, with the codes' labels; one-line error when the codes are not the decoder's shape."""
    expected = list(model.spec.code_shape)
    if list(codes.images.shape[1:]) != expected:
        raise PipelineError(f"input latents: codes are {list(codes.images.shape[1:])}, the autoencoder decodes "
                            f"{expected}")
    return Split(ae.decode(model, to_model_scale(codes.images)), codes.labels)


@stage(STAGE, inputs=("latents", "autoencoder"), outputs=("samples",),
       params={"name": "label of the sample set (manifest; default: the output's file stem)",
               "threads": "torch CPU threads (default 1)"})
def dp_ldm_decode(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Decode DP-LDM's sampled codes to images (post-processing); the manifest carries the latents' forward."""
    torch.set_num_threads(int(params.get("threads", 1)))
    codes, latents_manifest = load_split(inputs["latents"]), read_manifest(inputs["latents"])
    blob = ae.load_blob(inputs["autoencoder"])
    if blob.get("meta", {}).get("private", True):
        raise PipelineError(f"input autoencoder: {inputs['autoencoder']} is not marked public (meta.private false): "
                            "DP-LDM's decoder must never have seen a private record")
    images = decode_codes(ae.from_blob(blob), codes)
    name = str(params.get("name", Path(outputs["samples"]).stem))
    save_split(outputs["samples"], images, name=name, source=STAGE, seed=int(latents_manifest.get("seed", 0)),
               extra={key: latents_manifest[key] for key in ("sampler", "nfe", "wall_s", "denoiser", "denoiser_meta")
                      if key in latents_manifest}
               | {"latents": str(inputs["latents"]), "latents_sha256": latents_manifest.get("sha256"),
                  "autoencoder": str(inputs["autoencoder"]), "autoencoder_public_sha256":
                  blob["meta"].get("public_sha256")})
    log.info("%s: %d codes %s decoded to images %s", name, len(images), list(codes.images.shape[1:]),
             list(images.images.shape[1:]))

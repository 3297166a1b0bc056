"""STRAIGHTDP's latent variant (Sec. 4, Table 9): a small convolutional autoencoder trained on PUBLIC data only.

"The latent variant works in the d = 32 code of a frozen public convolutional autoencoder": the
flow, the moment release and DP-SGD then run on codes, and the decoder is post-processing (it never
sees a private record before the release, so decoding a released model's samples costs no privacy).

Codes are ``[c, H/4, W/4]`` in (-1, 1) (a tanh bottleneck; d = 2 x 4 x 4 = 32 at 16 x 16), so a code
split is an ordinary split: :func:`encode_split` writes them as uint8 in the pipeline's image scale
(x = u / 127.5 - 1), and every STRAIGHTDP stage runs on it unchanged (the 8-bit rounding of a code,
<= 1/255, is far below the decoder's sensitivity). Stages: ``train_autoencoder`` (public in, model
out) and ``encode_split`` (a split and the model in, its codes out); decoding is :func:`decode`.
``straightdp.space: latent`` runs the STRAIGHTDP rules on codes: the whole configuration, or one arm of
``straightdp.arms`` (the embedded default's ``latent`` arm: Table 1's latent block).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pipeline import seeds
from pipeline.config import deep_merge, schema_defaults
from pipeline.images import to_uint8
from pipeline.io import Split, atomic_path, save_split, write_json
from pipeline.stage import PipelineError, stage
from pipeline.training.data import load_training_split, to_model_scale

log = logging.getLogger(__name__)

FORMAT = "dpgen-autoencoder/1"


@dataclass(frozen=True)
class AutoencoderSpec:
    """Shape of the autoencoder: ``channels`` x ``image_size``^2 images <-> ``code_channels`` x (size / 4)^2 codes."""

    image_size: int = 16
    channels: int = 1
    code_channels: int = 2
    width: int = 32

    def __post_init__(self) -> None:
        if self.image_size % 4 or self.image_size < 4:
            raise ValueError(f"autoencoder: image_size must be a positive multiple of 4, got {self.image_size}")
        if min(self.channels, self.code_channels, self.width) < 1:
            raise ValueError("autoencoder: channels, code_channels and width must be >= 1")

    @property
    def code_shape(self) -> tuple[int, int, int]:
        return (self.code_channels, self.image_size // 4, self.image_size // 4)

    @property
    def code_dim(self) -> int:
        c, h, w = self.code_shape
        return c * h * w


class ConvAutoencoder(nn.Module):
    """Two stride-2 convolutions down, a tanh code, two transposed convolutions up (images in [-1, 1])."""

    def __init__(self, spec: AutoencoderSpec) -> None:
        super().__init__()
        self.spec = spec
        w, c = spec.width, spec.channels
        self.encoder = nn.Sequential(
            nn.Conv2d(c, w, 4, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(w, 2 * w, 4, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(2 * w, spec.code_channels, 3, padding=1), nn.Tanh())
        self.decoder = nn.Sequential(
            nn.Conv2d(spec.code_channels, 2 * w, 3, padding=1), nn.SiLU(),
            nn.ConvTranspose2d(2 * w, w, 4, stride=2, padding=1), nn.SiLU(),
            nn.ConvTranspose2d(w, c, 4, stride=2, padding=1), nn.Tanh())

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.encoder(x))


def train(images: np.ndarray, spec: AutoencoderSpec, *, steps: int, batch_size: int, lr: float,
          seed: int) -> tuple[ConvAutoencoder, list[float]]:
    """Fit the autoencoder to uint8 ``images`` ``[N, C, H, W]`` (PUBLIC) by mean squared error; returns it
    frozen (eval mode, no gradients) and the loss of every step."""
    from tqdm import tqdm

    seeds.seed_globals("straightdp.autoencoder_init", seed)
    model = ConvAutoencoder(spec)
    x = to_model_scale(images)
    gen = seeds.torch_generator("straightdp.autoencoder", seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in tqdm(range(steps), desc="train_autoencoder", unit="step"):
        batch = x[torch.randint(len(x), (min(batch_size, len(x)),), generator=gen)]
        loss = torch.mean((model(batch) - batch) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.eval().requires_grad_(False), losses


@torch.no_grad()
def encode(model: ConvAutoencoder, images: np.ndarray, batch_size: int = 500) -> Tensor:
    """Codes ``[N, *code_shape]`` in (-1, 1) of uint8 ``images``."""
    x = to_model_scale(images)
    return torch.cat([model.encoder(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])


@torch.no_grad()
def decode(model: ConvAutoencoder, codes: Tensor, batch_size: int = 500) -> np.ndarray:
    """uint8 images of ``codes`` (model scale, ``[N, *code_shape]``): post-processing of whatever made them."""
    return np.concatenate([to_uint8(model.decoder(codes[s:s + batch_size].float()).clamp(-1, 1))
                           for s in range(0, len(codes), batch_size)])


def save(path: str | Path, model: ConvAutoencoder, meta: Mapping[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT, "spec": asdict(model.spec), "state_dict": model.state_dict(),
                    "meta": dict(meta)}, tmp)


def load_blob(path: str | Path) -> dict[str, Any]:
    """What :func:`save` wrote (format, spec, state dict, meta), read ``weights_only``; one-line error for
    anything else."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)  # plain dicts, ints, floats, tensors
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise PipelineError(f"input autoencoder: cannot read {path} ({exc})") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise PipelineError(f"input autoencoder: {path} is not a {FORMAT} file (run the train_autoencoder stage)")
    return blob


def from_blob(blob: Mapping[str, Any]) -> ConvAutoencoder:
    """The frozen autoencoder of a :func:`load_blob` result."""
    model = ConvAutoencoder(AutoencoderSpec(**blob["spec"]))
    model.load_state_dict(blob["state_dict"])
    return model.eval().requires_grad_(False)


def load(path: str | Path) -> ConvAutoencoder:
    """The frozen autoencoder written by :func:`save` (one-line error for anything else)."""
    return from_blob(load_blob(path))


def mse(model: ConvAutoencoder, images: np.ndarray) -> float:
    """Reconstruction mean squared error in model scale of uint8 ``images``."""
    x = to_model_scale(images)
    return float(torch.mean((to_model_scale(decode(model, encode(model, images))) - x) ** 2))


PARAMS_DOC = {"autoencoder": "the straightdp.autoencoder section (code_channels, width, steps, batch_size, lr)",
              "seed": "integer seed",
              "threads": "torch CPU threads (default 1)"}


@stage("train_autoencoder", inputs=("public",), outputs=("model", "metrics"), params=PARAMS_DOC)
def train_autoencoder(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """The latent variant's autoencoder on PUBLIC images only (90% fit, 10% held out for the metrics)."""
    torch.set_num_threads(int(params.get("threads", 1)))
    ae = deep_merge(schema_defaults("straightdp", "autoencoder"), dict(params.get("autoencoder") or {}))
    public, sha = load_training_split(inputs["public"], "public")
    _, c, h, _ = public.images.shape
    seed = int(params.get("seed", 0))
    try:
        spec = AutoencoderSpec(image_size=int(h), channels=int(c), code_channels=int(ae["code_channels"]),
                               width=int(ae["width"]))
    except ValueError as exc:
        raise PipelineError(f"param {exc}") from None
    order = np.random.default_rng(seed).permutation(len(public))
    cut = max(1, len(public) // 10)
    held, fit = public.images[order[:cut]], public.images[order[cut:]]
    model, losses = train(fit, spec, steps=int(ae["steps"]), batch_size=int(ae["batch_size"]), lr=float(ae["lr"]),
                          seed=seed)
    metrics = {"format": "dpgen-train-metrics/1", "stage": "train_autoencoder", "private": False,
               "public_sha256": sha, "code_shape": list(spec.code_shape), "code_dim": spec.code_dim,
               "mse_fit": mse(model, fit), "mse_held_out_public": mse(model, held), "final_loss_mean50":
               float(np.mean(losses[-50:])), "steps": len(losses), "seed": seed}
    save(outputs["model"], model, metrics)
    write_json(outputs["metrics"], metrics)
    log.info("train_autoencoder: codes %s (d = %d), held-out public MSE %.4f", spec.code_shape, spec.code_dim,
             metrics["mse_held_out_public"])


@stage("encode_split", inputs=("split", "autoencoder"), outputs=("codes",),
       params={"name": "the code split's name (default: the input's file stem)"})
def encode_split(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A split's codes under the frozen public autoencoder, as a uint8 split in the image scale (module doc)."""
    split, sha = load_training_split(inputs["split"], "split")
    model = load(inputs["autoencoder"])
    if tuple(split.images.shape[1:]) != (model.spec.channels, model.spec.image_size, model.spec.image_size):
        raise PipelineError(f"input split: images are {list(split.images.shape[1:])}, the autoencoder takes "
                            f"{[model.spec.channels, model.spec.image_size, model.spec.image_size]}")
    codes = Split(to_uint8(encode(model, split.images)), split.labels)
    save_split(outputs["codes"], codes, name=str(params.get("name", Path(inputs["split"]).stem)),
               source="encode_split", seed=0, extra={"images_sha256": sha, "code_shape": list(model.spec.code_shape)})

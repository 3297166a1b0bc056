"""Image classifiers/embedders the EMPDEN diagnostics read samples with.

* :class:`EvalNetClassifier` -- the pipeline's evaluation CNN (trained on held-out real data);
  the embedded default's embedding and classifier.
* :class:`ZeroShotCLIP` -- zero-shot CLIP (Radford et al. 2021) through open_clip, EMPDEN's
  embedding for Table 1 and its critical-window detector (Sec. 6.3, Figure 6a): class
  probabilities are softmax(logit_scale * cos(image, "a photo of a {class}.")). Only used when
  the config names a local checkpoint file: weights are never downloaded.

Both take images on the uint8 scale (float values 0..255, ``[B, C, H, W]``) and return
(features ``[B, k]``, class probabilities ``[B, n_classes]``) as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from pipeline.evaluation.evalnet import EvalNet
from pipeline.images import adapt_images
from pipeline.stage import PipelineError


class Classifier(Protocol):
    name: str

    def features_and_probs(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]: ...


class EvalNetClassifier:
    """The evaluation CNN: penultimate features (the FID feature space) and softmax probabilities."""

    name = "evalnet"

    def __init__(self, net: EvalNet, *, batch_size: int = 256) -> None:
        self.net, self.batch_size = net, batch_size

    @torch.no_grad()
    def features_and_probs(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        device = next(self.net.parameters()).device
        feats, probs = [], []
        for batch in pixels.split(self.batch_size):
            f, z = self.net.features_and_logits(adapt_images(batch.to(device), self.net.in_shape))
            feats.append(f.cpu())
            probs.append(torch.softmax(z, dim=1).cpu())
        return torch.cat(feats).numpy(), torch.cat(probs).numpy()


def zero_shot_checkpoint(checkpoint: str | Path, class_names: Sequence[str]) -> Path:
    """``checkpoint`` as a local file :class:`ZeroShotCLIP` may load, with the class names it needs.

    Raises :class:`PipelineError` (one line naming the key) otherwise. Config validation runs this
    before any job is scheduled (:func:`pipeline.inputs.check_inputs_exist`), the class again.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise PipelineError(f"config error at empden_diagnostics.clip.checkpoint: no file at {checkpoint} "
                            "(CLIP weights are never downloaded; point this at a local checkpoint)")
    if not class_names:
        raise PipelineError("config error at empden_diagnostics.clip.class_names: zero-shot CLIP needs the "
                            "class names of the data's labels, in label order")
    return checkpoint


class ZeroShotCLIP:
    """open_clip model ``model_name`` with weights from the local file ``checkpoint``.

    ``pretrained`` is only ever given an existing file path: open_clip would download a known
    tag such as ``"openai"``, which must never happen at run time.
    """

    name = "clip"

    def __init__(self, model_name: str, checkpoint: str | Path, class_names: Sequence[str], *,
                 prompt: str = "a photo of a {}.", device: torch.device | str = "cpu", batch_size: int = 256) -> None:
        import open_clip

        checkpoint = zero_shot_checkpoint(checkpoint, class_names)
        self.model = open_clip.create_model(model_name, pretrained=str(checkpoint), device=device).eval()
        tokenizer = open_clip.get_tokenizer(model_name)
        visual = self.model.visual
        size = visual.image_size if isinstance(visual.image_size, int) else visual.image_size[0]
        self.in_shape = (3, int(size), int(size))
        mean = getattr(visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN
        std = getattr(visual, "image_std", None) or open_clip.OPENAI_DATASET_STD
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        self.device, self.batch_size = torch.device(device), batch_size
        with torch.no_grad():
            text = self.model.encode_text(tokenizer([prompt.format(c) for c in class_names]).to(device))
        self.text = text / text.norm(dim=-1, keepdim=True)

    @torch.no_grad()
    def features_and_probs(self, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        feats, probs = [], []
        for batch in pixels.split(self.batch_size):
            # grey -> RGB and resize to the model's input side, then CLIP's normalisation
            x = adapt_images(batch.to(self.device).float(), self.in_shape) / 255.0
            f = self.model.encode_image((x - self.mean) / self.std)
            f = f / f.norm(dim=-1, keepdim=True)
            logits = self.model.logit_scale.exp() * f @ self.text.T
            feats.append(f.cpu())
            probs.append(torch.softmax(logits, dim=1).cpu())
        return torch.cat(feats).numpy(), torch.cat(probs).numpy()

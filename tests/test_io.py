"""The split format and atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.io import Split, atomic_path, load_split, manifest_path, save_split


def _split(n: int = 12, seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    return Split(rng.integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8), rng.integers(0, 3, size=n))


def test_split_round_trips_with_manifest(tmp_path):
    split = _split()
    m = save_split(tmp_path / "s.npz", split, name="s", source="unit", seed=3)
    back = load_split(tmp_path / "s.npz")
    np.testing.assert_array_equal(back.images, split.images)
    np.testing.assert_array_equal(back.labels, split.labels)
    on_disk = json.loads(manifest_path(tmp_path / "s.npz").read_text())
    assert on_disk == m
    assert m["format"] == "dpgen-split/1" and m["n"] == 12 and m["shape"] == [1, 4, 4]
    assert sum(m["counts_per_class"].values()) == 12
    assert m["counts_per_class"] == {str(c): int((split.labels == c).sum()) for c in np.unique(split.labels)}


def test_tampered_split_is_refused(tmp_path):
    split = _split()
    save_split(tmp_path / "s.npz", split, name="s", source="unit", seed=0)
    other = Split(split.images.copy(), split.labels.copy())
    other.images[0, 0, 0, 0] ^= 1
    np.savez(tmp_path / "s.npz", images=other.images, labels=other.labels)
    with pytest.raises(ValueError, match="do not match the sha256"):
        load_split(tmp_path / "s.npz")


def test_split_rejects_wrong_dtype_and_shape():
    with pytest.raises(ValueError, match="uint8"):
        Split(np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="labels"):
        Split(np.zeros((2, 1, 4, 4), np.uint8), np.zeros(3, np.int64))


def test_missing_split_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothere.npz: dataset split not found"):
        load_split(tmp_path / "nothere.npz")


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-written")
            raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]

"""The split format and atomic writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pipeline.io import (Split, atomic_path, current_umask, load_points, load_split, manifest_path, read_json,
                         save_points, save_split)
from pipeline.stage import PipelineError


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


_UMASK_SCRIPT = """
import os, stat, sys
from pathlib import Path
import numpy as np
import pipeline.io as io
umask, out, fallback = int(sys.argv[1], 8), Path(sys.argv[2]), sys.argv[3] == "fallback"
if fallback:  # a system without /proc: the umask is read once by setting it
    io._proc_umask = lambda: None
os.umask(umask)
io.write_json(out / "a.json", {"x": 1})
io.save_split(out / "s.npz", io.Split(np.zeros((2, 1, 2, 2), np.uint8), np.zeros(2, np.int64)),
              name="s", source="unit", seed=0)
with open(out / "plain.txt", "w") as f:
    f.write("what open() gives")
print(" ".join(f"{p.name}={stat.S_IMODE(p.stat().st_mode):o}" for p in sorted(out.iterdir())))
"""


@pytest.mark.parametrize("how", ["proc", "fallback"])
@pytest.mark.parametrize("umask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_outputs_honour_the_umask_like_a_plain_open(tmp_path, repo, umask, want, how):
    # mkstemp's 0600 would hide every result from a collaborator on a shared cluster
    res = subprocess.run([sys.executable, "-c", _UMASK_SCRIPT, f"{umask:o}", str(tmp_path), how], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    modes = dict(item.split("=") for item in res.stdout.split())
    assert set(modes) == {"a.json", "plain.txt", "s.json", "s.npz"}  # no temporary left behind
    assert {name: int(m, 8) for name, m in modes.items()} == dict.fromkeys(modes, want)


def test_reading_the_umask_does_not_change_it():
    before = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(before)


# --------------------------------------------------------------------------------------
# every load is verified: corrupt, tampered or unverifiable files end in one line
# --------------------------------------------------------------------------------------


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _repack_with_one_pixel_changed(npz) -> None:
    with np.load(npz) as z:
        images, labels = z["images"].copy(), z["labels"]
    images[0, 0, 0, 0] ^= 1
    np.savez(npz, images=images, labels=labels)


def _corrupt(kind: str, npz) -> None:
    """Damage the split at ``npz`` (written by save_split) the way a crash or an edit would."""
    manifest = manifest_path(npz)
    if kind == "truncated npz":
        _truncate(npz)
    elif kind == "npz replaced by text":
        npz.write_text("not a zip\n")
    elif kind == "truncated manifest":
        _truncate(manifest)
    elif kind == "manifest not an object":
        manifest.write_text("[]\n")
    elif kind == "manifest without sha256":
        m = json.loads(manifest.read_text())
        del m["sha256"]
        manifest.write_text(json.dumps(m))
    elif kind == "pixel changed":
        _repack_with_one_pixel_changed(npz)
    elif kind == "pixel changed, manifest deleted":
        _repack_with_one_pixel_changed(npz)
        manifest.unlink()
    elif kind == "manifest deleted":
        manifest.unlink()
    else:
        raise AssertionError(kind)


CORRUPTIONS = ["truncated npz", "npz replaced by text", "truncated manifest", "manifest not an object",
               "manifest without sha256", "pixel changed", "pixel changed, manifest deleted", "manifest deleted"]
#: what each message must say, beyond naming the file
EXPECTED = {"truncated npz": "not a readable .npz", "npz replaced by text": "not a readable .npz",
            "truncated manifest": "not valid JSON", "manifest not an object": "expected a JSON object",
            "manifest without sha256": "sha256", "pixel changed": "do not match the sha256",
            "pixel changed, manifest deleted": "missing", "manifest deleted": "missing"}


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_every_damaged_split_is_refused_in_one_line_naming_the_file(tmp_path, kind):
    npz = tmp_path / "private_train.npz"
    save_split(npz, _split(), name="private_train", source="unit", seed=0)
    _corrupt(kind, npz)
    with pytest.raises(PipelineError) as err:
        load_split(npz)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(npz) in msg and EXPECTED[kind] in msg


def test_missing_manifest_says_what_to_rerun(tmp_path):
    npz = tmp_path / "s.npz"
    save_split(npz, _split(), name="s", source="unit", seed=0)
    manifest_path(npz).unlink()
    where = re.escape(str(tmp_path))
    with pytest.raises(PipelineError, match=rf"^{where}/s.npz: manifest {where}/s.json missing.*snakemake"):
        load_split(npz)


def test_toy_points_round_trip_and_are_verified(tmp_path):
    rng = np.random.default_rng(0)
    pts, lab = rng.standard_normal((20, 2)), rng.integers(0, 4, 20)
    save_points(tmp_path / "toy.npz", pts, lab, name="toy", source="unit", seed=0)
    got_pts, got_lab = load_points(tmp_path / "toy.npz")
    np.testing.assert_array_equal(got_pts, pts.astype(np.float32))
    np.testing.assert_array_equal(got_lab, lab)
    np.savez(tmp_path / "toy.npz", points=got_pts + 1, labels=got_lab)
    with pytest.raises(PipelineError, match="toy.npz: contents do not match the sha256"):
        load_points(tmp_path / "toy.npz")


def test_points_file_is_not_taken_for_an_image_split(tmp_path):
    save_points(tmp_path / "toy.npz", np.zeros((3, 2)), np.zeros(3), name="toy", source="unit", seed=0)
    with pytest.raises(PipelineError, match=r"toy.npz: expected arrays images, labels, found labels, points"):
        load_split(tmp_path / "toy.npz")


def test_corrupt_json_names_the_file(tmp_path):
    (tmp_path / "m.json").write_text('{"eps": 1.')
    with pytest.raises(PipelineError, match=r"m.json: not valid JSON") as err:
        read_json(tmp_path / "m.json")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_cli_reports_a_damaged_input_split_as_one_line_exit_2(tmp_path, capsys, kind):
    from pipeline.cli import main

    private, test = tmp_path / "private_train.npz", tmp_path / "test.npz"
    save_split(private, _split(seed=1), name="private_train", source="unit", seed=0)
    save_split(test, _split(seed=2), name="test", source="unit", seed=0)
    _corrupt(kind, private)
    rc = main(["data_figure", "--in", f"private_train={private}", f"test={test}",
               "--out", f"figure={tmp_path / 'fig.png'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: ") and str(private) in err[0], err
    assert not (tmp_path / "fig.png").exists()

"""The small CLIP: open_clip's model and loss learn ten captions from public images alone, its zero-shot
probe and its FD behave as metrics, and a wrong file or size is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.evaluation import clip
from pipeline.io import Split, save_split
from pipeline.stage import PipelineError

CLIP_CFG = {"steps": 150, "groups": 8, "lr": 3e-3, "width": 32, "layers": 1, "embed_dim": 16, "patch_size": 4}


def bars(n: int, seed: int, n_classes: int = 4) -> Split:
    """Class c is a bright horizontal bar in row band c of an 8x8 image, plus noise: trivially separable."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % n_classes
    images = rng.integers(0, 60, (n, 1, 8, 8))
    for i, c in enumerate(labels):
        images[i, 0, 2 * c:2 * c + 2, :] = 230
    return Split(images.astype(np.uint8), labels)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clip")
    save_split(tmp / "public.npz", bars(200, 0), name="public", source="test", seed=0)
    save_split(tmp / "test.npz", bars(80, 1), name="test", source="test", seed=1)
    out = {"model": tmp / "clip.pt", "metrics": tmp / "clip.json"}
    clip.train_clip({"public": tmp / "public.npz", "test": tmp / "test.npz"}, out, {"clip": CLIP_CFG, "seed": 0})
    return out


def test_the_small_clip_learns_the_captions_from_public_images(trained):
    import json

    m = json.loads(trained["metrics"].read_text())
    assert m["zero_shot_accuracy_public"] > 0.9 and m["zero_shot_accuracy_real_test"] > 0.9
    model = clip.ClipModel(trained["model"])
    assert model.class_names == ["zero", "one", "two", "three"] and model.template == clip.TEMPLATE


def test_an_untrained_clip_is_near_chance(tmp_path):
    cfg = clip.small_clip_config(8, width=32, layers=1, embed_dim=16)
    torch.manual_seed(0)
    blob = {"format": clip.FORMAT, "config": cfg, "class_names": ["zero", "one", "two", "three"],
            "template": clip.TEMPLATE, "state_dict": clip.build_clip(cfg).state_dict()}
    torch.save(blob, tmp_path / "random.pt")
    assert clip.ClipModel(tmp_path / "random.pt").zero_shot_accuracy(bars(200, 2)) < 0.5


def test_clip_fd_is_zero_for_the_same_set_and_grows_with_a_class_shift(trained):
    real = bars(120, 3)
    same = clip.clip_fd(real, real, clip_path=trained["model"])
    other = bars(120, 4)
    shifted = Split(other.images, other.labels)
    shifted.images[:, :, :, :] = bars(120, 4, n_classes=2).images  # only bars of classes 0 and 1
    assert abs(same) < 1e-3
    assert clip.clip_fd(shifted, real, clip_path=trained["model"]) > clip.clip_fd(bars(120, 5), real,
                                                                                  clip_path=trained["model"])


def test_each_contrastive_batch_holds_one_image_per_class():
    labels = np.repeat(np.arange(3), 5)
    idx = clip.class_balanced_groups(labels, 3, 7, torch.Generator().manual_seed(0))
    assert idx.shape == (7, 3)
    assert (labels[idx.numpy()] == np.arange(3)).all()
    with pytest.raises(PipelineError, match="no image of class 3"):
        clip.class_balanced_groups(labels, 4, 2, torch.Generator().manual_seed(0))


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(PipelineError, match="not a multiple of patch_size 4"):
        clip.small_clip_config(10)
    with pytest.raises(PipelineError, match="does not exist"):
        clip.ClipModel(tmp_path / "missing.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(PipelineError, match="is not a dpgen-clip/1 file"):
        clip.ClipModel(tmp_path / "other.pt")


def test_a_pretrained_clip_without_its_weights_file_is_one_line_naming_the_file(tmp_path):
    missing = tmp_path / "ViT-B-32-openai.bin"
    with pytest.raises(PipelineError, match=f"pretrained_path: {missing} not found: put the open_clip weights of "
                                            "ViT-B-32 there"):
        clip.import_clip({}, {"model": tmp_path / "c.pt", "metrics": tmp_path / "c.json"},
                         {"clip": {"pretrained_model": "ViT-B-32", "pretrained_path": str(missing),
                                   "class_names": ["zero", "one"]}})
    with pytest.raises(PipelineError, match="needs pretrained_model"):
        clip.import_clip({}, {"model": tmp_path / "c.pt", "metrics": tmp_path / "c.json"}, {"clip": {}})
    assert not (tmp_path / "c.pt").exists()

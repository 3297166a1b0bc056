"""Classifiers of the EMPDEN diagnostics: the evaluation net and zero-shot CLIP from a local file."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.methods.empden_diagnostics import proxy as dx
from pipeline.diagnostics.classifiers import EvalNetClassifier, ZeroShotCLIP
from pipeline.evaluation.evalnet import EvalNet
from pipeline.stage import PipelineError

#: a randomly initialised open_clip model small enough for a test (custom architecture config)
TINY_CLIP = {"embed_dim": 16, "vision_cfg": {"image_size": 16, "layers": 1, "width": 32, "patch_size": 8,
                                             "head_width": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
NAMES = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    import open_clip

    root = tmp_path_factory.mktemp("clip")
    (root / "tiny-test-clip.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(root / "tiny-test-clip.json")
    torch.manual_seed(1)
    model = open_clip.create_model("tiny-test-clip")
    torch.save(model.state_dict(), root / "weights.pt")
    return {"model": "tiny-test-clip", "checkpoint": str(root / "weights.pt"), "state": model.state_dict()}


def test_clip_weights_come_from_the_configured_file(tiny_clip):
    clip = ZeroShotCLIP(tiny_clip["model"], tiny_clip["checkpoint"], NAMES)
    for k, v in clip.model.state_dict().items():
        torch.testing.assert_close(v, tiny_clip["state"][k])


def test_clip_gives_unit_features_and_class_probabilities_for_grey_images(tiny_clip):
    clip = ZeroShotCLIP(tiny_clip["model"], tiny_clip["checkpoint"], NAMES)
    feats, probs = clip.features_and_probs(torch.rand(5, 1, 8, 8) * 255)  # grey, smaller than the model's side
    np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, rtol=1e-5)
    assert probs.shape == (5, 10)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("checkpoint", ["openai", "/nonexistent/clip.pt"])
def test_clip_never_downloads_a_tag_or_a_missing_file(tiny_clip, checkpoint):
    with pytest.raises(PipelineError, match="never downloaded"):
        ZeroShotCLIP(tiny_clip["model"], checkpoint, NAMES)


def test_clip_needs_class_names(tiny_clip):
    with pytest.raises(PipelineError, match="class_names"):
        ZeroShotCLIP(tiny_clip["model"], tiny_clip["checkpoint"], [])


def test_evalnet_classifier_probabilities_sum_to_one():
    torch.manual_seed(0)
    feats, probs = EvalNetClassifier(EvalNet((1, 8, 8), 10, width=4, feature_dim=8)).features_and_probs(
        torch.rand(3, 1, 8, 8) * 255)
    assert feats.shape == (3, 8)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)


def test_configured_clip_adds_a_critical_window_classifier(tiny_clip, files, tmp_path):
    clip = {"model": tiny_clip["model"], "checkpoint": tiny_clip["checkpoint"], "class_names": NAMES}
    params = {"diagnostics": {"n_trajectories": 2, "batch_size": 2, "critical_window_N": 3, "clip": clip},
              "config_id": "test", "seed": 0, "device": "cpu", "threads": 1}
    out = {"table": tmp_path / "f6.parquet", "figure": tmp_path / "f6.png"}
    dx.empden_figure6_critical_window({k: files[k] for k in ("denoiser", "evalnet")}, out, params)
    assert set(pd.read_parquet(out["table"])["classifier"]) == {"evalnet", "clip"}


def test_clip_is_a_second_endpoint_embedding(tiny_clip, files):
    clip = ZeroShotCLIP(tiny_clip["model"], tiny_clip["checkpoint"], NAMES)
    net = EvalNetClassifier(dx.load_evalnet(files["evalnet"]))
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    same = dx.endpoint_agreement(x, x, [net, clip], net)
    assert set(same.similarity) == {"evalnet", "clip"}
    np.testing.assert_allclose(same.similarity["clip"], 1.0, rtol=1e-5)
    other = dx.endpoint_agreement(x, -x, [net, clip], net)
    assert np.all(other.similarity["clip"] < 1)

"""The evaluation CNN: learns digits, is reproducible, and its checkpoint is self-describing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.evaluation.evalnet import (CHECKPOINT_FORMAT, EvalNet, TrainConfig, accuracy, fit_classifier,
                                         load_evalnet, predict)
from pipeline.stage import PipelineError

CPU = torch.device("cpu")


def test_stage_trains_a_classifier_far_above_chance(evalnet_metrics):
    # 10 balanced classes: chance is 0.1; even the tests' tiny net on 800 digits clears 0.7.
    assert evalnet_metrics["test_accuracy"] > 0.7
    assert evalnet_metrics["n_classes"] == 10 and evalnet_metrics["in_shape"] == [1, 16, 16]


def test_checkpoint_rebuilds_the_network_it_describes(evalnet, digits):
    ckpt = torch.load(evalnet, weights_only=True)
    assert ckpt["format"] == CHECKPOINT_FORMAT
    assert ckpt["arch"] == {"in_shape": [1, 16, 16], "n_classes": 10, "width": 16, "feature_dim": 64}
    model = load_evalnet(evalnet)
    assert not model.training
    assert accuracy(model, digits.test) == pytest.approx(ckpt["test_accuracy"])


def test_training_is_deterministic_given_the_seed(digits):
    small = digits.eval_train.subset(np.arange(128))
    config = TrainConfig(width=8, feature_dim=16, epochs=1, batch_size=32)
    runs = [fit_classifier(small, config, seed=s, device=CPU, desc="test") for s in (3, 3, 4)]
    a, b, c = (predict(m, digits.test.images[:64])[0] for m in runs)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_training_leaves_the_global_rng_alone(digits):
    small = digits.eval_train.subset(np.arange(32))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    fit_classifier(small, TrainConfig(width=4, feature_dim=4, epochs=1), seed=0, device=CPU, desc="test")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 64, 64), (1, 8, 8)])
def test_network_accepts_every_paper_resolution(shape):
    model = EvalNet(shape, 10, width=4, feature_dim=12)
    feats, logits = model.features_and_logits(torch.randint(0, 256, (2, *shape), dtype=torch.uint8))
    assert feats.shape == (2, 12) and logits.shape == (2, 10)


def test_missing_checkpoint_is_one_line(tmp_path):
    with pytest.raises(PipelineError, match="not found") as err:
        load_evalnet(tmp_path / "nope.pt")
    assert "\n" not in str(err.value)

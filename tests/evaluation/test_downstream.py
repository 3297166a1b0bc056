"""Downstream accuracy: classifiers trained on (image, label) pairs, tested on real digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.evaluation import downstream
from pipeline.evaluation.downstream import CLASSIFIERS, downstream_accuracy
from pipeline.evaluation.evalnet import TrainConfig
from pipeline.io import Split
from pipeline.stage import PipelineError

CNN = TrainConfig(width=16, feature_dim=64, epochs=6, batch_size=32, lr=0.003)
SMALL = {"mlp_hidden": 64, "cnn": CNN}


@pytest.fixture(scope="module")
def true_pairs(digits):
    return downstream_accuracy(digits.real, digits.test, seed=0, **SMALL)


def means(out):
    return {k: v for k, v in out.items() if not k.endswith("_std")}


def test_real_pairs_train_classifiers_far_above_chance(true_pairs):
    assert set(true_pairs) == {f"acc_{c}{s}" for c in CLASSIFIERS for s in ("", "_std")}
    for name, acc in means(true_pairs).items():
        assert acc > 0.6, name  # chance: 0.1
    assert all(true_pairs[f"acc_{c}_std"] is None for c in CLASSIFIERS)  # one repeat: no spread to report


def test_shuffled_labels_give_chance_accuracy(digits):
    out = downstream_accuracy(digits.shuffled(digits.real), digits.test, seed=0, **SMALL)
    for name, acc in means(out).items():
        assert acc < 0.2, name


def test_same_seed_same_accuracy(digits, true_pairs):
    again = downstream_accuracy(digits.real, digits.test, seed=0, **SMALL)
    assert again == true_pairs


def test_only_the_selected_classifiers_run(digits):
    out = downstream_accuracy(digits.real, digits.test, classifiers=["logreg"], seed=0, **SMALL)
    assert out["acc_logreg"] is not None and out["acc_mlp"] is None and out["acc_cnn"] is None


def test_a_collapsed_generator_scores_its_class_frequency(digits):
    ones = digits.real.subset(np.flatnonzero(digits.real.labels == 1))
    out = downstream_accuracy(ones, digits.test, seed=0, **SMALL)
    share_of_ones = float(np.mean(digits.test.labels == 1))
    assert all(acc == pytest.approx(share_of_ones) for acc in means(out).values())


def test_repeats_report_the_mean_and_spread_over_consecutive_classifier_seeds(digits):
    """acc_cnn with repeats = 3 from seed 4 is the mean of the single runs at seeds 4, 5, 6."""
    kw = {"classifiers": ["cnn"], **SMALL}
    single = [downstream_accuracy(digits.real, digits.test, seed=s, **kw)["acc_cnn"] for s in (4, 5, 6)]
    assert len(set(single)) > 1  # the seeds really differ, so the mean below identifies them
    out = downstream_accuracy(digits.real, digits.test, seed=4, repeats=3, **kw)
    assert out["acc_cnn"] == pytest.approx(np.mean(single))
    assert out["acc_cnn_std"] == pytest.approx(np.std(single, ddof=1))
    assert out["acc_logreg"] is None and out["acc_logreg_std"] is None


def test_the_logistic_regression_ignores_its_seed_so_it_is_fitted_once(digits, monkeypatch):
    """L-BFGS is a deterministic convex solve: two seeds give the same model, so repeats reuse one fit
    (the accuracy and val accuracy are what five fits give; the std is 0) while the MLP refits per seed."""
    a = downstream._fit_sklearn("logreg", digits.real, seed=0, mlp_hidden=64)
    b = downstream._fit_sklearn("logreg", digits.real, seed=123, mlp_hidden=64)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    fits = []
    real_fit = downstream._fit_sklearn
    monkeypatch.setattr(downstream, "_fit_sklearn", lambda kind, *a, **k: fits.append(kind) or real_fit(kind, *a, **k))
    out = downstream_accuracy(digits.real, digits.test, classifiers=["logreg", "mlp"], seed=0, repeats=3,
                              val=digits.test, mlp_hidden=64)
    assert fits.count("logreg") == 1 and fits.count("mlp") == 3
    once = downstream_accuracy(digits.real, digits.test, classifiers=["logreg"], seed=0, val=digits.test)
    assert out["acc_logreg"] == once["acc_logreg"] and out["acc_logreg_val"] == once["acc_logreg_val"]
    assert out["acc_logreg_std"] == 0.0


def test_unconditional_samples_have_no_downstream_accuracy(digits):
    unlabelled = Split(digits.real.images, np.full(len(digits.real), -1))
    assert set(downstream_accuracy(unlabelled, digits.test, **SMALL).values()) == {None}


def test_bad_requests_are_one_line(digits):
    with pytest.raises(PipelineError, match="expected one of logreg, mlp, cnn"):
        downstream_accuracy(digits.real, digits.test, classifiers=["svm"])
    with pytest.raises(PipelineError, match="downstream repeats: expected an integer >= 1, got 0"):
        downstream_accuracy(digits.real, digits.test, repeats=0)
    rgb = Split(np.repeat(digits.real.images, 3, axis=1), digits.real.labels)
    with pytest.raises(PipelineError, match=r"synthetic images are \[3, 16, 16\] but test images \[1, 16, 16\]"):
        downstream_accuracy(rgb, digits.test, device=torch.device("cpu"))


def test_val_is_scored_by_the_same_classifiers_and_moves_no_test_number(digits, true_pairs):
    """Selection rules read acc_<clf>_val; the test columns are exactly those without val."""
    half = len(digits.test) // 2
    val = digits.test.subset(np.arange(half))
    out = downstream_accuracy(digits.real, digits.test, seed=0, val=val, **SMALL)
    assert {k: out[k] for k in true_pairs} == true_pairs
    for c in CLASSIFIERS:
        assert out[f"acc_{c}_val"] > 0.6
    shuffled = downstream_accuracy(digits.shuffled(digits.real), digits.test, seed=0, val=val, **SMALL)
    assert all(shuffled[f"acc_{c}_val"] < 0.2 for c in CLASSIFIERS)

"""FID/KID/precision-recall in the eval net's feature space behave like distances between
distributions: ~0 between two samples of the same real distribution, large against noise;
the label-aware metrics see what FID cannot (labels that do not match the images)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch_fidelity
from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from pipeline.evaluation.evalnet import TrainConfig, fit_classifier, load_evalnet, predict, save_evalnet
from torch_fidelity.metric_fid import KEY_METRIC_FID
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD
from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL

from pipeline.evaluation.fidelity import (EVALNET_EXTRACTOR, EvalNetFeatureExtractor, UInt8Images, extract_features,
                                          fid_only, fidelity_metrics, inception_weights_path, label_consistency)
from pipeline.io import Split
from pipeline.stage import PipelineError

FAST = {"kid_subsets": 20, "kid_subset_size": 200}


@pytest.fixture(scope="module")
def real_vs_real(digits, evalnet):
    return fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, **FAST)


@pytest.fixture(scope="module")
def noise_vs_real(digits, evalnet):
    return fidelity_metrics(digits.noise_like(digits.real), digits.test, evalnet_path=evalnet, **FAST)


def _feature_variance(evalnet, split: Split) -> float:
    """Total variance tr(Σ) of the real features: the scale FID is measured on."""
    feats, _ = predict(load_evalnet(evalnet), split.images)
    return float(np.trace(np.cov(feats, rowvar=False)))


def test_fid_real_vs_real_is_near_zero_and_far_below_noise(real_vs_real, noise_vs_real, digits, evalnet):
    scale = _feature_variance(evalnet, digits.test)
    # Two finite samples of one distribution: FID is a small bias, a few percent of tr(Σ).
    assert 0 <= real_vs_real["fid"] < 0.05 * scale
    # Noise is another distribution entirely: FID of the order of tr(Σ) or more.
    assert noise_vs_real["fid"] > 0.5 * scale
    assert noise_vs_real["fid"] > 20 * real_vs_real["fid"]


def test_kid_real_vs_real_is_zero_within_its_spread_and_large_for_noise(real_vs_real, noise_vs_real):
    # KID is unbiased: for equal distributions its mean is 0 up to the subset spread.
    assert abs(real_vs_real["kid_mean"]) < 3 * real_vs_real["kid_std"] + 1e-6
    assert noise_vs_real["kid_mean"] > 10 * (abs(real_vs_real["kid_mean"]) + real_vs_real["kid_std"])
    assert real_vs_real["kid_subset_size"] == FAST["kid_subset_size"]


def test_precision_recall_high_for_real_and_near_zero_for_noise(real_vs_real, noise_vs_real):
    assert real_vs_real["precision"] > 0.8 and real_vs_real["recall"] > 0.8
    # Recall: no real digit lies in the (tight) noise manifold. Precision of noise stays
    # above 0 only through real outliers whose k-NN balls are wide (the known weakness of
    # Kynkäänniemi et al.'s estimator), so it is bounded, not pinned to 0.
    assert noise_vs_real["recall"] < 0.05
    assert noise_vs_real["precision"] < 0.3


def test_per_class_fid_sees_shuffled_labels_that_fid_cannot(real_vs_real, digits, evalnet):
    shuffled = fidelity_metrics(digits.shuffled(digits.real), digits.test, evalnet_path=evalnet, **FAST)
    assert shuffled["fid"] == pytest.approx(real_vs_real["fid"])  # same images: FID is label-blind
    assert shuffled["fid_class_mean"] > 10 * real_vs_real["fid_class_mean"]
    assert {f"fid_class_{c}" for c in range(10)} <= set(real_vs_real)


def test_per_class_fid_is_none_for_a_class_without_samples(digits, evalnet):
    without_7 = digits.real.subset(np.flatnonzero(digits.real.labels != 7))
    out = fidelity_metrics(without_7, digits.test, evalnet_path=evalnet, **FAST)
    assert out["fid_class_7"] is None and out["fid_class_3"] is not None


def test_label_consistency_is_high_for_true_labels_and_chance_for_shuffled(digits, evalnet):
    net = load_evalnet(evalnet)
    assert label_consistency(net, digits.real) > 0.7
    assert label_consistency(net, digits.shuffled(digits.real)) < 0.2  # chance: 0.1
    unconditional = Split(digits.real.images, np.full(len(digits.real), -1))
    assert label_consistency(net, unconditional) is None


def test_registered_extractor_is_the_eval_nets_penultimate_layer(digits, evalnet):
    assert FEATURE_EXTRACTORS_REGISTRY[EVALNET_EXTRACTOR] is EvalNetFeatureExtractor
    extractor = EvalNetFeatureExtractor(EVALNET_EXTRACTOR, ["features", "logits"],
                                        feature_extractor_weights_path=str(evalnet))
    x = torch.from_numpy(digits.test.images[:50])
    feats, logits = extractor(x)
    again, _ = extractor(x)
    torch.testing.assert_close(feats, again, rtol=0, atol=0)  # deterministic (no dropout at eval)
    want_feats, want_logits = predict(load_evalnet(evalnet), digits.test.images[:50])
    np.testing.assert_allclose(feats.numpy(), want_feats, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits.numpy(), want_logits, rtol=1e-5, atol=1e-5)


def test_extractor_shows_rgb_and_resized_images_to_a_grey_net(digits, evalnet):
    extractor = EvalNetFeatureExtractor(EVALNET_EXTRACTOR, ["logits"], feature_extractor_weights_path=str(evalnet))
    grey = torch.from_numpy(digits.test.images[:100])
    (ref,) = extractor(grey)
    (rgb,) = extractor(grey.expand(-1, 3, -1, -1).contiguous())  # luma of equal channels = grey
    torch.testing.assert_close(rgb, ref, rtol=1e-4, atol=1e-3)
    up = torch.nn.functional.interpolate(grey.float(), size=(32, 32), mode="bilinear").round().to(torch.uint8)
    (resized,) = extractor(up)
    assert (resized.argmax(1) == ref.argmax(1)).float().mean() > 0.8


def test_extractor_rejects_non_uint8_input(evalnet):
    extractor = EvalNetFeatureExtractor(EVALNET_EXTRACTOR, ["features"], feature_extractor_weights_path=str(evalnet))
    with pytest.raises(ValueError, match="uint8"):
        extractor(torch.zeros(2, 1, 16, 16))


def test_metrics_follow_the_eval_net_never_stale_cached_features(digits, evalnet, tmp_path):
    # torch-fidelity caches features by input and extractor *name*; a retrained eval net
    # under the same name must still give its own numbers.
    other = fit_classifier(digits.eval_train.subset(np.arange(200)), TrainConfig(width=8, feature_dim=16, epochs=1),
                           seed=5, device=torch.device("cpu"), desc="test")
    save_evalnet(other, tmp_path / "other.pt")
    args = (digits.real, digits.test)
    first = fidelity_metrics(*args, evalnet_path=evalnet, **FAST)["fid"]
    second = fidelity_metrics(*args, evalnet_path=tmp_path / "other.pt", **FAST)["fid"]
    third = fidelity_metrics(*args, evalnet_path=evalnet, **FAST)["fid"]
    assert second != pytest.approx(first)
    assert third == first


def test_inception_without_cached_weights_is_one_line_and_never_downloads(digits, evalnet, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_download(*args, **kwargs):
        raise AssertionError("tried to download weights")

    monkeypatch.setattr("torch_fidelity.feature_extractor_inceptionv3.load_state_dict_from_url", no_download)
    with pytest.raises(PipelineError) as err:
        fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, feature_extractor="inception-v3-compat")
    msg = str(err.value)
    assert "\n" not in msg and "inception-v3-compat weights not found" in msg
    assert str(tmp_path / "empty-torch-home") in msg and "evaluation.inception_weights" in msg


def _random_inception_weights(path, monkeypatch) -> None:
    """A randomly initialised inception-v3-compat state dict (the real one is never downloaded here)."""
    with monkeypatch.context() as m:
        m.setattr("torch_fidelity.feature_extractor_inceptionv3.load_state_dict_from_url", lambda *a, **k: {})
        m.setattr(FeatureExtractorInceptionV3, "load_state_dict", lambda self, *a, **k: None)
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    torch.save(net.state_dict(), path)


def test_inception_feature_space_takes_grey_digits(digits, evalnet, tmp_path, monkeypatch):
    weights = tmp_path / "weights-inception.pth"
    _random_inception_weights(weights, monkeypatch)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    assert inception_weights_path(weights) == weights
    few = np.arange(3)  # Inception runs at 299×299: a handful of images keeps this fast on a CPU
    out = fidelity_metrics(digits.real.subset(few), digits.test.subset(few), evalnet_path=evalnet,
                           feature_extractor="inception-v3-compat", inception_weights=weights, per_class=False,
                           kid_subsets=2, batch_size=3, prc_neighborhood=1)
    assert out["feature_extractor"] == "inception-v3-compat"
    assert np.isfinite(out["fid"]) and out["kid_subset_size"] == 3
    assert "fid_class_mean" not in out


def test_too_few_samples_for_k_neighbours_is_one_line(digits, evalnet):
    few = digits.real.subset(np.arange(3))
    with pytest.raises(PipelineError, match="need at least 4 images per set, got 3 samples"):
        fidelity_metrics(few, digits.test, evalnet_path=evalnet, prc_neighborhood=3)


def test_unknown_feature_extractor_is_one_line(digits, evalnet):
    with pytest.raises(PipelineError, match="expected one of evalnet, inception-v3-compat"):
        fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, feature_extractor="vgg16")


def test_the_numbers_are_torch_fidelitys_own(digits, evalnet):
    """FID, KID and precision-recall from the extracted features equal torch_fidelity.calculate_metrics on the
    same sets, settings and seed, to the last bit."""
    out = fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, prc_neighborhood=5, seed=3, **FAST)
    raw = torch_fidelity.calculate_metrics(
        input1=UInt8Images(digits.real.images), input2=UInt8Images(digits.test.images),
        feature_extractor=EVALNET_EXTRACTOR, feature_extractor_weights_path=str(evalnet), fid=True, kid=True,
        prc=True, prc_neighborhood=5, rng_seed=3, batch_size=256, cuda=False, save_cpu_ram=True, verbose=False, **FAST)
    assert out["fid"] == raw[KEY_METRIC_FID]
    assert (out["kid_mean"], out["kid_std"]) == (raw[KEY_METRIC_KID_MEAN], raw[KEY_METRIC_KID_STD])
    assert (out["precision"], out["recall"]) == (raw[KEY_METRIC_PRECISION], raw[KEY_METRIC_RECALL])
    assert out["prc_neighborhood"] == 5


def test_a_sharded_runs_merged_features_give_the_unsharded_numbers(digits, evalnet):
    """The features of three shards of the samples (cut anywhere), concatenated, give FID/KID/precision-recall and
    the validation FID of the whole set to 1e-6 (sampling.shards)."""
    whole = fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, seed=1, **FAST)
    n = len(digits.real)
    cuts = [0, n // 3, n // 3 + 7, n]
    parts = [Split(digits.real.images[a:b], digits.real.labels[a:b]) for a, b in zip(cuts, cuts[1:])]
    merged = torch.cat([extract_features(p, evalnet_path=evalnet) for p in parts])
    sharded = fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, seed=1, sample_features=merged, **FAST)
    assert sharded.keys() == whole.keys()
    for key, value in whole.items():
        assert sharded[key] == (value if not isinstance(value, float) else pytest.approx(value, rel=1e-6, abs=1e-9))
    assert fid_only(digits.real, digits.test, evalnet_path=evalnet, sample_features=merged) == pytest.approx(
        fid_only(digits.real, digits.test, evalnet_path=evalnet), rel=1e-6)
    # the features of other samples move the numbers: the merge is what is scored
    other = torch.cat([extract_features(digits.noise_like(p), evalnet_path=evalnet) for p in parts])
    assert fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, seed=1, sample_features=other,
                            **FAST)["fid"] > 10 * whole["fid"]
    with pytest.raises(PipelineError, match="sample features for"):
        fidelity_metrics(digits.real, digits.test, evalnet_path=evalnet, sample_features=merged[:-1], **FAST)

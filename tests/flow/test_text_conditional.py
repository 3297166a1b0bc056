"""The text-conditional moment model (STRAIGHTDP App. C): featurisations, their public radius, and the
post-processing of a release into one Gaussian per caption."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.flow import text_conditional as tc
from pipeline.privacy import moments, text_moments


def test_every_caption_is_encoded_inside_R_txt_and_none_is_clipped():
    for kind in tc.FEATURISATIONS:
        coding = tc.CaptionCoding.of(kind)
        e = coding.encode(tc.caption_slots())
        norms = np.linalg.norm(e, axis=1)
        assert norms.max() == pytest.approx(coding.R_txt) and (norms <= coding.R_txt * (1 + 1e-12)).all()
        # unclipped: the centred part is the featurisation minus the public centre, exactly
        raw = tc.featurise(tc.caption_slots(), kind) - coding.centre
        np.testing.assert_allclose(e[:, 1:], raw)
        assert e.shape[1] == coding.q


def test_the_one_hot_control_cannot_tell_quadrant_or_thickness_apart():
    slots = tc.caption_slots()
    e = tc.CaptionCoding.of("one_hot_class").encode(slots)
    same_class = slots[:, 0] == 3
    assert np.ptp(e[same_class], axis=0).max() == 0  # every caption of class 3 has one code
    e_ind = tc.CaptionCoding.of("slot_indicators").encode(slots)
    assert len(np.unique(e_ind, axis=0)) == len(slots)  # the indicators tell all 80 apart


def test_noise_free_moments_give_each_captions_mean_image():
    """With M_zc, M_cc exact and a vanishing ridge, mu(c) = m + P^T W e(c) is the least-squares fit of the
    features on the captions: on data whose feature is an additive function of the slots it is exact."""
    rng = np.random.default_rng(0)
    d, p, n = 12, 6, 4000
    slots = tc.caption_slots()[rng.integers(0, 80, size=n)]
    coding = tc.CaptionCoding.of("slot_indicators")
    effect = [rng.normal(size=(s, p)) * 0.3 for s in (10, 4, 2)]
    coords = sum(effect[a][slots[:, a]] for a in range(3))
    basis = np.linalg.qr(rng.normal(size=(d, p)))[0].T
    geometry = moments.PublicGeometry(mean=rng.normal(size=d), basis=basis, R=100.0)
    z = geometry.mean + coords @ basis
    f, e = geometry.features(z), coding.encode(slots)
    exact = text_moments.NoisyCrossMoments(M_zc=f.T @ e / n, M_cc=e.T @ e / n)
    W = text_moments.conditional_mean_map(exact, ridge=1e-10)
    model = tc.text_conditional_model(W, coding, geometry, eigvecs=np.zeros((d, 0)), eigvals=np.zeros(0),
                                      floor=1e-6)
    captions = tc.caption_slots()
    truth = geometry.mean + sum(effect[a][captions[:, a]] for a in range(3)) @ basis
    np.testing.assert_allclose(model.mu.numpy(), truth, atol=1e-8)


def test_the_public_covariance_holds_no_quadrant_or_thickness_mean():
    rng = np.random.default_rng(1)
    d, n = 8, 3000
    slots = tc.caption_slots()[rng.integers(0, 80, size=n)]
    shift = np.zeros((n, d))
    shift[:, 0] = 5.0 * (slots[:, 1] == 2)  # the quadrant moves coordinate 0 a lot
    geometry = moments.PublicGeometry(mean=np.zeros(d), basis=np.eye(d), R=1e3)
    f = shift + rng.normal(size=(n, d)) * 0.1
    V, s = tc.public_residual_covariance(f, slots, geometry, rank=d, floor=1e-6)
    assert s.max() < 0.02  # only the 0.1-std noise is left (variance 0.01), not the 5.0 quadrant step
    assert np.allclose(V.T @ V, np.eye(d), atol=1e-10)


def test_the_ridge_scales_with_the_declared_noise():
    plan = text_moments.calibrate_release(target_epsilon=1.0, delta=1e-5, R=2.0, R_txt=3.0, N=1000, p=4, q=5)
    assert tc.noise_ridge(plan, 2.0) == pytest.approx(2 * tc.noise_ridge(plan, 1.0))
    assert tc.noise_ridge(plan, 1.0) == pytest.approx(2 * np.sqrt(5) * plan.noise_std * 9.0)

"""Theoretical membership-inference bound (EMPDEN App. L)."""

from __future__ import annotations

import math

import pytest

from pipeline.privacy.mia import asr_bound


def test_no_privacy_loss_means_a_coin_flip():
    assert asr_bound(0.0) == pytest.approx(0.5)


def test_pure_dp_bound_is_the_logistic_of_eps():
    for eps in (0.1, 1.0, 5.0, 10.0):
        assert asr_bound(eps) == pytest.approx(1 / (1 + math.exp(-eps)), rel=1e-12)
    # App. L quotes 73.1% at eps = 1 and 99.33% at eps = 5
    assert round(asr_bound(1.0), 3) == 0.731 and round(asr_bound(5.0), 4) == 0.9933


def test_delta_adds_its_share_and_the_bound_is_monotone():
    assert asr_bound(1.0, 1e-3) == pytest.approx((math.e + 1e-3) / (1 + math.e))
    values = [asr_bound(e, 1e-5) for e in (0, 0.5, 1, 2, 10, 100, 1e4)]
    assert values == sorted(values) and values[-1] == 1.0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        asr_bound(-1)
    with pytest.raises(ValueError):
        asr_bound(1, 1.0)

"""The one-run canary audit of STRAIGHTDP's moment release: a correct release passes, a broken one is caught.

The positive controls make the audit worth running: the same release with its noise switched
off, or with its noise a thousand times below the declared std, must show an eps_lb above the
eps its plan certifies.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from pipeline.audit import moment_canaries as mc
from pipeline.audit.one_run import AuditError
from pipeline.privacy import moments, text_moments

DELTA = 1e-5


@functools.cache
def embedded_plan(eps: float) -> moments.MomentReleasePlan:
    """The embedded release's shape: N 2,500, ten classes, p 32 (the audit widens p)."""
    return moments.calibrate_release(target_epsilon=eps, delta=DELTA, R=3.0, N=2500, n_classes=10, p=32)


def noise_off(f, y, plan, *, generator):
    """The bug "the noise terms were dropped": the clean statistics leave the mechanism."""
    return moments.NoisyMoments(u=moments.whitened_statistic(f, y, n_classes=plan.n_classes, R=plan.R),
                                M2=moments.second_moment(f, N=plan.N))


def noise_scaled(factor):
    """The bug "the noise was calibrated to the wrong sensitivity": std times ``factor``."""
    def release(f, y, plan, *, generator):
        return moments.release(f, y, dataclasses.replace(plan, sigma=plan.sigma * factor), generator=generator)
    return release


@pytest.mark.parametrize("eps", [0.07, 1.0, 10.0])
def test_a_correct_release_is_not_refuted(eps):
    plan = embedded_plan(eps)
    audit = mc.audit_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0)
    assert audit.passed and audit.bound.epsilon_lb <= plan.epsilon()
    assert audit.steps == 1 and audit.bound.m == 1000 and 0 < audit.bound.n_in < 1000


@pytest.mark.parametrize("eps", [0.07, 1.0])
def test_noise_switched_off_is_caught(eps):
    plan = embedded_plan(eps)
    audit = mc.audit_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0, release=noise_off)
    assert not audit.passed and audit.bound.epsilon_lb > max(1.0, plan.epsilon())


def test_noise_far_below_its_declared_std_is_caught():
    plan = embedded_plan(1.0)
    audit = mc.audit_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0, release=noise_scaled(1e-3))
    assert not audit.passed


def test_the_canaries_go_through_the_feature_clip():
    """A canary is 10 R long; scored after the release, an included one moves its sum coordinate by
    exactly 1/2 (the clip brought it to R), which the noise-free release shows."""
    plan = embedded_plan(1.0)
    audit = mc.audit_release(plan, certified_epsilon=plan.epsilon(), m=200, seed=3, release=noise_off)
    expected_in = 0.5 * 0.5 / plan.std_u ** 2 + (plan.R ** 2 / plan.N) ** 2 / plan.std_M2 ** 2
    np.testing.assert_allclose(audit.in_scores, expected_in, rtol=1e-9)
    np.testing.assert_allclose(audit.out_scores, 0.0, atol=1e-12)
    assert audit.canary_norm == pytest.approx(mc.CANARY_NORM_FACTOR * plan.R)


def test_the_audit_is_reproducible_and_refuses_too_few_canaries():
    plan = embedded_plan(1.0)
    a = mc.audit_release(plan, certified_epsilon=1.0, m=300, seed=5)
    b = mc.audit_release(plan, certified_epsilon=1.0, m=300, seed=5)
    np.testing.assert_array_equal(a.in_scores, b.in_scores)
    with pytest.raises(AuditError, match="canaries m"):
        mc.audit_release(plan, certified_epsilon=1.0, m=1)


# --------------------------------------------------------------------------- the text release (Prop. B.10)

@functools.cache
def text_plan(eps: float) -> text_moments.TextReleasePlan:
    """Table 4's shape: N 2,500, p 32, the indicator captions' q = 17."""
    return text_moments.calibrate_release(target_epsilon=eps, delta=DELTA, R=3.0, R_txt=1.5, N=2500, p=32, q=17)


def text_noise_off(f, e, plan, *, generator):
    """The bug "the noise terms were dropped" in the text release."""
    return text_moments.NoisyCrossMoments(M_zc=f.T @ e / plan.N, M_cc=e.T @ e / plan.N)


@pytest.mark.parametrize("eps", [0.3, 3.0])
def test_a_correct_text_release_is_not_refuted(eps):
    plan = text_plan(eps)
    audit = mc.audit_text_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0)
    assert audit.passed and audit.bound.epsilon_lb <= plan.epsilon()


def test_a_text_release_without_noise_or_with_noise_far_below_its_std_is_caught():
    plan = text_plan(0.3)
    off = mc.audit_text_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0, release=text_noise_off)
    assert not off.passed and off.bound.epsilon_lb > 1.0

    def scaled(f, e, p, *, generator):
        return text_moments.release(f, e, dataclasses.replace(p, sigma=p.sigma * 1e-3), generator=generator)
    assert not mc.audit_text_release(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0, release=scaled).passed

"""The one-run canary audits of the baselines' releases (DP-MERF, Private Evolution): a correct release
passes, the same release with its noise switched off (or far below its declared std) is caught."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from pipeline.audit import baseline_canaries as bc
from pipeline.audit.one_run import AuditError
from pipeline.privacy import dp_merf
from pipeline.privacy import private_evolution as pe

DELTA = 1e-5


@functools.cache
def merf_plan(eps: float) -> dp_merf.MerfReleasePlan:
    """The embedded DP-MERF release: m 2,500 records, D 1,000 frequencies, ten classes."""
    return dp_merf.calibrate_release(target_epsilon=eps, delta=DELTA, m=2500, n_features=1000, n_classes=10)


@functools.cache
def pe_plan(eps: float) -> pe.PEHistogramPlan:
    """The embedded PE run: T = 4 histograms."""
    return pe.calibrate(target_epsilon=eps, delta=DELTA, T=4)


def merf_noise_off(phi, labels, plan, *, generator):
    return dp_merf.mean_embedding(phi, labels, plan.n_classes, plan.m)


def merf_noise_scaled(factor):
    def release(phi, labels, plan, *, generator):
        return dp_merf.release(phi, labels, dataclasses.replace(plan, sigma=plan.sigma * factor), generator=generator)
    return release


def pe_noise_off(counts, plan, *, threshold, generator):
    return np.maximum(counts - threshold, 0.0)


@pytest.mark.parametrize("eps", [0.3, 1.0, 10.0])
def test_correct_releases_are_not_refuted(eps):
    merf, hist = merf_plan(eps), pe_plan(eps)
    a = bc.audit_merf(merf, certified_epsilon=merf.epsilon(), m=1000, seed=0)
    b = bc.audit_pe(hist, certified_epsilon=hist.epsilon(), m=1000, seed=0)
    assert a.passed and b.passed
    assert a.bound.m == b.bound.m == 1000 and a.steps == 1 and b.steps == 4


def test_at_a_large_eps_the_canaries_show_through():
    """At eps = 10 both audits find a positive lower bound: the scores see the one record."""
    merf, hist = merf_plan(10.0), pe_plan(10.0)
    assert bc.audit_merf(merf, certified_epsilon=10.0, seed=0).bound.epsilon_lb > 0.5
    assert bc.audit_pe(hist, certified_epsilon=10.0, seed=0).bound.epsilon_lb > 0.5


@pytest.mark.parametrize("eps", [0.3, 1.0])
def test_noise_switched_off_is_caught(eps):
    merf, hist = merf_plan(eps), pe_plan(eps)
    assert not bc.audit_merf(merf, certified_epsilon=merf.epsilon(), seed=0, release=merf_noise_off).passed
    assert not bc.audit_pe(hist, certified_epsilon=hist.epsilon(), seed=0, histogram=pe_noise_off).passed


def test_merf_noise_calibrated_to_a_tenth_of_its_sensitivity_is_caught():
    plan = merf_plan(1.0)
    assert not bc.audit_merf(plan, certified_epsilon=plan.epsilon(), seed=0, release=merf_noise_scaled(0.1)).passed


def test_paired_merf_canaries_move_the_embedding_by_the_declared_sensitivity():
    """Noise off: an "in" slot releases +1/m on its coordinate, an "out" slot -1/m (difference 2/m)."""
    plan = merf_plan(1.0)
    a = bc.audit_merf(plan, certified_epsilon=1.0, m=200, seed=2, release=merf_noise_off)
    np.testing.assert_allclose(a.in_scores, 1.0 / plan.m)
    np.testing.assert_allclose(a.out_scores, -1.0 / plan.m)


def test_pe_canaries_cast_exactly_one_vote_each():
    plan = pe_plan(1.0)
    a = bc.audit_pe(plan, certified_epsilon=1.0, m=200, seed=2, histogram=pe_noise_off)
    np.testing.assert_array_equal(a.in_scores, plan.T * 1.0)
    np.testing.assert_array_equal(a.out_scores, 0.0)


def test_bad_requests_are_one_line():
    with pytest.raises(AuditError, match="canaries m"):
        bc.audit_pe(pe_plan(1.0), certified_epsilon=1.0, m=1)
    small = dataclasses.replace(merf_plan(1.0), m=100)
    with pytest.raises(AuditError, match="fewer canaries"):
        bc.audit_merf(small, certified_epsilon=1.0, m=100)
    assert torch.get_default_dtype() == torch.float32  # the audit builds float64 tensors of its own


@pytest.mark.parametrize("mechanism", ["dp_hp_embedding", "dp_ntk_embedding", "dp_mepf_embedding"])
def test_dp_merfs_successors_pass_and_their_release_without_noise_is_caught(mechanism):
    """DP-HP, DP-NTK and DP-MEPF share one release (pipeline/privacy/mean_embedding.py): the same paired canaries."""
    from pipeline.privacy import mean_embedding as me

    plan = me.calibrate_release(mechanism, target_epsilon=1.0, delta=1e-5, m=2500, feature_dim=100, n_classes=10)
    assert bc.audit_embedding(plan, certified_epsilon=plan.epsilon(), seed=0).passed

    def noise_off(batches, p, *, generator):
        return me.release(batches, dataclasses.replace(p, sigma=1e-12), generator=generator)
    assert not bc.audit_embedding(plan, certified_epsilon=plan.epsilon(), seed=0, release=noise_off).passed
    with pytest.raises(bc.AuditError, match="canaries among"):
        bc.audit_embedding(dataclasses.replace(plan, m=500), certified_epsilon=1.0, m=500)


@pytest.mark.parametrize("k", [1, 3])
def test_privimage_semantic_histogram_passes_and_is_caught_without_its_noise_or_at_half_its_sensitivity(k):
    """PrivImage's query: its canaries vote for k semantics of their own; noise of std sigma (the sensitivity of
    k = 1 when the line says k = 3) or none at all is caught."""
    from pipeline.privacy import semantic_histogram as sh

    plan = sh.calibrate(target_epsilon=1.0, delta=DELTA, k=k)
    assert bc.audit_semantic_histogram(plan, certified_epsilon=plan.epsilon(), seed=0).passed
    loud = sh.calibrate(target_epsilon=10.0, delta=DELTA, k=k)  # at eps 10 the canaries show through
    assert bc.audit_semantic_histogram(loud, certified_epsilon=loud.epsilon(), seed=0).bound.epsilon_lb > 0.5

    def noise_off(counts, p, *, generator):
        return counts
    assert not bc.audit_semantic_histogram(plan, certified_epsilon=plan.epsilon(), seed=0, histogram=noise_off).passed

    def half_sensitivity(counts, p, *, generator):  # noise for sensitivity sqrt(k)/4: a quarter of the std
        return sh.noisy_histogram(counts, dataclasses.replace(p, sigma=p.sigma / 4), generator=generator)
    assert not bc.audit_semantic_histogram(plan, certified_epsilon=plan.epsilon(), seed=0,
                                           histogram=half_sensitivity).passed

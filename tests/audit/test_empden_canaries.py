"""The one-run canary audit of EMPDEN's sampling-time blocks: a correct sampler passes, a broken one is caught.

The positive controls make the audit worth running: the same private step with its noise switched
off, or with the clip skipped (each record's term at its raw, unclipped size), must show an eps_lb
above the eps the block's line certifies.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from pipeline.audit import empden_canaries as ec
from pipeline.audit.one_run import AuditError
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.diffusion.steps import eq1_step
from pipeline.privacy import accountants as acc
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.empden_block import EmpdenBlock

DELTA = 1e-5
#: the embedded grid's shape, scaled down: n 500 records, B 40, 200 outputs, a 39-step EDM grid; with
#: C = 5 and k = 24 private steps (down to t = 0.69) each scheme certifies eps ~ 1.3 at delta 1e-5
SCHEDULE = EDMSchedule(N=39)


def block(scheme: str = "per_output", *, C: float = 5.0, k: int = 24, N_out: int = 200) -> EmpdenBlock:
    n = 500
    return EmpdenBlock(schedule=SCHEDULE, k=k, C=C, beta=1.0, B=n if scheme == "full_batch" else 40, n=n,
                       N_out=N_out, scheme=scheme)


@functools.cache
def certified(scheme: str) -> float:
    b = block(scheme)
    if scheme == "full_batch":
        return acc.gdp_epsilon(DELTA, acc.gdp_mu_of_event(b.event))
    return acc.pld_epsilon(b.event, DELTA, settings=acc.PLDSettings(value_discretization_interval=1e-4))


def noise_off(x, data, t, t_next, *, C, beta, subset=None, generator=None, log_normaliser=None):
    """The bug "the mechanism's noise was dropped": eq. 1 with eps = 0."""
    e_hat = emp.clipped_empirical_denoiser(x, data, t, C=C, beta=beta, subset=subset, log_normaliser=log_normaliser)
    return eq1_step(x, e_hat, t, t_next, torch.zeros_like(x))


def clip_skipped(x, data, t, t_next, *, C, beta, subset=None, generator=None, log_normaliser=None):
    """The bug "the clip was skipped": every record adds its own x0 (10 C for a canary), not <= C."""
    return emp.private_step(x, data, t, t_next, C=10.0 * C, beta=beta, subset=subset, generator=generator,
                            log_normaliser=log_normaliser)


@pytest.mark.parametrize("scheme", ["per_output", "per_step", "full_batch"])
def test_a_correct_sampler_is_not_refuted(scheme):
    eps = certified(scheme)
    audit = ec.audit_block(block(scheme), certified_epsilon=eps, delta=DELTA, m=500, seed=0)
    assert 0.5 < eps < 2 and audit.passed and audit.bound.epsilon_lb <= eps
    assert audit.steps == 24 and audit.bound.m == 500


@pytest.mark.parametrize("scheme", ["per_output", "per_step", "full_batch"])
def test_noise_switched_off_is_caught(scheme):
    eps = certified(scheme)
    audit = ec.audit_block(block(scheme), certified_epsilon=eps, delta=DELTA, m=500, seed=0, step=noise_off)
    assert not audit.passed and audit.bound.epsilon_lb > 2 * eps


def test_a_skipped_clip_is_caught():
    eps = certified("per_output")
    audit = ec.audit_block(block(), certified_epsilon=eps, delta=DELTA, m=500, seed=0, step=clip_skipped)
    assert not audit.passed


def test_a_strong_claim_shows_in_the_scores():
    """At eps ~ 11 (C = 20) the included canaries' scores stand apart: the scoring sees the signal."""
    b = block(C=20.0)
    audit = ec.audit_block(b, certified_epsilon=11.0, delta=DELTA, m=1000, seed=0)
    assert audit.passed and audit.bound.epsilon_lb > 0.1
    assert audit.in_scores.mean() > audit.out_scores.mean() + 0.2 * audit.out_scores.std()


def test_every_included_canary_adds_exactly_its_clipped_term():
    """Noise off, full batch, one output, one step: canary j's score is C / (beta n_actual) / s_t^2."""
    b = block("full_batch", C=1.0, k=1, N_out=1)
    audit = ec.audit_block(b, certified_epsilon=1e9, delta=DELTA, m=50, seed=4, step=noise_off)
    t, t_next = SCHEDULE.times()[:2]
    n_actual = b.n + audit.bound.n_in
    expected = b.C / (b.beta * n_actual) / emp.mechanism_noise_std(t, t_next) ** 2
    np.testing.assert_allclose(audit.in_scores, expected, rtol=1e-6)
    np.testing.assert_allclose(audit.out_scores, 0.0, atol=1e-9 * expected)


def test_the_audit_is_reproducible_and_refuses_what_it_cannot_run():
    a = ec.audit_block(block(N_out=20), certified_epsilon=1.0, delta=DELTA, m=100, seed=5)
    b = ec.audit_block(block(N_out=20), certified_epsilon=1.0, delta=DELTA, m=100, seed=5)
    np.testing.assert_array_equal(a.in_scores, b.in_scores)
    with pytest.raises(AuditError, match="canaries m"):
        ec.audit_block(block(), certified_epsilon=1.0, delta=DELTA, m=1)
    with pytest.raises(AuditError, match="0 private steps"):
        ec.audit_block(block(k=0), certified_epsilon=1.0, delta=DELTA, m=10)

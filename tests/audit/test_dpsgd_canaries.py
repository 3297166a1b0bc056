"""The one-run canary audit of the DP-SGD engine: a correct engine passes, a broken one is caught.

The positive controls are what make the audit worth running: the same engine with its noise
switched off, with the per-example clip skipped, or sampling five times more records than
the plan says, must show an eps_lb above the eps its plan would have certified.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from pipeline.audit import dpsgd_canaries as dc
from pipeline.audit.one_run import AuditError
from pipeline.privacy import dpsgd, tha

DELTA = 1e-5


@functools.cache  # one calibration per (eps, T) for the module
def dpdm_like_plan(eps: float, steps: int = 79) -> dpsgd.DPSGDPlan:
    """The embedded DPDM run's shape: N 2,500, expected batch 64, C 1, T 79, Poisson."""
    return dpsgd.plan_for_budget(target_epsilon=eps, delta=DELTA, max_grad_norm=1.0, batch_size=64,
                                 dataset_size=2500, steps=steps)


@dataclasses.dataclass(frozen=True)
class NoiseOff(dpsgd.DPSGDPlan):
    """The bug "the noise term was dropped": every step adds nothing."""

    def noise_std_at(self, step: int) -> float:
        return 0.0


def noise_off(plan: dpsgd.DPSGDPlan) -> NoiseOff:
    return NoiseOff(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})


class OverSampling(dpsgd.DPSGD):
    """The bug "the sampler touches more records than the ledger says": rate 5 q."""

    def sample(self) -> torch.Tensor:
        return dpsgd.poisson_sample(self.plan.dataset_size, min(1.0, 5 * self.plan.sampling_rate), self.generator)


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_a_correct_engine_is_not_refuted(eps):
    plan = dpdm_like_plan(eps)
    audit = dc.audit_plan(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0)
    assert audit.passed and 0 <= audit.bound.epsilon_lb <= plan.epsilon()
    assert audit.in_scores.mean() > audit.out_scores.mean()  # the canaries carry a signal at all


def test_a_tha_plan_with_per_bucket_clips_is_audited_through_the_same_engine():
    plan = tha.THAPlan(edges=(0.3, 0.5, 0.7, 0.85, 1.0), clips=(0.5, 0.8, 1.2, 1.5), noise_std=1.0,
                       sampling_rate=64 / 2500, dataset_size=2500, steps=60, delta=DELTA, beta=0.5)
    audit = dc.audit_plan(plan, certified_epsilon=plan.epsilon(), m=1000, seed=1)
    assert audit.passed and audit.canary_norm == pytest.approx(10 * 1.5)


def test_noise_switched_off_is_caught():
    plan = dpdm_like_plan(1.0)
    audit = dc.audit_plan(noise_off(plan), certified_epsilon=plan.epsilon(), m=1000, seed=0)
    assert not audit.passed and audit.bound.epsilon_lb > 3 * plan.epsilon()


def test_a_skipped_per_example_clip_is_caught(monkeypatch):
    plan = dpdm_like_plan(1.0)

    def sum_without_clipping(grads, max_grad_norm):
        return {k: g.sum(0) for k, g in grads.items()}, torch.zeros(next(iter(grads.values())).shape[0])

    monkeypatch.setattr(dpsgd, "clip_and_sum", sum_without_clipping)
    audit = dc.audit_plan(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0)
    assert not audit.passed


def test_sampling_more_than_declared_is_caught():
    plan = dpdm_like_plan(1.0)
    audit = dc.audit_plan(plan, certified_epsilon=plan.epsilon(), m=1000, seed=0, engine_factory=OverSampling)
    assert not audit.passed


def test_only_poisson_plans_and_enough_canaries():
    fixed = dpsgd.DPSGDPlan(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=0.1, dataset_size=500,
                            steps=10, delta=DELTA, sampling="fixed_size")
    with pytest.raises(AuditError, match="Poisson"):
        dc.audit_plan(fixed, certified_epsilon=1.0)
    with pytest.raises(AuditError, match="canaries"):
        dc.audit_plan(dpdm_like_plan(1.0), certified_epsilon=1.0, m=1)


def test_the_audit_is_reproducible_and_keeps_the_plans_mechanism():
    plan = dataclasses.replace(dpdm_like_plan(1.0), steps=20)
    a, b = (dc.audit_plan(plan, certified_epsilon=plan.epsilon(), m=200, seed=5) for _ in range(2))
    assert (a.in_scores == b.in_scores).all() and a.bound == b.bound
    bigger = dc.with_dataset_size(plan, 2600)
    assert bigger.epsilon() == plan.epsilon() and bigger.sampling_rate == plan.sampling_rate

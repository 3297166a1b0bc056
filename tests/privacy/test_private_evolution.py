"""Private Evolution's vote histogram (Lin et al. 2024, Alg. 2): votes by brute force, sensitivity 1
under add-or-remove-one (checked on neighbours), the noise and threshold, the T-fold accounting and
its ledger line. Each check comes with the mutation it must catch."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger, rebuild
from pipeline.privacy import private_evolution as pe
from pipeline.privacy.replay import audit

COARSE = acc.PLDSettings(1e-3)


def data(seed, n=12, k=6, e=3, Y=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((n, e), generator=g, dtype=torch.float64), torch.randint(0, Y, (n,), generator=g),
            torch.randn((k, e), generator=g, dtype=torch.float64), torch.arange(k) % Y)


def test_each_record_votes_for_its_nearest_candidate_of_its_own_class():
    x, y, c, cy = data(0)
    votes = pe.nn_votes(x, y, c, cy)
    for i in range(len(x)):
        same = [j for j in range(len(c)) if cy[j] == y[i]]
        best = min(same, key=lambda j: float((x[i] - c[j]).norm()))
        assert votes[i] == best


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 20))
def test_adding_or_removing_one_record_moves_the_histogram_by_exactly_one(seed, n):
    x, y, c, cy = data(seed, n=n + 1)
    full = pe.vote_histogram(pe.nn_votes(x, y, c, cy), len(c))
    for i in range(n + 1):
        keep = torch.arange(n + 1) != i
        without = pe.vote_histogram(pe.nn_votes(x[keep], y[keep], c, cy), len(c))
        assert np.linalg.norm(full - without) == pytest.approx(pe.SENSITIVITY)


def test_a_record_never_votes_twice():
    """The detector: a histogram that counted a record in two bins would have sensitivity sqrt 2."""
    x, y, c, cy = data(1)
    assert pe.vote_histogram(pe.nn_votes(x, y, c, cy), len(c)).sum() == len(x)


def test_noise_has_std_sigma_and_the_threshold_clamps_at_zero():
    plan = pe.PEHistogramPlan(sigma=3.0, T=2, delta=1e-5)
    counts = np.full(20_000, 5.0)
    noisy = pe.noisy_histogram(counts, plan, threshold=0.0, generator=np.random.default_rng(0))
    kept = noisy[noisy > 0]
    assert (noisy >= 0).all()
    # below the clamp the noise is N(5, 9): its upper half is untouched by max(., 0)
    assert np.std(noisy[noisy > 5] - 5) == pytest.approx(3.0 * math.sqrt(1 - 2 / math.pi), rel=0.05)
    assert len(kept) < len(counts)  # noise switched off would keep every bin at 5
    thresholded = pe.noisy_histogram(counts, plan, threshold=4.0, generator=np.random.default_rng(0))
    np.testing.assert_allclose(thresholded, np.maximum(noisy - 4.0, 0.0))


@pytest.mark.parametrize("T", [1, 4])
def test_calibration_meets_the_target_for_t_releases(T):
    plan = pe.calibrate(target_epsilon=2.0, delta=1e-5, T=T, settings=COARSE)
    assert plan.epsilon(COARSE) <= 2.0
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dp_event.GaussianDpEvent(plan.sigma), T)
    assert ref.get_epsilon(1e-5) <= 2.0 + 1e-9
    # T Gaussians of sigma are exactly sqrt(T)/sigma-GDP: the certified eps is at or just above that
    # (1e-9: the two sides are computed by different float routines; a real shortfall is far larger)
    exact = acc.gdp_epsilon(1e-5, math.sqrt(T) / plan.sigma)
    assert exact * (1 - 1e-9) <= plan.epsilon(COARSE) <= exact * 1.01


def test_ledger_line_replays_and_a_smaller_t_is_refused(tmp_path):
    plan = pe.calibrate(target_epsilon=1.0, delta=1e-5, T=3, settings=COARSE)
    entry = pe.ledger_entry(plan, stage="private_evolution", config_id="t", seed=0, settings=COARSE)
    assert entry.count == 3 and entry.adjacency == "add_or_remove_one"
    path = tmp_path / "l.jsonl"
    ledger.append_entry(path, entry)
    results, _ = audit({"pe": path}, {"pe": 1})
    assert results[0]["ok"]
    fewer = dataclasses.replace(entry, event=ledger.event_to_dict(pe.histogram_event(plan.sigma, 1)), count=1)
    with pytest.raises(rebuild.RebuildError):
        rebuild.check(fewer)


def test_votes_need_a_candidate_of_every_private_class():
    x, y, c, cy = data(2)
    with pytest.raises(pe.PEError, match="no synthetic candidate"):
        pe.nn_votes(x, torch.full_like(y, 5), c, cy)

"""DP-MERF's release (Harder et al. 2021): unit-norm features, sensitivity 2/m by brute force,
the noise it adds, its certified eps and its ledger line. Each privacy check comes with the
mutation it must catch (a halved sensitivity, the noise switched off, an edited event)."""

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
from pipeline.privacy import dp_merf as merf
from pipeline.privacy import ledger, rebuild
from pipeline.privacy.replay import ReplayError, audit

COARSE = acc.PLDSettings(1e-3)


def features(x, D=64, length_scale=1.0, seed=0):
    W = merf.rff_frequencies(x.shape[1], D, length_scale, torch.Generator().manual_seed(seed))
    return merf.rff_features(x, W)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.floats(0.05, 50.0), st.integers(0, 10_000))
def test_every_feature_row_has_norm_exactly_one(dim, length_scale, seed):
    x = torch.randn((7, dim), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 5
    phi = features(x, D=16, length_scale=length_scale, seed=seed)
    assert torch.allclose(phi.norm(dim=1), torch.ones(7, dtype=torch.float64), atol=1e-12)


def test_features_approximate_the_gaussian_kernel():
    x = torch.randn((20, 5), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    phi = features(x, D=20_000, length_scale=2.0)
    k = torch.exp(-torch.cdist(x, x) ** 2 / (2 * 2.0 ** 2))
    assert torch.allclose(phi @ phi.T, k, atol=0.03)


def brute_force_sensitivity(x, y, candidates, cand_labels, n_classes, D=32):
    """max over every record i and every replacement c of ||mu(D) - mu(D with x_i := c)||_F."""
    W = merf.rff_frequencies(x.shape[1], D, 1.0, torch.Generator().manual_seed(0))
    base = merf.mean_embedding(merf.rff_features(x, W), y, n_classes)
    worst = 0.0
    for i in range(len(x)):
        for c, yc in zip(candidates, cand_labels):
            x2, y2 = x.clone(), y.clone()
            x2[i], y2[i] = c, yc
            diff = merf.mean_embedding(merf.rff_features(x2, W), y2, n_classes) - base
            worst = max(worst, float(diff.norm()))
    return worst


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000))
def test_declared_sensitivity_bounds_every_replace_one_neighbour(m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, 3), generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (m,), generator=g)
    cands = torch.randn((6, 3), generator=g, dtype=torch.float64) * 3
    worst = brute_force_sensitivity(x, y, cands, torch.arange(6) % 3, 3)
    assert worst <= merf.embedding_sensitivity(m) + 1e-12


def test_a_halved_sensitivity_is_caught_by_the_brute_force():
    """A replacement that changes the label moves the embedding by exactly sqrt(2)/m > 1/m."""
    m = 5
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn((m, 3), generator=g, dtype=torch.float64), torch.zeros(m, dtype=torch.long)
    worst = brute_force_sensitivity(x, y, torch.randn((2, 3), generator=g, dtype=torch.float64),
                                    torch.tensor([1, 2]), 3)
    assert worst == pytest.approx(math.sqrt(2) / m, rel=1e-12)
    assert worst > merf.embedding_sensitivity(m) / 2


def plan(sigma=2.0, m=50, D=16, Y=3):
    return merf.MerfReleasePlan(sigma=sigma, m=m, n_features=D, n_classes=Y, delta=1e-5)


def test_release_adds_gaussian_noise_of_std_sigma_times_two_over_m():
    p = plan(sigma=2.0, m=50, D=500, Y=4)
    x = torch.randn((50, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    phi = features(x, D=500)
    y = torch.arange(50) % 4
    noisy = merf.release(phi, y, p, generator=torch.Generator().manual_seed(1))
    noise = noisy - merf.mean_embedding(phi, y, 4)
    assert float(noise.std()) == pytest.approx(2.0 * 2 / 50, rel=0.05)  # 4000 entries
    assert abs(float(noise.mean())) < 3 * 0.08 / math.sqrt(noise.numel())
    # the detector: the noise switched off (sigma -> 0) would fail the first assertion
    assert float(noise.std()) > 0.5 * p.noise_std


def test_release_refuses_features_that_are_not_unit_norm():
    p = plan(m=4, D=2)
    with pytest.raises(merf.MerfError, match="norm 1"):
        merf.release(torch.full((4, 4), 0.9, dtype=torch.float64), torch.zeros(4, dtype=torch.long), p,
                     generator=torch.Generator())


def test_calibration_meets_the_target_and_matches_dp_accountings_own_pld():
    p = merf.calibrate_release(target_epsilon=1.0, delta=1e-5, m=100, n_features=8, n_classes=2, settings=COARSE)
    eps = p.epsilon(COARSE)
    assert eps <= 1.0 and eps > 0.99
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_event.GaussianDpEvent(p.sigma))
    assert pld.get_epsilon(1e-5) <= 1.0 + 1e-9
    # the exact GDP eps of one Gaussian (1/sigma) is below the certified PLD eps, and close
    exact = acc.gdp_epsilon(1e-5, 1 / p.sigma)
    assert exact * (1 - 1e-9) <= eps <= exact * 1.01


def test_ledger_line_replays_and_an_edited_sigma_is_refused(tmp_path):
    p = merf.calibrate_release(target_epsilon=3.0, delta=1e-5, m=100, n_features=8, n_classes=2, settings=COARSE)
    entry = merf.ledger_entry(p, stage="dp_merf", config_id="t", seed=0, settings=COARSE)
    assert entry.adjacency == "replace_one" and entry.sensitivity == pytest.approx(0.02)
    path = tmp_path / "l.jsonl"
    ledger.append_entry(path, entry)
    results, _ = audit({"merf": path}, {"merf": 1})
    assert results[0]["ok"] and results[0]["recomputed_epsilon"] <= 3.0
    weaker = dataclasses.replace(entry, event=ledger.event_to_dict(dp_event.GaussianDpEvent(2 * p.sigma)),
                                 noise_std=2 * p.noise_std, noise_multiplier=2 * p.sigma)
    with pytest.raises(rebuild.RebuildError):
        rebuild.check(weaker)
    bad = tmp_path / "bad.jsonl"
    ledger.append_entry(bad, dataclasses.replace(entry, claimed_epsilon=entry.claimed_epsilon / 2))
    with pytest.raises(ReplayError, match="claimed eps"):
        audit({"merf": bad}, {"merf": 1})


@pytest.mark.parametrize("bad", [{"sigma": 0.0}, {"m": 0}, {"n_features": 0}, {"delta": 1.0}])
def test_bad_plans_are_one_line_errors(bad):
    args = {"sigma": 1.0, "m": 10, "n_features": 4, "n_classes": 2, "delta": 1e-5, **bad}
    with pytest.raises(merf.MerfError):
        merf.MerfReleasePlan(**args)

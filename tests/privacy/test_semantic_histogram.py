"""PrivImage's semantic query (Li et al. 2024, Sec. 3.2): the class-by-semantics counts have L2 sensitivity sqrt(k)
under add-or-remove-one and sqrt(2k) under replace-one (brute force over neighbours), the release adds noise of std
sqrt(k) sigma, its eps matches dp_accounting and the Gaussian's closed form, its line replays, and a DP-SGD run
composed with it is calibrated to the composition. Each check comes with the mutation it must catch."""

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
from scipy.stats import norm

from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd_plan, ledger, rebuild
from pipeline.privacy import semantic_histogram as sh
from pipeline.privacy.replay import audit

COARSE = acc.PLDSettings(1e-3)


def records(seed: int, n: int, k: int, S: int = 7, C: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """n private records' top-k votes (from random semantic scores) and labels."""
    g = torch.Generator().manual_seed(seed)
    votes = sh.top_k_semantics(torch.randn((n, S), generator=g), k).numpy()
    return votes, torch.randint(0, C, (n,), generator=g).numpy()


def counts(votes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return sh.semantic_counts(votes, labels, n_classes=3, n_semantics=7)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(1, 4))
def test_adding_or_removing_one_record_moves_the_counts_by_exactly_sqrt_k(seed, n, k):
    votes, labels = records(seed, n + 1, k)
    full = counts(votes, labels)
    for i in range(n + 1):
        keep = np.arange(n + 1) != i
        assert np.linalg.norm(full - counts(votes[keep], labels[keep])) == pytest.approx(sh.sensitivity(k))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4))
def test_replacing_one_record_moves_the_counts_by_at_most_sqrt_2k_and_can_reach_it(seed, k):
    votes, labels = records(seed, 6, k)
    other_votes, other_labels = records(seed + 1, 6, k)
    full, worst = counts(votes, labels), 0.0
    for i in range(6):
        for j in range(6):
            v, y = votes.copy(), labels.copy()
            v[i], y[i] = other_votes[j], other_labels[j]
            worst = max(worst, float(np.linalg.norm(full - counts(v, y))))
    assert worst <= math.sqrt(2 * k) + 1e-12
    # a record moved to another class row, disjoint cells: the bound is attained
    v, y = votes.copy(), labels.copy()
    y[0] = (labels[0] + 1) % 3
    assert np.linalg.norm(full - counts(v, y)) == pytest.approx(math.sqrt(2 * k))


def test_a_record_voting_twice_for_one_semantic_is_refused():
    """The detector: a repeated vote moves one cell by 2 (sensitivity 2 > sqrt 2 for k = 2)."""
    with pytest.raises(sh.SemanticQueryError, match="distinct"):
        sh.semantic_counts(np.array([[1, 1]]), np.array([0]), n_classes=2, n_semantics=3)


def test_labels_outside_the_declared_classes_are_refused():
    with pytest.raises(sh.SemanticQueryError, match="declared 2 classes"):
        sh.semantic_counts(np.array([[0]]), np.array([2]), n_classes=2, n_semantics=3)


def test_each_record_adds_k_votes_in_its_own_class_row():
    votes, labels = records(3, 50, 2)
    H = counts(votes, labels)
    assert H.sum() == 100
    for c in range(3):
        assert H[c].sum() == 2 * (labels == c).sum()


@pytest.mark.parametrize("k", [1, 3])
def test_noise_has_std_sqrt_k_sigma(k):
    plan = sh.SemanticQueryPlan(sigma=2.0, k=k, delta=1e-5)
    clean = np.full((10, 5_000), 7.0)
    noisy = sh.noisy_histogram(clean, plan, generator=np.random.default_rng(0))
    # halving the sensitivity (std sigma instead of sqrt(k) sigma at k = 3) or switching the noise off fails this
    assert np.std(noisy - clean) == pytest.approx(2.0 * math.sqrt(k), rel=0.02)
    assert plan.noise_std == pytest.approx(2.0 * math.sqrt(k))


def test_certified_eps_matches_dp_accounting_and_the_gaussian_closed_form():
    plan = sh.calibrate(target_epsilon=0.5, delta=1e-5, k=2, settings=COARSE)
    assert plan.epsilon(COARSE) <= 0.5
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dp_event.GaussianDpEvent(plan.sigma))
    assert ref.get_epsilon(1e-5) <= 0.5 + 1e-9
    # Balle & Wang 2018, Thm 8: the exact delta(eps) of a Gaussian of multiplier sigma (mu = 1/sigma)
    mu, eps = 1 / plan.sigma, plan.epsilon(COARSE)
    exact_delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert exact_delta <= 1e-5
    assert eps <= acc.gdp_epsilon(1e-5, mu) * 1.01  # tight: within 1% of the exact eps


def test_the_line_replays_and_an_edited_k_is_refused(tmp_path):
    plan = sh.calibrate(target_epsilon=0.1, delta=1e-5, k=2, settings=COARSE)
    entry = sh.ledger_entry(plan, stage="privimage_select", config_id="t", seed=0, settings=COARSE)
    assert entry.adjacency == "add_or_remove_one" and entry.count == 1
    assert entry.sensitivity == pytest.approx(math.sqrt(2)) and entry.noise_multiplier == pytest.approx(plan.sigma)
    path = tmp_path / "l.jsonl"
    ledger.append_entry(path, entry)
    results, _ = audit({"q": path}, {"q": 1})
    assert results[0]["ok"]
    # k = 4 on the line with the noise of k = 2: the declared sensitivity no longer matches the noise
    with pytest.raises(rebuild.RebuildError):
        rebuild.check(dataclasses.replace(entry, extra={**entry.extra, "k": 4}))


def test_each_class_keeps_its_k_largest_noisy_semantics():
    noisy = np.array([[5.0, 9.0, 1.0, 0.0], [0.0, 3.0, 8.0, 2.0]])
    assert sh.select_semantics(noisy, 2).tolist() == [[1, 0], [2, 1]]


def test_dpsgd_calibrated_with_a_prior_release_meets_the_target_for_the_composition():
    query = sh.calibrate(target_epsilon=0.1, delta=1e-5, k=1, settings=COARSE)
    kw = dict(target_epsilon=1.0, delta=1e-5, sampling_rate=0.05, steps=40, settings=COARSE)
    alone = dpsgd_plan.calibrate_noise_multiplier(**kw)
    sigma = dpsgd_plan.calibrate_noise_multiplier(**kw, prior=[query.event()])
    assert sigma > alone  # the query's share is paid by DP-SGD
    plan = dpsgd_plan.DPSGDPlan(noise_multiplier=sigma, max_grad_norm=1.0, sampling_rate=0.05, dataset_size=1000,
                                steps=40, delta=1e-5)
    composed = dpsgd_plan.composed_epsilon([query.event()], plan, settings=COARSE)
    assert composed <= 1.0
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dp_event.ComposedDpEvent([query.event(), plan.event()]))
    assert ref.get_epsilon(1e-5) <= 1.0 + 1e-6
    # DP-SGD calibrated alone, then composed with the query, would overspend: the prior is not ignored
    naive = dataclasses.replace(plan, noise_multiplier=alone)
    assert dpsgd_plan.composed_epsilon([query.event()], naive, settings=COARSE) > 1.0

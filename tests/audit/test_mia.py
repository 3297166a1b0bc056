"""Membership attacks: they find a memorising model, see nothing in a model that ignores its data, read a
flow as a denoiser exactly, and the ROC check refutes a claim only when the data contradict it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from sklearn.metrics import roc_auc_score

from pipeline.audit import mia
from pipeline.flow.rectified import x_t_from


def auc(ins, outs):
    return roc_auc_score(np.r_[np.ones(len(ins)), np.zeros(len(outs))], np.r_[ins, outs])


class Memoriser(torch.nn.Module):
    """The ideal denoiser of the empirical distribution of ``members`` (a model that memorised them)."""

    convention = "ve_sigma"

    def __init__(self, members: torch.Tensor) -> None:
        super().__init__()
        self.members = members

    def forward(self, x, sigma, class_labels=None):
        d2 = ((x[:, None] - self.members[None]) ** 2).flatten(2).sum(-1)  # [B, n]
        w = torch.softmax(-d2 / (2 * sigma.view(-1, 1) ** 2), dim=1)
        return torch.einsum("bn,nchw->bchw", w, self.members)


class Shrink(torch.nn.Module):
    """D(x; sigma) = x / (1 + sigma^2): the ideal denoiser of N(0, I) data, which knows no record."""

    convention = "ve_sigma"

    def forward(self, x, sigma, class_labels=None):
        return x / (1 + sigma.view(-1, 1, 1, 1) ** 2)


@pytest.fixture(scope="module")
def records():
    g = torch.Generator().manual_seed(0)
    members, nonmembers = torch.randn(60, 1, 4, 4, generator=g), torch.randn(60, 1, 4, 4, generator=g)
    return members, nonmembers


def test_the_loss_attack_finds_a_memorising_model_and_nothing_in_one_that_ignores_the_data(records):
    members, nonmembers = records
    memo, shrink = mia.ve_denoiser(Memoriser(members)), mia.ve_denoiser(Shrink())
    ins, outs = (mia.loss_scores(memo, x, None, 0.5, draws=4, seed=1) for x in (members, nonmembers))
    assert auc(ins, outs) > 0.95
    ins, outs = (mia.loss_scores(shrink, x, None, 0.5, draws=4, seed=1) for x in (members, nonmembers))
    assert 0.35 < auc(ins, outs) < 0.65


def test_secmi_t_error_finds_a_memorising_model_and_nothing_in_one_that_ignores_the_data(records):
    members, nonmembers = records
    grid = np.geomspace(0.002, 80, 40)
    stops = [(0.3, 0.5), (1.0, 1.5)]
    memo = mia.ve_denoiser(Memoriser(members))
    for ins, outs in zip(*(mia.secmi_scores(memo, x, None, stops, inversion_grid=grid) for x in (members, nonmembers))):
        assert auc(ins, outs) > 0.9
    shrink = mia.ve_denoiser(Shrink())
    for ins, outs in zip(*(mia.secmi_scores(shrink, x, None, stops, inversion_grid=grid)
                           for x in (members, nonmembers))):
        assert 0.35 < auc(ins, outs) < 0.65


def test_the_ddim_step_is_the_probability_flow_euler_step():
    x, sigma_a, sigma_b = torch.randn(3, 1, 2, 2), 0.7, 1.3
    d = Shrink()(x, torch.full((3,), sigma_a))
    euler = x + (sigma_b - sigma_a) * (x - d) / sigma_a  # dx/dsigma = (x - D) / sigma (Karras et al. eq. 4)
    torch.testing.assert_close(mia._ddim(mia.ve_denoiser(Shrink()), x, sigma_a, sigma_b, None), euler)


def test_a_flow_reads_as_a_ve_denoiser_exactly():
    """For the exact velocity of one data point y, D(y + sigma n; sigma) must return y for every sigma."""
    y = torch.randn(1, 1, 3, 3)

    class OnePointFlow(torch.nn.Module):
        convention = "rectified_flow_t"

        def forward(self, x_t, t, class_labels=None):  # v = (y - x_t) / (1 - t) on x_t = (1 - t) n + t y
            return (y - x_t) / (1 - t).view(-1, 1, 1, 1)

    denoise = mia.ve_denoiser(OnePointFlow())
    n = torch.randn(4, 1, 3, 3)
    sigma = torch.tensor([0.01, 0.5, 2.0, 30.0])
    torch.testing.assert_close(denoise(y + sigma.view(-1, 1, 1, 1) * n, sigma, None), y.expand(4, -1, -1, -1))
    # and the ve input is the flow's x_t divided by t (STRAIGHTDP eq. 1)
    t = 1 / (1 + sigma)
    torch.testing.assert_close(x_t_from(y.expand(4, -1, -1, -1), n, t) / t.view(-1, 1, 1, 1),
                               y + sigma.view(-1, 1, 1, 1) * n)


def test_a_model_of_unknown_convention_is_refused():
    class Odd(torch.nn.Module):
        convention = "score"

    with pytest.raises(ValueError, match="convention 'score'"):
        mia.ve_denoiser(Odd())


def test_roc_points_count_scores_at_or_above_each_threshold():
    fpr, tpr, thr = mia.roc_points(np.array([3.0, 2.0, 2.0]), np.array([2.0, 1.0]))
    assert thr.tolist() == [3.0, 2.0, 1.0]
    assert tpr.tolist() == pytest.approx([1 / 3, 1.0, 1.0]) and fpr.tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_attack_accuracy_is_the_best_balanced_accuracy():
    assert mia.attack_accuracy(np.array([3.0, 2.0]), np.array([1.0, 0.0])) == 1.0
    assert mia.attack_accuracy(np.array([3.0, 0.5]), np.array([1.0, 0.0])) == 0.75
    assert mia.attack_accuracy(np.array([0.0, 0.0]), np.array([1.0, 1.0])) == 0.5


@pytest.mark.parametrize("k,n", [(0, 20), (7, 20), (20, 20), (130, 500)])
def test_clopper_pearson_matches_scipy(k, n):
    ci = binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
    lo, hi = mia.clopper_pearson(k, n, 0.9)
    assert (float(lo), float(hi)) == pytest.approx((ci.low, ci.high), abs=1e-9)


def randomised_response(eps: float, n: int, rng: np.random.Generator):
    """Scores of an exactly eps-DP membership bit: truthful with probability e^eps / (1 + e^eps)."""
    p = math.exp(eps) / (1 + math.exp(eps))
    return (rng.random(n) < p).astype(float), (rng.random(n) >= p).astype(float)


def test_the_roc_check_holds_for_an_eps_dp_mechanism_and_refutes_a_smaller_claim():
    rng = np.random.default_rng(0)
    ins, outs = randomised_response(1.0, 4000, rng)
    assert mia.curve_excess(ins, outs, epsilon=1.0, delta=1e-5).under_curve
    refuted = mia.curve_excess(ins, outs, epsilon=0.5, delta=1e-5)
    assert not refuted.under_curve and refuted.max_excess > 0.05


def test_the_roc_check_does_not_refute_on_sampling_noise_alone():
    """Members and non-members from the same distribution (eps = 0 truth) at 250 each, the audit's size."""
    rng = np.random.default_rng(1)
    verdicts = [mia.curve_excess(rng.normal(size=250), rng.normal(size=250), epsilon=0.05, delta=1e-5)
                for _ in range(20)]
    assert all(v.under_curve for v in verdicts)
    assert max(v.max_excess for v in verdicts) > 0  # the raw points do poke above the curve: the intervals matter


@pytest.mark.parametrize("eps_true,n", [(1.0, 4000), (0.3, 250), (2.0, 800)])
def test_refutable_epsilon_is_where_the_roc_check_changes_its_verdict(eps_true, n):
    """Brute force: on a grid of claims the ROC check refutes exactly those below eps_refutable."""
    rng = np.random.default_rng(int(eps_true * 10) + n)
    ins, outs = randomised_response(eps_true, n, rng)
    e_star = mia.refutable_epsilon(ins, outs, delta=1e-5)
    grid = np.linspace(0, 3, 601)
    refuted = np.array([not mia.curve_excess(ins, outs, epsilon=e, delta=1e-5).under_curve for e in grid])
    away = np.abs(grid - e_star) > 1e-9
    assert np.array_equal(refuted[away], (grid < e_star)[away])
    if e_star > 0:  # just below it is refuted, at it not: the sign of the significant excess changes there
        assert mia.curve_excess(ins, outs, epsilon=e_star * (1 - 1e-6), delta=1e-5).significant_excess > 0
        assert mia.curve_excess(ins, outs, epsilon=e_star, delta=1e-5).significant_excess == pytest.approx(0,
                                                                                                           abs=1e-12)


def test_refutable_epsilon_is_below_the_truth_and_reaches_it_with_many_records():
    """Randomised response at eps sits on the eps-DP region's boundary: an honest audit never refutes eps itself,
    and with 200,000 records per side its power reaches within 0.03 of eps."""
    rng = np.random.default_rng(3)
    small = mia.refutable_epsilon(*randomised_response(1.0, 4000, rng), delta=0.0)
    large = mia.refutable_epsilon(*randomised_response(1.0, 200_000, rng), delta=0.0)
    assert 0.5 < small < large <= 1.0 and large > 0.97


@pytest.mark.parametrize("eps,delta", [(0.3, 1e-5), (1.0, 0.0), (2.5, 1e-3)])
def test_a_point_on_the_regions_boundary_gives_its_eps(eps, delta):
    """Points on the boundary of the (eps, delta)-DP region, on TPR = e^eps FPR + delta (low FPR) or on its mirror
    1 - FPR = e^eps (1 - TPR) + delta (high TPR), cross at exactly that eps."""
    fpr = np.array([0.001, 0.01, 0.05])
    on_line = np.exp(eps) * fpr + delta
    assert mia.crossing_epsilon(on_line, fpr, delta) == pytest.approx(eps, rel=1e-12)
    tpr = np.array([0.95, 0.99])
    mirrored_fpr = 1 - (np.exp(eps) * (1 - tpr) + delta)
    assert mia.crossing_epsilon(tpr, mirrored_fpr, delta) == pytest.approx(eps, rel=1e-12)
    # inside the region (below the line) crosses below eps; a point below the diagonal refutes nothing
    assert mia.crossing_epsilon(on_line * 0.9, fpr, delta) < eps
    assert mia.crossing_epsilon(np.array([0.1]), np.array([0.3]), delta) == 0.0
    with pytest.raises(ValueError, match="must lie in"):
        mia.crossing_epsilon(np.array([1.2]), np.array([0.1]), delta)


def test_an_attack_on_independent_scores_refutes_nothing():
    """Members and non-members from one distribution, 250 each (the audit's size): eps_refutable is 0."""
    rng = np.random.default_rng(1)
    assert all(mia.refutable_epsilon(rng.normal(size=250), rng.normal(size=250), delta=1e-5) == 0.0
               for _ in range(20))

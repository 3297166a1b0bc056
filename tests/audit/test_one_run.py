"""The attack statistics: a sound and non-vacuous one-run bound, AUROC / TPR at FPR, the DP TPR ceiling.

The one-run bound (Steinke et al. 2023) must hold for a mechanism whose eps is known exactly:
randomised response on each canary's membership bit is eps-DP and no better, so eps_lb may
exceed eps in at most ~5% of independent audits (significance 0.05), and with many canaries it
must come close enough to eps to be worth running.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.audit import one_run
from pipeline.audit.one_run import AuditError


def randomised_response_scores(eps: float, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each canary's bit reported truthfully w.p. e^eps / (1 + e^eps): the score is the (noisy) bit."""
    bits = rng.random(m) < 0.5
    truthful = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    report = np.where(truthful, bits, ~bits).astype(float)
    return report[bits], report[~bits]


def test_the_bound_is_sound_for_an_exactly_eps_dp_mechanism():
    rng = np.random.default_rng(0)
    eps, trials = 1.0, 40
    lbs = [one_run.one_run_epsilon_lb(*randomised_response_scores(eps, 1000, rng), delta=1e-5).epsilon_lb
           for _ in range(trials)]
    assert sum(lb > eps for lb in lbs) <= 5  # at most ~5% above the truth (expected 2 of 40 at worst)


def test_the_bound_is_not_vacuous_with_many_canaries():
    rng = np.random.default_rng(1)
    lb = one_run.one_run_epsilon_lb(*randomised_response_scores(2.0, 5000, rng), delta=1e-5).epsilon_lb
    assert 1.0 < lb <= 2.0


def test_no_signal_gives_no_bound():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=1000)
    assert one_run.one_run_epsilon_lb(scores[:500], scores[500:], delta=1e-5).epsilon_lb == 0.0


def test_perfect_separation_is_capped_by_the_number_of_canaries():
    """All guesses right: the bound grows with m (it can never certify more than m canaries allow)."""
    small = one_run.one_run_epsilon_lb(np.ones(50), np.zeros(50), delta=1e-5).epsilon_lb
    large = one_run.one_run_epsilon_lb(np.ones(500), np.zeros(500), delta=1e-5).epsilon_lb
    assert 1.0 < small < large < 10.0


def test_attack_curve_of_separated_and_of_identical_scores():
    rng = np.random.default_rng(3)
    sep = one_run.attack_curve(rng.normal(10, 1, 500), rng.normal(0, 1, 500), n_bootstrap=50)
    assert sep.auc == pytest.approx(1.0) and sep.tpr_at_fpr[0.01] == pytest.approx(1.0)
    same = one_run.attack_curve(rng.normal(size=2000), rng.normal(size=2000), n_bootstrap=50)
    lo, hi = same.auc_interval
    assert lo < 0.5 < hi and abs(same.auc - 0.5) < 0.05
    assert same.tpr_interval[0.01][0] <= same.tpr_at_fpr[0.01] <= same.tpr_interval[0.01][1]


@pytest.mark.parametrize("eps,delta,fpr,expected", [
    (0.0, 0.0, 0.3, 0.3),                       # no privacy loss: TPR = FPR
    (1.0, 1e-5, 0.01, math.e * 0.01 + 1e-5),    # e^eps FPR + delta
    (5.0, 0.0, 0.5, 1.0),                       # capped at 1
    (2.0, 1e-3, 0.0, 1e-3),                     # FPR 0: only delta
])
def test_tpr_bound_is_e_to_the_eps_fpr_plus_delta(eps, delta, fpr, expected):
    assert one_run.tpr_bound(eps, delta, fpr) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("call", [
    lambda: one_run.one_run_epsilon_lb([1.0], [], delta=1e-5),
    lambda: one_run.one_run_epsilon_lb([1.0], [0.0], delta=0.0),
    lambda: one_run.one_run_epsilon_lb([1.0], [0.0], delta=1e-5, significance=1.0),
    lambda: one_run.one_run_epsilon_lb([float("nan")], [0.0], delta=1e-5),
    lambda: one_run.tpr_bound(-1.0, 0.0, 0.1),
])
def test_bad_input_is_one_clear_error(call):
    with pytest.raises(AuditError):
        call()


def test_the_library_module_is_loaded_without_jax():
    import sys

    assert one_run.auditing().__name__ == "jax_privacy_auditing"
    assert "jax" not in sys.modules

"""Attack statistics from canary scores: the one-run eps lower bound and MIA metrics.

The one-run bound is Steinke, Nasr & Jagielski (2023, "Privacy Auditing with One (1) Training
Run"). Each of the m canaries is included by a fair coin S_i; the auditor guesses "in" for some
canaries and W counts the right guesses. Thm. 3: if the mechanism is (eps, delta)-DP and the
guesses T are a post-processing of its output with ||T||_1 <= r for an r FIXED IN ADVANCE, then
for every v

    (1)  P[W >= v] <= f_{r,eps}(v) = P[Bin(r, q) >= v] + 2 m delta max_{i=1..v} P[v-i <= Bin(r, q) < v] / i,

q = e^eps / (1 + e^eps); Alg. 1 accordingly takes its guess counts k_+, k_- as inputs, and Alg. 2's
eps is the largest one whose f stays <= the significance. (Only k_- = 0 here, as in the library.)

``jax_privacy.auditing`` 2.0.0's ``CanaryScoreAuditor.epsilon_one_run`` instead guesses at every
vertex of the ROC hull, with r = the number of scores above that threshold, and divides the
significance by the hull's size: both the guess counts and the Bonferroni divisor are read off the
scores, so Thm. 3 does not cover it (its coverage held in simulation, not by construction). A
union over every count tried (Bonferroni over all m) is valid but void: the delta term of (1)
is at least about 2 m delta / v, above the level significance / m unless v > 2 m^2 delta /
significance, so it gives eps_lb = 0 even on the library's own test canaries (m = 20,000).

:func:`one_run_epsilon_lb` commits to the guess counts before any score is seen, and is valid by
construction for every (eps, delta)-DP mechanism whose canary coins are fair:

1. K = :func:`guess_counts`: k = ceil(m / 2^j), j >= 1 (m/2, m/4, ...), a function of (m, delta,
   significance) alone (m is the audit's design, not the random n_in), less the counts that could
   never reject (f_{k,0}(k) above the level even with all k right; k = m is left out since
   W_m = n_in has the same law under every mechanism). Halving reaches every scale of k at the
   cost of about log2(m) tests.
2. For k in K the guess is "the k highest scores are in", ties at the k-th score broken by a
   uniformly random draw R independent of the coins: exactly k guesses and a post-processing, so
   (1) holds with r = k. As (eps, delta)-DP implies (eps', delta)-DP for eps' >= eps and W >= v
   implies W >= v' for v' <= v, F(v) = min over v' <= v, eps' >= eps of f_{k,eps'}(v') bounds
   P[W_k >= v] too and is non-increasing in v, so the test "F(W_k) <= beta" has level beta.
3. Markov's inequality removes R: phi = P_R[F(W_k) <= beta | scores, S] has E phi <= beta, so
   P[phi >= c] <= beta / c; and phi >= c exactly when F(W_k^c) <= beta, W_k^c being the right
   guesses above the tie plus the largest w with P[H >= w] >= c, H ~ Hypergeometric for the tied
   ones (:func:`top_k_correct`). Hence beta = c significance / |K| with c = :data:`TIE_CONFIDENCE`;
   without ties W_k^c is the plain count and the cost is the factor c in level alone.
4. eps_lb = max over k in K of Alg. 2's eps for (m, k, W_k^c) at level beta (the library's
   search), each checked to satisfy f_{k,eps_k}(W_k^c) <= beta at the returned eps itself. If an
   (eps, delta)-DP mechanism gave eps_lb > eps, then for the maximising k F(W_k^c) <=
   f_{k,eps_lb}(W_k^c) <= beta, an event of probability <= significance / |K| by 2-3; the union
   over K gives P[eps_lb > eps] <= significance.

The per-count statistic f and its eps search (Alg. 2) are the library's (``_one_run_p_value``,
``_epsilon_one_run``); only the committed counts, the tie rule and the union are written here.

The other statistics come from the same module: the maximal TPR at a given FPR and the AUROC,
with bootstrap intervals. That module needs only numpy, scipy and dp_accounting, but the package's
``__init__`` imports JAX; the Makefile installs the pinned wheel without its JAX dependencies
(``envs/requirements-nodeps.txt``) and :func:`auditing` loads the one file, so the statistics are
the maintained library's and no JAX is installed.

A canary's score is larger when the attack believes it was included ("in").
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

#: the library version the statistics were checked against (tests/audit/test_one_run.py)
JAX_PRIVACY_VERSION = "2.0.0"
REFERENCE = "Steinke, Nasr & Jagielski 2023 (one-run audit); jax_privacy.auditing " + JAX_PRIVACY_VERSION


class AuditError(ValueError):
    """An audit that cannot be run as asked; one line of text."""


@cache
def auditing() -> ModuleType:
    """``jax_privacy/auditing.py`` loaded as a module of its own, without the package's JAX imports."""
    name = "jax_privacy_auditing"
    spec = importlib.util.find_spec("jax_privacy")
    if spec is None or not spec.submodule_search_locations:
        raise AuditError("package jax-privacy is not installed: run `make install` (it installs "
                         f"jax-privacy=={JAX_PRIVACY_VERSION} without JAX, envs/requirements-nodeps.txt)")
    path = f"{list(spec.submodule_search_locations)[0]}/auditing.py"
    file_spec = importlib.util.spec_from_file_location(name, path)
    if file_spec is None or file_spec.loader is None:
        raise AuditError(f"cannot load {path}")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[name] = module  # dataclasses resolve their module by name while the file runs
    file_spec.loader.exec_module(module)
    return module


def _scores(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(a)):
        raise AuditError(f"{what} scores must be finite")
    return a


def auditor(in_scores: Any, out_scores: Any) -> Any:
    """``CanaryScoreAuditor`` over the scores of included ("in") and excluded ("out") canaries."""
    ins, outs = _scores(in_scores, "in"), _scores(out_scores, "out")
    if len(ins) == 0 or len(outs) == 0:
        raise AuditError(f"an audit needs in and out canaries, got {len(ins)} in and {len(outs)} out")
    return auditing().CanaryScoreAuditor(ins, outs)


#: c of the module docstring's step 3: tied guesses count at their c-quantile, the level is c alpha / |K|
TIE_CONFIDENCE = 0.95
#: the root tolerance of the library's eps search (``_epsilon_one_run``'s brentq xtol)
_EPS_XTOL = 1e-6


@dataclass(frozen=True)
class OneRunBound:
    """eps_lb: with probability >= 1 - significance over the canary coins, the mechanism is not
    (eps, delta)-DP for any eps < eps_lb (Steinke et al. 2023, Thm. 3, over the guess counts
    committed in advance; module docstring). ``tests``: how many guess counts the significance is
    split over (|K|); ``guesses``: the count k that gave eps_lb (0 when eps_lb = 0)."""

    epsilon_lb: float
    significance: float
    delta: float
    m: int
    n_in: int
    tests: int = 0
    guesses: int = 0


@cache
def guess_counts(m: int, *, delta: float, significance: float) -> tuple[int, ...]:
    """K: the numbers of "in" guesses, fixed by (m, delta, significance) before any score is seen:
    ceil(m / 2^j) for j >= 1, less those that could not reject even eps = 0 with every guess right."""
    halvings = sorted({-(-m // 2 ** j) for j in range(1, max(1, m.bit_length()) + 1)})
    level = TIE_CONFIDENCE * significance / len(halvings)  # the strictest level any k can face
    lib = auditing()
    return tuple(k for k in halvings if lib._one_run_p_value(m, k, k, 0.0, delta) <= level)


def _tied_quantile(tied: int, tied_in: int, taken: int) -> int:
    """The largest w with P[H >= w] >= TIE_CONFIDENCE, H ~ Hypergeometric(tied, tied_in, taken): the
    right guesses among ``taken`` of ``tied`` equal scores drawn at random (docstring, step 3).
    Hand-written: the library thresholds scores and never splits a tie."""
    from scipy.stats import hypergeom

    lo, hi = max(0, taken - (tied - tied_in)), min(taken, tied_in)
    if lo == hi:
        return lo
    w = np.arange(lo, hi + 1)
    return int(w[hypergeom.sf(w - 1, tied, tied_in, taken) >= TIE_CONFIDENCE].max())


def top_k_correct(ins_sorted: np.ndarray, outs_sorted: np.ndarray, k: int) -> int:
    """W_k^c: right guesses when the k highest scores are guessed "in" (ascending inputs; ties at the
    k-th score counted at their TIE_CONFIDENCE-quantile, docstring step 3)."""
    n_in, n_out = len(ins_sorted), len(outs_sorted)
    kth = np.sort(np.r_[ins_sorted[-k:], outs_sorted[-k:]])[-k]  # the k-th highest of all scores
    in_lo, in_hi = np.searchsorted(ins_sorted, kth, "left"), np.searchsorted(ins_sorted, kth, "right")
    out_lo, out_hi = np.searchsorted(outs_sorted, kth, "left"), np.searchsorted(outs_sorted, kth, "right")
    above_in, above = n_in - in_hi, (n_in - in_hi) + (n_out - out_hi)
    tied_in, tied = int(in_hi - in_lo), int((in_hi - in_lo) + (out_hi - out_lo))
    return int(above_in) + _tied_quantile(tied, tied_in, k - int(above))


def _epsilon_for_count(m: int, k: int, correct: int, *, level: float, delta: float, floor: float) -> float:
    """Alg. 2 for one committed count: the library's largest eps >= ``floor`` that ``correct`` of ``k``
    reject at ``level`` (``floor`` when none does). Its root is only within a tolerance, so the eps
    returned is one where f_{k,eps}(correct) <= level holds itself (docstring, step 4): stepped back
    by the tolerance a few times, else ``floor``."""
    lib = auditing()
    eps = float(lib._epsilon_one_run(floor, m, k, correct, level, delta))
    for _ in range(4):
        if eps <= floor or lib._one_run_p_value(m, k, correct, eps, delta) <= level:
            return max(eps, floor)
        eps -= _EPS_XTOL
    return floor


def one_run_epsilon_lb(in_scores: Any, out_scores: Any, *, delta: float, significance: float = 0.05) -> OneRunBound:
    """The one-run lower bound on eps at confidence 1 - ``significance`` (one-sided guesses, k_- = 0):
    the largest Alg. 2 eps over the committed guess counts K, each at level c significance / |K|
    (module docstring, steps 1-4)."""
    if not 0 < significance < 1:
        raise AuditError(f"significance must be in (0, 1), got {significance}")
    if not 0 < delta < 1:
        raise AuditError(f"delta must be in (0, 1), got {delta}")
    ins, outs = np.sort(_scores(in_scores, "in")), np.sort(_scores(out_scores, "out"))
    if len(ins) == 0 or len(outs) == 0:
        raise AuditError(f"an audit needs in and out canaries, got {len(ins)} in and {len(outs)} out")
    m = len(ins) + len(outs)
    ks = guess_counts(m, delta=delta, significance=significance)
    level = TIE_CONFIDENCE * significance / max(1, len(ks))
    correct = {k: top_k_correct(ins, outs, k) for k in ks}
    # for speed only: the library's order (decreasing precision lower bound), so that later counts
    # mostly fail the search's cheap first check at ``best``; every eps kept is checked (step 4)
    order = sorted(ks, key=lambda k: float(auditing()._clopper_pearson_upper(k - correct[k], k, level)))
    best, best_k = 0.0, 0
    for k in order:
        eps = _epsilon_for_count(m, k, correct[k], level=level, delta=delta, floor=best)
        if eps > best:
            best, best_k = eps, k
    return OneRunBound(epsilon_lb=best, significance=significance, delta=delta, m=m, n_in=len(ins), tests=len(ks),
                       guesses=best_k)


@dataclass(frozen=True)
class CanaryAudit:
    """One audited ledger line: canary scores, the bound and the mechanism's size (steps, canary norm)."""

    bound: OneRunBound
    in_scores: np.ndarray
    out_scores: np.ndarray
    certified_epsilon: float
    steps: int
    canary_norm: float

    @property
    def passed(self) -> bool:
        """eps_lb does not exceed the certified eps (the claim is not refuted)."""
        return self.bound.epsilon_lb <= self.certified_epsilon


def check_canaries(m: Any) -> None:
    """An audit needs at least two canaries (one-line error otherwise)."""
    if not (isinstance(m, int) and m >= 2):
        raise AuditError(f"canaries m must be an integer >= 2, got {m!r}")


def canary_audit(scores: np.ndarray, included: np.ndarray, *, delta: float, significance: float,
                 certified_epsilon: float, steps: int, canary_norm: float) -> CanaryAudit:
    """The audit of one line from every canary's score and inclusion coin: the one-run bound and the scores."""
    ins, outs = scores[included], scores[~included]
    bound = one_run_epsilon_lb(ins, outs, delta=delta, significance=significance)
    return CanaryAudit(bound=bound, in_scores=ins, out_scores=outs, certified_epsilon=certified_epsilon, steps=steps,
                       canary_norm=canary_norm)


def summary(audit: CanaryAudit) -> dict[str, Any]:
    """The audit's table columns (no scores)."""
    b = audit.bound
    return {"canaries": b.m, "canaries_in": b.n_in, "steps": audit.steps, "confidence": 1 - b.significance,
            "delta": b.delta, "epsilon_lb": b.epsilon_lb, "certified_epsilon": audit.certified_epsilon,
            "passed": audit.passed, "mean_score_in": float(np.mean(audit.in_scores)),
            "mean_score_out": float(np.mean(audit.out_scores))}


@dataclass(frozen=True)
class AttackCurve:
    """AUROC and TPR at fixed FPRs of a membership attack, with bootstrap (low, high) intervals."""

    auc: float
    auc_interval: tuple[float, float]
    tpr_at_fpr: dict[float, float]
    tpr_interval: dict[float, tuple[float, float]]


def attack_curve(in_scores: Any, out_scores: Any, *, fprs: tuple[float, ...] = (0.01, 0.001),
                 n_bootstrap: int = 200, confidence: float = 0.95, seed: int = 0) -> AttackCurve:
    """AUROC and max TPR at each FPR in ``fprs``; percentile intervals from ``n_bootstrap`` resamples.

    The AUROC is the usual one (Mann-Whitney, sklearn), not the library's, which takes the ROC's
    convex hull (randomised thresholds) and so sits above 0.5 even for an attack without signal.
    The TPR at a given FPR is the library's: the best operating point an attacker can realise.
    """
    from sklearn.metrics import roc_auc_score

    lib = auditing()
    ins, outs = _scores(in_scores, "in"), _scores(out_scores, "out")
    a = auditor(ins, outs)
    labels = np.r_[np.ones(len(ins)), np.zeros(len(outs))]
    auc = float(roc_auc_score(labels, np.r_[ins, outs]))
    rng = np.random.default_rng(seed)
    boot = [roc_auc_score(labels, np.r_[rng.choice(ins, len(ins)), rng.choice(outs, len(outs))])
            for _ in range(n_bootstrap)]
    alpha = (1 - confidence) / 2
    lo, hi = (float(v) for v in np.quantile(boot, [alpha, 1 - alpha]))
    params = lib.BootstrapParams.confidence_interval(num_samples=n_bootstrap, confidence=confidence, seed=seed)
    tprs, intervals = {}, {}
    for f in fprs:
        tprs[f] = float(a.tpr_at_given_fpr(f))
        tlo, thi = (float(v) for v in np.asarray(a.tpr_at_given_fpr(f, bootstrap_params=params)).reshape(-1)[:2])
        intervals[f] = (tlo, thi)
    return AttackCurve(auc=auc, auc_interval=(lo, hi), tpr_at_fpr=tprs, tpr_interval=intervals)


def tpr_bound(epsilon: float, delta: float, fpr: float) -> float:
    """The largest TPR an (eps, delta)-DP mechanism allows at ``fpr``: min(1, e^eps FPR + delta)
    (Kairouz et al. 2015; the hypothesis-testing reading of DP)."""
    if not (epsilon >= 0 and 0 <= delta < 1 and 0 <= fpr <= 1):
        raise AuditError(f"tpr_bound needs eps >= 0, delta in [0, 1), fpr in [0, 1]; got {epsilon}, {delta}, {fpr}")
    if fpr == 0:
        return min(1.0, delta)
    return min(1.0, math.exp(min(epsilon + math.log(fpr), 0.0)) + delta)

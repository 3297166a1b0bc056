"""Attack statistics from canary scores: the one-run eps lower bound and MIA metrics.

The statistics come from DeepMind's ``jax_privacy.auditing`` (``CanaryScoreAuditor``): the
one-run bound of Steinke, Nasr & Jagielski (2023, "Privacy Auditing with One (1) Training
Run", Thm. 3 / Alg. 1 with Bonferroni over thresholds), the maximal TPR at a given FPR and
the AUROC, with bootstrap intervals. That module needs only numpy, scipy and dp_accounting,
but the package's ``__init__`` imports JAX; the Makefile installs the pinned wheel without
its JAX dependencies (``envs/requirements-nodeps.txt``) and :func:`auditing` loads the one
file, so the statistics are the maintained library's and no JAX is installed.

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


@dataclass(frozen=True)
class OneRunBound:
    """eps_lb: with probability >= 1 - significance over the canary coins, the mechanism is not
    (eps, delta)-DP for any eps < eps_lb (Steinke et al. 2023, Thm. 3)."""

    epsilon_lb: float
    significance: float
    delta: float
    m: int
    n_in: int


def one_run_epsilon_lb(in_scores: Any, out_scores: Any, *, delta: float, significance: float = 0.05) -> OneRunBound:
    """The one-run lower bound on eps at confidence 1 - ``significance`` (one-sided guesses, k_- = 0)."""
    if not 0 < significance < 1:
        raise AuditError(f"significance must be in (0, 1), got {significance}")
    if not 0 < delta < 1:
        raise AuditError(f"delta must be in (0, 1), got {delta}")
    ins, outs = _scores(in_scores, "in"), _scores(out_scores, "out")
    eps = float(auditor(ins, outs).epsilon_one_run(significance=significance, delta=delta))
    return OneRunBound(epsilon_lb=eps, significance=significance, delta=delta, m=len(ins) + len(outs), n_in=len(ins))


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

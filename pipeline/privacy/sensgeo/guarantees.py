"""Exact guarantees fixed by rho_* (SENSGEO Sec. IV) and the generic conversions they replace.

For the Gaussian mechanism M(D) = m_g(D) + N(0, Sigma) and adjacent D, D' whose outputs
differ by a shift s, D_alpha(N(mu_1, Sigma) || N(mu_2, Sigma)) = alpha/2 (mu_1 - mu_2)^T
Sigma^-1 (mu_1 - mu_2). Taking the supremum over the sensitivity set gives (Theorem 2):

* RDP at every order:   eps*_alpha(Sigma) = alpha rho_* / 2;
* zCDP:                 rho_z = rho_* / 2 (the smallest);
* Gaussian DP:          mu = sqrt(rho_*) (the smallest; the privacy loss is a 1-D Gaussian test);
* (eps, delta)-DP:      delta = h_eps(rho_*) = Phi(q/2 - eps/q) - e^eps Phi(-q/2 - eps/q),
  q = sqrt(rho_*), the analytic Gaussian mechanism of Balle & Wang (2018, Thm. 8), which the
  paper derives from P(Lambda > eps) = Phi(q/2 - eps/q), Q(Lambda > eps) = Phi(-q/2 - eps/q).
  h_eps is strictly increasing in rho_*, so (eps, delta)-DP holds iff rho_* <= h_eps^-1(delta).

The generic route it replaces is RDP -> DP: eps = min_alpha [alpha rho_*/2 + log(1/delta)/(alpha-1)]
= rho_*/2 + sqrt(2 rho_* log(1/delta)) (Mironov 2017, Prop. 3; the paper's Sec. IV formula,
identical to Bun & Steinke's zCDP conversion), and ``dp_accounting``'s RDP accountant, whose
conversion is tighter but still not exact.

The closed form delta(eps; mu) is :func:`pipeline.privacy.accountants.gdp_delta` (EMPDEN
eq. 44 is the same Gaussian trade-off curve), reused here rather than written twice; it is
computed in log space, so large mu does not overflow.
"""

from __future__ import annotations

import math

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import optimize

from pipeline.privacy.accountants import gdp_delta, gdp_epsilon, gdp_log_delta


class GuaranteeError(ValueError):
    """A privacy parameter out of range; one line."""


def _check_rho(rho_star: float) -> None:
    if not (isinstance(rho_star, (int, float)) and math.isfinite(rho_star) and rho_star > 0):
        raise GuaranteeError(f"rho_* must be a positive finite number, got {rho_star!r}")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise GuaranteeError(f"delta must be in (0, 1), got {delta!r}")


# --------------------------------------------------------------------------- Theorem 2

def renyi_curve(alpha: float, rho_star: float) -> float:
    """eps*_alpha(Sigma) = alpha rho_* / 2, the exact Renyi DP curve at order alpha (SENSGEO Sec. IV, Theorem 2).

    A closed form in rho_*, unlike :func:`pipeline.privacy.accountants.rdp_epsilon`, which converts
    a composed DpEvent's RDP curve to an (eps, delta) guarantee.
    """
    _check_rho(rho_star)
    if not alpha > 1:
        raise GuaranteeError(f"Renyi order alpha must be > 1, got {alpha!r}")
    return 0.5 * alpha * rho_star


def zcdp_rho(rho_star: float) -> float:
    """Smallest zCDP parameter rho_* / 2 (SENSGEO Theorem 2)."""
    _check_rho(rho_star)
    return 0.5 * rho_star


def gdp_mu(rho_star: float) -> float:
    """Smallest Gaussian-DP parameter mu = sqrt(rho_*) (SENSGEO Theorem 2)."""
    _check_rho(rho_star)
    return math.sqrt(rho_star)


# --------------------------------------------------------------------------- exact (eps, delta)

def exact_delta(eps: float, rho_star: float) -> float:
    """h_eps(rho_*): the exact delta at eps (SENSGEO Sec. IV; Balle & Wang 2018)."""
    if not eps >= 0:
        raise GuaranteeError(f"eps must be >= 0, got {eps!r}")
    return gdp_delta(eps, gdp_mu(rho_star))


def exact_epsilon(delta: float, rho_star: float) -> float:
    """Smallest eps with h_eps(rho_*) <= delta: the exact (eps, delta) curve (SENSGEO Sec. IV)."""
    _check_delta(delta)
    return gdp_epsilon(delta, gdp_mu(rho_star))


def max_rho_star(eps: float, delta: float) -> float:
    """h_eps^-1(delta): the largest rho_* for which the mechanism is (eps, delta)-DP (SENSGEO Sec. IV).

    h_eps is strictly increasing in rho_* (h'_eps(q) = phi(q/2 - eps/q)/(2q) > 0), so the
    root is unique; it is found on log delta so tiny delta stays accurate.
    """
    _check_delta(delta)
    if not eps >= 0:
        raise GuaranteeError(f"eps must be >= 0, got {eps!r}")
    target = math.log(delta)
    f = lambda log_mu: gdp_log_delta(eps, math.exp(log_mu)) - target  # noqa: E731 (increasing)
    lo, hi = -30.0, 1.0
    while f(hi) < 0:
        hi += 1.0
    return math.exp(2.0 * optimize.brentq(f, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500))


# --------------------------------------------------------------------------- generic conversions

def rdp_to_dp_classic(delta: float, rho_star: float) -> float:
    """min_alpha alpha rho_*/2 + log(1/delta)/(alpha - 1) = rho_*/2 + sqrt(2 rho_* log(1/delta)).

    The generic RDP -> DP conversion (Mironov 2017, Prop. 3) optimised in closed form over
    real alpha > 1; this is the formula SENSGEO Sec. IV quotes as the looser alternative.
    """
    _check_rho(rho_star)
    _check_delta(delta)
    return 0.5 * rho_star + math.sqrt(2.0 * rho_star * math.log(1.0 / delta))


def rdp_to_dp_accountant(delta: float, rho_star: float) -> float:
    """eps from ``dp_accounting``'s RdpAccountant for a Gaussian with sensitivity/std = sqrt(rho_*).

    The field's RDP accountant (its own order grid and improved conversion); still a
    generic conversion, so it is >= the exact value.
    """
    _check_delta(delta)
    acc = rdp_lib.RdpAccountant()
    acc.compose(dp_event.GaussianDpEvent(noise_multiplier=1.0 / gdp_mu(rho_star)))
    return float(acc.get_epsilon(delta))

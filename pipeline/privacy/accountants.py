"""Accountants: PLD (certified eps_u, optimistic eps_l), exact GDP, RDP, GDP CLT estimate.

Mechanisms are ``dp_accounting`` events (``GaussianDpEvent``, ``PoissonSampledDpEvent``,
``SelfComposedDpEvent``, ``ComposedDpEvent``); an accountant consumes an event and never
trusts a number the mechanism computed itself (SPEC, Methods/Accounting).

* :func:`pld_epsilon` -- Doroshenko et al. 2022 via ``dp_accounting.pld``. ``pessimistic=True``
  gives the certified upper bound eps_u (EMPDEN App. G steps 3-5); ``pessimistic=False``
  rounds every value down and gives eps_l, which is NOT a bound and only shows how much of
  eps_u is discretisation slack (step 6). The discretisation ``h`` and the log-mass
  truncation are explicit because EMPDEN's numbers depend on them (h = 1e-5, -50).
  ``dp_accounting``'s ``PLDAccountant`` hides the truncation bound, so the PLD is built from
  ``privacy_loss_distribution.from_gaussian_mechanism`` directly.
* :func:`gdp_delta` / :func:`gdp_epsilon` -- exact GDP composition (EMPDEN eq. 3) and the
  closed form delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (eq. 44), written
  out because ``dp_accounting`` has no GDP accountant; computed in log space so that the
  full-batch regime (mu ~ 10^2, eps ~ 10^4) neither overflows nor underflows.
* :func:`rdp_epsilon` -- ``dp_accounting.rdp.RdpAccountant`` (Mironov; Wang et al. 2019).
* :func:`clt_mu` -- the GDP central-limit estimate (Dong et al. 2022, Cor. 5.4) that EMPDEN
  Table 11 compares against; an ESTIMATE, never a bound.

Output-wise subsampling (EMPDEN Prop. 4.1) is ``SelfComposed(PoissonSampled(q_B,
Gaussian(1/mu_bar_B)), N_out)``: the one-output trade-off curve h_B = q_B G_mu + (1 - q_B) Id
is exactly the Poisson-subsampled Gaussian's, in both directions. Per-step subsampling
(Prop. C.1) is ``SelfComposed(Composed([PoissonSampled(q_t, Gaussian(1/mu_t))]), N_out)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import optimize, special

from pipeline.privacy import fast_pld, ledger

#: relative margin on the fast path's pessimistic eps (pld_epsilon): never below dp_accounting's
#: eps_u at the same h (tests/privacy/test_accountants.py checks random cases against it)
FAST_PATH_REL_MARGIN = 1e-6

#: EMPDEN Sec. 6 / App. G accountant settings.
PAPER_DISCRETISATION = 1e-5
PAPER_LOG_MASS_TRUNCATION = -50.0


class AccountingError(ValueError):
    """An event or parameter an accountant cannot handle; the message is one line."""


@dataclass(frozen=True)
class PLDSettings:
    """Discretisation interval h and ln of the tail mass that may be truncated (added to delta)."""

    value_discretization_interval: float = PAPER_DISCRETISATION
    log_mass_truncation_bound: float = PAPER_LOG_MASS_TRUNCATION

    def __post_init__(self) -> None:
        if not 0 < self.value_discretization_interval < 1:
            raise AccountingError(f"PLD discretisation h must be in (0, 1), got {self.value_discretization_interval}")
        if not -math.inf < self.log_mass_truncation_bound < 0:
            raise AccountingError(f"log-mass truncation bound must be finite and < 0, "
                                  f"got {self.log_mass_truncation_bound}")


# --------------------------------------------------------------------------- events

def gaussian_event(mu: float) -> dp_event.DpEvent:
    """One Gaussian mechanism with GDP parameter mu = sensitivity / noise std."""
    _check_mu(mu)
    return dp_event.GaussianDpEvent(noise_multiplier=1.0 / mu)


def full_batch_event(mu_t: Sequence[float], n_out: int = 1) -> dp_event.DpEvent:
    """Full-batch sampler (EMPDEN Sec. 3.2): every step touches every record, n_out outputs."""
    _check_count(n_out)
    steps = dp_event.ComposedDpEvent([gaussian_event(float(m)) for m in mu_t])
    return steps if n_out == 1 else dp_event.SelfComposedDpEvent(steps, n_out)


def outputwise_event(mu_bar: float, q: float, n_out: int) -> dp_event.DpEvent:
    """Output-wise subsampled block (EMPDEN Prop. 4.1): noise multiplier 1/mu_bar_B, rate q_B."""
    _check_q(q)
    _check_count(n_out)
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, gaussian_event(mu_bar)), n_out)


def per_step_event(mu_t: Sequence[float], q_t: Sequence[float] | float, n_out: int) -> dp_event.DpEvent:
    """Per-step subsampling (EMPDEN Prop. C.1): a fresh subsample at every private step.

    Valid only for a sampler that truly resamples each step; never for Algorithm 1.
    """
    _check_count(n_out)
    qs = [float(q_t)] * len(mu_t) if isinstance(q_t, (int, float)) else [float(q) for q in q_t]
    if len(qs) != len(mu_t):
        raise AccountingError(f"per-step accountant: {len(mu_t)} mu_t but {len(qs)} q_t")
    for q in qs:
        _check_q(q)
    steps = dp_event.ComposedDpEvent([dp_event.PoissonSampledDpEvent(q, gaussian_event(float(m)))
                                      for m, q in zip(mu_t, qs)])
    return dp_event.SelfComposedDpEvent(steps, n_out)


def _check_mu(mu: float) -> None:
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu > 0):
        raise AccountingError(f"mu must be a positive finite number, got {mu!r}")


def _check_q(q: float) -> None:
    if not (isinstance(q, (int, float)) and 0 < q <= 1):
        raise AccountingError(f"sampling probability must be in (0, 1], got {q!r}")


def _check_count(n: int) -> None:
    if not (isinstance(n, int) and n >= 1):
        raise AccountingError(f"number of compositions must be an integer >= 1, got {n!r}")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise AccountingError(f"delta must be in (0, 1), got {delta!r}")


# --------------------------------------------------------------------------- GDP

def gdp_compose(mus: Sequence[float]) -> float:
    """Exact GDP composition mu = sqrt(sum mu_i^2) (EMPDEN eq. 3 / eq. 43)."""
    return float(math.sqrt(sum(float(m) ** 2 for m in mus)))


def gdp_log_delta(eps: float, mu: float) -> float:
    """log delta(eps) of a mu-GDP mechanism (EMPDEN eq. 44), stable for huge eps/mu."""
    _check_mu(mu)
    la = special.log_ndtr(-eps / mu + mu / 2)
    lb = special.log_ndtr(-eps / mu - mu / 2)
    ratio = eps + lb - la  # log(e^eps Phi(b) / Phi(a)) < 0 always
    if ratio >= 0:  # only reachable through rounding when delta is ~0
        return -math.inf
    return float(la + math.log(-math.expm1(ratio)))


def gdp_delta(eps: float, mu: float) -> float:
    """delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (EMPDEN eq. 44)."""
    return math.exp(gdp_log_delta(eps, mu))


def gdp_epsilon(delta: float, mu: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for a mu-GDP mechanism (root finding on log delta)."""
    _check_delta(delta)
    _check_mu(mu)
    target = math.log(delta)
    f = lambda e: gdp_log_delta(e, mu) - target  # noqa: E731  (decreasing in eps)
    if f(0.0) <= 0:
        return 0.0
    hi = max(1.0, mu * mu)
    if not math.isfinite(hi):  # mu > 1e154: eps ~ mu^2 / 2 is beyond a double; +inf is still a valid bound
        return math.inf
    while f(hi) > 0:
        hi *= 2
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12, maxiter=500))


def gdp_mu_of_event(event: dp_event.DpEvent) -> float:
    """Exact GDP parameter of a composition of plain Gaussian mechanisms (no subsampling)."""
    if isinstance(event, dp_event.GaussianDpEvent):
        if event.noise_multiplier <= 0:
            raise AccountingError("a Gaussian event with noise multiplier 0 is not private")
        return 1.0 / event.noise_multiplier
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return math.sqrt(event.count) * gdp_mu_of_event(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return gdp_compose([gdp_mu_of_event(e) for e in event.events])
    if isinstance(event, dp_event.PoissonSampledDpEvent) and event.sampling_probability == 1:
        return gdp_mu_of_event(event.event)
    raise AccountingError(f"GDP composition is exact only for plain Gaussian mechanisms, not {type(event).__name__}")


# --------------------------------------------------------------------------- PLD

def _gaussian_pld(noise_multiplier: float, q: float, pessimistic: bool, s: PLDSettings, reference: bool):
    if noise_multiplier <= 0:
        raise AccountingError("a Gaussian event with noise multiplier 0 is not private")
    if not reference:
        # Same PMF as dp_accounting's, built on arrays (see pipeline.privacy.fast_pld).
        return fast_pld.from_gaussian_mechanism(
            noise_multiplier, sampling_prob=q, pessimistic_estimate=pessimistic,
            value_discretization_interval=s.value_discretization_interval,
            log_mass_truncation_bound=s.log_mass_truncation_bound)
    # Connect-the-dots is dp_accounting's tightest pessimistic construction; it has no
    # optimistic variant, so eps_l uses privacy buckets (rounded down).
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, sensitivity=1.0, sampling_prob=q,
        pessimistic_estimate=pessimistic,
        value_discretization_interval=s.value_discretization_interval,
        log_mass_truncation_bound=s.log_mass_truncation_bound,
        use_connect_dots=pessimistic)


def build_pld(event: dp_event.DpEvent, *, pessimistic: bool = True, settings: PLDSettings = PLDSettings(),
              reference: bool = False):
    """PLD of ``event`` (both neighbouring directions), composed by FFT (EMPDEN App. G 3-4).

    ``reference=True`` builds every Gaussian PLD with ``dp_accounting``'s own (slower) code
    path instead of :mod:`pipeline.privacy.fast_pld`; the replay uses it, so an audit never
    depends on our speed-up. The fast path composes self-compositions on a grid of ~1e-4
    (:func:`fast_pld.coarse_self_compose`) when h is finer: its pessimistic eps is provably
    never below the reference's (a dominating split of the one-output PMF) and within 0.1%
    of it on EMPDEN's Table 8/9 grid (``benchmarks/bench_accounting.py``).
    """
    return _build_pld_cached(ledger.event_to_json(event), pessimistic, settings, reference)


@lru_cache(maxsize=2)  # composed PLDs at h = 1e-5 hold ~100 MB each
def _build_pld_cached(event_json: str, pessimistic: bool, settings: PLDSettings, reference: bool):
    # Repeated mechanisms (the same block in several tables, the same event in a replay)
    # are built once: keyed on the canonical JSON of the event.
    return _build_pld(ledger.event_from_json(event_json), pessimistic, settings, reference)


def _build_pld(event: dp_event.DpEvent, pessimistic: bool, s: PLDSettings, reference: bool,
               factor: int | None = None):
    # factor: the split factor every self-composition inside must use (None: each picks its own)
    if isinstance(event, dp_event.GaussianDpEvent):
        return _gaussian_pld(event.noise_multiplier, 1.0, pessimistic, s, reference)
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        inner = event.event
        if not isinstance(inner, dp_event.GaussianDpEvent):
            raise AccountingError(f"PLD: Poisson sampling is supported around a Gaussian event, "
                                  f"not {type(inner).__name__}")
        return _gaussian_pld(inner.noise_multiplier, event.sampling_probability, pessimistic, s, reference)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        single = _build_pld(event.event, pessimistic, s, reference, factor)
        if reference:
            return single.self_compose(event.count)
        # Composed on a coarser grid k h after a dominating split of the one-output PMF: never
        # below dp_accounting's composition at h, much cheaper (fast_pld, "Speed").
        return fast_pld.coarse_self_compose(single, event.count, factor=factor)
    if isinstance(event, dp_event.ComposedDpEvent):
        if not event.events:
            raise AccountingError("PLD: empty composition")
        plds = [_build_pld(e, pessimistic, s, reference, factor) for e in event.events]
        grids = [p._pmf_remove._discretization for p in plds]  # noqa: SLF001
        if len(set(grids)) > 1:
            # parts split onto different grids cannot be composed: rebuild the coarser ones on the
            # finest grid chosen (a part on a finer grid than it chose is only more accurate)
            common = round(min(grids) / s.value_discretization_interval)
            plds = [p if g == min(grids) else _build_pld(e, pessimistic, s, reference, common)
                    for p, g, e in zip(plds, grids, event.events)]
        out = plds[0]
        for other in plds[1:]:
            out = out.compose(other)
        return out
    raise AccountingError(f"PLD: unsupported event {type(event).__name__}")


def bisect_log_sigma(eps_of: Callable[[float], float], lo: float, hi: float, target_epsilon: float,
                     rtol: float) -> float:
    """Bisection on log sigma from a bracket with eps(hi) <= target < eps(lo), kept invariant: the
    returned ``hi`` is certified and a sigma smaller by more than ``rtol`` exceeds the target.

    Shared by every noise calibration (DP-SGD, the Gaussian releases): the callers check the
    bracket, since each seeds it differently.
    """
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        if eps_of(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def gdp_noise_multiplier(*, target_epsilon: float, delta: float, gdp_scale: float) -> float:
    """The sigma at which an event that is exactly (``gdp_scale`` / sigma)-GDP has eps(delta) =
    ``target_epsilon`` (closed form, EMPDEN eq. 44): a Gaussian of multiplier sigma is (1/sigma)-GDP,
    k of them composed (sqrt(k)/sigma)-GDP."""
    log_mu = optimize.brentq(lambda lm: gdp_epsilon(delta, math.exp(lm)) - target_epsilon,
                             math.log(1e-8), math.log(1e4), xtol=1e-14, rtol=1e-14, maxiter=500)
    return gdp_scale / math.exp(log_mu)


def calibrate_gaussian_noise_multiplier(event_of: Callable[[float], dp_event.DpEvent], *, gdp_scale: float,
                                        target_epsilon: float, delta: float, settings: PLDSettings,
                                        rtol: float = 1e-3) -> float:
    """Smallest sigma (to relative tolerance ``rtol``) whose certified PLD eps of ``event_of(sigma)``
    is <= ``target_epsilon``, for an event of unsampled Gaussians that is exactly
    (``gdp_scale``/sigma)-GDP (the moment release: sqrt 2; DP-MERF: 1; Private Evolution: sqrt T).

    The bracket is seeded by the exact GDP closed form sigma_gdp (:func:`gdp_noise_multiplier`):
    the pessimistic PLD eps is never below the exact one, so every sigma < sigma_gdp exceeds the
    target, and the search starts within a few rtol of the answer (a fixed wide bracket would ask
    the PLD for sigma ~ 0.05, whose grid is millions of points). Invariant: eps(hi) <= target <
    eps(lo); ``hi`` is returned.
    """
    if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise AccountingError(f"target epsilon must be > 0 and finite, got {target_epsilon!r}")
    _check_delta(delta)
    if not 0 < rtol < 0.5:
        raise AccountingError(f"rtol must be in (0, 0.5), got {rtol}")
    eps_of = lambda s: pld_epsilon(event_of(s), delta, settings=settings)  # noqa: E731
    sigma_gdp = gdp_noise_multiplier(target_epsilon=target_epsilon, delta=delta, gdp_scale=gdp_scale)
    lo, hi = sigma_gdp / (1 + rtol), sigma_gdp * (1 + rtol)
    if eps_of(lo) <= target_epsilon:  # impossible for a certified accountant; refuse rather than trust it
        raise AccountingError(f"PLD eps at sigma {lo:.6g} is below the exact GDP eps: the accountant is not "
                              f"certified")
    for _ in range(200):
        if eps_of(hi) <= target_epsilon:
            break
        lo, hi = hi, hi * 1.1
    else:
        raise AccountingError(f"target eps {target_epsilon} at delta {delta} not met by sigma <= {hi:.6g}; "
                              f"the PLD discretisation h = {settings.value_discretization_interval} is too coarse")
    return bisect_log_sigma(eps_of, lo, hi, target_epsilon, rtol)


def pld_epsilon(event: dp_event.DpEvent, delta: float, *, pessimistic: bool = True,
                settings: PLDSettings = PLDSettings(), reference: bool = False) -> float:
    """eps(delta) from the PLD, the larger of the two directions (App. G step 5).

    ``pessimistic=True`` is the certified eps_u; ``False`` is eps_l (NOT a bound).
    """
    _check_delta(delta)
    pld = build_pld(event, pessimistic=pessimistic, settings=settings, reference=reference)
    if reference:
        return float(pld.get_epsilon_for_delta(delta))
    eps = fast_pld.epsilon_for_delta(pld, delta)  # the library's scan, vectorised
    if pessimistic and math.isfinite(eps):
        # the fast path's grids and FFTs round differently from dp_accounting's: without a split
        # (one Gaussian, or a self-composition at k = 1) it can land up to ~4e-7 relative BELOW the
        # reference eps_u; the margin keeps every certified eps at or above the reference
        eps *= 1.0 + FAST_PATH_REL_MARGIN
    return eps


def pld_delta(event: dp_event.DpEvent, eps: float, *, pessimistic: bool = True,
              settings: PLDSettings = PLDSettings(), reference: bool = False) -> float:
    """delta(eps) (hockey-stick divergence, both directions) from the PLD."""
    pld = build_pld(event, pessimistic=pessimistic, settings=settings, reference=reference)
    return float(pld.get_delta_for_epsilon(eps))


# --------------------------------------------------------------------------- RDP

def rdp_epsilon(event: dp_event.DpEvent, delta: float, *, orders: Sequence[float] | None = None,
                replace_one: bool = False) -> float:
    """Certified eps from ``dp_accounting.rdp.RdpAccountant`` (add/remove adjacency, or
    replace-one for fixed-size batches with ``replace_one=True``).

    ``orders=None`` uses dp_accounting's default order grid (fractional orders, tighter);
    EMPDEN Tables 7 and 12 are reproduced more closely with the integer orders 2..255.
    """
    _check_delta(delta)
    relation = rdp_lib.NeighborRel.REPLACE_ONE if replace_one else rdp_lib.NeighborRel.ADD_OR_REMOVE_ONE
    acc = rdp_lib.RdpAccountant(orders=list(orders) if orders is not None else None, neighboring_relation=relation)
    if not acc.supports(event):
        raise AccountingError(f"RDP: unsupported event {type(event).__name__}")
    acc.compose(event)
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------- CLT

def clt_mu(blocks: Sequence[tuple[float, float, int]]) -> float:
    """GDP CLT estimate for composed subsampled Gaussians: mu = sqrt(sum n q^2 (e^{mu^2} - 1)).

    Dong, Roth & Su 2022, Cor. 5.4 (the limit of Thm 3.5's moment ratio 2 sum kl / sqrt(sum
    kappa_2) for small q); ``blocks`` holds (mu, q, count). An ESTIMATE: the paper's Table 11
    shows it off by 18-31% and by x200 for heterogeneous, strong blocks.
    """
    total = 0.0
    for mu, q, n in blocks:
        _check_mu(mu)
        _check_q(q)
        try:
            total += n * q * q * math.expm1(mu * mu)
        except OverflowError:  # mu > 26.6: the estimate is +inf (clt_epsilon reports eps = inf)
            return math.inf
    return math.sqrt(total)


def clt_epsilon(blocks: Sequence[tuple[float, float, int]], delta: float) -> float:
    """eps(delta) of the CLT's Gaussian curve G_mu (an estimate, EMPDEN Table 11)."""
    mu = clt_mu(blocks)
    if not math.isfinite(mu):
        return math.inf
    if mu == 0:  # q^2 (e^{mu^2} - 1) underflowed: the estimate is a mechanism that reveals nothing
        return 0.0
    return gdp_epsilon(delta, mu)


def describe(settings: PLDSettings) -> dict[str, Any]:
    return {"value_discretization_interval": settings.value_discretization_interval,
            "log_mass_truncation_bound": settings.log_mass_truncation_bound}


"""dp_accounting's (subsampled) Gaussian PLD pipeline, vectorised -- same numbers, faster.

Why this exists: at EMPDEN's h = 1e-5 the one-output PLD of a strong block has 1-3 million
grid points, and ``dp_accounting`` 0.6.0 walks them in Python: the hockey-stick divergence
of connect-the-dots calls ``inverse_privacy_loss`` once per point (40 s of 48 s for
mu_bar_B = 1.56), privacy buckets (the optimistic eps_l) does the same and accumulates a
dict of millions of keys, the composition's truncation bounds run 40 generic ``logsumexp``
calls, and ``get_epsilon_for_delta`` scans the composed PMF point by point. Here:

* :class:`VectorizedGaussianPrivacyLoss` subclasses the library's ``GaussianPrivacyLoss`` and
  overrides only ``get_delta_for_epsilon`` with the same formulas on a NumPy array.
* :func:`_privacy_buckets_pmf` is the library's privacy-buckets branch with the loop on arrays.
* :func:`self_compose` is the library's FFT self-composition (same Chernoff truncation bounds
  at the same orders, truncated mass added to the infinity mass, i.e. into delta) with a real
  FFT and the bounds' log-MGFs computed in one pass each.
* :func:`epsilon_for_delta` is the library's scan from the largest loss down, chunked on arrays.
* :func:`_connect_dots_pmf` is the library's ``create_pmf_pessimistic_connect_dots_fixed_gap``
  (same formulas) building the dense array directly instead of a dict of millions of keys.

``tests/privacy/test_fast_pld.py`` checks PMFs, bounds and eps against dp_accounting (equal
to floating-point rounding, ~1e-10 relative in eps: the library accumulates its loss grid by
repeated subtraction, we multiply). The replay never uses this module
(``accountants.pld_epsilon(reference=True)``), so an audit does not depend on it.

Speed for many compositions: coarsen once, then compose (certified, never below the naive)
------------------------------------------------------------------------------------------
The FFT self-composition of N_out = 50,000 outputs at h = 1e-5 dominates the cost (FFTs of 6-16
million points per direction). :func:`coarsen` maps the one-output PMF on the grid h Z onto the
grid k h Z *before* composing, by splitting every atom at loss l, a <= l <= b = a + k h, between a and b with the
weights that keep both its mass p and its e^{-L}-mass p e^{-l}:

    p_b = p (1 - e^{-(l - a)}) / (1 - e^{-(b - a)}),     p_a = p - p_b.

Why the result upper-bounds the naive eps_u (and hence the true eps):

1. The hockey-stick divergence of a PLD is delta(eps) = E_L[(1 - e^{eps} e^{-L})_+] + m_inf, a
   *convex* function of y = e^{-L} for every atom. The split is a mean-preserving spread of
   y (Jensen), so the coarse one-output PMF has delta'(eps) >= delta(eps) for every eps, and
   it keeps sum p = 1 and sum p e^{-L} (still a PLD of a pair of distributions).
2. For N-fold composition, delta_N(eps) = E[(1 - e^{eps} prod_i y_i)_+] + ...; conditioned on
   the other N - 1 outputs it is again convex in each y_i, so replacing the outputs' PMFs one
   at a time by their splits never lowers delta_N: coarse-then-compose dominates
   compose-at-h for every eps, hence eps_ours(delta) >= eps_naive(delta) for every delta.
   (Equivalently: a dominating pair of a dominating pair dominates, and composition
   preserves domination; Zhu, Dong & Wang 2022, Thm. 10.)
3. The naive eps_u is certified (dp_accounting's connect-the-dots PMF dominates the Gaussian
   mechanism, Doroshenko et al. 2022), so by transitivity ours upper-bounds the true eps.
4. Truncation: both sides drop the composed tails outside Chernoff bounds of mass
   tail_mass_truncation / 2 each and add tail_mass_truncation to the infinity mass, so each
   side's delta is within [exact, exact + tail_mass_truncation]; ours adds one more
   tail_mass_truncation (``margin``), which makes delta_ours >= delta_naive hold after
   truncation too (costs ~1e-10 relative in eps at delta = 1e-5).

How coarse (adaptive, :func:`split_factor`): k is the largest integer with k h <=
:data:`COMPOSITION_INTERVAL` (1e-4), or k <= :data:`MIN_COMPOSITION_FACTOR` (8) when h is already
that coarse, whose split adds at most :data:`SPLIT_VARIANCE_TOLERANCE` (1e-4) x Var(L) to the
one-output loss, so a narrow loss (weak block, small q) keeps a finer grid; the composed spread,
and eps, then move by ~5e-5 relative at most. The tolerance, not the absolute interval, is what
bounds the excess: at h = 1e-4 (the CLI's and DP-SGD calibration's grid) a strong block still
coarsens (EMPDEN's strongest block, mu_bar_B = 3.90 at q = 4e-3: k = 8, eps_u +4e-7 relative, the
composition 7x cheaper). Because k h is a sub-grid of h, the split's delta curve equals the fine
one at the coarse nodes and is the chord (linear in e^eps) in between -- connect-the-dots at k h
of the fine PMF -- so the excess shrinks quadratically with k h (EMPDEN's (mu_bar_B, q_B) =
(2.09, 1e-3): eps_u on 1e-4 exceeds eps_u on 1e-5 by 8e-6 relative).

What is *not* covered by the argument: floating-point rounding, which both sides have
(dp_accounting's eps and a re-implementation of it differ by ~1e-8 relative, either sign:
complex vs real FFT, loss grid by repeated subtraction vs multiplication). With k >= 2 the
coarsening's systematic excess (>= ~1e-5 relative) is orders of magnitude above it, which is
why :func:`split_factor` prefers k = 2 over k = 1 whenever k = 2 still costs <= 10x the
tolerance; with k = 1 (h already coarse, or a very narrow loss) ours is dp_accounting's
number up to that rounding, which the replay's 1e-6 relative tolerance absorbs.
``benchmarks/bench_accounting.py`` prints the signed differences on the whole Table 8/9 grid.

The optimistic eps_l (privacy buckets rounded down, NOT a bound) goes through the same split;
for it the split moves the estimate *up* by the same tiny amount, so eps_l stays a
diagnostic of the discretisation slack eps_u - eps_l, never a guarantee.

Depends on private helpers of dp_accounting (``_create_pld_pmf_from_monotone_privacy_loss``,
``_pld_for_subsampled_mechanism``, ``DensePLDPmf`` fields); the version is pinned in
envs/requirements.txt and the equality tests fail loudly if a new version changes them.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator

import numpy as np
import threadpoolctl
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy import fft as sp_fft
from scipy import special

AdjacencyType = plm.AdjacencyType


class VectorizedGaussianPrivacyLoss(plm.GaussianPrivacyLoss):
    """``GaussianPrivacyLoss`` whose ``get_delta_for_epsilon`` runs on arrays (ADD/REMOVE)."""

    # The library's noise CDFs go through a frozen ``scipy.stats.norm(scale=sigma)``, whose
    # argument checks and masking cost as much as the CDF itself on a million-point grid; for
    # loc = 0 it returns exactly ndtr(x / sigma) (and log_ndtr), including at +-inf and NaN.
    def noise_cdf(self, x):
        return special.ndtr(np.asarray(x, dtype=float) / self._standard_deviation)

    def noise_log_cdf(self, x):
        return special.log_ndtr(np.asarray(x, dtype=float) / self._standard_deviation)

    def _inverse_privacy_loss_array(self, eps: np.ndarray) -> np.ndarray:
        """Vectorised ``inverse_privacy_loss`` (dp_accounting's formulas, Gaussian, ADD/REMOVE)."""
        q, s, var = self.sampling_prob, self.sensitivity, self._standard_deviation ** 2
        remove_inverse = lambda loss: -0.5 * s - loss * var / s  # noqa: E731  (no-subsampling REMOVE)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if q == 1.0:
                x = remove_inverse(eps)
                return x + s if self.adjacency_type == AdjacencyType.ADD else x
            # log(a e^b + c) with a = 1/q, c = 1 - 1/q < 0, as common.log_a_times_exp_b_plus_c
            log_a, log_minus_c = -math.log(q), math.log(1 / q - 1)
            if self.adjacency_type == AdjacencyType.REMOVE:
                d = eps + log_a
                loss_ws = d + np.log1p(-np.exp(log_minus_c - d))
                x = remove_inverse(loss_ws)
                edge = np.isclose(eps, math.log(1 - q), rtol=1e-9, atol=0.0)
                x[edge] = math.inf
                return x
            d = -eps + log_a
            loss_ws = -(d + np.log1p(-np.exp(log_minus_c - d)))
            x = s + remove_inverse(loss_ws)
            edge = np.isclose(eps, -math.log(1 - q), rtol=1e-9, atol=0.0)
            x[edge] = -math.inf
            return x

    def get_delta_for_epsilon(self, epsilon):
        if self.adjacency_type not in (AdjacencyType.ADD, AdjacencyType.REMOVE):
            return super().get_delta_for_epsilon(epsilon)
        is_scalar = isinstance(epsilon, numbers.Number)
        epsilons = np.array([epsilon], dtype=float) if is_scalar else np.asarray(epsilon, dtype=float)
        deltas = np.zeros_like(epsilons, dtype=float)
        q = self.sampling_prob
        if q == 1.0:
            inverse = np.full_like(epsilons, True, dtype=bool)
        elif self.adjacency_type == AdjacencyType.ADD:
            inverse = epsilons < -math.log1p(-q)
        else:
            inverse = epsilons > math.log1p(-q)
            deltas[~inverse] = -np.expm1(epsilons[~inverse])
        x = self._inverse_privacy_loss_array(epsilons[inverse])
        deltas[inverse] = self.mu_upper_cdf(x) - np.exp(epsilons[inverse] + self.mu_lower_log_cdf(x))
        deltas = np.clip(deltas, 0, 1)
        return float(deltas[0]) if is_scalar else deltas


class GridTooLarge(ValueError):
    """A PMF would exceed the grid limit set by :func:`grid_limit`; the message is one line."""


#: Largest PMF (grid points) the code below may allocate; None: no limit (the pipeline's
#: own stages, whose sizes are fixed by the config). Set with :func:`grid_limit`.
_GRID_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("fast_pld_grid_limit", default=None)


@contextlib.contextmanager
def grid_limit(max_points: int) -> Iterator[None]:
    """Refuse (:class:`GridTooLarge`) any PMF of more than ``max_points`` points inside the block.

    For user-typed parameters (``python -m pipeline account``): mu = 1e4 alone asks for a
    1e11-point grid, which must be refused before the array is allocated, not by the OOM killer.
    """
    token = _GRID_LIMIT.set(int(max_points))
    try:
        yield
    finally:
        _GRID_LIMIT.reset(token)


def _check_grid(points: int | float, what: str, h: float) -> None:
    limit = _GRID_LIMIT.get()
    if limit is not None and not points <= limit:
        raise GridTooLarge(f"{what} would need {float(points):.3g} grid points at interval {h:g} "
                           f"(limit {limit:.3g})")


def _privacy_buckets_pmf(loss: VectorizedGaussianPrivacyLoss, pessimistic: bool, h: float):
    """dp_accounting's privacy-buckets discretisation (the ``use_connect_dots=False`` branch of
    ``_create_pld_pmf_from_monotone_privacy_loss``), with its per-bucket loop over
    ``inverse_privacy_loss`` replaced by one array evaluation."""
    round_fn = math.ceil if pessimistic else math.floor
    tail = loss.privacy_loss_tail()
    lower_x, upper_x = tail.lower_x_truncation, tail.upper_x_truncation
    pmf: dict[int, float] = {}
    infinity_mass = tail.tail_probability_mass_function.get(math.inf, 0)
    for value, mass in tail.tail_probability_mass_function.items():
        if value != math.inf:
            key = round_fn(value / h)
            pmf[key] = pmf.get(key, 0.0) + mass
    upper_loss = loss.privacy_loss(upper_x)
    _check_grid((loss.privacy_loss(lower_x) - upper_loss) / h + 3, "the one-output PLD", h)
    r0 = math.floor(loss.privacy_loss(lower_x) / h)
    # Buckets r0, r0 - 1, ... until the first r with h r <= L(upper_x), which closes at upper_x.
    rs = np.arange(r0, math.floor(upper_loss / h) - 2, -1, dtype=np.int64)
    closing = np.flatnonzero(h * rs <= upper_loss)[0]
    inner = loss._inverse_privacy_loss_array(h * rs[:closing].astype(float))
    reached = np.flatnonzero(inner >= upper_x)  # the library's `while x < upper_x` exit
    if len(reached):
        closing = reached[0]
        xs = np.concatenate([[lower_x], inner[:closing + 1]])
        rs = rs[:closing + 1]
    else:
        xs = np.concatenate([[lower_x], inner, [upper_x]])
        rs = rs[:closing + 1]
    rounded = rs + 1 if pessimistic else rs  # round_fn(r + 0.5) for integer r: consecutive, descending
    cdf = loss.mu_upper_cdf(xs)
    probs = cdf[1:] - cdf[:-1]
    if len(rounded) + len(pmf) <= pld_pmf._MAX_PMF_SPARSE_SIZE:  # noqa: SLF001  small: the library's dict
        for key, mass in zip(rounded.tolist(), probs.tolist()):
            pmf[key] = pmf.get(key, 0.0) + mass
        return pld_pmf.create_pmf(pmf, h, infinity_mass, pessimistic_estimate=pessimistic)
    # Large: the buckets are one contiguous range, so build the dense array directly instead
    # of a dict of millions of keys (the tail's few entries are added into the same array).
    lowest = int(min(rounded[-1], min(pmf, default=rounded[-1])))
    highest = int(max(rounded[0], max(pmf, default=rounded[0])))
    dense = np.zeros(highest - lowest + 1)
    np.add.at(dense, rounded - lowest, probs)  # unique keys; add.at keeps the library's summation
    for key, mass in pmf.items():
        dense[key - lowest] += mass
    return pld_pmf.DensePLDPmf(h, lowest, dense, infinity_mass, pessimistic)


def _connect_dots_pmf(loss: VectorizedGaussianPrivacyLoss, h: float):
    """dp_accounting's connect-the-dots PMF of a continuous monotone loss (the
    ``use_connect_dots=True`` branch of ``_create_pld_pmf_from_monotone_privacy_loss`` with
    ``create_pmf_pessimistic_connect_dots_fixed_gap``, Doroshenko et al. 2022, Alg. 1): same
    nodes, same formulas, but the dense array is returned directly instead of going through a
    dict of millions of keys (2 of the 3 s of a one-output PMF at h = 1e-5)."""
    bounds = loss.connect_dots_bounds()
    _check_grid((bounds.epsilon_upper - bounds.epsilon_lower) / h + 2, "the one-output PLD", h)
    lower = math.floor(bounds.epsilon_lower / h)
    upper = math.ceil(bounds.epsilon_upper / h)
    deltas = np.asarray(loss.get_delta_for_epsilon(np.arange(lower, upper + 1) * h), dtype=float)
    if upper - lower + 1 <= pld_pmf._MAX_PMF_SPARSE_SIZE:  # noqa: SLF001  small: the library's own code
        return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(h, lower, upper, deltas)
    if np.any(np.diff(deltas) > pld_pmf._DELTA_DIFF_TOLERANCE):  # noqa: SLF001  the library's check
        raise ValueError("connect-the-dots: deltas are not non-increasing")
    deltas = np.minimum.accumulate(deltas)
    diffs = np.diff(deltas)
    probs = np.empty_like(deltas)
    probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(h)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(h)) / math.expm1(h)
    probs[-1] = diffs[-1] / math.expm1(-h)
    np.maximum(probs, 0.0, out=probs)  # the library clips rounding noise the same way
    return pld_pmf.DensePLDPmf(h, lower, probs, float(deltas[-1]), True)


def from_gaussian_mechanism(standard_deviation: float, *, sampling_prob: float = 1.0,
                            pessimistic_estimate: bool = True, value_discretization_interval: float = 1e-4,
                            log_mass_truncation_bound: float = -50.0) -> pld_lib.PrivacyLossDistribution:
    """Drop-in for ``privacy_loss_distribution.from_gaussian_mechanism`` (sensitivity 1, add/remove).

    Connect-the-dots when pessimistic (as the library's default), privacy buckets otherwise.
    """

    def single(adjacency_type: AdjacencyType):
        loss = VectorizedGaussianPrivacyLoss(
            standard_deviation, sensitivity=1.0, pessimistic_estimate=pessimistic_estimate,
            log_mass_truncation_bound=log_mass_truncation_bound, sampling_prob=sampling_prob,
            adjacency_type=adjacency_type)
        if not pessimistic_estimate:
            return _privacy_buckets_pmf(loss, False, value_discretization_interval)
        return _connect_dots_pmf(loss, value_discretization_interval)

    return pld_lib._pld_for_subsampled_mechanism(single, sampling_prob)  # noqa: SLF001


#: Coarsest grid on which many-fold compositions are run ("Speed" in the module docstring):
#: eps_u composed on 1e-4 is within ~1e-5 relative of 1e-5 for most of EMPDEN's grid, and the
#: FFTs are 10x shorter.
COMPOSITION_INTERVAL = 1e-4
#: Largest k allowed whatever h (the split tolerance still decides): at h >= 1e-4 the interval
#: alone would force k = 1, i.e. dp_accounting's full-length FFTs, for no accuracy reason.
MIN_COMPOSITION_FACTOR = 8


#: Largest variance the split may add to the one-output loss, relative to its variance. The
#: composed loss's spread grows by the same ratio; eps moved by ~half of it on EMPDEN's grid
#: (a 1.7e-4 ratio gave +7.9e-5 relative in eps_u), so 1e-4 keeps eps_u within ~5e-5.
SPLIT_VARIANCE_TOLERANCE = 1e-4


#: the largest split factor: it binds only for h < interval / 10^5 (1e-9 at the default interval), far finer than any
#: accountant's grid; only the CLI's free inputs reach it (a denormal h made interval / h infinite, and
#: :func:`split_factor` tries every k down from it)
MAX_COMPOSITION_FACTOR = 10**5


def composition_factor(h: float, interval: float = COMPOSITION_INTERVAL,
                       min_factor: int = MIN_COMPOSITION_FACTOR) -> int:
    """Largest split factor k allowed: the integer k with k h <= ``interval``, at least ``min_factor``
    (k = 1: compose on h itself, as dp_accounting). :func:`split_factor` picks k up to it.

    An integer k keeps the coarse grid a sub-grid of h, which the domination argument of
    :func:`coarsen` needs; the 1e-9 guards 1e-4 / 1e-5 = 9.999999999999998.
    """
    ratio = interval / h
    # a grid step far below any accountant's (a denormal h makes the ratio infinite) caps k: k h stays <= interval
    return max(1, min_factor, MAX_COMPOSITION_FACTOR if not ratio < MAX_COMPOSITION_FACTOR
               else math.floor(ratio + 1e-9))


def split_factor(pmf, max_factor: int, tolerance: float = SPLIT_VARIANCE_TOLERANCE) -> int:
    """Largest k <= ``max_factor`` whose split adds at most ``tolerance`` x Var(L) to the
    one-output loss (adaptive: a narrow loss, e.g. a weak block at small q, keeps the fine grid).

    An atom at l = a + r h of a cell [a, a + k h] is split into a and b = a + k h; to second
    order its variance grows by (l - a)(b - l) = r (k - r) h^2 (exact in e^{-L}, where the
    split keeps the mean).
    """
    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
    total = probs.sum()
    if max_factor <= 1 or total <= 0:
        return 1
    # sums of products, not `@`: a BLAS dot spins OpenBLAS's idle threads (CPU burnt for no speed)
    index = np.arange(len(probs), dtype=float)
    mean = np.sum(probs * index) / total
    var = np.sum(probs * (index - mean) ** 2) / total  # in units of h^2
    fine_index = dense._lower_loss + np.arange(len(probs))  # noqa: SLF001

    def added(k: int) -> float:  # variance added by the split onto k h, in units of h^2
        r = fine_index % k
        return np.sum(probs * (r * (k - r))) / total

    for k in range(max_factor, 1, -1):
        if added(k) <= tolerance * var:
            return k
    # k = 2 even for a narrow loss if it costs <= 10x the tolerance (eps_u ~5e-4 relative): a
    # systematic excess that dominates the ~1e-8 floating-point noise by which dp_accounting
    # and any re-implementation of it (k = 1) differ, so ours stays >= the naive eps_u
    return 2 if added(2) <= 10 * tolerance * var else 1


def coarsen_pmf(pmf, factor: int) -> pld_pmf.DensePLDPmf:
    """The PMF on the grid ``factor`` * h, each atom split between its two neighbouring coarse
    nodes keeping its mass and its e^{-L}-mass (a mean-preserving spread of e^{-L}; module
    docstring, "Speed"). The result dominates ``pmf``: its delta(eps) is >= for every eps."""
    dense = pmf.to_dense_pmf()
    if factor == 1:
        return dense
    h, lower = dense._discretization, dense._lower_loss  # noqa: SLF001
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
    coarse_h = factor * h
    first = lower // factor  # coarse node at or below the lowest loss (floor division)
    head = lower - first * factor  # offset of the first fine point inside its coarse cell
    cells = -(-(head + len(probs)) // factor)
    padded = np.zeros(cells * factor)
    padded[head:head + len(probs)] = probs
    table = padded.reshape(cells, factor)  # row j: the fine points a + r h of cell [a, a + k h)
    r = np.arange(factor, dtype=float)
    # weight of the upper node b = a + k h: (1 - e^{-(l - a)}) / (1 - e^{-(b - a)}), l = a + r h
    to_upper = np.expm1(-r * h) / math.expm1(-coarse_h)
    out = np.zeros(cells + 1)
    # one BLAS thread: OpenBLAS's gemv threads spin on the other core for no speed on this
    # memory-bound k-column product (~40% of the accountant's CPU on EMPDEN's grid at h = 1e-4)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        out[:-1] = table @ (1.0 - to_upper)
        out[1:] += table @ to_upper
    infinity_mass, pessimistic = dense._infinity_mass, dense._pessimistic_estimate  # noqa: SLF001
    return pld_pmf.DensePLDPmf(coarse_h, int(first), out, infinity_mass, pessimistic)


def coarsen(pld: pld_lib.PrivacyLossDistribution, factor: int) -> pld_lib.PrivacyLossDistribution:
    """:func:`coarsen_pmf` applied to both neighbouring directions."""
    remove = coarsen_pmf(pld._pmf_remove, factor)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return pld_lib.PrivacyLossDistribution(remove)
    return pld_lib.PrivacyLossDistribution(remove, coarsen_pmf(pld._pmf_add, factor))  # noqa: SLF001


def self_convolve_bounds(probs: np.ndarray, num_times: int, tail_mass_truncation: float) -> tuple[int, int]:
    """``common.compute_self_convolve_bounds`` (Chernoff bounds at the same 40 orders), with the
    log-MGFs computed on the support once instead of through 40 generic ``logsumexp`` calls."""
    n = len(probs)
    lower, upper = 0, (n - 1) * num_times
    if tail_mass_truncation == 0:
        return lower, upper
    support = np.flatnonzero(probs > 0)
    log_p = np.log(probs[support])
    index = support.astype(float)
    for order in np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n:
        v = index * order + log_p
        m = v.max()
        log_mgf = m + math.log(np.sum(np.exp(v - m)))
        bound = (num_times * log_mgf + math.log(2 / tail_mass_truncation)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, upper


#: Spectral components with |z|^N below this are set to 0 instead of being raised to the power N
#: (:func:`_spectrum_power`).
SPECTRUM_DROP = 1e-40


def _spectrum_power(spectrum: np.ndarray, num_times: int) -> np.ndarray:
    """spectrum ** num_times, computed only where the result is above :data:`SPECTRUM_DROP`.

    Why: NumPy's complex ``**`` for a large integer goes through ``cpow`` (a complex log and exp,
    ~180 ns an element) and was most of a composition's time at h = 1e-4, yet the composed PLD is
    smooth: on EMPDEN's grid (N = 50,000) fewer than 0.5% of the frequencies have |z|^N above
    1e-40. The kept ones are bit-identical to ``**`` (repeated squaring would be faster still but
    loses ~N x machine epsilon near |z| = 1, a uniform offset over the whole composed PMF). A dropped
    one moves every point of the inverse FFT by at most 2 x 1e-40 / size, i.e. the PMF by < 2e-40 in
    L1; all of them together by < 1e-40 x size, below 1e-32 even for a 1e8-point grid: 17 orders of
    magnitude below the truncation mass already in delta, and far below the FFT's own rounding.
    """
    threshold = math.exp(math.log(SPECTRUM_DROP) / num_times)  # |z| > threshold <=> |z|^N > SPECTRUM_DROP
    keep = np.abs(spectrum) > threshold
    powered = np.zeros_like(spectrum)
    powered[keep] = spectrum[keep] ** num_times
    return powered


def _self_compose_pmf(pmf, num_times: int, tail_mass_truncation: float, workers: int, margin: float = 0.0):
    """``DensePLDPmf.self_compose`` with a real FFT (half the work of the library's complex one).

    Same Chernoff truncation bounds and the same mass bookkeeping as dp_accounting (the
    truncated mass goes to the infinity mass, i.e. into delta); only the arithmetic path of
    the convolution differs. ``margin`` is added to the infinity mass (item 4 of "Speed").
    """
    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
    lo, hi = self_convolve_bounds(probs, num_times, tail_mass_truncation)
    out_len = hi - lo + 1
    _check_grid(max(out_len, len(probs)), f"the {num_times}-fold composed PLD", dense._discretization)  # noqa: SLF001
    size = sp_fft.next_fast_len(max(out_len, len(probs)), real=True)
    spectrum = sp_fft.rfft(probs, size, workers=workers)
    conv = sp_fft.irfft(_spectrum_power(spectrum, num_times), size, workers=workers)
    out = np.roll(conv, -lo)[:out_len]
    inf_prob = margin + tail_mass_truncation - math.expm1(num_times * math.log1p(-dense._infinity_mass))  # noqa: SLF001
    return pld_pmf.DensePLDPmf(dense._discretization, dense._lower_loss * num_times + lo, out,  # noqa: SLF001
                               inf_prob, dense._pessimistic_estimate)  # noqa: SLF001


def self_compose(pld: pld_lib.PrivacyLossDistribution, num_times: int, *, tail_mass_truncation: float = 1e-15,
                 workers: int = 1, margin: float = 0.0) -> pld_lib.PrivacyLossDistribution:
    """``PrivacyLossDistribution.self_compose`` through :func:`_self_compose_pmf` (both directions)."""
    if num_times == 1:
        return pld
    remove = _self_compose_pmf(pld._pmf_remove, num_times, tail_mass_truncation, workers, margin)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return pld_lib.PrivacyLossDistribution(remove)
    add = _self_compose_pmf(pld._pmf_add, num_times, tail_mass_truncation, workers, margin)  # noqa: SLF001
    return pld_lib.PrivacyLossDistribution(remove, add)


def coarse_self_compose(pld: pld_lib.PrivacyLossDistribution, num_times: int, *,
                        interval: float = COMPOSITION_INTERVAL, tail_mass_truncation: float = 1e-15,
                        workers: int = 1, factor: int | None = None) -> pld_lib.PrivacyLossDistribution:
    """N-fold composition on the grid k h ~ ``interval``: :func:`coarsen`, then :func:`self_compose`
    with one extra ``tail_mass_truncation`` in the infinity mass. Dominates dp_accounting's
    ``pld.self_compose(num_times)`` for every eps (module docstring, "Speed"); with k = 1 it is
    exactly :func:`self_compose`. ``factor`` forces k (a composition of several mechanisms needs
    one grid: the caller passes the smallest k its parts chose, which only makes a part finer)."""
    if num_times == 1:
        return pld
    if factor is not None:
        k = int(factor)
    else:
        k_max = composition_factor(pld._pmf_remove._discretization, interval)  # noqa: SLF001
        # one k for both directions (they are composed separately, but one grid keeps eps's
        # max over directions comparable); the narrower direction decides
        k = min(split_factor(pld._pmf_remove, k_max), split_factor(pld._pmf_add, k_max))  # noqa: SLF001
    if k == 1:
        return self_compose(pld, num_times, tail_mass_truncation=tail_mass_truncation, workers=workers)
    return self_compose(coarsen(pld, k), num_times, tail_mass_truncation=tail_mass_truncation, workers=workers,
                        margin=tail_mass_truncation)


def _epsilon_for_delta_pmf(pmf, delta: float, chunk: int = 1 << 16) -> float:
    """``pld_pmf._get_epsilon_for_delta`` on a dense PMF: its scan from the largest loss down,
    stopping at the first loss where eps >= loss, done chunk by chunk with cumulative sums
    instead of a Python loop over (possibly millions of) grid points."""
    dense = pmf.to_dense_pmf()
    infinity_mass = dense._infinity_mass  # noqa: SLF001
    if infinity_mass > delta:
        return math.inf
    h = dense._discretization  # noqa: SLF001
    all_probs = np.asarray(dense._probs, dtype=float)[::-1]  # noqa: SLF001  descending losses
    top = dense._lower_loss + len(all_probs) - 1  # noqa: SLF001
    mass_upper, mass_lower = infinity_mass, 0.0
    for start in range(0, len(all_probs), chunk):
        probs = all_probs[start:start + chunk]
        losses = (top - start - np.arange(len(probs))) * h
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            upper_after = mass_upper + np.cumsum(probs)
            lower_after = mass_lower + np.cumsum(np.exp(-losses) * probs)
            upper_before = np.concatenate([[mass_upper], upper_after[:-1]])
            lower_before = np.concatenate([[mass_lower], lower_after[:-1]])
            stop = (upper_before > delta) & (lower_before > 0) & (
                np.log((upper_before - delta) / lower_before) >= losses)
            degenerate = (upper_after >= delta) & (lower_after == 0)  # exp(-loss) underflowed to 0
        first_stop = int(np.argmax(stop)) if stop.any() else len(probs)
        first_degenerate = int(np.argmax(degenerate)) if degenerate.any() else len(probs)
        if first_degenerate < first_stop:
            return max(0.0, float(losses[first_degenerate]))
        if first_stop < len(probs):
            mass_upper, mass_lower = upper_before[first_stop], lower_before[first_stop]
            break
        mass_upper, mass_lower = upper_after[-1], lower_after[-1]
    if mass_upper <= mass_lower + delta:
        return 0.0
    return float(math.log((mass_upper - delta) / mass_lower))


def epsilon_for_delta(pld: pld_lib.PrivacyLossDistribution, delta: float) -> float:
    """``PrivacyLossDistribution.get_epsilon_for_delta``: the larger eps of the two directions."""
    eps = _epsilon_for_delta_pmf(pld._pmf_remove, delta)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return eps
    return max(eps, _epsilon_for_delta_pmf(pld._pmf_add, delta))  # noqa: SLF001

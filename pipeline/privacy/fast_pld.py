"""dp_accounting's (subsampled) Gaussian PLD pipeline, vectorised -- same numbers, faster.

Why this exists: at EMPDEN's h = 1e-5 the one-output PLD of a strong block has 1-3 million
grid points, and ``dp_accounting`` 0.6.0 walks them in Python: the hockey-stick divergence
of connect-the-dots calls ``inverse_privacy_loss`` once per point (40 s of 48 s for
mu_bar_B = 1.56), privacy buckets (the optimistic eps_l) does the same and accumulates a
dict of millions of keys, the composition's truncation bounds run 40 generic ``logsumexp``
calls, and ``get_epsilon_for_delta`` scans the composed PMF point by point. Here:

* :class:`VectorizedGaussianPrivacyLoss` subclasses the library's ``GaussianPrivacyLoss`` and
  overrides only ``get_delta_for_epsilon`` with the same formulas on a NumPy array;
  connect-the-dots itself stays the library's.
* :func:`_privacy_buckets_pmf` is the library's privacy-buckets branch with the loop on arrays.
* :func:`self_compose` is the library's FFT self-composition (same Chernoff truncation bounds
  at the same orders, truncated mass added to the infinity mass, i.e. into delta) with a real
  FFT and the bounds' log-MGFs computed in one pass each.
* :func:`epsilon_for_delta` is the library's scan from the largest loss down, chunked on arrays.

``tests/privacy/test_fast_pld.py`` checks PMFs, bounds and eps against dp_accounting (equal
to floating-point rounding, ~1e-10 relative in eps: the library accumulates its loss grid by
repeated subtraction, we multiply). The replay never uses this module
(``accountants.pld_epsilon(reference=True)``), so an audit does not depend on it.

Depends on private helpers of dp_accounting (``_create_pld_pmf_from_monotone_privacy_loss``,
``_pld_for_subsampled_mechanism``, ``DensePLDPmf`` fields); the version is pinned in
envs/requirements.txt and the equality tests fail loudly if a new version changes them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy import fft as sp_fft

AdjacencyType = plm.AdjacencyType


class VectorizedGaussianPrivacyLoss(plm.GaussianPrivacyLoss):
    """``GaussianPrivacyLoss`` whose ``get_delta_for_epsilon`` runs on arrays (ADD/REMOVE)."""

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
    r0 = math.floor(loss.privacy_loss(lower_x) / h)
    upper_loss = loss.privacy_loss(upper_x)
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
        return pld_lib._create_pld_pmf_from_monotone_privacy_loss(  # noqa: SLF001 (see module doc)
            loss, pessimistic_estimate=pessimistic_estimate,
            value_discretization_interval=value_discretization_interval, use_connect_dots=pessimistic_estimate)

    return pld_lib._pld_for_subsampled_mechanism(single, sampling_prob)  # noqa: SLF001


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


def _self_compose_pmf(pmf, num_times: int, tail_mass_truncation: float, workers: int):
    """``DensePLDPmf.self_compose`` with a real FFT (half the work of the library's complex one).

    Same Chernoff truncation bounds and the same mass bookkeeping as dp_accounting (the
    truncated mass goes to the infinity mass, i.e. into delta); only the arithmetic path of
    the convolution differs.
    """
    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
    lo, hi = self_convolve_bounds(probs, num_times, tail_mass_truncation)
    out_len = hi - lo + 1
    size = sp_fft.next_fast_len(max(out_len, len(probs)), real=True)
    spectrum = sp_fft.rfft(probs, size, workers=workers)
    conv = sp_fft.irfft(spectrum ** num_times, size, workers=workers)
    out = np.roll(conv, -lo)[:out_len]
    inf_prob = tail_mass_truncation - math.expm1(num_times * math.log1p(-dense._infinity_mass))  # noqa: SLF001
    return pld_pmf.DensePLDPmf(dense._discretization, dense._lower_loss * num_times + lo, out,  # noqa: SLF001
                               inf_prob, dense._pessimistic_estimate)  # noqa: SLF001


def self_compose(pld: pld_lib.PrivacyLossDistribution, num_times: int, *, tail_mass_truncation: float = 1e-15,
                 workers: int = 1) -> pld_lib.PrivacyLossDistribution:
    """``PrivacyLossDistribution.self_compose`` through :func:`_self_compose_pmf` (both directions)."""
    if num_times == 1:
        return pld
    remove = _self_compose_pmf(pld._pmf_remove, num_times, tail_mass_truncation, workers)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return pld_lib.PrivacyLossDistribution(remove)
    add = _self_compose_pmf(pld._pmf_add, num_times, tail_mass_truncation, workers)  # noqa: SLF001
    return pld_lib.PrivacyLossDistribution(remove, add)


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

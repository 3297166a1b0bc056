"""STRAIGHTDP Stage 2: time-heterogeneous allocation (THA) DP-SGD (Sec. 3.2, Remark 3.3, App. B.5).

**Time.** t is the paper's rectified-flow time, x_t = (1 - t) xi + t z with xi ~ N(0, I) and
t in [0, 1], **t = 0 the noise end** (Sec. 2). (``pipeline.models.denoiser``'s
``rectified_flow_t`` files write x_t = (1 - t) y + t n, i.e. t_model = 1 - t: a caller that
trains such a model maps the draws.) Stage 1 distils the released analytic field into
[0, tau); Stage 2 trains only t in [tau, 1], so no private gradient targets [0, tau).

**Buckets.** K buckets of equal width, edges tau = t_0 < t_1 < ... < t_K = 1
(:func:`bucket_edges`); bucket k trains t in [t_k, t_{k+1}). Steps go to buckets round-robin:
step i trains bucket i mod K, so bucket k runs T_k = floor(T/K) + [k < T mod K] steps
(:func:`round_robin_counts`; T need not divide by K). The assignment is a public function of
the step index, fixed before training.

**Shape family** (App. B.5, Figure 2b). C_beta(t) proportional to
(sqrt(w(t) Vbar(t)) / (1 - t))^beta, with w the loss weighting (1 for the plain
rectified-flow loss) and Vbar(t) = tr Cov[z | x_t] of the RELEASED analytic field (Stage 1's
moments after post-processing, or a public model: never the private data). Since
z - xi = (z - x_t)/(1 - t), sqrt(Vbar)/(1 - t) is the rms spread of the velocity target
around its posterior mean, the scale of a per-example gradient at time t. The profile is
evaluated at bucket midpoints and rescaled publicly so that the mean over buckets is C_ref
(:func:`clip_shape`); beta = 0 is the uniform plan C_k = C_ref. For beta > 0,
C_k / C_j = (g_k / g_j)^beta with g = sqrt(w Vbar)/(1 - t): the buckets keep the order of g,
so a larger posterior variance (at the same t) gets a larger clip.

**Noise.** ONE absolute noise scale s, the std of the Gaussian added to the clipped SUM, is
shared by all buckets, so bucket k has noise multiplier sigma_k = s / C_k: a bucket with a
larger clip pays more privacy. (Were the multiplier shared instead, every beta would cost the
same eps and the calibration would have nothing to trade.) The released gradient is
(sum clip_{C_k}(g_i) + N(0, s^2 I)) / (q N) as in :mod:`pipeline.privacy.dpsgd` (step 5).

**Accounting.** The run is ComposedDpEvent([SelfComposed(PoissonSampled(q, Gaussian(sigma_k)),
T_k) for each bucket with T_k > 0]) under add/remove adjacency (:meth:`THAPlan.event`).
:func:`calibrate_noise_scale` finds the smallest s (relative tolerance rtol) whose certified
pessimistic PLD eps of Composed([prior_event, THA event]) meets the target, where the prior
event is a FIXED earlier release (Stage 1's moments). Invariant, as in
:func:`pipeline.privacy.dpsgd.calibrate_noise_multiplier`: the returned s has eps(s) <=
target < eps(s / (1 + rtol)). The run's ledger line (:func:`ledger_entry`) carries the THA
event alone (Stage 1 writes its own line) and the replay rebuilds it from the line's
parameters (the ``tha_dpsgd`` rebuilder below).

Speed (K = 4, T = 300..2000, q = 0.02..0.1, h = 1e-4): one PLD evaluation of the 4-bucket
event costs 0.8-3 s on one CPU (four FFT self-compositions and three dense compositions), so a
plain 15-step bisection over 5 candidates would take minutes. The search therefore runs on a
coarse grid (h = 1e-3, ~6x cheaper; eps ~1e-5 relative above the fine one, ~0.3% with an
unsampled Gaussian prior) with log-log secant steps from a GDP-CLT starting guess (an
estimate only), and the final bracket is verified at the run's own h; whatever the search
grid says, the returned s is certified by evaluations at the run's settings. Measured
(``plan_candidates``, 5 betas, K = 4, N = 60,000, on a shared 2-core machine): 2-8 s where
the calibrated sigma is ~1.5-6 (q = 0.02..0.1, T = 300..2000, eps 0.77-3, with or without a
Gaussian prior), 27-37 s where it is ~0.6-1 (eps 8 at T = 300, eps 40 at q = 0.1, T = 2000),
whose fine PLDs cost ~3 s each. The result equals dpsgd's
bisection within rtol (uniform plan: s = 0.99493 vs sigma = 0.99524 at rtol 1e-3).

**Planner** (App. B.5). For each beta in {0, 1/4, 1/2, 3/4, 1}: shape, calibrate s (a beta
that does not calibrate in the bracket is dropped; the uniform plan must calibrate), and
score the candidate with a PUBLIC proxy U; :func:`select_plan` returns the arg max, ties to
uniform. Remark 3.3: uniform is a candidate and every candidate meets the same budget with
the same accountant, so the selected plan's eps meets the budget and U(selected) >=
U(uniform), for every U; this is a selection-consistency statement, not a utility guarantee.
Planning costs no privacy: Vbar, w and U are computed on public data and the accountant is
a deterministic function of declared parameters; only the executed plan touches the data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd_plan  # DP-SGD's accounting half: the replay rebuilds THA lines without torch
from pipeline.privacy import ledger

if TYPE_CHECKING:  # torch is imported where a tensor is made (the replay and the tables read this module)
    import torch
    from torch import Tensor
from pipeline.privacy.rebuild import Expected, RebuildError, param, register

log = logging.getLogger(__name__)

MECHANISM = "tha_dpsgd"
REFERENCE = "STRAIGHTDP Sec. 3.2, App. B.5"
#: the shape family of App. B.5 / Table 9 (beta = 0: uniform)
PAPER_BETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: grid of the calibration's search phase; the final bracket is checked at the run's own settings
SEARCH_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-3)

#: ``vbar(t) -> tr Cov[z | x_t]`` and ``weight(t) -> w(t)`` at one time t (public functions)
TimeFunction = Callable[[float], float]


class THAError(dpsgd_plan.DPSGDError):
    """Bad THA parameters or an impossible plan; the message is one line."""


# --------------------------------------------------------------------------- buckets and shapes

def bucket_edges(tau: float, K: int) -> tuple[float, ...]:
    """K equal-width buckets covering [tau, 1]: (tau, ..., 1.0), K + 1 edges, the last exactly 1."""
    if not (isinstance(K, int) and K >= 1):
        raise THAError(f"number of buckets K must be an integer >= 1, got {K!r}")
    if not 0 <= tau < 1:
        raise THAError(f"horizon tau must be in [0, 1), got {tau}")
    return tuple(tau + (1.0 - tau) * k / K for k in range(K)) + (1.0,)


def round_robin_counts(steps: int, K: int) -> tuple[int, ...]:
    """T_k when step i trains bucket i mod K: floor(T/K), plus one for the first T mod K buckets."""
    return tuple(steps // K + (1 if k < steps % K else 0) for k in range(K))


def gaussian_vbar(eigenvalues: Sequence[float]) -> TimeFunction:
    """Vbar(t) = tr Cov[z | x_t] = sum_i lambda_i (1-t)^2 / (t^2 lambda_i + (1-t)^2) for z ~ N(mu, Sigma).

    Gaussian conditioning of the moment model (Prop. 3.1, eq. 3) on x_t = (1-t) xi + t z;
    ``eigenvalues`` are those of the RELEASED covariance (post-processing of Stage 1). The
    class means do not enter: the shared covariance makes every class's posterior spread equal.
    """
    lam = [float(v) for v in eigenvalues]
    if not lam or not all(math.isfinite(v) and v >= 0 for v in lam):
        raise THAError(f"covariance eigenvalues must be finite and >= 0, got {list(eigenvalues)[:5]}")

    def vbar(t: float) -> float:
        a = (1.0 - t) ** 2
        return sum(v * a / (t * t * v + a) for v in lam) if a > 0 else 0.0

    return vbar


def clip_shape(edges: Sequence[float], *, beta: float, vbar: TimeFunction, weight: TimeFunction | None = None,
               c_ref: float = 1.0) -> tuple[float, ...]:
    """C_k of the shape family C_beta(t) ~ (sqrt(w(t) Vbar(t)) / (1 - t))^beta (App. B.5) at bucket midpoints.

    Rescaled publicly so that mean_k C_k = ``c_ref``; beta = 0 gives C_k = c_ref exactly.
    """
    edges = _edges(edges)
    if not (math.isfinite(beta) and beta >= 0):
        raise THAError(f"shape exponent beta must be finite and >= 0, got {beta}")
    if not (math.isfinite(c_ref) and c_ref > 0):
        raise THAError(f"reference clip C_ref must be > 0 and finite, got {c_ref}")
    if beta == 0:
        return (float(c_ref),) * (len(edges) - 1)
    logs = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        t = 0.5 * (lo + hi)
        w = 1.0 if weight is None else float(weight(t))
        v = float(vbar(t))
        if not (math.isfinite(w) and w > 0 and math.isfinite(v) and v > 0):
            raise THAError(f"w(t) and Vbar(t) must be > 0 and finite at the bucket midpoint t={t:g}, "
                           f"got w={w}, Vbar={v}")
        logs.append(beta * (0.5 * math.log(w * v) - math.log1p(-t)))
    top = max(logs)  # in log space: (g_k / g_max)^beta cannot overflow
    raw = [math.exp(x - top) for x in logs]
    mean = sum(raw) / len(raw)
    return tuple(c_ref * r / mean for r in raw)


def _edges(edges: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(e) for e in edges)
    if len(out) < 2:
        raise THAError(f"bucket edges need at least 2 values (one bucket), got {list(out)}")
    if not (0 <= out[0] and out[-1] == 1.0 and all(a < b for a, b in zip(out[:-1], out[1:]))):
        raise THAError(f"bucket edges must increase strictly from tau >= 0 to exactly 1, got {list(out)}")
    return out


def uniform_time_sampler(n: int, generator: torch.Generator | None = None,
                         time_range: tuple[float, float] | None = None) -> Tensor:
    """t ~ U[lo, hi) (``[0, 1)`` without a range), float32, for :class:`dpsgd.NoiseMultiplicity`.

    Computed in float32 and clamped below hi there, so that rounding never puts a draw on the
    next bucket's edge (the engine checks [lo, hi) in the model's dtype).
    """
    import torch

    lo, hi = time_range if time_range is not None else (0.0, 1.0)
    lo32, hi32 = torch.tensor(lo, dtype=torch.float32), torch.tensor(hi, dtype=torch.float32)
    u = torch.rand(n, generator=generator, dtype=torch.float32)
    t = lo32 + (hi32 - lo32) * u
    return torch.minimum(torch.maximum(t, lo32), torch.nextafter(hi32, lo32))


# --------------------------------------------------------------------------- the plan

def tha_event(noise_multipliers: Sequence[float], sampling_rate: float,
              step_counts: Sequence[int]) -> dp_event.DpEvent:
    """Composed([SelfComposed(PoissonSampled(q, Gaussian(sigma_k)), T_k)]) over buckets with T_k > 0."""
    parts = [dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(float(s))), int(n))
        for s, n in zip(noise_multipliers, step_counts) if n > 0]
    if not parts:
        raise THAError("a THA event needs at least one bucket with T_k > 0")
    return dp_event.ComposedDpEvent(parts)


def with_prior(event: dp_event.DpEvent, prior_event: dp_event.DpEvent | None) -> dp_event.DpEvent:
    """Composed([prior, event]): the whole pipeline's mechanism when an earlier release is fixed."""
    return event if prior_event is None else dp_event.ComposedDpEvent([prior_event, event])


@dataclass(frozen=True)
class THAPlan:
    """A Stage-2 run declared before training: buckets, per-bucket clips, ONE noise std s.

    ``edges`` (K + 1, ending at 1), ``clips`` C_k (K), ``noise_std`` s (std of the Gaussian on
    the clipped SUM, every step), ``sampling_rate`` q (Poisson), ``dataset_size`` N, ``steps``
    T (all buckets), ``delta``, ``beta`` (the shape it came from; informational). Implements
    :class:`pipeline.privacy.dpsgd.StepPlan`, so :class:`pipeline.privacy.dpsgd.DPSGD` runs it.
    """

    edges: tuple[float, ...]
    clips: tuple[float, ...]
    noise_std: float
    sampling_rate: float
    dataset_size: int
    steps: int
    delta: float
    beta: float = 0.0
    sampling: Literal["poisson"] = "poisson"

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", _edges(self.edges))
        object.__setattr__(self, "clips", tuple(float(c) for c in self.clips))
        if len(self.clips) != len(self.edges) - 1:
            raise THAError(f"clips: {len(self.clips)} values for {len(self.edges) - 1} buckets")
        if not all(math.isfinite(c) and c > 0 for c in self.clips):
            raise THAError(f"clip norms C_k must be > 0 and finite, got {list(self.clips)}")
        if not (math.isfinite(self.noise_std) and self.noise_std > 0):
            raise THAError(f"noise std s must be > 0 and finite, got {self.noise_std}")
        if not 0 < self.sampling_rate <= 1:
            raise THAError(f"sampling rate q must be in (0, 1], got {self.sampling_rate}")
        if not (isinstance(self.dataset_size, int) and self.dataset_size >= 1):
            raise THAError(f"dataset size N must be an integer >= 1, got {self.dataset_size!r}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise THAError(f"number of steps T must be an integer >= 1, got {self.steps!r}")
        if not 0 < self.delta < 1:
            raise THAError(f"delta must be in (0, 1), got {self.delta}")
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise THAError(f"shape exponent beta must be finite and >= 0, got {self.beta}")
        if self.sampling != "poisson":
            raise THAError(f"THA runs Poisson sampling only (add/remove accounting), got {self.sampling!r}")

    # ---- derived
    @property
    def K(self) -> int:
        return len(self.clips)

    @property
    def step_counts(self) -> tuple[int, ...]:
        """T_k (round-robin)."""
        return round_robin_counts(self.steps, self.K)

    @property
    def noise_multipliers(self) -> tuple[float, ...]:
        """sigma_k = s / C_k."""
        return tuple(self.noise_std / c for c in self.clips)

    @property
    def expected_batch_size(self) -> float:
        """q N, the public divisor of the noisy sum."""
        return self.sampling_rate * self.dataset_size

    @property
    def batch_size(self) -> int:
        return int(round(self.expected_batch_size))

    @property
    def adjacency(self) -> str:
        return "add_or_remove_one"

    @property
    def first_bucket(self) -> int:
        """The first bucket that runs (T_k > 0): its clip is the ledger line's sensitivity."""
        return next(k for k, n in enumerate(self.step_counts) if n > 0)

    @property
    def sensitivity(self) -> float:
        return self.clips[self.first_bucket]

    def bucket_of(self, step: int) -> int:
        """k = step mod K (round-robin), for 0 <= step < T."""
        if not (isinstance(step, int) and 0 <= step < self.steps):
            raise THAError(f"step must be an integer in [0, T={self.steps}), got {step!r}")
        return step % self.K

    def time_range(self, k: int) -> tuple[float, float]:
        """[t_k, t_{k+1}): the times bucket k trains."""
        if not (isinstance(k, int) and 0 <= k < self.K):
            raise THAError(f"bucket must be an integer in [0, K={self.K}), got {k!r}")
        return self.edges[k], self.edges[k + 1]

    def clip_of(self, step: int) -> float:
        return self.clips[self.bucket_of(step)]

    # ---- dpsgd.StepPlan
    def clip_at(self, step: int) -> float:
        return self.clip_of(step)

    def noise_std_at(self, step: int) -> float:
        self.bucket_of(step)  # range check: no noise is defined past T
        return self.noise_std

    def time_range_at(self, step: int) -> tuple[float, float]:
        return self.time_range(self.bucket_of(step))

    # ---- accounting
    def event(self) -> dp_event.DpEvent:
        return tha_event(self.noise_multipliers, self.sampling_rate, self.step_counts)

    def epsilon(self, settings: acc.PLDSettings = dpsgd_plan.DPSGD_PLD_SETTINGS,
                prior_event: dp_event.DpEvent | None = None) -> float:
        """Certified (pessimistic PLD) eps at ``delta`` of this run, composed with ``prior_event`` if given."""
        return acc.pld_epsilon(with_prior(self.event(), prior_event), self.delta, settings=settings)


# --------------------------------------------------------------------------- calibration

def calibrate_noise_scale(*, clips: Sequence[float], sampling_rate: float, step_counts: Sequence[int],
                          delta: float, target_epsilon: float, prior_event: dp_event.DpEvent | None = None,
                          settings: acc.PLDSettings = dpsgd_plan.DPSGD_PLD_SETTINGS, rtol: float = 1e-3,
                          bracket: tuple[float, float] = (0.2, 200.0)) -> float:
    """Smallest s (to relative tolerance ``rtol``) with certified eps(Composed([prior, THA(s)])) <= target.

    ``bracket`` bounds s / mean(C_k), the noise multiplier of a clip of mean size, like
    dpsgd's sigma bracket. Invariant: eps(s) <= target < eps(s / (1 + rtol)), both evaluated
    with ``settings`` (see the module docstring, "Speed", for the coarse search before it).
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise THAError(f"target epsilon must be > 0 and finite, got {target_epsilon}")
    if not 0 < rtol < 1:
        raise THAError(f"rtol must be in (0, 1), got {rtol}")
    clips = tuple(float(c) for c in clips)
    counts = tuple(int(n) for n in step_counts)
    if len(clips) != len(counts) or not clips:
        raise THAError(f"clips and step counts must have the same length >= 1, got {len(clips)} and {len(counts)}")
    if not all(math.isfinite(c) and c > 0 for c in clips):
        raise THAError(f"clip norms C_k must be > 0 and finite, got {list(clips)}")
    if not 0 < sampling_rate <= 1:
        raise THAError(f"sampling rate q must be in (0, 1], got {sampling_rate}")
    if not 0 < bracket[0] < bracket[1]:
        raise THAError(f"bracket must be (lo, hi) with 0 < lo < hi, got {bracket}")
    c_mean = sum(clips) / len(clips)
    bounds = (bracket[0] * c_mean, bracket[1] * c_mean)
    where = f"(q={sampling_rate}, T_k={list(counts)}, delta={delta}{', with the prior event' if prior_event else ''})"

    def log_excess(s: acc.PLDSettings) -> Callable[[float], float]:
        def f(log_scale: float) -> float:
            event = tha_event([math.exp(log_scale) / c for c in clips], sampling_rate, counts)
            eps = acc.pld_epsilon(with_prior(event, prior_event), delta, settings=s)
            return math.log(eps / target_epsilon) if eps > 0 else -math.inf
        return f

    x = math.log(_clt_guess(clips, sampling_rate, counts, delta, target_epsilon, bounds))
    step, slope = math.log(1.3), None
    if settings.value_discretization_interval < SEARCH_PLD_SETTINGS.value_discretization_interval:
        try:  # cheap search on the coarse grid: only a starting point for the certified phase below
            _, x, slope = _refine(log_excess(SEARCH_PLD_SETTINGS), x, bounds, math.log1p(rtol / 4), step, None,
                                  where, target_epsilon)
            step = 0.5 * math.log1p(rtol)
        except THAError:
            pass  # the coarse grid is looser near the bracket's ends; the certified phase decides
    _, b, _ = _refine(log_excess(settings), x, bounds, math.log1p(rtol), step, slope, where, target_epsilon)
    return math.exp(b)


def _clt_guess(clips: Sequence[float], q: float, counts: Sequence[int], delta: float, target: float,
               bounds: tuple[float, float]) -> float:
    """Starting point of the search: s where the GDP CLT estimate (acc.clt_epsilon) meets the target.

    An ESTIMATE (it ignores the prior event and can be off by 20-30%); the search walks from it.
    """
    def eps(log_scale: float) -> float:
        s = math.exp(log_scale)
        return acc.clt_epsilon([(c / s, q, n) for c, n in zip(clips, counts) if n > 0], delta)

    a, b = math.log(bounds[0]), math.log(bounds[1])
    if eps(b) > target:
        out = bounds[1]
    elif eps(a) <= target:
        out = bounds[0]
    else:
        for _ in range(40):
            mid = 0.5 * (a + b)
            a, b = (a, mid) if eps(mid) <= target else (mid, b)
        out = math.exp(b)
    return out


def _refine(f: Callable[[float], float], x: float, bounds: tuple[float, float], width: float, step: float,
            slope: float | None, where: str, target: float) -> tuple[float, float, float]:
    """(a, b, slope) in log s with f(a) > 0 >= f(b), b - a <= ``width``; f = log(eps / target), decreasing.

    Walks from ``x`` by doubling steps (the first one at least 1.5x the distance to the root
    that a known ``slope`` df/dlog s predicts) until the root is bracketed, then takes secant
    steps on the (nearly linear) log-log curve, probing ``width/4`` either side of each secant
    root so that both ends close in; a round that does not halve the bracket adds a bisection
    step. The slope returned is that of the first bracket, for the next phase's first step.
    """
    lo_b, hi_b = math.log(bounds[0]), math.log(bounds[1])
    x = min(max(x, lo_b), hi_b)
    fx = f(x)
    if slope is not None and slope < 0 and math.isfinite(fx):
        step = max(step, 1.5 * abs(fx / slope))
    if fx <= 0:
        b, fb = x, fx
        while True:
            if b <= lo_b:
                raise THAError(f"target eps {target} is met already at s = {bounds[0]:.6g} {where}; widen the bracket")
            a = max(b - step, lo_b)
            fa = f(a)
            if fa > 0:
                break
            b, fb, step = a, fa, 2 * step
    else:
        a, fa = x, fx
        while True:
            if a >= hi_b:
                raise THAError(f"target eps {target} unreachable with s <= {bounds[1]:.6g} {where}; lower q or T")
            b = min(a + step, hi_b)
            fb = f(b)
            if fb <= 0:
                break
            a, fa, step = b, fb, 2 * step
    first_slope = (fb - fa) / (b - a) if math.isfinite(fa) and math.isfinite(fb) else None
    while b - a > width:
        before = b - a
        root = a + before * fa / (fa - fb) if math.isfinite(fa) and math.isfinite(fb) else a + before / 2
        for p in (root + width / 4, root - width / 4):
            if a < p < b:
                fp = f(p)
                if fp > 0:
                    a, fa = p, fp
                else:
                    b, fb = p, fp
        if b - a > before / 2:
            mid = 0.5 * (a + b)
            fm = f(mid)
            if fm > 0:
                a, fa = mid, fm
            else:
                b, fb = mid, fm
    return a, b, first_slope


# --------------------------------------------------------------------------- the planner

def plan_candidates(*, edges: Sequence[float], vbar: TimeFunction, sampling_rate: float, dataset_size: int,
                    steps: int, delta: float, target_epsilon: float, betas: Sequence[float] = PAPER_BETAS,
                    weight: TimeFunction | None = None, c_ref: float = 1.0,
                    prior_event: dp_event.DpEvent | None = None,
                    settings: acc.PLDSettings = dpsgd_plan.DPSGD_PLD_SETTINGS, rtol: float = 1e-3,
                    bracket: tuple[float, float] = (0.2, 200.0)) -> list[THAPlan]:
    """One calibrated :class:`THAPlan` per beta (App. B.5 steps 1-2), uniform first.

    A beta whose calibration fails in the bracket is dropped (logged); the uniform plan
    (beta = 0) must be among ``betas`` and must calibrate, else :class:`THAError`.
    """
    betas = sorted({float(b) for b in betas})
    if 0.0 not in betas:
        raise THAError(f"betas must include 0 (the uniform plan, Remark 3.3), got {betas}")
    counts = round_robin_counts(steps, len(_edges(edges)) - 1)
    out = []
    for beta in betas:
        clips = clip_shape(edges, beta=beta, vbar=vbar, weight=weight, c_ref=c_ref)
        try:
            s = calibrate_noise_scale(clips=clips, sampling_rate=sampling_rate, step_counts=counts, delta=delta,
                                      target_epsilon=target_epsilon, prior_event=prior_event, settings=settings,
                                      rtol=rtol, bracket=bracket)
        except dpsgd_plan.DPSGDError as exc:
            if beta == 0:
                raise THAError(f"the uniform plan (beta 0) does not calibrate: {exc}") from None
            log.info("THA planner: beta %g dropped (%s)", beta, exc)
            continue
        out.append(THAPlan(edges=tuple(edges), clips=clips, noise_std=s, sampling_rate=sampling_rate,
                           dataset_size=dataset_size, steps=steps, delta=delta, beta=beta))
    return out


def select_plan(candidates: Sequence[THAPlan], proxy: Callable[[THAPlan], float]
                ) -> tuple[THAPlan, dict[float, float]]:
    """(arg max of the PUBLIC proxy U over the candidates, {beta: U}) (App. B.5 step 3).

    Ties go to the uniform plan (then to the smaller beta), so U(selected) >= U(uniform)
    whatever U is (Remark 3.3). ``proxy`` must be computed on public data only.
    """
    betas = [p.beta for p in candidates]
    if len(set(betas)) != len(betas):
        raise THAError(f"candidates must have distinct beta, got {betas}")
    uniform = [p for p in candidates if p.beta == 0]
    if not uniform:
        raise THAError(f"the candidates must include the uniform plan (beta 0), got betas {betas}")
    scores: dict[float, float] = {}
    for p in candidates:
        u = float(proxy(p))
        if not math.isfinite(u):
            raise THAError(f"proxy score of beta {p.beta} must be finite, got {u}")
        scores[p.beta] = u
    best = uniform[0]
    for p in sorted(candidates, key=lambda c: c.beta):
        if scores[p.beta] > scores[best.beta]:  # strict: a tie keeps uniform (or the smaller beta)
            best = p
    return best, scores


def gradient_snr_proxy(bucket_grads: Sequence[Tensor], plan: THAPlan) -> float:
    """U(plan) = sum_k T_k ||m_k||^2 / (P (s / (q N))^2), an expected signal-to-noise of the whole run.

    ``bucket_grads[k]`` ``[n_k, P]`` are per-example gradients of the PUBLIC model on PUBLIC
    examples at times in bucket k; m_k = mean_i clip_{C_k}(g_i) is the bucket's clipped mean
    gradient and s / (q N) the per-coordinate noise std on the released mean gradient. One
    reasonable public proxy among many (the paper leaves U open); it must never be evaluated
    on private data (its value would then select the plan from private information).
    """
    if len(bucket_grads) != plan.K:
        raise THAError(f"gradient_snr_proxy: {len(bucket_grads)} gradient blocks for K={plan.K} buckets")
    import torch

    from pipeline.privacy.dpsgd import clip_and_sum

    noise = plan.noise_std / plan.expected_batch_size
    total, width = 0.0, None
    for k, (g, c, n) in enumerate(zip(bucket_grads, plan.clips, plan.step_counts)):
        if n == 0:
            continue
        g = torch.as_tensor(g).detach().to(torch.float64)
        if g.dim() != 2 or g.shape[0] < 1:
            raise THAError(f"gradient_snr_proxy: bucket {k} needs gradients [n_k >= 1, P], got {tuple(g.shape)}")
        if width is not None and g.shape[1] != width:
            raise THAError(f"gradient_snr_proxy: bucket {k} has P={g.shape[1]}, bucket 0 has P={width}")
        width = g.shape[1]
        summed, _ = clip_and_sum({"g": g}, c)
        mean = summed["g"] / g.shape[0]
        total += n * float(mean.pow(2).sum()) / (width * noise ** 2)
    return total


# --------------------------------------------------------------------------- ledger and replay

def ledger_entry(plan: THAPlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = dpsgd_plan.DPSGD_PLD_SETTINGS,
                 extra: Mapping[str, Any] | None = None) -> ledger.LedgerEntry:
    """The run's ledger line: the THA event alone (Stage 1's release writes its own line).

    sensitivity = C of the first bucket that runs and noise_std = s, so the line's noise
    multiplier is that bucket's sigma, a Gaussian of the event; count = T; the claim is the
    certified PLD eps of this event at ``settings``.
    """
    return ledger.LedgerEntry(
        # the literal name: tests/privacy/test_replay.py finds every written mechanism by it
        stage=stage, mechanism="tha_dpsgd", event=ledger.event_to_dict(plan.event()),
        sensitivity=plan.sensitivity, noise_std=plan.noise_std,
        sampling={"scheme": "poisson", "probability": plan.sampling_rate, "n": plan.dataset_size},
        adjacency=plan.adjacency, count=plan.steps, delta=plan.delta, claimed_epsilon=plan.epsilon(settings),
        accountant={"name": "pld_pessimistic", **acc.describe(settings)}, config_id=config_id, seed=seed,
        extra={"edges": list(plan.edges), "C_k": list(plan.clips), "sigma_k": list(plan.noise_multipliers),
               "T_k": list(plan.step_counts), "noise_scale": plan.noise_std, "beta": plan.beta,
               "expected_batch_size": plan.expected_batch_size,
               "time_convention": "t = 0 noise end (STRAIGHTDP Sec. 2)", "reference": REFERENCE, **dict(extra or {})})


def configured_params(*, dataset_size: int, sampling_rate: float, steps: int, buckets: int, tau: float | None = None,
                      uniform_clip: float | None = None) -> dict[str, Any]:
    """The parameters of a :func:`ledger_entry` line that a configuration fixes before any data is read, by their
    dotted line paths (what a method registers for the replay, pipeline.registry.TranscriptSpec ``params``): N, q
    and the expected batch q N, T and the round-robin T_k over ``buckets`` K; with a known horizon ``tau`` the
    bucket edges; where every candidate is the uniform shape (``uniform_clip`` = C_ref) the clips and beta 0. The
    noise s is calibrated (registered as a target), and a shaped plan's clips come from Vbar and the proxy."""
    out: dict[str, Any] = {"sampling.n": dataset_size, "sampling.probability": sampling_rate,
                           "extra.expected_batch_size": sampling_rate * dataset_size, "count": steps,
                           "extra.T_k": list(round_robin_counts(steps, buckets))}
    if tau is not None:
        out["extra.edges"] = list(bucket_edges(tau, buckets))
    if uniform_clip is not None:
        # beta 0 is C_ref in every bucket whatever Vbar and the edges are (clip_shape never calls Vbar at beta 0)
        out["extra.C_k"] = list(clip_shape(bucket_edges(0.0 if tau is None else tau, buckets), beta=0.0,
                                           vbar=lambda t: 1.0, c_ref=uniform_clip))
        out["extra.beta"] = 0.0
    return out


def _numbers(entry: ledger.LedgerEntry, key: str) -> tuple[float, ...]:
    value = entry.extra.get(key)
    if not (isinstance(value, list) and value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise RebuildError(f"mechanism {MECHANISM!r}: parameter extra.{key} must be a non-empty list of finite "
                           f"numbers, got {value!r}")
    return tuple(float(v) for v in value)


def plan_from_entry(entry: ledger.LedgerEntry) -> THAPlan:
    """The THA plan a ``tha_dpsgd`` line's parameters declare: edges, C_k, s, q N, N and T (q is rebuilt
    from the expected batch over N, as for ``dpsgd``)."""
    n = param(entry, "sampling.n", int)
    return THAPlan(edges=_numbers(entry, "edges"), clips=_numbers(entry, "C_k"),
                   noise_std=param(entry, "extra.noise_scale"),
                   sampling_rate=param(entry, "extra.expected_batch_size") / n, dataset_size=n,
                   steps=entry.count, delta=entry.delta, beta=param(entry, "extra.beta"))


@register(MECHANISM, size="sampling.n")
def _rebuild_tha(entry: ledger.LedgerEntry) -> Expected:
    """THA DP-SGD (STRAIGHTDP Sec. 3.2): the buckets' events from the plan its line declares.

    sigma_k and T_k on the line are derived fields and must equal s / C_k and the round-robin counts.
    """
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {
        "sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
        "noise_multiplier": plan.noise_multipliers[plan.first_bucket], "sampling.scheme": "poisson",
        "sampling.probability": plan.sampling_rate, "adjacency": plan.adjacency,
        "extra.sigma_k": list(plan.noise_multipliers), "extra.T_k": list(plan.step_counts)})

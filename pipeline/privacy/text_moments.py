"""STRAIGHTDP's text-conditional moment release (Sec. 3.1 "Beyond classes", eq. 5; App. B.3, Prop. B.10).

The class-conditional release (:mod:`pipeline.privacy.moments`) needs a finite partition of the
data. For general captions, Stage 1 instead releases the whitened cross moments

    M_zc = (1/N) sum_i f_i e(c_i)^T  [p, q],        M_cc = (1/N) sum_i e(c_i) e(c_i)^T  [q, q]      (eq. 5)

of the private image features f_i (the public-geometry features of :class:`moments.PublicGeometry`,
||f_i|| <= R) and a caption featurisation e(c_i) clipped to a public radius R_txt
(||e_i|| <= R_txt), both blocks whitened by the type radii:

    u(D) = (M_zc / (R R_txt), M_cc / R_txt^2).

**Sensitivity (Prop. B.10).** Replacing (f, e) by (f', e') moves the first block by
||f e^T - f' e'^T||_F / (N R R_txt) <= (||f|| ||e|| + ||f'|| ||e'||) / (N R R_txt) <= 2/N (rank-one
Frobenius norms and the triangle inequality) and the second by <= 2/N in the same way; the blocks
occupy disjoint coordinates, so ||u(D) - u(D')|| <= sqrt((2/N)^2 + (2/N)^2) = 2 sqrt(2)/N
(:data:`SENSITIVITY_FACTOR` / N), the constant the accountant uses. Image-only and caption-only
replacements are special cases. The exact worst case is smaller, 3/sqrt(2) / N ~ 2.12/N (unit
vectors with f . f' = -1 and e . e' = 1/2 maximise 4 - 2 (f.f')(e.e') - 2 (e.e')^2 = 9/2; the
brute-force test finds it): the declared 2 sqrt(2)/N is sound and ~33% conservative, as in the paper.
**Adjacency** is add/remove-one on padded databases exactly as for Prop. B.9: both blocks are
normalised by the DECLARED public N, never by len(D), so adding or removing a record moves one
summand only (by at most the replace bound).

One Gaussian mechanism of multiplier sigma on the concatenation: N(0, (sigma 2 sqrt(2)/N)^2) on every
entry of both blocks (the full q x q matrix, not a triangle, as in :func:`moments.release`):
``GaussianDpEvent(sigma)``, certified by the PLD; one ledger line ``text_moment_release``.

**Post-processing** (:func:`conditional_mean_map`): un-whiten, symmetrise M_cc, PSD-project it, then
the ridge regression W = M_zc (M_cc + lambda I)^{-1} gives the linear conditional mean
mu(c) = W e(c) in feature space (lifted back to data space by the public geometry). The intercept
mu_0 is released inside the same mechanism by :func:`with_intercept`: a constant coordinate
R_txt / sqrt(2) is prepended to every (centred, R_txt / sqrt(2)-clipped) featurisation, so the
regression's constant column is the released mean and no extra budget is spent (Sec. 3.1's
"centering and intercept"). With one-hot features and lambda -> 0, W[:, y] is the class-y mean
(Prop. B.10, second part; tested): the class release is the special case.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting import dp_event

from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.rebuild import Expected, param, register

MECHANISM = "text_moment_release"
#: the joint L2 sensitivity of u(D), times N (Prop. B.10)
SENSITIVITY_FACTOR = 2.0 * math.sqrt(2.0)
#: the exact replace-one worst case of ||u(D) - u(D')||, times N (see the module docstring)
WORST_CASE_FACTOR = 3.0 / math.sqrt(2.0)
#: one Gaussian, accounted on the same grid as the class release
TEXT_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)


class TextMomentsError(ValueError):
    """Bad text-release parameters or inputs; the message is one line."""


def release_sensitivity(N: int) -> float:
    """2 sqrt(2) / N: Prop. B.10's joint sensitivity of the whitened cross moments."""
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise TextMomentsError(f"declared dataset size N must be an integer >= 1, got {N!r}")
    return SENSITIVITY_FACTOR / float(N)


@dataclass(frozen=True)
class TextReleasePlan:
    """The mechanism, declared before private data is read: multiplier ``sigma``, feature radius ``R``,
    caption radius ``R_txt``, declared size ``N``, feature dimension ``p``, caption dimension ``q``."""

    sigma: float
    R: float
    R_txt: float
    N: int
    p: int
    q: int
    delta: float

    def __post_init__(self) -> None:
        for name in ("sigma", "R", "R_txt"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise TextMomentsError(f"{name} must be > 0 and finite, got {v!r}")
        release_sensitivity(self.N)
        for name in ("p", "q"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TextMomentsError(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise TextMomentsError(f"delta must be in (0, 1), got {self.delta!r}")

    @property
    def sensitivity(self) -> float:
        return release_sensitivity(self.N)

    @property
    def noise_std(self) -> float:
        """Std of the noise on every whitened entry: sigma * 2 sqrt(2) / N."""
        return self.sigma * self.sensitivity

    def event(self) -> dp_event.DpEvent:
        return dp_event.GaussianDpEvent(self.sigma)

    def epsilon(self, settings: acc.PLDSettings = TEXT_PLD_SETTINGS) -> float:
        return acc.pld_epsilon(self.event(), self.delta, settings=settings)


def calibrate_release(*, target_epsilon: float, delta: float, R: float, R_txt: float, N: int, p: int, q: int,
                      settings: acc.PLDSettings = TEXT_PLD_SETTINGS, rtol: float = 1e-3) -> TextReleasePlan:
    """The plan with the smallest sigma (to ``rtol``) whose certified PLD eps <= ``target_epsilon``."""
    try:
        sigma = acc.calibrate_gaussian_noise_multiplier(dp_event.GaussianDpEvent, gdp_scale=1.0,
                                                        target_epsilon=target_epsilon, delta=delta,
                                                        settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise TextMomentsError(str(exc)) from None
    return TextReleasePlan(sigma=sigma, R=R, R_txt=R_txt, N=N, p=p, q=q, delta=delta)


# --------------------------------------------------------------------------- featurisation helpers (public)

def clip_rows(x: np.ndarray, radius: float) -> np.ndarray:
    """Each row projected onto the ball of ``radius`` (rows inside are unchanged)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * (radius / np.maximum(norms, radius))


def with_intercept(e: np.ndarray, R_txt: float) -> np.ndarray:
    """[R_txt/sqrt 2, clip_{R_txt/sqrt 2}(e)] per row: norm <= R_txt, and the regression's first column is
    the released unconditional mean mu_0 (Sec. 3.1 (i)). Centre ``e`` at its PUBLIC mean first."""
    half = R_txt / math.sqrt(2.0)
    e = clip_rows(e, half)
    return np.concatenate([np.full((len(e), 1), half), e], axis=1)


def slot_indicators(slots: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """Per-slot indicator featurisation of templated captions: one one-hot block per attribute
    (``slots [n, A]`` integer values, attribute a in [0, sizes[a])); norm sqrt(A) per row."""
    slots = np.asarray(slots)
    if slots.ndim != 2 or slots.shape[1] != len(sizes):
        raise TextMomentsError(f"slots must be [n, {len(sizes)}] (one column per attribute), got {slots.shape}")
    blocks = []
    for a, size in enumerate(sizes):
        col = slots[:, a]
        if np.any((col < 0) | (col >= size)):
            raise TextMomentsError(f"attribute {a}: values must lie in [0, {size})")
        blocks.append(np.eye(size)[col])
    return np.concatenate(blocks, axis=1)


#: Table 4's caption featurisations of composed-MNIST's templated captions (App. C (iii);
#: pipeline/flow/text_conditional.py)
FEATURISATIONS = ("one_hot_class", "slot_indicators")


def caption_slots() -> np.ndarray:
    """Every caption of composed-MNIST as slots ``[K, 3]`` (class, quadrant, thickness), K = 80."""
    from pipeline.data.composed import SLOT_SIZES  # its image code (scipy.ndimage) only where captions are made

    return np.array(list(itertools.product(*(range(s) for s in SLOT_SIZES))), dtype=np.int64)


def featurise(slots: np.ndarray, kind: str) -> np.ndarray:
    """e(c) before centring: ``[n, q]`` (q = 10 for one_hot_class, 16 for slot_indicators)."""
    from pipeline.data.composed import SLOT_SIZES

    if kind == "one_hot_class":
        return slot_indicators(np.asarray(slots)[:, :1], SLOT_SIZES[:1])
    if kind == "slot_indicators":
        return slot_indicators(slots, SLOT_SIZES)
    raise ValueError(f"caption featurisation must be one of {list(FEATURISATIONS)}, got {kind!r}")


@dataclass(frozen=True)
class CaptionCoding:
    """A featurisation with its public centre and radius: e(c) = with_intercept(featurise(c) - centre, R_txt).

    Public (a function of the caption set alone), so the release's ``q`` and ``R_txt`` are what the configuration's
    featurisation fixes: Table 4's stage releases with them and the wiring registers them for the replay."""

    kind: str
    centre: np.ndarray
    R_txt: float

    @classmethod
    def of(cls, kind: str) -> CaptionCoding:
        e = featurise(caption_slots(), kind)
        centre = e.mean(axis=0)
        # with_intercept clips the centred part to R_txt / sqrt 2: this R_txt clips no caption
        R_txt = math.sqrt(2.0) * float(np.linalg.norm(e - centre, axis=1).max())
        return cls(kind=kind, centre=centre, R_txt=R_txt)

    @property
    def q(self) -> int:
        """Width of e(c), intercept included."""
        return int(self.centre.shape[0]) + 1

    def encode(self, slots: np.ndarray) -> np.ndarray:
        return with_intercept(featurise(slots, self.kind) - self.centre, self.R_txt)


# --------------------------------------------------------------------------- the mechanism

def whitened_cross_moments(f: np.ndarray, e: np.ndarray, *, R: float, R_txt: float, N: int) -> np.ndarray:
    """u(D) = (M_zc / (R R_txt), M_cc / R_txt^2), flattened and concatenated (eq. 5, normalised by the
    declared N)."""
    M_zc = f.T @ e / float(N)
    M_cc = e.T @ e / float(N)
    return np.concatenate([(M_zc / (R * R_txt)).ravel(), (M_cc / R_txt**2).ravel()])


@dataclass(frozen=True)
class NoisyCrossMoments:
    """What left the mechanism, un-whitened: noisy ``M_zc [p, q]`` and noisy, NOT symmetrised ``M_cc [q, q]``."""

    M_zc: np.ndarray
    M_cc: np.ndarray


def release(f: np.ndarray, e: np.ndarray, plan: TextReleasePlan, *, generator: np.random.Generator
            ) -> NoisyCrossMoments:
    """One Gaussian mechanism on u(D) of the private features ``f [n, p]`` (rows in the R-ball) and caption
    features ``e [n, q]`` (rows in the R_txt-ball): u + N(0, noise_std^2 I), returned un-whitened."""
    if not isinstance(generator, np.random.Generator):
        raise TextMomentsError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
    f, e = _rows(f, "f", plan.p, plan.R), _rows(e, "e", plan.q, plan.R_txt)
    if len(f) != len(e):
        raise TextMomentsError(f"f and e must hold the same records, got {len(f)} and {len(e)} rows")
    u = whitened_cross_moments(f, e, R=plan.R, R_txt=plan.R_txt, N=plan.N)
    noisy = u + generator.normal(0.0, 1.0, size=u.shape) * plan.noise_std
    k = plan.p * plan.q
    return NoisyCrossMoments(M_zc=noisy[:k].reshape(plan.p, plan.q) * plan.R * plan.R_txt,
                             M_cc=noisy[k:].reshape(plan.q, plan.q) * plan.R_txt**2)


def conditional_mean_map(noisy: NoisyCrossMoments, *, ridge: float) -> np.ndarray:
    """W = M_zc (sym+(M_cc) + lambda I)^{-1} ``[p, q]`` (post-processing): mu(c) = W e(c) in feature space.

    M_cc is symmetrised and projected onto the PSD cone (eigenvalues clipped at 0) before the ridge.
    """
    if not (math.isfinite(ridge) and ridge > 0):
        raise TextMomentsError(f"ridge lambda must be > 0 and finite, got {ridge!r}")
    sym = (noisy.M_cc + noisy.M_cc.T) / 2
    vals, vecs = np.linalg.eigh(sym)
    psd = (vecs * np.clip(vals, 0.0, None)) @ vecs.T
    return np.linalg.solve(psd + ridge * np.eye(len(psd)), noisy.M_zc.T).T


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: TextReleasePlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = TEXT_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The release's line: one Gaussian of multiplier sigma at sensitivity 2 sqrt(2)/N (add/remove-one on
    padded databases, a fortiori from the replace bound)."""
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()), sensitivity=plan.sensitivity,
        noise_std=plan.noise_std, sampling={"scheme": "none"}, adjacency="add_or_remove_one", count=1,
        delta=plan.delta, claimed_epsilon=plan.epsilon(settings),
        accountant={"name": "pld_pessimistic", **acc.describe(settings)}, config_id=config_id, seed=seed,
        extra={"text_noise_multiplier": plan.sigma, "R": plan.R, "R_txt": plan.R_txt, "N": plan.N, "p": plan.p,
               "q": plan.q, "worst_case_sensitivity": WORST_CASE_FACTOR / plan.N,
               "reference": "STRAIGHTDP eq. 5, Prop. B.10", **dict(extra or {})})


def configured_params(*, N: int, p: int, q: int, R_txt: float) -> dict[str, Any]:
    """The parameters of a :func:`ledger_entry` line that a configuration fixes, by their dotted line paths (what a
    method registers for the replay, pipeline.registry.TranscriptSpec ``params``): the declared N, the PCA rank p,
    the featurisation's width q and radius R_txt (:class:`CaptionCoding`, public), one release. Not R (a quantile
    of the PUBLIC features, measured) nor sigma (calibrated to a target eps)."""
    return {"extra.N": N, "extra.p": p, "extra.q": q, "extra.R_txt": R_txt, "count": 1}


def plan_from_entry(entry: ledger.LedgerEntry) -> TextReleasePlan:
    """The plan a ``text_moment_release`` line declares (what the replay recomputes)."""
    return TextReleasePlan(sigma=param(entry, "extra.text_noise_multiplier"), R=param(entry, "extra.R"),
                           R_txt=param(entry, "extra.R_txt"), N=param(entry, "extra.N", int),
                           p=param(entry, "extra.p", int), q=param(entry, "extra.q", int), delta=entry.delta)


@register(MECHANISM, size="extra.N")
def _text_moment_release(entry: ledger.LedgerEntry) -> Expected:
    """Prop. B.10: one Gaussian of multiplier sigma on the whitened cross moments, sensitivity 2 sqrt(2)/N."""
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": plan.sensitivity, "noise_std": plan.noise_std,
                                   "noise_multiplier": plan.sigma, "sampling.scheme": "none",
                                   "adjacency": "add_or_remove_one", "count": 1})


def _rows(x: Any, name: str, width: int, radius: float) -> np.ndarray:
    """A finite ``[n, width]`` array whose rows lie in the ball of ``radius`` (the sensitivity assumes it);
    the message names no data-dependent value."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != width or arr.shape[0] < 1:
        raise TextMomentsError(f"{name} must be a [n, {width}] array with n >= 1, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise TextMomentsError(f"{name} must be finite")
    if np.any(np.linalg.norm(arr, axis=1) > radius * (1 + 1e-9)):
        raise TextMomentsError(f"every row of {name} must lie in the ball of radius {radius} (clip it first)")
    return arr

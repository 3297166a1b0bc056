"""STRAIGHTDP Stage 1: the class-conditional moment release (Sec. 3.1; App. B.3, Prop. B.9).

The release, in the order the data flow through it:

1. **Public geometry** (:func:`fit_public_geometry`, public data only). A PCA basis
   P in R^{p x d} (orthonormal rows) of the centred public data, the public mean m, and a
   feature clip radius R = a public quantile of ||P (z - m)||. Every private record enters
   only through its feature f = clip_R(P (z - m)) (:meth:`PublicGeometry.features`), the
   projection onto the R-ball, so ||f|| <= R for every record whatever the data.
2. **Two Gaussian mechanisms** on the private features (Prop. B.9), sharing one noise
   multiplier sigma (noise std / sensitivity) and therefore one event
   ``Composed([Gaussian(sigma), Gaussian(sigma)])`` (:class:`MomentReleasePlan`):

   (i) the whitened statistic u(D) = (n_y, S_y / (2R))_{y in [Y]} in R^{Y(1+p)}, all classes
       stacked (:func:`whitened_statistic`). Replacing one record moves two counts by 1 and
       two whitened sums by <= 1/2 each, so the exact worst case is sqrt(5/2) ~ 1.58 (attained:
       ||z|| = ||z'|| = R, orthogonal, label changed); the accountant is declared
       ``DELTA_U = 2`` as in the paper (sound, mildly conservative, robust to drift);
   (ii) the average-form second moment M2(D) = (1/N) sum_i f_i f_i^T (:func:`second_moment`),
       Frobenius sensitivity 2R^2/N (the worst case is sqrt(2) R^2/N, orthogonal records).

   :func:`release` adds N(0, (2 sigma)^2 I) to u and N(0, (sigma 2R^2/N)^2) to every entry of
   the p x p matrix M2 and returns only those noisy values (:class:`NoisyMoments`).
3. **Post-processing** (:func:`moment_model`), a function of the noisy release and the public
   geometry only: noisy counts clamped at 1, class means mu_y = 2R S~_y / n_y, classes whose
   noisy count is below a public ``min_count`` fall back to the released global mean, priors
   pi_y = n_y / sum n, the noisy M2 symmetrised, the pooled within-class covariance
   C = M2 - sum_y pi_y mu_y mu_y^T PSD-projected and truncated to rank r with eigenvalues
   floored at lambda0, and everything lifted back to data space (:class:`ReleasedMoments`).

**Adjacency.** Prop. B.9 is proved for replace-one. The pipeline's adjacency is add/remove-one
(Sec. 2; the same as the Poisson-subsampled DP-SGD of Stage 2, under one accountant). App. B.3
covers it on padded databases: a dataset is a capacity-N tuple over the record domain
extended by a null record, which contributes 0 to every released statistic; adding a record
is the replacement null -> r, removing it is r -> null. Because M2 is normalised by the
DECLARED public constant N (a config value, never ``len(D)``), such a change moves exactly one
summand and leaves the normalisation of all others alone, so the replace-one bounds (which
allow ANY pair r -> r') dominate it: add/remove moves u by <= sqrt(1 + 1/4) and M2 by
<= R^2/N. Normalising by the realised dataset size instead would make every term depend on
whether one record is present, and the 2R^2/N bound would no longer hold.

The PLD accountant is fed the composed event with the certified (pessimistic) construction
(:meth:`MomentReleasePlan.epsilon`); the ledger line (:func:`ledger_entry`) is rebuilt from
its own parameters by the rebuilder registered here (``"moment_release"``) before the replay
recomputes its eps.

Randomness: ``numpy.random.Generator`` (PCG64) is not a cryptographically secure source;
like the DP-SGD engine this is adequate for research reproducibility, not for a deployment
that must resist an attacker who can predict the noise.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dp_accounting import dp_event

from pipeline.io import CorruptFileError, atomic_path
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
from pipeline.privacy.rebuild import Expected, param, register
from pipeline.stage import DataNotFoundError

#: L2 sensitivity of the whitened statistic u declared to the accountant (Prop. B.9).
DELTA_U = 2.0
#: the proven exact worst case of ||u(D) - u(D')|| under replace-one (Prop. B.9): sqrt(5/2).
U_WORST_CASE = math.sqrt(5.0 / 2.0)

#: PLD settings of the release. The event is only two Gaussians, but the replay recomputes it
#: with dp_accounting's own (slower) construction, which at the paper's h = 1e-5 takes ~10 s
#: per line on 2 CPU cores at sigma ~ 1; h = 1e-4 (the DP-SGD default, so both stages are
#: accounted on the same grid) costs ~1 s and adds < 1e-7 relative to eps. Recorded on the
#: ledger line like any other setting.
MOMENT_PLD_SETTINGS = acc.PLDSettings(value_discretization_interval=1e-4)

MOMENTS_FORMAT = "straightdp-moments/1"
#: the ledger mechanism name of the release
MECHANISM = "moment_release"


class MomentsError(ValueError):
    """Bad moment-release parameters or inputs; the message is one line."""


# --------------------------------------------------------------------------- public geometry

@dataclass(frozen=True)
class PublicGeometry:
    """Public PCA geometry of the release (Sec. 3.1 (iii)): ``mean [d]``, ``basis [p, d]`` with
    orthonormal rows, and the feature clip radius ``R`` (R_feat, a public quantile)."""

    mean: np.ndarray
    basis: np.ndarray
    R: float

    def __post_init__(self) -> None:
        mean = _readonly(self.mean, "mean")
        basis = _readonly(self.basis, "basis")
        if mean.ndim != 1 or basis.ndim != 2 or basis.shape[1] != mean.shape[0]:
            raise MomentsError(f"geometry: need mean [d] and basis [p, d], got {mean.shape} and {basis.shape}")
        if not np.allclose(basis @ basis.T, np.eye(basis.shape[0]), atol=1e-8):
            raise MomentsError("geometry: basis rows must be orthonormal (P P^T = I_p)")
        if not (math.isfinite(self.R) and self.R > 0):
            raise MomentsError(f"geometry: feature clip radius R must be > 0 and finite, got {self.R}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "basis", basis)
        object.__setattr__(self, "R", float(self.R))

    @property
    def p(self) -> int:
        return int(self.basis.shape[0])

    @property
    def d(self) -> int:
        return int(self.basis.shape[1])

    def features(self, z: np.ndarray) -> np.ndarray:
        """f = clip_R(P (z - m)) ``[n, p]``: the projection of the PCA coordinates onto the R-ball.

        Both maps are nonexpansive (App. B.3, Fact B.2), and the clip is what bounds every
        record's contribution: ||f|| <= R whatever z is.
        """
        z = _matrix(z, "z", self.d)
        coords = (z - self.mean) @ self.basis.T
        return clip_to_ball(coords, self.R)


def clip_to_ball(x: np.ndarray, R: float) -> np.ndarray:
    """Rows of ``x`` projected onto the centred ball of radius R: x * min(1, R / ||x||)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    # R / max(||x||, R): exactly 1 inside the ball; no division by zero at x = 0
    return x * (R / np.maximum(norms, R))


def fit_public_geometry(z_public: np.ndarray, *, p: int, clip_quantile: float = 0.95) -> PublicGeometry:
    """PCA of the centred PUBLIC data (top-p right singular vectors) and R = the ``clip_quantile``
    quantile of ||P (z - m)|| on the same public data (Table 9: "feature clip R_feat (public
    quantile)"). Never call it on private data: the geometry is not accounted.

    Each basis vector's sign is fixed (largest-magnitude entry positive) so that a refit on
    the same data gives the same basis.
    """
    z = _matrix(z_public, "z_public")
    n, d = z.shape
    if not (isinstance(p, (int, np.integer)) and not isinstance(p, bool) and 1 <= p <= min(n, d)):
        raise MomentsError(f"p must be an integer in [1, min(n, d)] = [1, {min(n, d)}] for public data of "
                           f"shape {z.shape}, got {p!r}")
    if not 0 < clip_quantile <= 1:
        raise MomentsError(f"clip_quantile must be in (0, 1], got {clip_quantile}")
    mean = z.mean(axis=0)
    _, _, vt = np.linalg.svd(z - mean, full_matrices=False)
    basis = vt[:p]
    idx = np.argmax(np.abs(basis), axis=1)
    basis = basis * np.sign(basis[np.arange(p), idx])[:, None]
    norms = np.linalg.norm((z - mean) @ basis.T, axis=1)
    R = float(np.quantile(norms, clip_quantile))
    if not R > 0:
        raise MomentsError(f"public data give feature clip radius R = {R} at quantile {clip_quantile}; "
                           f"need R > 0 (public data constant along the basis?)")
    return PublicGeometry(mean=mean, basis=basis, R=R)


# --------------------------------------------------------------------------- the two statistics

def whitened_statistic(f: np.ndarray, y: np.ndarray, *, n_classes: int, R: float) -> np.ndarray:
    """u(D) = (n_y, S_y / (2R))_{y in [Y]} in R^{Y(1+p)} (Prop. B.9), class-major: entry
    ``y * (1 + p)`` is n_y and the next p entries are S_y / (2R).

    Whitening each coordinate by its type's worst-case move (1 for a count, 2R for a sum)
    makes a replacement move u by <= sqrt(1 + 1 + 1/4 + 1/4) = sqrt(5/2) <= ``DELTA_U``.
    Rows of ``f`` must lie in the R-ball (use :meth:`PublicGeometry.features`).
    """
    f, y = _records(f, y, n_classes=n_classes, R=R)
    p = f.shape[1]
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    sums = np.zeros((n_classes, p))
    np.add.at(sums, y, f)
    return np.concatenate([counts[:, None], sums / (2.0 * R)], axis=1).reshape(-1)


def second_moment(f: np.ndarray, *, N: int) -> np.ndarray:
    """M2(D) = (1/N) sum_i f_i f_i^T ``[p, p]`` (Prop. B.9), average form over the DECLARED N.

    N is a public constant (the config's dataset size), never ``len(f)``: the sensitivity
    2R^2/N and its add/remove reading on padded databases (module docstring) need every term's
    normalisation to be the same on adjacent datasets.
    """
    _check_N(N)
    f = _matrix(f, "f")
    return (f.T @ f) / float(N)


def second_moment_sensitivity(R: float, N: int) -> float:
    """Frobenius sensitivity of M2: ||f f^T - f' f'^T||_F <= ||f||^2 + ||f'||^2 <= 2R^2, over N."""
    return 2.0 * R * R / float(N)


# --------------------------------------------------------------------------- plan and accounting

@dataclass(frozen=True)
class MomentReleasePlan:
    """The release's mechanism, declared before any private data is read.

    ``sigma`` is noise std / sensitivity, the SAME for both mechanisms (so each is a
    Gaussian of multiplier sigma and they compose to one of sigma / sqrt(2)); ``R`` the feature
    clip radius; ``N`` the declared public dataset size; ``n_classes`` = Y; ``p`` the PCA rank.
    """

    sigma: float
    R: float
    N: int
    n_classes: int
    p: int
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise MomentsError(f"noise multiplier sigma must be > 0 and finite, got {self.sigma!r}")
        if not (isinstance(self.R, (int, float)) and math.isfinite(self.R) and self.R > 0):
            raise MomentsError(f"feature clip radius R must be > 0 and finite, got {self.R!r}")
        _check_N(self.N)
        for name in ("n_classes", "p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise MomentsError(f"{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise MomentsError(f"delta must be in (0, 1), got {self.delta!r}")

    @property
    def std_u(self) -> float:
        """Noise std on every coordinate of u: sigma * DELTA_U."""
        return self.sigma * DELTA_U

    @property
    def sensitivity_M2(self) -> float:
        return second_moment_sensitivity(self.R, self.N)

    @property
    def std_M2(self) -> float:
        """Noise std on every entry of M2: sigma * 2R^2 / N."""
        return self.sigma * self.sensitivity_M2

    def event(self) -> dp_event.DpEvent:
        """Two independent Gaussian mechanisms of multiplier sigma (u, then M2)."""
        return moment_event(self.sigma)

    def epsilon(self, settings: acc.PLDSettings = MOMENT_PLD_SETTINGS) -> float:
        """Certified eps at ``delta``: pessimistic PLD of the composed event."""
        return acc.pld_epsilon(self.event(), self.delta, settings=settings)


def moment_event(sigma: float) -> dp_event.DpEvent:
    """``Composed([Gaussian(sigma), Gaussian(sigma)])``: exactly (sqrt(2)/sigma)-GDP."""
    return dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(sigma), dp_event.GaussianDpEvent(sigma)])


def gdp_noise_multiplier(*, target_epsilon: float, delta: float) -> float:
    """The sigma at which the release's exact eps(delta) is ``target_epsilon``: the composition
    of two Gaussians of multiplier sigma is sqrt(2)/sigma-GDP (closed form, EMPDEN eq. 44)."""
    return acc.gdp_noise_multiplier(target_epsilon=target_epsilon, delta=delta, gdp_scale=math.sqrt(2.0))


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float,
                               settings: acc.PLDSettings = MOMENT_PLD_SETTINGS, rtol: float = 1e-3) -> float:
    """Smallest sigma (to relative tolerance ``rtol``) whose certified eps <= ``target_epsilon``
    (:func:`pipeline.privacy.accountants.calibrate_gaussian_noise_multiplier`, seeded by the exact
    GDP closed form of the two Gaussians, :func:`gdp_noise_multiplier`)."""
    try:
        return acc.calibrate_gaussian_noise_multiplier(moment_event, gdp_scale=math.sqrt(2.0),
                                                       target_epsilon=target_epsilon, delta=delta,
                                                       settings=settings, rtol=rtol)
    except acc.AccountingError as exc:
        raise MomentsError(str(exc)) from None


def calibrate_release(*, target_epsilon: float, delta: float, R: float, N: int, n_classes: int, p: int,
                      settings: acc.PLDSettings = MOMENT_PLD_SETTINGS, rtol: float = 1e-3) -> MomentReleasePlan:
    """The plan whose sigma is the smallest meeting (``target_epsilon``, ``delta``) (certified PLD)."""
    sigma = calibrate_noise_multiplier(target_epsilon=target_epsilon, delta=delta, settings=settings, rtol=rtol)
    return MomentReleasePlan(sigma=sigma, R=R, N=N, n_classes=n_classes, p=p, delta=delta)


# --------------------------------------------------------------------------- the mechanism

@dataclass(frozen=True)
class NoisyMoments:
    """What left the mechanism: the noisy whitened statistic ``u [Y(1+p)]`` and the noisy,
    NOT yet symmetrised, second moment ``M2 [p, p]``. Nothing here is a clean statistic."""

    u: np.ndarray
    M2: np.ndarray

    def __post_init__(self) -> None:
        u, M2 = _readonly(self.u, "u"), _readonly(self.M2, "M2")
        if M2.ndim != 2 or M2.shape[0] != M2.shape[1] or M2.shape[0] < 1:
            raise MomentsError(f"noisy M2 must be a square [p, p] matrix, got shape {M2.shape}")
        p = M2.shape[0]
        if u.ndim != 1 or u.size == 0 or u.size % (1 + p):
            raise MomentsError(f"noisy u must be a vector of length Y(1+p) with p = {p}, got shape {u.shape}")
        object.__setattr__(self, "u", u)
        object.__setattr__(self, "M2", M2)

    @property
    def p(self) -> int:
        return int(self.M2.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.u.size // (1 + self.p))


def release(f: np.ndarray, y: np.ndarray, plan: MomentReleasePlan, *, generator: np.random.Generator) -> NoisyMoments:
    """Run both Gaussian mechanisms of Prop. B.9 once on the private features ``f [n, p]``
    (rows in the R-ball) and labels ``y [n]``: u + N(0, std_u^2 I), M2 + N(0, std_M2^2) entrywise.

    The noise is drawn on the FULL p x p matrix (p^2 independent coordinates), not on its upper
    triangle: that is the Gaussian mechanism whose sensitivity is the Frobenius bound (a
    symmetric noise matrix would put sqrt(2) x the std on each off-diagonal pair and need its
    own analysis). Symmetrising afterwards (:func:`moment_model`) is post-processing.
    Every record is used; the count of records is never consulted (N is the plan's).
    """
    if not isinstance(generator, np.random.Generator):
        raise MomentsError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}")
    f, y = _records(f, y, n_classes=plan.n_classes, R=plan.R)
    if f.shape[1] != plan.p:
        raise MomentsError(f"features have p = {f.shape[1]} columns but the plan was made for p = {plan.p}")
    u = whitened_statistic(f, y, n_classes=plan.n_classes, R=plan.R)
    M2 = second_moment(f, N=plan.N)
    noisy_u = u + generator.normal(0.0, 1.0, size=u.shape) * plan.std_u
    noisy_M2 = M2 + generator.normal(0.0, 1.0, size=M2.shape) * plan.std_M2
    return NoisyMoments(u=noisy_u, M2=noisy_M2)


# --------------------------------------------------------------------------- post-processing

@dataclass(frozen=True)
class ReleasedMoments:
    """The Gaussian class model of the release in DATA space (input to Prop. 3.1's field).

    ``pi [Y]`` priors, ``mu [Y, d]`` class means, ``eigvecs`` V ``[d, r]`` (orthonormal columns),
    ``eigvals`` s ``[r]`` (each >= ``floor``), ``floor`` lambda0, ``fell_back [Y]`` which classes
    use the global mean. The shared covariance is Sigma = V diag(s) V^T + lambda0 (I - V V^T).
    """

    pi: np.ndarray
    mu: np.ndarray
    eigvecs: np.ndarray
    eigvals: np.ndarray
    floor: float
    fell_back: np.ndarray

    def __post_init__(self) -> None:
        pi, mu = _readonly(self.pi, "pi"), _readonly(self.mu, "mu")
        V, s = _readonly(self.eigvecs, "eigvecs"), _readonly(self.eigvals, "eigvals")
        fell_back = np.array(self.fell_back, dtype=bool, copy=True)
        fell_back.setflags(write=False)
        if pi.ndim != 1 or mu.ndim != 2 or mu.shape[0] != pi.shape[0] or fell_back.shape != pi.shape:
            raise MomentsError(f"released moments: need pi [Y], mu [Y, d], fell_back [Y]; got {pi.shape}, "
                               f"{mu.shape}, {fell_back.shape}")
        if V.ndim != 2 or V.shape[0] != mu.shape[1] or s.shape != (V.shape[1],):
            raise MomentsError(f"released moments: need eigvecs [d, r], eigvals [r] with d = {mu.shape[1]}; got "
                               f"{V.shape}, {s.shape}")
        if not (math.isfinite(self.floor) and self.floor > 0):
            raise MomentsError(f"released moments: floor lambda0 must be > 0 and finite, got {self.floor}")
        if np.any(pi < 0) or not math.isclose(float(pi.sum()), 1.0, rel_tol=1e-9):
            raise MomentsError("released moments: pi must be non-negative and sum to 1")
        if np.any(s < self.floor * (1 - 1e-12)):
            raise MomentsError(f"released moments: eigvals must be >= floor {self.floor}")
        if not np.allclose(V.T @ V, np.eye(V.shape[1]), atol=1e-8):
            raise MomentsError("released moments: eigvecs must have orthonormal columns")
        for name, value in (("pi", pi), ("mu", mu), ("eigvecs", V), ("eigvals", s), ("fell_back", fell_back)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "floor", float(self.floor))

    @property
    def n_classes(self) -> int:
        return int(self.pi.shape[0])

    @property
    def d(self) -> int:
        return int(self.mu.shape[1])

    @property
    def rank(self) -> int:
        return int(self.eigvals.shape[0])

    def covariance(self) -> np.ndarray:
        """Sigma ``[d, d]`` = V diag(s) V^T + lambda0 (I - V V^T) (dense: tests and small d only)."""
        V = self.eigvecs
        return (V * (self.eigvals - self.floor)) @ V.T + self.floor * np.eye(self.d)

    def sample(self, y: int, n: int, generator: np.random.Generator) -> np.ndarray:
        """``n`` draws ``[n, d]`` from N(mu_y, Sigma): the "released moments only" control.

        x = mu_y + V (sqrt(s) g1) + sqrt(lambda0) (g2 - V V^T g2), g1 ~ N(0, I_r), g2 ~ N(0, I_d):
        the two parts are independent with covariances V diag(s) V^T and lambda0 (I - V V^T).
        """
        if isinstance(y, bool) or not isinstance(y, (int, np.integer)) or not 0 <= y < self.n_classes:
            raise MomentsError(f"class y must be an integer in [0, {self.n_classes}), got {y!r}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise MomentsError(f"number of samples n must be an integer >= 0, got {n!r}")
        V = self.eigvecs
        g1 = generator.standard_normal((n, self.rank))
        g2 = generator.standard_normal((n, self.d))
        return self.mu[y] + (g1 * np.sqrt(self.eigvals)) @ V.T + math.sqrt(self.floor) * (g2 - (g2 @ V) @ V.T)

    def save(self, path: str | Path) -> None:
        """Write an ``.npz`` atomically (a crash leaves no half-written file)."""
        arrays = {"format": np.array(MOMENTS_FORMAT), "pi": self.pi, "mu": self.mu, "eigvecs": self.eigvecs,
                  "eigvals": self.eigvals, "floor": np.array(self.floor), "fell_back": self.fell_back}
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez(tmp, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> ReleasedMoments:
        """Read what :meth:`save` wrote; a missing, foreign or corrupt file is a one-line error."""
        path = Path(path)
        if not path.is_file():
            raise DataNotFoundError(f"{path}: released moments not found (run the release_moments stage)")
        try:
            with np.load(path, allow_pickle=False) as data:
                fmt = str(data["format"]) if "format" in data else None
                if fmt != MOMENTS_FORMAT:
                    raise CorruptFileError(f"{path}: format {fmt!r}, expected {MOMENTS_FORMAT!r}")
                return cls(pi=data["pi"], mu=data["mu"], eigvecs=data["eigvecs"], eigvals=data["eigvals"],
                           floor=float(data["floor"]), fell_back=data["fell_back"])
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            if isinstance(exc, CorruptFileError):
                raise
            text = " ".join(str(exc).split())
            raise CorruptFileError(f"{path}: not a released-moments file ({type(exc).__name__}: {text})") from None


def moment_model(noisy: NoisyMoments, geometry: PublicGeometry, *, rank: int, floor: float,
                 min_count: float = 1.0) -> ReleasedMoments:
    """The Gaussian class model from the release (Sec. 3.1, "Noisy counts are clamped ...").

    A pure function of the released values and the public geometry (hence post-processing):

    * n_y = max(n~_y, 1); mu_y = 2R S~_y / n_y in feature space;
    * a class with n~_y < ``min_count`` (public) takes the released global mean
      sum_y 2R S~_y / sum_y n_y instead (its own mean would be mostly noise);
    * pi_y = n_y / sum n;
    * M = (M2~ + M2~^T) / 2; C = M - sum_y pi_y mu_y mu_y^T (the pooled within-class covariance,
      since E[f f^T] = sum_y pi_y (Sigma_y + mu_y mu_y^T)), with the means after fallback;
    * C PSD-projected (eigenvalues clipped at 0), its top ``rank`` eigenpairs kept and their
      eigenvalues floored at lambda0 = ``floor``;
    * lifted to data space: mu_y^data = m + P^T mu_y, V = P^T U_r (orthonormal columns since
      P has orthonormal rows), Sigma = V diag(s) V^T + lambda0 (I - V V^T).

    M2 estimates E[f f^T] when the declared N equals the private dataset size (the embedded
    default's split sizes are public); a different N scales it by n/N.
    """
    if noisy.p != geometry.p:
        raise MomentsError(f"noisy release has p = {noisy.p} but the geometry has p = {geometry.p}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= geometry.p:
        raise MomentsError(f"rank r must be an integer in [1, p = {geometry.p}], got {rank!r}")
    if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
        raise MomentsError(f"floor lambda0 must be > 0 and finite, got {floor!r}")
    if not (isinstance(min_count, (int, float)) and math.isfinite(min_count)):
        raise MomentsError(f"min_count must be a finite number, got {min_count!r}")
    Y, p, R = noisy.n_classes, geometry.p, geometry.R
    block = noisy.u.reshape(Y, 1 + p)
    noisy_counts, sums = block[:, 0], 2.0 * R * block[:, 1:]
    counts = np.maximum(noisy_counts, 1.0)
    mu = sums / counts[:, None]
    fell_back = noisy_counts < min_count
    mu[fell_back] = sums.sum(axis=0) / counts.sum()
    pi = counts / counts.sum()

    M = 0.5 * (noisy.M2 + noisy.M2.T)
    C = M - np.einsum("y,yi,yj->ij", pi, mu, mu)
    C = 0.5 * (C + C.T)
    evals, evecs = np.linalg.eigh(C)
    order = np.argsort(evals)[::-1][:rank]
    evals = np.clip(evals[order], 0.0, None)  # PSD projection
    evecs = evecs[:, order]
    # a deterministic sign per eigenvector (largest-magnitude entry positive)
    idx = np.argmax(np.abs(evecs), axis=0)
    evecs = evecs * np.sign(evecs[idx, np.arange(rank)])[None, :]
    s = np.maximum(evals, floor)

    return ReleasedMoments(pi=pi, mu=geometry.mean + mu @ geometry.basis, eigvecs=geometry.basis.T @ evecs,
                           eigvals=s, floor=float(floor), fell_back=fell_back)


# --------------------------------------------------------------------------- ledger

def ledger_entry(plan: MomentReleasePlan, *, stage: str, config_id: str, seed: int,
                 settings: acc.PLDSettings = MOMENT_PLD_SETTINGS, extra: Mapping[str, Any] | None = None
                 ) -> ledger.LedgerEntry:
    """The release's ledger line: the composed event and the certified PLD eps at ``plan.delta``.

    ``sensitivity`` / ``noise_std`` are u's (2, 2 sigma); M2's ride in ``extra``. Both
    mechanisms share sigma, so ``noise_multiplier`` matches both Gaussians of the event.
    """
    return ledger.LedgerEntry(
        stage=stage, mechanism=MECHANISM, event=ledger.event_to_dict(plan.event()),
        sensitivity=DELTA_U, noise_std=plan.std_u, sampling={"scheme": "none"}, adjacency="add_or_remove_one",
        count=1, delta=plan.delta, claimed_epsilon=plan.epsilon(settings),
        accountant={"name": "pld_pessimistic", **acc.describe(settings)}, config_id=config_id, seed=seed,
        extra={"moment_noise_multiplier": plan.sigma, "R": plan.R, "N": plan.N, "p": plan.p,
               "n_classes": plan.n_classes, "std_M2": plan.std_M2, "sensitivity_M2": plan.sensitivity_M2,
               "worst_case_sensitivity_u": U_WORST_CASE, "reference": "STRAIGHTDP Prop. B.9",
               **dict(extra or {})})


def configured_params(*, N: int, n_classes: int, p: int) -> dict[str, Any]:
    """The parameters of a :func:`ledger_entry` line that a configuration fixes, by their dotted line paths (what a
    method registers for the replay, pipeline.registry.TranscriptSpec ``params``): the declared N and number of
    classes, the PCA rank p, one release. Not R (a quantile of the PUBLIC features, measured) nor sigma (calibrated
    to a target eps)."""
    return {"extra.N": N, "extra.n_classes": n_classes, "extra.p": p, "count": 1}


def plan_from_entry(entry: ledger.LedgerEntry) -> MomentReleasePlan:
    """The plan a ``moment_release`` line declares (its sigma, R, N, Y, p and delta): what the replay
    recomputes and the one-run audit runs (:mod:`pipeline.audit.moment_canaries`)."""
    return MomentReleasePlan(sigma=param(entry, "extra.moment_noise_multiplier"), R=param(entry, "extra.R"),
                             N=param(entry, "extra.N", int), n_classes=param(entry, "extra.n_classes", int),
                             p=param(entry, "extra.p", int), delta=entry.delta)


@register(MECHANISM, size="extra.N")
def _moment_release(entry: ledger.LedgerEntry) -> Expected:
    """Prop. B.9: two Gaussians of multiplier sigma on u (sensitivity 2) and M2 (2R^2/N).

    Rebuilt through :class:`MomentReleasePlan` from the line's sigma, R, N, p and Y, so an
    event whose sigma was edited, or an R or N that no longer gives the recorded M2 noise,
    is refused.
    """
    plan = plan_from_entry(entry)
    return Expected(plan.event(), {"sensitivity": DELTA_U, "noise_std": plan.std_u, "noise_multiplier": plan.sigma,
                                   "extra.std_M2": plan.std_M2, "extra.sensitivity_M2": plan.sensitivity_M2,
                                   "sampling.scheme": "none", "adjacency": "add_or_remove_one", "count": 1})


# --------------------------------------------------------------------------- input checks

def _readonly(x: Any, name: str) -> np.ndarray:
    arr = np.array(x, dtype=np.float64, copy=True)
    if not np.all(np.isfinite(arr)):
        raise MomentsError(f"{name} must be finite")
    arr.setflags(write=False)
    return arr


def _matrix(x: Any, name: str, d: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or (d is not None and arr.shape[1] != d):
        want = f"[n, {d}]" if d is not None else "[n, d]"
        raise MomentsError(f"{name} must be a {want} array, got shape {arr.shape}")
    if arr.shape[0] < 1:
        raise MomentsError(f"{name} must hold at least one row")
    if not np.all(np.isfinite(arr)):
        raise MomentsError(f"{name} must be finite")
    return arr


def _check_N(N: Any) -> None:
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise MomentsError(f"declared dataset size N must be an integer >= 1, got {N!r}")


def _records(f: Any, y: Any, *, n_classes: int, R: float) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels checked. A row outside the R-ball is refused (the sensitivities assume
    ||f_i|| <= R); the message names no data-dependent value."""
    f = _matrix(f, "f")
    y_arr = np.asarray(y)
    if y_arr.shape != (f.shape[0],) or not np.issubdtype(y_arr.dtype, np.integer):
        raise MomentsError(f"labels y must be an integer array of shape ({f.shape[0]},), got {y_arr.dtype} "
                           f"{y_arr.shape}")
    if np.any((y_arr < 0) | (y_arr >= n_classes)):
        raise MomentsError(f"labels y must lie in [0, n_classes = {n_classes})")
    if np.any(np.linalg.norm(f, axis=1) > R * (1 + 1e-9)):
        raise MomentsError(f"feature rows must lie in the R-ball (||f_i|| <= R = {R}); pass geometry.features(z)")
    return f, y_arr.astype(np.int64)

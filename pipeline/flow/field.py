"""The analytic velocity field of a Gaussian moment model (STRAIGHTDP Prop. 3.1), the empirical field, the horizon.

STRAIGHTDP Sec. 3.1, Prop. 3.1: approximate the class-conditional law of z by N(mu_y, Sigma) with
class priors pi_y, and let A_t = (1 - t)^2 I + t^2 Sigma (t = 0 the noise end,
:mod:`pipeline.flow.rectified`). Then

* (eq. 3) E[z | x_t = x, y] = mu_y + t Sigma A_t^{-1} (x - t mu_y);
* (eq. 4) E[z | x_t = x] = sum_y w_y(x, t) (mu_y + t Sigma A_t^{-1} (x - t mu_y)), with the
  responsibilities w_y ∝ pi_y N(x; t mu_y, A_t);
* (eq. 2) v(x, t) = (E[z | x_t = x] - x) / (1 - t), conditionally on y or not (the null branch).

The covariance is the released one, low rank plus a floor: Sigma = V diag(s) V^T + lambda0 (I - V V^T)
with V [d, r] orthonormal columns (Table 9: r = 32, lambda0 = 1e-2). Sigma, A_t and A_t^{-1} share
the eigenbasis (V, its complement), so every product is computed there: A_t^{-1} is diagonal,
with a_j = (1 - t)^2 + t^2 s_j on V and a_0 = (1 - t)^2 + t^2 lambda0 on the complement. No d x d
matrix is ever formed (d = 784 pixels at the embedded scale, 3072 for CIFAR).

The empirical field of a finite set (Fig. 2a's "exact empirical field on D_pub"; App. B.2, Remark
B.5: the limit Sigma -> 0 with one component per point) and the public horizon tau (Sec. 3.1
"Conditional distillation": the knee of the cosine between the two fields on public data, Table 9
cap 0.35) are here too: they are the same formulas on another mixture.

Everything works in the dtype of the model's tensors (use float64 for d in the hundreds: the
responsibilities are softmaxes of quadratic forms of size ~d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pipeline.flow.rectified import x_t_from

#: the cosine below which the moment field no longer points where the empirical one does (Fig. 2a)
DEFAULT_COSINE_THRESHOLD = 0.9
#: Table 9: tau = 0.35, capped by the public cosine-knee calibration
TAU_MAX = 0.35


def _times(t: Tensor | float, n: int, like: Tensor) -> Tensor:
    """``t`` as a ``[n, 1]`` column of ``like``'s dtype (a float, a 0-d tensor or one time per row)."""
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    if t.ndim == 0:
        return t.expand(n).reshape(n, 1)
    if t.shape != (n,):
        raise ValueError(f"t must be a scalar or have shape [{n}], got {tuple(t.shape)}")
    return t.reshape(n, 1)


@dataclass(frozen=True, eq=False)
class GaussianMomentModel:
    """Class priors ``pi`` [Y], means ``mu`` [Y, d], covariance V diag(s) V^T + floor (I - V V^T) (Prop. 3.1).

    ``eigvecs`` V [d, r] has orthonormal columns (r may be 0: Sigma = floor I), ``eigvals`` s [r] > 0,
    ``floor`` lambda0 > 0 the eigenvalue of every direction outside V. Frozen: a fitted or
    released model is a value; :meth:`to` makes a converted copy.
    """

    pi: Tensor
    mu: Tensor
    eigvecs: Tensor
    eigvals: Tensor
    floor: float

    def __post_init__(self) -> None:
        y, d = self.mu.shape if self.mu.ndim == 2 else (None, None)
        if y is None:
            raise ValueError(f"moment model: mu must be [Y, d], got shape {tuple(self.mu.shape)}")
        if self.pi.shape != (y,):
            raise ValueError(f"moment model: pi must have one prior per class ([{y}]), got {tuple(self.pi.shape)}")
        if not (bool((self.pi >= 0).all()) and abs(float(self.pi.sum()) - 1.0) < 1e-6):
            raise ValueError(f"moment model: pi must be non-negative and sum to 1, got sum {float(self.pi.sum())}")
        if self.eigvecs.ndim != 2 or self.eigvecs.shape[0] != d:
            raise ValueError(f"moment model: eigvecs must be [d={d}, r], got {tuple(self.eigvecs.shape)}")
        r = self.eigvecs.shape[1]
        if self.eigvals.shape != (r,):
            raise ValueError(f"moment model: eigvals must be [r={r}], got {tuple(self.eigvals.shape)}")
        if r and not bool((self.eigvals > 0).all()):
            raise ValueError(f"moment model: eigvals must be > 0, got min {float(self.eigvals.min())}")
        if not (math.isfinite(self.floor) and self.floor > 0):
            raise ValueError(f"moment model: floor lambda0 must be > 0 and finite, got {self.floor}")
        gram = self.eigvecs.T @ self.eigvecs
        tol = 1e-4 if self.eigvecs.dtype == torch.float32 else 1e-8
        if r and float((gram - torch.eye(r, dtype=gram.dtype, device=gram.device)).abs().max()) > tol:
            raise ValueError("moment model: eigvecs must have orthonormal columns (V^T V = I)")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_arrays(cls, *, pi: np.ndarray | Tensor, mu: np.ndarray | Tensor, eigvecs: np.ndarray | Tensor,
                    eigvals: np.ndarray | Tensor, floor: float, dtype: torch.dtype = torch.float64,
                    device: torch.device | str = "cpu") -> GaussianMomentModel:
        """From numpy arrays or tensors (e.g. a released moment file), converted to ``dtype`` on ``device``."""
        # np.array copies: a released file's arrays may be read-only, which torch warns about
        conv = lambda a: torch.as_tensor(a if isinstance(a, Tensor) else np.array(a)).to(device, dtype)  # noqa: E731
        return cls(pi=conv(pi), mu=conv(mu), eigvecs=conv(eigvecs), eigvals=conv(eigvals), floor=float(floor))

    @classmethod
    def fit(cls, z: Tensor, y: Tensor, *, rank: int, floor: float, n_classes: int | None = None) -> GaussianMomentModel:
        """The NON-private moment model of ``z`` [n, d] with labels ``y`` [n] (public data, tests).

        pi_y = n_y / n, mu_y the class means, Sigma the pooled within-class covariance
        (1/n) sum_i (z_i - mu_{y_i})(z_i - mu_{y_i})^T, kept at its top ``rank`` eigenpairs with
        eigenvalues floored at ``floor``, every other direction at ``floor`` (the release's shape,
        Table 9). The eigenpairs come from an SVD of the centred [n, d] matrix: no d x d matrix.
        """
        if z.ndim != 2 or y.shape != (z.shape[0],):
            raise ValueError(f"fit: z must be [n, d] and y [n], got {tuple(z.shape)} and {tuple(y.shape)}")
        n, d = z.shape
        k = int(y.max()) + 1 if n_classes is None else int(n_classes)
        if not (isinstance(rank, int) and 0 <= rank <= min(n, d)):
            raise ValueError(f"fit: rank must be an integer in [0, min(n, d) = {min(n, d)}], got {rank!r}")
        counts = torch.bincount(y, minlength=k).to(z.dtype)
        if counts.shape[0] != k or bool((counts == 0).any()):
            raise ValueError(f"fit: every one of the {k} classes needs at least one example, "
                             f"got counts {counts.tolist()}")
        mu = torch.zeros(k, d, dtype=z.dtype, device=z.device).index_add_(0, y, z) / counts[:, None]
        centred = (z - mu[y]) / math.sqrt(n)
        _, sv, vh = torch.linalg.svd(centred, full_matrices=False)
        eigvals = (sv[:rank] ** 2).clamp_min(floor)
        return cls(pi=counts / n, mu=mu, eigvecs=vh[:rank].T.contiguous(), eigvals=eigvals, floor=float(floor))

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> GaussianMomentModel:
        """A copy with every tensor converted."""
        conv = lambda a: a.to(device=device, dtype=dtype)  # noqa: E731
        return GaussianMomentModel(pi=conv(self.pi), mu=conv(self.mu), eigvecs=conv(self.eigvecs),
                                   eigvals=conv(self.eigvals), floor=self.floor)

    @property
    def n_classes(self) -> int:
        return self.mu.shape[0]

    @property
    def dim(self) -> int:
        return self.mu.shape[1]

    @property
    def rank(self) -> int:
        return self.eigvecs.shape[1]

    def covariance(self) -> Tensor:
        """Sigma as a d x d matrix: for tests and small d only (every method here avoids it)."""
        v = self.eigvecs
        return v @ torch.diag(self.eigvals) @ v.T + self.floor * (torch.eye(self.dim, dtype=v.dtype, device=v.device)
                                                                  - v @ v.T)

    # ------------------------------------------------------------------ the eigenbasis

    def spectrum(self) -> Tensor:
        """Every eigenvalue of Sigma, ``[d]``: the top-r ``eigvals``, then ``floor`` on the other d - r directions."""
        return torch.cat([self.eigvals, self.eigvals.new_full((self.dim - self.rank,), self.floor)])

    def _a(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Eigenvalues of A_t: on V ``[n, r]`` and on the complement ``[n, 1]``, for times ``t`` [n, 1]."""
        one_minus = (1 - t) ** 2
        return one_minus + t ** 2 * self.eigvals, one_minus + t ** 2 * self.floor

    def _apply(self, u: Tensor, on_v: Tensor, on_perp: Tensor | float) -> Tensor:
        """M u for the symmetric M = V diag(on_v) V^T + on_perp (I - V V^T), row-wise on ``u`` [n, d]."""
        c = u @ self.eigvecs  # [n, r]
        return on_perp * u + (c * (on_v - on_perp)) @ self.eigvecs.T

    def _check_x(self, x: Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must be [n, d={self.dim}] (flatten images first), got {tuple(x.shape)}")

    def _labels(self, y: Tensor, n: int) -> Tensor:
        y = torch.as_tensor(y, device=self.mu.device).long()
        if y.shape != (n,):
            raise ValueError(f"y must be [{n}] class labels, got {tuple(y.shape)}")
        if bool(((y < 0) | (y >= self.n_classes)).any()):
            raise ValueError(f"y must be class labels in [0, {self.n_classes}), got {y.min()}..{y.max()} "
                             "(the null label is y=None)")
        return y

    # ------------------------------------------------------------------ Prop. 3.1

    def posterior_mean(self, x: Tensor, t: Tensor | float, y: Tensor) -> Tensor:
        """E[z | x_t = x, y] = mu_y + t Sigma A_t^{-1} (x - t mu_y) (eq. 3), ``x`` [n, d], ``y`` [n]."""
        self._check_x(x)
        return self._conditional_mean(x, _times(t, x.shape[0], x), self.mu[self._labels(y, x.shape[0])])

    def _conditional_mean(self, x: Tensor, t: Tensor, mean: Tensor) -> Tensor:
        a_v, a_perp = self._a(t)
        # Sigma A_t^{-1} is diagonal in the eigenbasis: s_j / a_j on V, lambda0 / a_0 on the complement
        return mean + t * self._apply(x - t * mean, self.eigvals / a_v, self.floor / a_perp)

    def log_responsibilities(self, x: Tensor, t: Tensor | float) -> Tensor:
        """log w_y(x, t), w_y ∝ pi_y N(x; t mu_y, A_t) (eq. 4), ``[n, Y]``, normalised in log space.

        log det A_t is the same for every class (Sigma is shared) and cancels; so does (2 pi)^{d/2}.
        """
        self._check_x(x)
        t = _times(t, x.shape[0], x)
        a_v, a_perp = self._a(t)
        logits = []
        for k in range(self.n_classes):  # one class at a time: memory n x d, never n x Y x d
            u = x - t * self.mu[k]
            quad = (u * self._apply(u, 1 / a_v, 1 / a_perp)).sum(1)
            logits.append(torch.log(self.pi[k]) - 0.5 * quad)
        return torch.log_softmax(torch.stack(logits, 1), dim=1)

    def unconditional_posterior_mean(self, x: Tensor, t: Tensor | float) -> Tensor:
        """E[z | x_t = x] = sum_y w_y (mu_y + t Sigma A_t^{-1}(x - t mu_y)) (eq. 4).

        Eq. 3 is affine in mu_y, so the average is eq. 3 at the responsibility-weighted mean.
        """
        return self._conditional_mean(x, _times(t, x.shape[0], x), self._weighted_mean(x, t))

    def _weighted_mean(self, x: Tensor, t: Tensor | float) -> Tensor:
        return self.log_responsibilities(x, t).exp() @ self.mu

    def velocity(self, x: Tensor, t: Tensor | float, y: Tensor | None = None) -> Tensor:
        """v(x, t, y) = (E[z | x_t = x, y] - x) / (1 - t) (eq. 2); ``y=None`` the null branch (eq. 4).

        Computed as A_t^{-1} ((1 - t)(m - x) + t Sigma x) with m = mu_y (or the responsibility-
        weighted mean): substituting eq. 3 into eq. 2, the numerator is (1 - t) times this, so the
        1/(1 - t) cancels exactly and the field is finite up to and including t = 1 (where it is x,
        the velocity of a path that has arrived). This is the guard against t -> 1.
        """
        self._check_x(x)
        tt = _times(t, x.shape[0], x)
        mean = self._weighted_mean(x, t) if y is None else self.mu[self._labels(y, x.shape[0])]
        a_v, a_perp = self._a(tt)
        return self._apply((1 - tt) * (mean - x), 1 / a_v, 1 / a_perp) + tt * self._apply(
            x, self.eigvals / a_v, self.floor / a_perp)

    def posterior_cov_trace(self, t: Tensor | float) -> Tensor:
        """Vbar(t) = tr(Sigma - t^2 Sigma A_t^{-1} Sigma) = tr Cov[z | x_t, y] (Prop. 3.1's Gaussian).

        Per eigenvalue lambda: lambda (1 - t)^2 / ((1 - t)^2 + t^2 lambda); ``t`` a float or ``[m]``,
        the result of the same shape. THA's shape family C_beta(t) reads it (STRAIGHTDP App. B.5).
        """
        t = torch.as_tensor(t, dtype=self.mu.dtype, device=self.mu.device)
        tt = t.reshape(-1, 1)
        om = (1 - tt) ** 2
        on_v = (self.eigvals * om / (om + tt ** 2 * self.eigvals)).sum(1)
        perp = (self.dim - self.rank) * self.floor * om[:, 0] / (om[:, 0] + tt[:, 0] ** 2 * self.floor)
        return (on_v + perp).reshape(t.shape)

    def sample(self, y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """z ~ N(mu_y, Sigma), one row per label in ``y`` [n] (draws: d standard normals per row).

        z = mu_y + V diag(sqrt s) V^T e + sqrt(lambda0) (e - V V^T e), e ~ N(0, I_d): the same
        square root of Sigma the eigenbasis gives, no d x d matrix.
        """
        y = self._labels(y, torch.as_tensor(y).shape[0])
        e = torch.randn((y.shape[0], self.dim), generator=generator, dtype=self.mu.dtype).to(self.mu.device)
        return self.mu[y] + self._apply(e, self.eigvals.sqrt(), math.sqrt(self.floor))


def guided_start(model: GaussianMomentModel, y: Tensor, *, t0: float, generator: torch.Generator | None = None
                 ) -> Tensor:
    """x_{t0} ~ N(t0 mu_y, t0^2 Sigma + (1 - t0)^2 I), ``[n, d]`` (Sec. 3.1 "Sampling-time guidance").

    The moment model's marginal at t0, drawn as t0 z + (1 - t0) xi with z ~ N(mu_y, Sigma) and
    xi ~ N(0, I) (z first, then xi, from ``generator``); reshape to images and hand it to
    :func:`pipeline.flow.rectified.euler_sample` with the same ``t0``.
    """
    if not 0.0 <= t0 < 1.0:
        raise ValueError(f"the guided start time t0 must be in [0, 1), got {t0}")
    z = model.sample(y, generator)
    xi = torch.randn(z.shape, generator=generator, dtype=z.dtype).to(z.device)
    return x_t_from(z, xi, t0)


# --------------------------------------------------------------------------- the empirical field

def empirical_posterior_mean(x: Tensor, t: Tensor | float, data: Tensor, weights: Tensor | None = None, *,
                             labels: Tensor | None = None, y: Tensor | None = None, chunk: int = 256) -> Tensor:
    """E[z | x_t = x] under the empirical law of ``data`` [m, d] (the exact field of a finite set; Fig. 2a).

    Softmax over i of log w_i + log N(x; t z_i, (1 - t)^2 I) (Remark B.5 with Sigma -> 0), in log
    space and over ``chunk`` rows of ``x`` at a time (memory chunk x m). ``weights`` [m]: optional
    non-negative point weights (uniform when None). With ``labels`` [m] and ``y`` [n], row n sees
    only the points of class y[n] (the conditional field). ``t`` must be < 1: at t = 1 the kernel is
    a point mass.
    """
    if x.ndim != 2 or data.ndim != 2 or x.shape[1] != data.shape[1]:
        raise ValueError(f"x [n, d] and data [m, d] must share d, got {tuple(x.shape)} and {tuple(data.shape)}")
    if (labels is None) != (y is None):
        raise ValueError("the conditional empirical field needs both labels (of the data) and y (of x)")
    n = x.shape[0]
    t = _times(t, n, x)
    if bool((t >= 1).any()) or bool((t < 0).any()):
        raise ValueError("the empirical field needs 0 <= t < 1 (at t = 1 its kernel is a point mass)")
    data = data.to(x.dtype)
    log_w = (torch.zeros(data.shape[0], dtype=x.dtype, device=x.device) if weights is None
             else torch.log(weights.to(x.dtype)))
    sq = (data * data).sum(1)
    out = torch.empty_like(x)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        tc = t[sl]
        # -||x - t z_i||^2 / (2 (1-t)^2) without the ||x||^2 term (constant over i)
        logits = (2 * tc * (x[sl] @ data.T) - tc ** 2 * sq) / (2 * (1 - tc) ** 2) + log_w
        if labels is not None:
            other = labels[None, :].to(x.device) != y[sl].to(x.device)[:, None]
            logits = logits.masked_fill(other, -math.inf)
        out[sl] = torch.softmax(logits, dim=1) @ data
    return out


def empirical_velocity(x: Tensor, t: Tensor | float, data: Tensor, weights: Tensor | None = None, *,
                       labels: Tensor | None = None, y: Tensor | None = None, chunk: int = 256) -> Tensor:
    """(E_emp[z | x_t = x] - x) / (1 - t) (eq. 2 on the empirical law), ``t`` < 1."""
    m = empirical_posterior_mean(x, t, data, weights, labels=labels, y=y, chunk=chunk)
    return (m - x) / (1 - _times(t, x.shape[0], x))


# --------------------------------------------------------------------------- the horizon

@dataclass(frozen=True)
class CosineCurve:
    """Fig. 2a: mean cosine between the moment field and the empirical field at each t.

    ``conditional_per_class`` [T, Y] (mean over the probes of each class), ``conditional_worst``
    its minimum over classes, ``unconditional`` [T] the null-branch pair.
    """

    ts: np.ndarray
    conditional_per_class: np.ndarray
    conditional_worst: np.ndarray
    unconditional: np.ndarray


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-30)


@torch.no_grad()
def field_cosine_curve(model: GaussianMomentModel, data: Tensor, labels: Tensor, ts: np.ndarray | list[float], *,
                       n_probe: int, generator: torch.Generator | None = None, chunk: int = 256) -> CosineCurve:
    """Cosines between the moment-model velocity and the empirical velocity of ``data`` (Fig. 2a).

    Probes: ``n_probe`` points z_i drawn from ``data`` [m, d] (without replacement when possible)
    with their labels, and at each t the state x_t = t z_i + (1 - t) xi from the probe itself.
    The conditional pair compares ``model.velocity(x, t, y_i)`` with the empirical field of class
    y_i's points; the unconditional pair ``model.velocity(x, t)`` with the field of all points.
    Computed in ``model``'s dtype; the same probes and xi at every t. Public data only: this is a
    calibration (Sec. 3.1 "Conditional distillation"), never run on private records.
    """
    ts = np.asarray(ts, dtype=np.float64)
    if ts.ndim != 1 or ts.size == 0 or ts.min() < 0 or ts.max() >= 1:
        raise ValueError(f"ts must be a non-empty 1-d grid in [0, 1), got {ts}")
    dtype, device = model.mu.dtype, model.mu.device
    data = data.to(device, dtype)
    labels = torch.as_tensor(labels, device=device).long()
    m = data.shape[0]
    idx = (torch.randperm(m, generator=generator)[:n_probe] if n_probe <= m
           else torch.randint(m, (n_probe,), generator=generator))
    z, y = data[idx.to(device)], labels[idx.to(device)]
    xi = torch.randn(z.shape, generator=generator, dtype=dtype).to(device)
    per_class = np.full((ts.size, model.n_classes), np.nan)
    uncond = np.empty(ts.size)
    for i, t in enumerate(ts.tolist()):
        x = x_t_from(z, xi, t)
        c_cond = _cosine(model.velocity(x, t, y), empirical_velocity(x, t, data, labels=labels, y=y, chunk=chunk))
        c_unc = _cosine(model.velocity(x, t), empirical_velocity(x, t, data, chunk=chunk))
        uncond[i] = float(c_unc.mean())
        for k in torch.unique(y).tolist():
            per_class[i, k] = float(c_cond[y == k].mean())
    return CosineCurve(ts=ts, conditional_per_class=per_class, conditional_worst=np.nanmin(per_class, axis=1),
                       unconditional=uncond)


def knee_point(ts: np.ndarray, cos: np.ndarray, *, min_drop: float = 0.05) -> float:
    """The knee of a falling curve: the t farthest above the chord from the first to the last point.

    Kneedle (Satopää et al. 2011) on the curve normalised to [0, 1] in both axes. A curve that
    varies by less than ``min_drop`` is flat (normalising it would turn noise into a knee), and a
    curve with no point above its chord (it falls fastest at once) has no shoulder: both return
    the last t, leaving the decision to the threshold of :func:`knee_horizon`.
    """
    ts, cos = np.asarray(ts, dtype=np.float64), np.asarray(cos, dtype=np.float64)
    span = cos.max() - cos.min()
    if ts.size < 3 or span < min_drop:
        return float(ts[-1])
    x = (ts - ts[0]) / (ts[-1] - ts[0])
    yv = (cos - cos.min()) / span
    above = yv - (yv[0] + (yv[-1] - yv[0]) * x)
    return float(ts[int(np.argmax(above))]) if above.max() > 0 else float(ts[-1])


def knee_horizon(ts: np.ndarray | list[float], cos: np.ndarray | list[float], *, tau_max: float = TAU_MAX,
                 threshold: float = DEFAULT_COSINE_THRESHOLD, min_drop: float = 0.05) -> float:
    """The public horizon tau of Sec. 3.1 "Conditional distillation": how far the moment field can be trusted.

    Rule, on a grid ``ts`` (increasing) with cosines ``cos`` (e.g. ``CosineCurve.conditional_worst``):

    1. t_thr = the largest grid t such that cos >= ``threshold`` at every grid point up to it
       (0.0 when the first point is already below: no horizon);
    2. t_knee = :func:`knee_point` of the curve (where it turns from flat to falling; the last t
       when it drops by less than ``min_drop`` overall or has no shoulder);
    3. tau = min(t_thr, t_knee, ``tau_max``) (Table 9 caps tau at 0.35).

    Whichever of the threshold and the knee comes first wins: past either, the field of the
    release no longer describes the data. A miscalibrated tau costs utility, never privacy.
    """
    ts, cos = np.asarray(ts, dtype=np.float64), np.asarray(cos, dtype=np.float64)
    if ts.ndim != 1 or ts.shape != cos.shape or ts.size == 0:
        raise ValueError(f"ts and cos must be 1-d of one length, got {ts.shape} and {cos.shape}")
    if np.any(np.diff(ts) <= 0):
        raise ValueError("ts must be strictly increasing")
    below = np.flatnonzero(cos < threshold)
    if below.size and below[0] == 0:
        return 0.0
    t_thr = float(ts[below[0] - 1]) if below.size else float(ts[-1])
    return float(min(t_thr, knee_point(ts, cos, min_drop=min_drop), tau_max))

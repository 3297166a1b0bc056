"""Sensitivity geometry of the ideal denoiser (SENSGEO Sec. II-III).

Paper symbols (SENSGEO = Do & Alabi, "Diffusion Sensitivity Geometry and Strong Duality for
Optimal Privacy-Utility Tradeoffs"):

* ``w_g(x) = exp(-||g - x||^2 / (2 sigma^2))``, ``r_i(g; D) = w_g(x_i) / sum_j w_g(x_j)`` and
  the ideal denoiser ``m_g(D) = sum_i r_i x_i`` (Sec. II-A): the softmax-weighted average of
  the records, i.e. the empirical posterior mean at query ``g`` and bandwidth ``sigma``.
* the exact deletion shift ``s_k = m_g(D) - m_g(D_-k) = r_k (x_k - m_g(D_-k))
  = r_k / (1 - r_k) (x_k - m_g(D))`` (Sec. III-A);
* the add/remove set ``S^ar = {+-s_k(g; D) : D in K, |D| >= 2}`` and the replacement set
  ``S^rep = {m_g(V + x) - m_g(V + x')}`` (Sec. III-B1/B2, the replacement shift is the
  difference of two deletion shifts through V);
* the two-record generators ``t_g(x, y) = w_g(x) / (w_g(x) + w_g(y)) (x - y)`` over a finite
  public domain K (Sec. III-C): every ``s_k`` is a combination ``sum_i c_i t_g(x_k, x_i)`` with
  ``c_i >= 0, sum_i c_i <= 1``, so by convexity (Lemma 1) the supremum of any convex function
  that vanishes at 0 -- in particular ``s^T Sigma^-1 s`` -- over all datasets is attained
  on the m(m-1) generators, i.e. by two-record datasets (Theorem 1);
* the uniform-query worst case ``sup_{g, D, k} s_k^T Sigma^-1 s_k = max_{x, y in K}
  (x - y)^T Sigma^-1 (x - y)``, the largest Mahalanobis distance in K (Corollary 1), reached
  in the limit of the queries ``g_gamma`` of Sec. III-C;
* ``rho_*(Sigma) = sup_{s in S} s^T Sigma^-1 s`` (Sec. IV), the single number that fixes every
  guarantee in :mod:`.guarantees`.

The brute-force enumerations (:func:`add_remove_set`, :func:`replacement_set`) exist to check
the two-record reduction; they are exponential in the domain size and meant for m <= ~10.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import special


class SensitivityError(ValueError):
    """Bad input to a sensitivity computation (shape, bandwidth, covariance); one line."""


# --------------------------------------------------------------------------- checks

def _as_points(points: np.ndarray, name: str = "K") -> np.ndarray:
    arr = np.asarray(points, dtype=float)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise SensitivityError(f"{name} must be a [m, d] array of points, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise SensitivityError(f"{name} has non-finite coordinates")
    return arr


def _as_query(g: np.ndarray, d: int) -> np.ndarray:
    q = np.asarray(g, dtype=float).reshape(-1)
    if q.shape != (d,):
        raise SensitivityError(f"query g must have {d} coordinates, got shape {np.shape(g)}")
    return q


def _check_sigma(sigma: float) -> None:
    if not (np.isfinite(sigma) and sigma > 0):
        raise SensitivityError(f"bandwidth sigma must be a positive finite number, got {sigma!r}")


def _cholesky(cov: np.ndarray) -> np.ndarray:
    cov = np.asarray(cov, dtype=float)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise SensitivityError(f"Sigma must be a square matrix, got shape {cov.shape}")
    if not np.allclose(cov, cov.T, rtol=1e-10, atol=1e-12):
        raise SensitivityError("Sigma must be symmetric")
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        raise SensitivityError("Sigma must be positive definite (Cholesky failed)") from None


# --------------------------------------------------------------------------- Sec. II-A

def log_weights(g: np.ndarray, points: np.ndarray, sigma: float) -> np.ndarray:
    """log w_g(x_i) = -||g - x_i||^2 / (2 sigma^2) (SENSGEO Sec. II-A), kept in log space."""
    x = _as_points(points, "D")
    _check_sigma(sigma)
    diff = x - _as_query(g, x.shape[1])
    return -np.einsum("nd,nd->n", diff, diff) / (2.0 * sigma * sigma)


def responsibilities(g: np.ndarray, points: np.ndarray, sigma: float) -> np.ndarray:
    """r_i(g; D) = w_g(x_i) / sum_j w_g(x_j) (Sec. II-A), a softmax so far queries do not underflow."""
    return special.softmax(log_weights(g, points, sigma))


def ideal_denoiser(g: np.ndarray, points: np.ndarray, sigma: float) -> np.ndarray:
    """m_g(D) = sum_i r_i(g; D) x_i, the ideal (empirical-risk-minimising) denoiser (Sec. II-A)."""
    x = _as_points(points, "D")
    return responsibilities(g, x, sigma) @ x


# --------------------------------------------------------------------------- Sec. III-A

def deletion_shift(g: np.ndarray, points: np.ndarray, sigma: float, k: int) -> np.ndarray:
    """s_k = m_g(D) - m_g(D_-k) = r_k (x_k - m_g(D_-k)) (SENSGEO Sec. III-A).

    The paper's second form r_k/(1 - r_k) (x_k - m_g(D)) divides by 1 - r_k, which rounds to
    0 when x_k dominates the softmax; the first form is used because it stays exact there.
    """
    x = _as_points(points, "D")
    n = x.shape[0]
    if n < 2:
        raise SensitivityError(f"deleting a record needs |D| >= 2, got |D| = {n}")
    if not 0 <= k < n:
        raise SensitivityError(f"record index k={k} out of range for |D| = {n}")
    r_k = responsibilities(g, x, sigma)[k]
    rest = np.delete(x, k, axis=0)
    return r_k * (x[k] - ideal_denoiser(g, rest, sigma))


def deletion_shifts(g: np.ndarray, points: np.ndarray, sigma: float) -> np.ndarray:
    """All s_k(g; D), k = 1..|D|, as a [|D|, d] array (Sec. III-A)."""
    x = _as_points(points, "D")
    return np.stack([deletion_shift(g, x, sigma, k) for k in range(x.shape[0])])


# --------------------------------------------------------------------------- Sec. III-B

def _subsets(m: int, sizes: range):
    for size in sizes:
        yield from itertools.combinations(range(m), size)


def add_remove_set(g: np.ndarray, domain: np.ndarray, sigma: float, *, max_size: int) -> np.ndarray:
    """Brute-force S^ar = {+-s_k(g; D) : D subset of K, 2 <= |D| <= max_size} (Sec. III-B1).

    Exponential in |K|; it exists to check the two-record reduction of Theorem 1.
    """
    k_pts = _as_points(domain)
    if max_size < 2:
        raise SensitivityError(f"max_size must be >= 2 (deletion needs two records), got {max_size}")
    shifts = [deletion_shifts(g, k_pts[list(idx)], sigma)
              for idx in _subsets(k_pts.shape[0], range(2, min(max_size, k_pts.shape[0]) + 1))]
    s = np.concatenate(shifts, axis=0)
    return np.concatenate([s, -s], axis=0)


def replacement_set(g: np.ndarray, domain: np.ndarray, sigma: float, *, max_size: int) -> np.ndarray:
    """Brute-force S^rep = {m_g(V + x) - m_g(V + x') : V subset of K, x != x' not in V} (Sec. III-B2).

    ``max_size`` bounds |V + x|. The paper's decomposition m_g(D) - m_g(D') =
    [m_g(D) - m_g(V)] + [m_g(V) - m_g(D')] writes each element as a difference of two
    deletion shifts, so sqrt(sup s^T Sigma^-1 s) over S^rep is at most twice that over S^ar.
    """
    k_pts = _as_points(domain)
    m = k_pts.shape[0]
    if max_size < 2:
        raise SensitivityError(f"max_size must be >= 2 (|V| >= 1 plus the replaced record), got {max_size}")
    out = []
    for v in _subsets(m, range(1, min(max_size, m - 1))):
        rest = [i for i in range(m) if i not in v]
        for a, b in itertools.permutations(rest, 2):
            out.append(ideal_denoiser(g, k_pts[list(v) + [a]], sigma) - ideal_denoiser(g, k_pts[list(v) + [b]], sigma))
    if not out:
        raise SensitivityError(f"replacement needs a domain of at least 3 points, got {m}")
    return np.stack(out)


# --------------------------------------------------------------------------- Sec. III-C

def pair_generators(g: np.ndarray, domain: np.ndarray, sigma: float) -> np.ndarray:
    """The m(m-1) two-record generators t_g(x, y), x != y in K, as a [m(m-1), d] array (Sec. III-C).

    ``t_g(x, y) = w_g(x)/(w_g(x) + w_g(y)) (x - y)`` is exactly the deletion shift of x from
    the two-record dataset {x, y}; the coefficient is a logistic function of the log-weight
    difference, evaluated with ``expit`` so that distant points do not give 0/0.
    """
    k_pts = _as_points(domain)
    m = k_pts.shape[0]
    if m < 2:
        raise SensitivityError(f"the domain K needs at least 2 points, got {m}")
    lw = log_weights(g, k_pts, sigma)
    i, j = np.array([(a, b) for a in range(m) for b in range(m) if a != b]).T
    coef = special.expit(lw[i] - lw[j])
    return coef[:, None] * (k_pts[i] - k_pts[j])


def dominant_pair_generators(g: np.ndarray, domain: np.ndarray, sigma: float) -> np.ndarray:
    """One generator per unordered pair: the longer of t_g(x, y) and t_g(y, x).

    The two are antiparallel, and a constraint s^T Sigma^-1 s <= rho is the same for +-s, so
    the shorter one is implied by the longer: m(m-1)/2 of the m(m-1) constraints suffice.
    """
    k_pts = _as_points(domain)
    m = k_pts.shape[0]
    if m < 2:
        raise SensitivityError(f"the domain K needs at least 2 points, got {m}")
    lw = log_weights(g, k_pts, sigma)
    i, j = np.triu_indices(m, k=1)
    coef = special.expit(np.abs(lw[i] - lw[j]))
    return coef[:, None] * (k_pts[i] - k_pts[j])


def uniform_query_generators(domain: np.ndarray) -> np.ndarray:
    """x - y for every unordered pair of K: the sensitivity hull that serves every query (Corollary 1).

    These are the limits of t_{g_gamma}(x, y) as gamma -> infinity along the queries of
    Sec. III-C, whose coefficient 1/(1 + exp(-(2 gamma + 1)||x - y||^2 / (2 sigma^2))) -> 1.
    """
    k_pts = _as_points(domain)
    m = k_pts.shape[0]
    if m < 2:
        raise SensitivityError(f"the domain K needs at least 2 points, got {m}")
    i, j = np.triu_indices(m, k=1)
    return k_pts[i] - k_pts[j]


def query_family_generator(x: np.ndarray, y: np.ndarray, sigma: float, gamma: float) -> np.ndarray:
    """t_{g_gamma}(x, y) at g_gamma = x + gamma (x - y) (SENSGEO Sec. III-C, the family behind Corollary 1)."""
    _check_sigma(sigma)
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    dist2 = float(np.sum((x - y) ** 2))
    return special.expit((2.0 * gamma + 1.0) * dist2 / (2.0 * sigma * sigma)) * (x - y)


# --------------------------------------------------------------------------- rho_*

def mahalanobis_sq(shifts: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """s_j^T Sigma^-1 s_j for every row s_j of ``shifts`` (one Cholesky solve, no inverse)."""
    s = np.atleast_2d(np.asarray(shifts, dtype=float))
    chol = _cholesky(cov)
    if s.shape[1] != chol.shape[0]:
        raise SensitivityError(f"shifts have {s.shape[1]} coordinates but Sigma is {chol.shape[0]}x{chol.shape[0]}")
    z = np.linalg.solve(chol, s.T)
    return np.einsum("jn,jn->n", z, z)


def rho_star(shifts: np.ndarray, cov: np.ndarray) -> float:
    """rho_*(Sigma) = sup_{s in S} s^T Sigma^-1 s over a finite (generator) set S (SENSGEO Sec. IV)."""
    return float(np.max(mahalanobis_sq(shifts, cov)))


def fixed_query_rho_star(g: np.ndarray, domain: np.ndarray, sigma: float, cov: np.ndarray) -> float:
    """Exact sup over all D subset of K and k of s_k^T Sigma^-1 s_k for one query g (Theorem 1)."""
    return rho_star(dominant_pair_generators(g, domain, sigma), cov)


def uniform_query_rho_star(domain: np.ndarray, cov: np.ndarray) -> float:
    """Largest squared Mahalanobis distance between two points of K (Corollary 1)."""
    return rho_star(uniform_query_generators(domain), cov)


# --------------------------------------------------------------------------- Fig. 1

def cube_difference_vertices(d: int) -> np.ndarray:
    """The sign vectors v in {-1, 1}^d with v_1 = 1: vertices of K - K for K = [0,1]^d, up to sign.

    A convex quadratic attains its maximum over the polytope K - K = [-1, 1]^d at a vertex,
    so these 2^(d-1) points give the exact Corollary 1 value for the unit cube.
    """
    if not 1 <= d <= 20:
        raise SensitivityError(f"cube dimension d must be in 1..20 (2^(d-1) vertices), got {d}")
    rest = np.array(list(itertools.product((-1.0, 1.0), repeat=d - 1))).reshape(-1, d - 1)
    return np.concatenate([np.ones((rest.shape[0], 1)), rest], axis=1)


def cube_exact_sensitivity(cov: np.ndarray) -> np.ndarray:
    """sup_{x, y in [0,1]^d} (x - y)^T Sigma^-1 (x - y) for a stack of covariances [..., d, d] (Corollary 1)."""
    cov = np.asarray(cov, dtype=float)
    d = cov.shape[-1]
    v = cube_difference_vertices(d)
    prec = np.linalg.inv(cov).reshape(-1, d, d)
    # Chunked so that the [chunk, 2^(d-1), d] intermediate stays below ~100 MB for any d.
    chunk = max(1, int(1.2e7 // (v.shape[0] * d)))
    out = np.concatenate([np.einsum("vi,nvi->nv", v, v @ prec[a:a + chunk]).max(axis=-1)
                          for a in range(0, prec.shape[0], chunk)])
    return out.reshape(cov.shape[:-2])


def cube_naive_sensitivity(cov: np.ndarray) -> np.ndarray:
    """diam(K)^2 * lambda_max(Sigma^-1) for K = [0,1]^d, diam^2 = d: the naive bound of Fig. 1."""
    cov = np.asarray(cov, dtype=float)
    d = cov.shape[-1]
    return d / np.linalg.eigvalsh(cov)[..., 0]


def random_covariances(rng: np.random.Generator, d: int, n: int, *, cond_max: float) -> np.ndarray:
    """n random SPD matrices Q diag(lambda) Q^T: Haar rotation Q, log-uniform eigenvalues in [1/cond_max, 1].

    SENSGEO Fig. 1 does not state its distribution of Sigma; this one is explicit and
    scale-free (the ratio of Fig. 1 does not depend on the scale of Sigma).
    """
    if d < 1 or n < 1:
        raise SensitivityError(f"need d >= 1 and n >= 1, got d={d}, n={n}")
    if not cond_max >= 1:
        raise SensitivityError(f"cond_max must be >= 1, got {cond_max}")
    g = rng.standard_normal((n, d, d))
    q, r = np.linalg.qr(g)
    # Sign fix of the QR factor so Q is Haar-distributed (Mezzadri 2007).
    q = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    lam = np.exp(-rng.uniform(0.0, np.log(cond_max), size=(n, d)))
    cov = np.einsum("nij,nj,nkj->nik", q, lam, q)
    return 0.5 * (cov + np.swapaxes(cov, -1, -2))


def wishart_covariances(rng: np.random.Generator, d: int, n: int) -> np.ndarray:
    """n Wishart matrices A A^T / d with A a d x d standard Gaussian matrix (d degrees of freedom).

    The second explicit choice for SENSGEO Fig. 1: heavier-tailed conditioning than
    :func:`random_covariances`, singular with probability zero.
    """
    if d < 1 or n < 1:
        raise SensitivityError(f"need d >= 1 and n >= 1, got d={d}, n={n}")
    a = rng.standard_normal((n, d, d))
    return a @ np.swapaxes(a, -1, -2) / d

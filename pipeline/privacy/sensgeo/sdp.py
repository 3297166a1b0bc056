"""The covariance SDP, its conic dual and the duality-gap certificate (SENSGEO Sec. V).

Primal (P_{rho, eta}): for sensitivity generators s_1..s_J (whose symmetric convex hull is
the sensitivity hull), a budget rho > 0, a task weight W > 0 and a public noise floor eta >= 0,

    v_eta(rho) = min_{Sigma in S^d} <W, Sigma>
                 s.t. Sigma - eta I >= 0,
                      F_j(Sigma) = [[Sigma, s_j], [s_j^T, rho]] >= 0,  j = 1..J.

By the Schur complement F_j >= 0 iff s_j^T Sigma^-1 s_j <= rho, so the feasible set is
exactly {rho_*(Sigma) <= rho}, and rho = 2 eps_alpha / alpha makes it the least-loss
covariance under alpha-RDP (any budget of :mod:`.guarantees` is a budget on rho_*).

Conic dual: with multipliers H >= 0 and Z_j = [[A_j, b_j], [b_j^T, gamma_j]] >= 0, the
Lagrangian <W, Sigma> - <H, Sigma - eta I> - sum_j <Z_j, F_j(Sigma)> is bounded below in
Sigma iff H + sum_j A_j = W, which leaves

    max  eta tr(H) - sum_j (2 b_j^T s_j + gamma_j rho)
    s.t. H + sum_j A_j = W,  H >= 0,  Z_j >= 0,

and for any primal-dual feasible pair the gap is exactly
<H, Sigma - eta I> + sum_j <Z_j, F_j(Sigma)> >= 0 (the paper's Z_j F_j(Sigma) expansion).
Theorem 3: strong duality holds and both optima are attained, so a small gap certifies
global optimality.

The certificate here does not trust the solver: :func:`certify` turns the solver's primal
into an exactly feasible Sigma (scaled up until every Schur constraint holds in numpy) and
its dual into an exactly feasible (H, Z_j) (PSD projection, then H := W - sum A_j, mixed
with W until H >= 0), so primal >= v >= dual holds up to float rounding, and the reported
gap is an honest bound on the distance to the optimum.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

SOLVERS = ("CLARABEL", "SCS")


class SDPError(ValueError):
    """A malformed SDP instance or a solver failure; one line."""


@dataclass(frozen=True)
class Instance:
    """One (P_{rho, eta}) instance: generators [J, d], weight W [d, d], budget rho, floor eta."""

    shifts: np.ndarray
    weight: np.ndarray
    rho: float
    eta: float = 0.0

    def __post_init__(self) -> None:
        s = np.atleast_2d(np.asarray(self.shifts, dtype=float))
        w = np.asarray(self.weight, dtype=float)
        if s.ndim != 2 or s.shape[0] < 1:
            raise SDPError(f"shifts must be a [J, d] array with J >= 1, got shape {np.shape(self.shifts)}")
        d = s.shape[1]
        if w.shape != (d, d) or not np.allclose(w, w.T, atol=1e-12):
            raise SDPError(f"W must be a symmetric {d}x{d} matrix, got shape {w.shape}")
        if np.linalg.eigvalsh(w)[0] <= 0:
            raise SDPError("W must be positive definite (SENSGEO Sec. II-B assumes W > 0 so the optimum is attained)")
        if not (np.isfinite(self.rho) and self.rho > 0):
            raise SDPError(f"budget rho must be a positive finite number, got {self.rho!r}")
        if not (np.isfinite(self.eta) and self.eta >= 0):
            raise SDPError(f"noise floor eta must be >= 0, got {self.eta!r}")
        object.__setattr__(self, "shifts", s)
        object.__setattr__(self, "weight", w)

    @property
    def d(self) -> int:
        return int(self.shifts.shape[1])

    @property
    def J(self) -> int:
        return int(self.shifts.shape[0])


@dataclass(frozen=True)
class PrimalSolution:
    sigma: np.ndarray
    value: float
    H: np.ndarray
    Z: np.ndarray  # [J, d+1, d+1]
    status: str
    wall_s: float  # cvxpy compilation + solve
    solve_s: float  # the solver alone


@dataclass(frozen=True)
class DualSolution:
    H: np.ndarray
    Z: np.ndarray
    value: float
    status: str
    wall_s: float
    solve_s: float


@dataclass(frozen=True)
class Certificate:
    """Exactly feasible primal/dual pair (checked in numpy) and the gap between them."""

    sigma: np.ndarray
    primal_value: float
    dual_value: float
    gap_abs: float
    gap_rel: float
    max_schur_ratio: float  # max_j s_j^T Sigma^-1 s_j / rho, <= 1 when feasible
    min_eig_floor: float  # lambda_min(Sigma - eta I), >= 0 when feasible


def _solve(problem: cp.Problem, solver: str) -> tuple[float, float]:
    """Solve in place; return (wall seconds incl. cvxpy compilation, the solver's own seconds)."""
    if solver not in SOLVERS:
        raise SDPError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # cvxpy warns about one subexpression per generator; J of them is the SDP's size.
            warnings.filterwarnings("ignore", message="Objective contains too many subexpressions")
            warnings.filterwarnings("ignore", message="Constraint #")
            if solver == "SCS":
                problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200_000)
            else:
                problem.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise SDPError(f"{solver} failed: {exc}") from None
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise SDPError(f"{solver} returned status {problem.status}")
    wall = time.perf_counter() - t0
    own = problem.solver_stats.solve_time if problem.solver_stats is not None else None
    return wall, float(own) if own is not None else wall


def solve_primal(inst: Instance, *, solver: str = "CLARABEL") -> PrimalSolution:
    """Solve (P_{rho, eta}) (SENSGEO Sec. V) and return Sigma with the solver's dual multipliers."""
    d = inst.d
    sigma = cp.Variable((d, d), symmetric=True)
    floor = sigma - inst.eta * np.eye(d) >> 0
    # F_j(Sigma) = E(Sigma) + C_j: one affine embedding E of Sigma shared by all J LMIs, the
    # generator and the budget in the constant C_j.
    embed = cp.bmat([[sigma, np.zeros((d, 1))], [np.zeros((1, d)), np.zeros((1, 1))]])
    consts = np.zeros((inst.J, d + 1, d + 1))
    consts[:, :d, d] = inst.shifts
    consts[:, d, :d] = inst.shifts
    consts[:, d, d] = inst.rho
    lmis = [embed + c >> 0 for c in consts]
    problem = cp.Problem(cp.Minimize(cp.trace(inst.weight @ sigma)), [floor, *lmis])
    wall, secs = _solve(problem, solver)
    z = np.stack([np.asarray(c.dual_value, dtype=float) for c in lmis])
    return PrimalSolution(sigma=np.asarray(sigma.value, dtype=float), value=float(problem.value),
                          H=np.asarray(floor.dual_value, dtype=float), Z=z, status=problem.status,
                          wall_s=wall, solve_s=secs)


def solve_dual(inst: Instance, *, solver: str = "CLARABEL") -> DualSolution:
    """Solve the conic dual of (P_{rho, eta}) as its own SDP (SENSGEO Sec. V, Theorem 3)."""
    d = inst.d
    H = cp.Variable((d, d), PSD=True)
    Z = [cp.Variable((d + 1, d + 1), PSD=True) for _ in range(inst.J)]
    objective = inst.eta * cp.trace(H) - sum(2 * Zj[:d, d] @ s + inst.rho * Zj[d, d] for Zj, s in zip(Z, inst.shifts))
    stationarity = H + sum(Zj[:d, :d] for Zj in Z) == inst.weight
    problem = cp.Problem(cp.Maximize(objective), [stationarity])
    wall, secs = _solve(problem, solver)
    return DualSolution(H=np.asarray(H.value, dtype=float), Z=np.stack([np.asarray(Zj.value, dtype=float) for Zj in Z]),
                        value=float(problem.value), status=problem.status, wall_s=wall, solve_s=secs)


# --------------------------------------------------------------------------- numpy checks

def schur_ratios(sigma: np.ndarray, shifts: np.ndarray, rho: float) -> np.ndarray:
    """s_j^T Sigma^-1 s_j / rho for every generator: F_j(Sigma) >= 0 iff the ratio is <= 1."""
    chol = np.linalg.cholesky(sigma)
    z = np.linalg.solve(chol, np.asarray(shifts, dtype=float).T)
    return np.einsum("jn,jn->n", z, z) / rho


def block_min_eigs(sigma: np.ndarray, shifts: np.ndarray, rho: float) -> np.ndarray:
    """lambda_min of every F_j(Sigma) = [[Sigma, s_j], [s_j^T, rho]], the primal LMIs as written."""
    s = np.asarray(shifts, dtype=float)
    J, d = s.shape
    F = np.empty((J, d + 1, d + 1))
    F[:, :d, :d] = sigma
    F[:, :d, d] = s
    F[:, d, :d] = s
    F[:, d, d] = rho
    return np.linalg.eigvalsh(F)[:, 0]


def dual_objective(inst: Instance, H: np.ndarray, Z: np.ndarray) -> float:
    """eta tr(H) - sum_j (2 b_j^T s_j + gamma_j rho) for Z_j = [[A_j, b_j], [b_j^T, gamma_j]]."""
    d = inst.d
    b, gamma = Z[:, :d, d], Z[:, d, d]
    return float(inst.eta * np.trace(H) - 2.0 * np.einsum("jd,jd->", b, inst.shifts) - inst.rho * gamma.sum())


def _psd_part(m: np.ndarray) -> np.ndarray:
    m = 0.5 * (m + np.swapaxes(m, -1, -2))
    lam, vec = np.linalg.eigh(m)
    return np.einsum("...ij,...j,...kj->...ik", vec, np.clip(lam, 0.0, None), vec)


def feasible_primal(inst: Instance, sigma: np.ndarray) -> np.ndarray:
    """The solver's Sigma made exactly feasible in numpy: floor lifted to eta, then scaled to rho_* <= rho.

    Scaling Sigma by c >= 1 divides every s^T Sigma^-1 s by c and keeps Sigma >= eta I, so the
    result satisfies every constraint while its objective moves only by the solver's slack.
    """
    d = inst.d
    sig = 0.5 * (sigma + sigma.T)
    lam_min = np.linalg.eigvalsh(sig - inst.eta * np.eye(d))[0]
    if lam_min < 0:
        sig = sig + (-lam_min) * np.eye(d) * (1 + 1e-12)
    if np.linalg.eigvalsh(sig)[0] <= 0:  # eta = 0 and a singular solver Sigma
        sig = sig + 1e-12 * np.trace(sig) / d * np.eye(d)
    worst = float(np.max(schur_ratios(sig, inst.shifts, inst.rho)))
    if worst > 1:
        sig = sig * worst * (1 + 1e-12)
    return sig


def feasible_dual(inst: Instance, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exactly dual-feasible (H, Z) from the solver's Z: PSD projection, H := W - sum A_j, mixed with W.

    If W - sum A_j is not PSD, (1 - theta) Z with H = W - (1 - theta) sum A_j is, for the
    smallest theta in [0, 1] that makes lambda_min(H) >= 0 (W > 0 makes theta = 1 feasible).
    """
    d = inst.d
    zp = _psd_part(Z)
    a_sum = zp[:, :d, :d].sum(axis=0)
    H = inst.weight - a_sum
    lam_h = np.linalg.eigvalsh(H)[0]
    if lam_h < 0:
        # lambda_min(W - c A) is concave in c; bisect for the largest c in [0, 1] with it >= 0.
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if np.linalg.eigvalsh(inst.weight - mid * a_sum)[0] >= 0:
                lo = mid
            else:
                hi = mid
        zp = lo * zp
        H = inst.weight - lo * a_sum
    return H, zp


def certify(inst: Instance, sol: PrimalSolution) -> Certificate:
    """Duality-gap certificate from an exactly feasible primal and dual pair (SENSGEO Theorem 3)."""
    sigma = feasible_primal(inst, sol.sigma)
    H, Z = feasible_dual(inst, sol.Z)
    p = float(np.sum(inst.weight * sigma))
    dv = dual_objective(inst, H, Z)
    gap = p - dv
    return Certificate(sigma=sigma, primal_value=p, dual_value=dv, gap_abs=gap, gap_rel=gap / max(abs(p), 1e-300),
                       max_schur_ratio=float(np.max(schur_ratios(sigma, inst.shifts, inst.rho))),
                       min_eig_floor=float(np.linalg.eigvalsh(sigma - inst.eta * np.eye(inst.d))[0]))


def isotropic_baseline(inst: Instance) -> tuple[float, float]:
    """(sigma^2, <W, sigma^2 I>) of the best isotropic covariance with the same rho_* budget.

    sigma^2 I is feasible iff max_j ||s_j||^2 / sigma^2 <= rho and sigma^2 >= eta, so the least
    loss is at sigma^2 = max(eta, max_j ||s_j||^2 / rho).
    """
    var = max(inst.eta, float(np.max(np.sum(inst.shifts ** 2, axis=1))) / inst.rho)
    return var, var * float(np.trace(inst.weight))

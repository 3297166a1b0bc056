"""SENSGEO stages: Figure 1, the guarantee table, the SDP table, the MI-vs-SNR figure, the bridge.

Every number comes from :mod:`pipeline.privacy.sensgeo`; these stages only draw instances
from the seed, arrange the results and write them (Parquet tables in ``results/tables/``,
PNG + PDF figures in ``results/figures/``). They read no data: SENSGEO is analytic, its
public domains K are drawn here from ``sensgeo.seed``.

* ``sensgeo_fig1_naive_vs_exact`` -- SENSGEO Fig. 1: naive diam(K)^2 lambda_max(Sigma^-1) over
  the exact Corollary 1 value for random Sigma on K = [0,1]^d (histogram + summary table).
* ``sensgeo_table_guarantees`` -- Sec. IV: exact eps(delta) from rho_* against the generic
  RDP -> DP conversions and ``dp_accounting``'s Gaussian PLD.
* ``sensgeo_table_sdp`` -- Sec. V: primal, dual, certified gap, MSE gain over the best
  isotropic noise, solver time, for growing m and d.
* ``sensgeo_fig_mi_snr`` -- Sec. VI: capacity of the binary-input Gaussian channel vs SNR,
  its I-MMSE derivative, and the rho_* calibration for MI budgets kappa.
* ``sensgeo_table_bridge`` -- one empirical-denoiser sampler step: SENSGEO's exact rho_*
  next to EMPDEN's 2C/(beta |D|).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import seeds
from pipeline.privacy.sensgeo import bridge, geometry, guarantees, midp, sdp
from pipeline.reporting.figures import save_figure
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage

log = logging.getLogger(__name__)

#: SENSGEO Sec. V bar: every reported SDP instance must close its gap to this relative level.
GAP_TOLERANCE = 1e-6

_PROVENANCE = {"config_id": "id of the configuration (provenance column)", "seed": "sensgeo.seed"}


def _section(params: Mapping[str, Any], key: str, stage_name: str) -> Mapping[str, Any]:
    if key not in params or not isinstance(params[key], Mapping):
        raise PipelineError(f"stage {stage_name}: params need a {key!r} object (config key sensgeo.{key})")
    return params[key]


def _provenance(params: Mapping[str, Any], stage_name: str) -> tuple[str, int]:
    for key in ("config_id", "seed"):
        if key not in params:
            raise PipelineError(f"stage {stage_name}: params need {key!r}")
    return str(params["config_id"]), int(params["seed"])


def _rng(seed: int, salt: int) -> np.random.Generator:
    # One independent stream per output, so changing one grid never moves another table.
    return seeds.numpy_rng("sensgeo.output", seed, salt)


# --------------------------------------------------------------------------- Fig. 1

def fig1_ratios(rng: np.random.Generator, d: int, n: int, cond_max: float,
                distribution: str = "log_uniform") -> np.ndarray:
    """Naive / exact sensitivity ratio for n random covariances on K = [0,1]^d (SENSGEO Fig. 1).

    The paper does not say how its Sigma are drawn, so the distribution is a config choice:
    ``log_uniform`` (Haar rotation, eigenvalues log-uniform in [1/cond_max, 1]) or ``wishart``.
    """
    if distribution == "log_uniform":
        cov = geometry.random_covariances(rng, d, n, cond_max=cond_max)
    elif distribution == "wishart":
        cov = geometry.wishart_covariances(rng, d, n)
    else:
        raise PipelineError(f"sensgeo.fig1.distribution: expected log_uniform or wishart, got {distribution!r}")
    return geometry.cube_naive_sensitivity(cov) / geometry.cube_exact_sensitivity(cov)


def fig1_figure_of(ratios: Mapping[int, np.ndarray], *, n_covariances: int, bins: int, how: str) -> Any:
    """Fig. 1's histogram: one colour per dimension d (filled lightly and outlined, so overlapping bars stay
    apart), the title in mathtext."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    hi = max(float(r.max()) for r in ratios.values())
    edges = np.linspace(1.0, hi, bins + 1)
    colours = plt.get_cmap("tab10")
    for k, (d, r) in enumerate(ratios.items()):
        colour = colours(k % 10)
        ax.hist(r, bins=edges, color=colour, alpha=0.3, histtype="stepfilled")
        ax.hist(r, bins=edges, color=colour, histtype="step", linewidth=1.6,
                label=f"d = {d}: mean {r.mean():.2f}×, max {r.max():.2f}×")
    ax.set_xlabel(r"naive / exact:  $d\,\lambda_{\max}(\Sigma^{-1})\;/\;"
                  r"\max_{x,y\in[0,1]^d}(x-y)^\top\Sigma^{-1}(x-y)$")
    ax.set_ylabel("random covariances")
    ax.set_title(f"SENSGEO Fig. 1: $K=[0,1]^d$, {n_covariances} random $\\Sigma$ per d ({how})", fontsize=9)
    ax.legend(fontsize=8)
    return fig


@stage("sensgeo_fig1_naive_vs_exact", outputs=("figure", "table"),
       params={**_PROVENANCE, "fig1": "{d: [dims], n_covariances, distribution, cond_max, bins}"})
def sensgeo_fig1_naive_vs_exact(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                                params: Mapping[str, Any]) -> None:
    """SENSGEO Fig. 1: histogram of naive diam(K)^2 lambda_max(Sigma^-1) / exact Mahalanobis diameter."""
    config_id, seed = _provenance(params, "sensgeo_fig1_naive_vs_exact")
    p = _section(params, "fig1", "sensgeo_fig1_naive_vs_exact")
    rows, ratios = [], {}
    for i, d in enumerate(p["d"]):
        r = fig1_ratios(_rng(seed, 100 + i), int(d), int(p["n_covariances"]), float(p["cond_max"]),
                        p["distribution"])
        ratios[int(d)] = r
        rows.append({"d": int(d), "n_covariances": int(r.size), "distribution": p["distribution"],
                     "cond_max": float(p["cond_max"]) if p["distribution"] == "log_uniform" else math.nan,
                     "ratio_mean": float(r.mean()), "ratio_median": float(np.median(r)),
                     "ratio_max": float(r.max()), "ratio_min": float(r.min())})
        log.info("Fig. 1, d=%d: naive/exact mean %.3f, max %.3f over %d covariances", d, r.mean(), r.max(), r.size)
    fig = fig1_figure_of(ratios, n_covariances=int(p["n_covariances"]), bins=int(p["bins"]),
                         how=(f"log-uniform spectrum, cond ≤ {float(p['cond_max']):g}"
                              if p["distribution"] == "log_uniform" else "Wishart"))
    save_figure(fig, outputs["figure"])
    write_table(pd.DataFrame(rows), outputs["table"], config_id=config_id, seed=seed)


# --------------------------------------------------------------------------- Sec. IV table

def gaussian_plds(rho_star: float, pld_interval: float) -> dict[bool, Any]:
    """dp_accounting's Gaussian PLDs (pessimistic = bound, optimistic = NOT a bound) for mu = sqrt(rho_*)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    mu = guarantees.gdp_mu(rho_star)
    # Connect-the-dots is the tightest pessimistic construction and has no optimistic
    # variant, so the optimistic side uses privacy buckets (rounded down).
    return {pess: pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0 / mu, sensitivity=1.0, pessimistic_estimate=pess,
        value_discretization_interval=pld_interval, use_connect_dots=pess) for pess in (True, False)}


def guarantee_row(rho_star: float, delta: float, plds: Mapping[bool, Any], pld_interval: float) -> dict[str, Any]:
    """One row of the guarantee table: exact values fixed by rho_* and the conversions it replaces."""
    exact = guarantees.exact_epsilon(delta, rho_star)
    classic = guarantees.rdp_to_dp_classic(delta, rho_star)
    acct = guarantees.rdp_to_dp_accountant(delta, rho_star)
    return {
        "rho_star": rho_star, "delta": delta, "mu_gdp": guarantees.gdp_mu(rho_star),
        "rho_zcdp": guarantees.zcdp_rho(rho_star), "eps_rdp_alpha2": guarantees.renyi_curve(2.0, rho_star),
        "eps_exact": exact,
        "eps_pld_pessimistic_bound": float(plds[True].get_epsilon_for_delta(delta)),
        "eps_pld_optimistic_estimate": float(plds[False].get_epsilon_for_delta(delta)),
        "eps_rdp_classic_bound": classic, "eps_rdp_dp_accounting_bound": acct,
        "ratio_rdp_classic_over_exact": classic / exact if exact > 0 else math.inf,
        "ratio_rdp_dp_accounting_over_exact": acct / exact if exact > 0 else math.inf,
        "pld_discretization": pld_interval,
    }


@stage("sensgeo_table_guarantees", outputs=("table",),
       params={**_PROVENANCE, "guarantees": "{rho_star: [..], delta: [..], pld_discretization}"})
def sensgeo_table_guarantees(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                             params: Mapping[str, Any]) -> None:
    """SENSGEO Sec. IV: exact (eps, delta) from rho_* vs generic RDP->DP and the Gaussian PLD."""
    config_id, seed = _provenance(params, "sensgeo_table_guarantees")
    p = _section(params, "guarantees", "sensgeo_table_guarantees")
    interval = float(p["pld_discretization"])
    rows = []
    for r in map(float, p["rho_star"]):
        plds = gaussian_plds(r, interval)  # one PLD per rho_*, read at every delta
        rows += [guarantee_row(r, float(dl), plds, interval) for dl in p["delta"]]
    write_table(pd.DataFrame(rows), outputs["table"], config_id=config_id, seed=seed)


# --------------------------------------------------------------------------- Sec. V table

def sdp_instance(rng: np.random.Generator, *, m: int, d: int, query: str, bandwidth: float, rho: float,
                 eta: float, weight: str) -> tuple[sdp.Instance, int]:
    """A random public domain K of m points in [0,1]^d and its (P_{rho, eta}) instance.

    ``query='fixed'``: the Theorem 1 generators t_g(x, y) at one random query g in [0,1]^d;
    ``'uniform'``: the Corollary 1 generators x - y. Returns the instance and the number of
    ordered pairs m(m-1) it reduces (the dominated, antiparallel half is implied).
    """
    domain = rng.uniform(size=(m, d))
    if query == "fixed":
        shifts = geometry.dominant_pair_generators(rng.uniform(size=d), domain, bandwidth)
    elif query == "uniform":
        shifts = geometry.uniform_query_generators(domain)
    else:
        raise PipelineError(f"sensgeo.sdp.queries: expected fixed or uniform, got {query!r}")
    if weight == "identity":
        w = np.eye(d)
    elif weight == "random":
        a = rng.standard_normal((d, d))
        w = a @ a.T / d + 0.1 * np.eye(d)
    else:
        raise PipelineError(f"sensgeo.sdp.weight: expected identity or random, got {weight!r}")
    return sdp.Instance(shifts, w, rho, eta), m * (m - 1)


def sdp_row(inst: sdp.Instance, *, solver: str, solve_dual: bool) -> dict[str, Any]:
    """Solve, certify in numpy and compare with isotropic noise: one row of the SDP table."""
    sol = sdp.solve_primal(inst, solver=solver)
    cert = sdp.certify(inst, sol)
    iso_var, iso_mse = sdp.isotropic_baseline(inst)
    row = {
        "n_lmi": inst.J, "primal_value": cert.primal_value, "dual_value_certified": cert.dual_value,
        "gap_abs": cert.gap_abs, "gap_rel": cert.gap_rel,
        "max_schur_ratio": cert.max_schur_ratio, "min_eig_sigma_minus_eta": cert.min_eig_floor,
        "mse_isotropic": iso_mse, "isotropic_variance": iso_var,
        "mse_gain_over_isotropic": iso_mse / cert.primal_value,
        "solver": solver, "primal_wall_s": sol.wall_s, "primal_solver_s": sol.solve_s,
    }
    if solve_dual:
        dual = sdp.solve_dual(inst, solver=solver)
        row.update(dual_value_dual_sdp=dual.value, gap_rel_dual_sdp=(cert.primal_value - dual.value) / cert.primal_value,
                   dual_wall_s=dual.wall_s)
    else:
        row.update(dual_value_dual_sdp=math.nan, gap_rel_dual_sdp=math.nan, dual_wall_s=math.nan)
    # weak duality makes the gap >= 0 in exact arithmetic; allow float rounding below 0
    row["certified"] = bool(-1e-12 <= cert.gap_rel < GAP_TOLERANCE and cert.max_schur_ratio <= 1 + 1e-9
                            and cert.min_eig_floor >= -1e-12)
    return row


@stage("sensgeo_table_sdp", outputs=("table",),
       params={**_PROVENANCE, "sdp": "{m: [..], d: [..], queries, bandwidth, rho, eta, weight, solver, solve_dual}"})
def sensgeo_table_sdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """SENSGEO Sec. V: optimal covariance, conic dual, certified gap, MSE gain over isotropic, timing."""
    config_id, seed = _provenance(params, "sensgeo_table_sdp")
    p = _section(params, "sdp", "sensgeo_table_sdp")
    rows = []
    for qi, query in enumerate(p["queries"]):
        for d in p["d"]:
            for m in p["m"]:
                rng = _rng(seed, 1000 + 97 * qi + 7 * int(d) + int(m))
                inst, n_pairs = sdp_instance(rng, m=int(m), d=int(d), query=query, bandwidth=float(p["bandwidth"]),
                                             rho=float(p["rho"]), eta=float(p["eta"]), weight=p["weight"])
                row = {"query": query, "m": int(m), "d": int(d), "n_generators": n_pairs,
                       "rho": inst.rho, "eta": inst.eta, "weight": p["weight"],
                       **sdp_row(inst, solver=p["solver"], solve_dual=bool(p["solve_dual"]))}
                if not row["certified"]:
                    log.warning("SDP %s m=%d d=%d: gap_rel %.2e not certified below %.0e", query, m, d,
                                row["gap_rel"], GAP_TOLERANCE)
                log.info("SDP %s m=%d d=%d: v=%.6g gap_rel=%.1e gain=%.3fx (%.2fs)", query, m, d,
                         row["primal_value"], row["gap_rel"], row["mse_gain_over_isotropic"], row["primal_wall_s"])
                rows.append(row)
    write_table(pd.DataFrame(rows), outputs["table"], config_id=config_id, seed=seed)


# --------------------------------------------------------------------------- Sec. VI figure

@stage("sensgeo_fig_mi_snr", outputs=("figure",),
       params={**_PROVENANCE, "mi": "{snr_min, snr_max, n_points, kappa: [..]}"})
def sensgeo_fig_mi_snr(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """SENSGEO Sec. VI: binary-input Gaussian channel capacity vs SNR and the MI-DP calibration."""
    import matplotlib.pyplot as plt

    _provenance(params, "sensgeo_fig_mi_snr")
    p = _section(params, "mi", "sensgeo_fig_mi_snr")
    snr = np.geomspace(float(p["snr_min"]), float(p["snr_max"]), int(p["n_points"]))
    cap = midp.binary_capacity(snr)
    half_mmse = midp.binary_mmse(snr) / 2
    kappas = [float(k) for k in p["kappa"]]
    rho_max = [midp.calibrate_rho_star(k) for k in kappas]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.0, 4.2))
    a1.semilogx(snr, cap, label="C(snr) = I(B; Y): exact MI-DP level (nats)")
    a1.semilogx(snr, half_mmse, "--", label="dC/dsnr = mmse/2 > 0 (I-MMSE): C increases")
    a1.axhline(math.log(2), color="grey", lw=0.8, ls=":", label="log 2 nats = 1 bit: most a binary record can leak")
    # Each budget kappa as a dotted level ending where C reaches it: the largest admissible SNR.
    snr_max = [r / 4 for r in rho_max]
    for i, (k, s_k) in enumerate(zip(kappas, snr_max)):
        a1.plot([snr[0], s_k], [k, k], color="C3", lw=0.7, ls=":", marker="o", ms=4, markevery=[1],
                label="MI budgets κ (sensgeo.mi.kappa), each ending at its largest SNR C⁻¹(κ)" if i == 0 else None)
    a1.set_xlabel("SNR = ρ* / 4   (channel Y = q B/2 + Z, q = √ρ*)")
    a1.set_ylabel("nats (C);  nats per unit SNR (slope)")
    a1.set_title("SENSGEO Sec. VI: binary-input Gaussian channel", fontsize=9)
    a1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    a2.loglog(kappas, rho_max, "o-", color="C3")
    a2.set_xlabel("MI-DP budget κ (nats)")
    a2.set_ylabel("largest ρ* = 4 C⁻¹(κ)  (dimensionless)")
    a2.set_title("calibration: κ-MI-DP iff ρ* ≤ 4 C⁻¹(κ)", fontsize=9)
    for k, r in zip(kappas, rho_max):
        log.info("MI-DP kappa=%.4g nats -> rho_* <= %.6g", k, r)
    save_figure(fig, outputs["figure"])


# --------------------------------------------------------------------------- bridge table

@stage("sensgeo_table_bridge", outputs=("table",),
       params={**_PROVENANCE, "bridge": "{m, d, n_records, t: [..], dt_over_t, clip_C, beta, n_queries}"})
def sensgeo_table_bridge(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One empirical-denoiser step per noise level t: SENSGEO's exact rho_* next to EMPDEN's 2C/(beta|D|)."""
    config_id, seed = _provenance(params, "sensgeo_table_bridge")
    p = _section(params, "bridge", "sensgeo_table_bridge")
    m, d, n = int(p["m"]), int(p["d"]), int(p["n_records"])
    if not 2 <= n <= m:
        raise PipelineError(f"sensgeo.bridge: need 2 <= n_records <= m (D is a subset of K), got n_records={n}, m={m}")
    rng = _rng(seed, 5000)
    domain = rng.uniform(size=(m, d))
    dataset = domain[rng.choice(m, size=n, replace=False)]
    clip, beta = float(p["clip_C"]), float(p["beta"])
    diam_sq = float(np.max(np.sum(geometry.uniform_query_generators(domain) ** 2, axis=1)))
    rows = []
    for t in p["t"]:
        t = float(t)
        dt = float(p["dt_over_t"]) * t
        tau = bridge.step_noise_std(t, dt)
        cov = tau * tau * np.eye(d)
        queries = bridge.forward_queries(rng, domain, t, int(p["n_queries"]))
        fixed = np.array([geometry.fixed_query_rho_star(g, domain, t, cov) for g in queries])
        local = np.array([bridge.local_ideal_sensitivity(g, dataset, t) for g in queries]) / tau
        emp_exact = np.array([bridge.empden_exact_sensitivity(g, domain, t, clip, beta, n) for g in queries])
        emp_bound = bridge.empden_sensitivity_bound(clip, beta, n)
        rho_uniform = diam_sq / tau ** 2
        rows.append({
            "t": t, "dt": dt, "noise_std": tau, "m": m, "d": d, "n_records": n, "n_queries": int(p["n_queries"]),
            "clip_C": clip, "beta": beta,
            "empden_sensitivity_bound": emp_bound, "empden_mu_bound": emp_bound / tau,
            "empden_mu_exact_query_max": float(emp_exact.max()) / tau,
            "ideal_rho_star_fixed_query_max": float(fixed.max()), "ideal_mu_fixed_query_max": math.sqrt(fixed.max()),
            "ideal_mu_fixed_query_mean": float(np.sqrt(fixed).mean()),
            "ideal_rho_star_uniform_query": rho_uniform, "ideal_mu_uniform_query": math.sqrt(rho_uniform),
            "ideal_mu_local_dataset_max_not_dp": float(local.max()),
        })
    write_table(pd.DataFrame(rows), outputs["table"], config_id=config_id, seed=seed)

"""EMPDEN full-batch figures from the EDM schedule (exact GDP; App. I, I.1).

* Figure 4 left/middle: full-batch (S = D) sampling for a sweep of sigma_min. Every step
  touches every record, so mu = sqrt(sum mu_t^2) over all N steps (including the last step
  t_{N-1} -> 0, which reproduces the paper's eps ~ 200 at sigma_min = 0.1 and eps ~ 1 at
  sigma_min = 5) and delta(eps) is the GDP closed form (eq. 44). Left: delta(eps) curves;
  middle: trade-off curves G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) (eq. 42).
* Figure 5: mu_t of every step against log SNR = log(1/(4 t^2)).
* Figure 7: eps(delta) traces (left) and trade-off curves (right) when the full-batch
  sampler stops after k of the N steps (k = 4, 9, ..., N - 1 as in the paper's legend).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from pipeline.methods.accounting.blocks import PARAMS_DOC, AccountingConfig
from pipeline.privacy import accountants as acc
from pipeline.privacy.schedule import block_mu, log_snr
from pipeline.reporting import save_figure
from pipeline.reporting.figures import readable_log_axis
from pipeline.stage import stage

import matplotlib.pyplot as plt  # noqa: E402  (pipeline.reporting selected the Agg backend)


def trade_off(alpha: np.ndarray, mu: float) -> np.ndarray:
    """G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu), the mu-GDP trade-off curve (EMPDEN eq. 42)."""
    return special.ndtr(special.ndtri(1 - alpha) - mu)


def delta_curve(eps: np.ndarray, mu: float) -> np.ndarray:
    return np.array([acc.gdp_delta(float(e), mu) for e in eps])


def full_batch_mu(cfg: AccountingConfig, sigma_min: float, k: int | None = None) -> float:
    """mu of the full-batch sampler (|S| = n) over the first k steps (all N steps by default)."""
    mu_t = cfg.mu_t(cfg.n, N=cfg.N_full_batch, sigma_min=sigma_min)
    return block_mu(mu_t, len(mu_t) if k is None else k)


def _eps_axis() -> np.ndarray:
    return np.logspace(-2, 4, 300)


@stage("empden_figure4_full_batch", outputs=("figure",), params=PARAMS_DOC)
def empden_figure4_full_batch(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                              params: Mapping[str, Any]) -> None:
    """EMPDEN Figure 4 left/middle: full-batch delta(eps) and trade-off curves over sigma_min."""
    cfg = AccountingConfig.from_params(params)
    fig, (left, mid) = plt.subplots(1, 2, figsize=(10, 4))
    alpha = np.linspace(0, 1, 401)
    for s in cfg.sigma_min_sweep:
        mu = full_batch_mu(cfg, s)
        eps_at = acc.gdp_epsilon(cfg.delta, mu)
        label = f"σmin = {s:g} (μ = {mu:.3g}, ε = {eps_at:.3g})"
        left.loglog(_eps_axis(), np.maximum(delta_curve(_eps_axis(), mu), 1e-300), label=label)
        mid.plot(alpha, trade_off(alpha, mu), label=f"σmin = {s:g}")
    left.axhline(cfg.delta, color="k", ls=":", lw=1, label=f"δ = {cfg.delta:g}")
    left.set(xlabel="ε", ylabel="δ(ε)", ylim=(1e-10, 1.5), title="full batch, GDP → (ε, δ)")
    left.legend(fontsize=6)
    mid.plot(alpha, 1 - alpha, "k--", lw=1, label="indistinguishable")
    mid.set(xlabel="Type I error (α)", ylabel="Type II error (β)", title="trade-off curves")
    mid.legend(fontsize=6)
    save_figure(fig, outputs["figure"])


@stage("empden_figure5_mu_vs_logsnr", outputs=("figure",), params=PARAMS_DOC)
def empden_figure5_mu_vs_logsnr(inputs, outputs, params) -> None:
    """EMPDEN Figure 5: per-step mu_t of the full-batch sampler against log SNR."""
    cfg = AccountingConfig.from_params(params)
    t = cfg.schedule(N=cfg.N_full_batch).times()[:-1]
    mu_t = cfg.mu_t(cfg.n, N=cfg.N_full_batch)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogy(log_snr(t), mu_t, "o-", ms=3)
    ax.set(xlabel="log SNR", ylabel="μ_t (GDP)", title=f"μ-GDP across timesteps (β = {cfg.beta:g})")
    save_figure(fig, outputs["figure"])


def stopping_steps(N: int) -> list[int]:
    """Steps after which Figure 7's sampler stops: 4, 9, ..., N - 1 (every ~10% of N = 50)."""
    return list(range(4, N, 5)) if N > 5 else list(range(1, N + 1))


@stage("empden_figure7_stopping_traces", outputs=("figure",), params=PARAMS_DOC)
def empden_figure7_stopping_traces(inputs, outputs, params) -> None:
    """EMPDEN Figure 7: eps(delta) traces and trade-off curves for full-batch stopping times.

    The left panel's eps axis is logarithmic: stopping after k steps moves eps over many
    decades (mu from ~0.01 to ~300), which a linear axis collapses onto zero. Where delta(0) of
    a weak mechanism is already below delta, eps = 0 and that part of its trace is not drawn.
    """
    cfg = AccountingConfig.from_params(params)
    t = cfg.schedule(N=cfg.N_full_batch).times()
    steps = cfg.N_full_batch - 1
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    deltas = np.logspace(-12, -0.5, 60)
    alpha = np.linspace(0, 1, 401)
    for k in stopping_steps(cfg.N_full_batch):
        mu = full_batch_mu(cfg, cfg.sigma_min, k)
        eps = np.array([acc.gdp_epsilon(float(d), mu) for d in deltas])
        label = f"{k / steps:.0%}: k = {k}, σ_k = {t[k]:.3g}, μ = {mu:.3g}"
        line, = left.loglog(np.where(eps > 0, eps, np.nan), deltas)
        right.plot(alpha, trade_off(alpha, mu), color=line.get_color(), label=label)
    left.axhline(cfg.delta, color="k", ls=":", lw=1)
    left.annotate(f"δ = {cfg.delta:g} (accounting.delta)", (0.02, cfg.delta), xycoords=("axes fraction", "data"),
                  xytext=(0, 3), textcoords="offset points", fontsize=7)
    readable_log_axis(left.xaxis)
    left.set(xlabel="ε (nats; exact GDP → (ε, δ), eq. 44)", ylabel="δ (probability)",
             title=f"(ε, δ) of the full-batch sampler stopped early (σ_min = {cfg.sigma_min:g})")
    left.title.set_fontsize(9)
    right.plot(alpha, 1 - alpha, "k--", lw=1, label="β = 1 − α: indistinguishable")
    right.set(xlabel="Type I error α (false-positive rate)", ylabel="Type II error β (false-negative rate)",
              title="trade-off curves G_μ(α) (eq. 42)")
    right.title.set_fontsize(9)
    right.legend(fontsize=7, title=f"stopped after k of {steps} private steps\n(share of the schedule, "
                                   f"noise level σ_k reached, GDP μ)", title_fontsize=7,
                 loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    save_figure(fig, outputs["figure"])

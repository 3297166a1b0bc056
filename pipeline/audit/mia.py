"""Membership inference on a trained denoiser: the loss attack and SecMI's t-error attack.

Two black-box attacks on the model file a run releases, scored on members (records the run
trained on) and non-members (held-out real records it never saw); a member should score higher.

* **Loss (residual) attack** at a noise level sigma: score(y) = -(1/R) sum_r ||D(y + sigma n_r; sigma, c)
  - y||^2 over R fixed noise draws (Carlini et al. 2023, Sec. 5; the diffusion analogue of the loss
  threshold attack of Yeom et al. 2018). The draws are the same for every record and every model.
* **SecMI_stat** (Duan et al. 2023, "Are Diffusion Models Vulnerable to Membership Inference
  Attacks?", Sec. 4, eq. 7-9): the deterministic DDIM inversion x~_t = Phi(y, t) from the record to
  noise level t, one more deterministic step forward to t + k and one deterministic denoising step
  back; the *t-error* ||psi(phi(x~_t, t), t + k) - x~_t||^2 is small for members. In the VE-sigma
  convention the DDIM step between sigma_a and sigma_b is the Euler step of the probability-flow
  ODE, x_b = D(x_a) + (sigma_b / sigma_a)(x_a - D(x_a)) (Karras et al. 2022, Sec. 3), so the attack is
  written once against ``D(x; sigma, c)``.

Both attacks are written against the VE-sigma denoiser; a rectified-flow velocity model (STRAIGHTDP)
is read as one through :func:`ve_denoiser` (x_t = t x_ve with t = 1 / (1 + sigma), y_hat = x_t + (1 - t) v).

The statistics (AUROC and TPR at fixed FPR with bootstrap intervals) come from
:mod:`pipeline.audit.one_run`; :func:`curve_excess` checks an attack's whole ROC against the
trade-off an (eps, delta)-DP release allows (TPR <= e^eps FPR + delta and its mirror,
Kairouz et al. 2015) with Clopper-Pearson intervals, so sampling noise on a few hundred records
does not read as a refuted claim; :func:`refutable_epsilon` inverts that check for eps: the attack's
power as the largest claim it refutes (0 for an attack that refutes nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import beta as beta_dist
from torch import Tensor, nn

#: D(x, sigma[B], labels[B] | None) -> y_hat, the VE-sigma denoiser every attack speaks
Denoise = Callable[[Tensor, Tensor, Tensor | None], Tensor]

REFERENCES = {
    "loss": "loss/residual threshold (Carlini et al. 2023, Sec. 5; Yeom et al. 2018)",
    "secmi": "SecMI_stat t-error (Duan et al. 2023, eq. 7-9), DDIM = probability-flow Euler steps",
}


def ve_denoiser(model: nn.Module) -> Denoise:
    """``model`` as D(x; sigma, c) in the VE-sigma convention (``ve_sigma`` or ``rectified_flow_t`` files).

    For a flow, x_ve = y + sigma n is the straight path's x_t = (1 - t) n + t y divided by t with
    t = 1 / (1 + sigma) (STRAIGHTDP eq. 1), and the flow's x0-estimate is x_t + (1 - t) v(x_t, t).
    """
    convention = getattr(type(model), "convention", "ve_sigma")
    if convention == "ve_sigma":
        return lambda x, sigma, labels: model(x, sigma, labels)
    if convention == "rectified_flow_t":
        def denoise(x: Tensor, sigma: Tensor, labels: Tensor | None) -> Tensor:
            t = (1.0 / (1.0 + sigma)).view(-1, *([1] * (x.ndim - 1)))
            x_t = t * x
            return x_t + (1 - t) * model(x_t, t.view(-1), labels)
        return denoise
    raise ValueError(f"no membership attack for a model of convention {convention!r}")


def _batches(n: int, batch_size: int) -> list[slice]:
    return [slice(i, min(n, i + batch_size)) for i in range(0, n, batch_size)]


@torch.no_grad()
def loss_scores(denoise: Denoise, images: Tensor, labels: Tensor | None, sigma: float, *, draws: int,
                seed: int, batch_size: int = 250) -> np.ndarray:
    """-(1/R) sum_r ||D(y + sigma n_r; sigma, c) - y||^2 per record (higher = more member-like).

    The noise of draw r for record i is a function of (seed, r, i) only, so members and
    non-members, and every model scored with the same seed, see the same noise.
    """
    n = len(images)
    total = torch.zeros(n, dtype=torch.float64)
    for r in range(draws):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + r) % (2**63 - 1))
        noise = torch.randn(images.shape, generator=gen).to(images.device)
        for sl in _batches(n, batch_size):
            y = images[sl]
            s = torch.full((len(y),), float(sigma), dtype=y.dtype, device=y.device)
            lab = None if labels is None else labels[sl]
            err = (denoise(y + s.view(-1, *([1] * (y.ndim - 1))) * noise[sl], s, lab) - y).flatten(1)
            total[sl] += err.pow(2).sum(1).double().cpu()
    return (-total / draws).numpy()


def _ddim(denoise: Denoise, x: Tensor, sigma_a: float, sigma_b: float, labels: Tensor | None) -> Tensor:
    """One deterministic DDIM step sigma_a -> sigma_b: x_b = D(x_a) + (sigma_b / sigma_a)(x_a - D(x_a))."""
    s = torch.full((len(x),), float(sigma_a), dtype=x.dtype, device=x.device)
    d = denoise(x, s, labels)
    return d + (sigma_b / sigma_a) * (x - d)


@torch.no_grad()
def secmi_scores(denoise: Denoise, images: Tensor, labels: Tensor | None, stops: Sequence[tuple[float, float]], *,
                 inversion_grid: np.ndarray, batch_size: int = 250) -> list[np.ndarray]:
    """SecMI_stat scores (minus the t-error) at each (sigma_t, sigma_t_plus_k) of ``stops``.

    The inversion starts at the record itself, read as x at ``inversion_grid[0]`` (the grid's
    smallest sigma, where x = y + sigma_min n is y to within sigma_min), and walks up the
    ascending grid (plus every sigma_t) with DDIM steps; one walk serves every stop.
    """
    grid = np.asarray(inversion_grid, dtype=np.float64)
    if grid.ndim != 1 or len(grid) < 2 or not np.all(np.diff(grid) > 0) or grid[0] <= 0:
        raise ValueError("inversion_grid must be an ascending array of at least two positive sigmas")
    for s_t, s_k in stops:
        if not grid[0] < s_t < s_k:
            raise ValueError(f"SecMI stop needs sigma_min {grid[0]:g} < sigma_t < sigma_t+k, got {s_t:g}, {s_k:g}")
    path = np.unique(np.r_[grid, [s for s, _ in stops]])
    out = [np.empty(len(images)) for _ in stops]
    for sl in _batches(len(images), batch_size):
        x, lab = images[sl].clone(), None if labels is None else labels[sl]
        at_stop: dict[float, Tensor] = {}
        wanted = {s for s, _ in stops}
        for a, b in zip(path[:-1], path[1:]):
            if a >= max(wanted):
                break
            x = _ddim(denoise, x, a, b, lab)
            if b in wanted:
                at_stop[float(b)] = x
        for j, (s_t, s_k) in enumerate(stops):
            x_t = at_stop[float(s_t)]
            x_back = _ddim(denoise, _ddim(denoise, x_t, s_t, s_k, lab), s_k, s_t, lab)
            out[j][sl] = -(x_back - x_t).flatten(1).pow(2).sum(1).double().cpu().numpy()
    return out


def roc_points(in_scores: np.ndarray, out_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FPR, TPR, threshold) of the rule "member iff score >= threshold" at every distinct threshold."""
    ins, outs = np.sort(np.asarray(in_scores, float)), np.sort(np.asarray(out_scores, float))
    thresholds = np.unique(np.r_[ins, outs])[::-1]
    tpr = 1 - np.searchsorted(ins, thresholds, side="left") / len(ins)
    fpr = 1 - np.searchsorted(outs, thresholds, side="left") / len(outs)
    return fpr, tpr, thresholds


def attack_accuracy(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """ASR: the best balanced accuracy over thresholds, max_t (TPR + 1 - FPR) / 2 (Duan et al. 2023, Sec. 5)."""
    fpr, tpr, _ = roc_points(in_scores, out_scores)
    return float(max(0.5, np.max((tpr + 1 - fpr) / 2)))


def clopper_pearson(k: np.ndarray | int, n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided exact binomial interval for k successes in n trials (vectorised over k)."""
    k = np.asarray(k, dtype=float)
    a = 1 - confidence
    with np.errstate(invalid="ignore"):
        lo = np.where(k == 0, 0.0, beta_dist.ppf(a / 2, k, n - k + 1))
        hi = np.where(k == n, 1.0, beta_dist.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class CurveCheck:
    """An attack's ROC against the (eps, delta) trade-off curve.

    ``max_excess``: the largest TPR - (e^eps FPR + delta) (or the mirrored 1 - FPR - (e^eps (1 - TPR)
    + delta)) over the ROC's points, as measured. ``significant_excess``: the same with TPR at the
    low end and FPR at the high end of their Clopper-Pearson intervals (Bonferroni over the
    points); > 0 means the points refute (eps, delta) at the given confidence.
    """

    max_excess: float
    significant_excess: float
    points: int

    @property
    def under_curve(self) -> bool:
        return self.significant_excess <= 0


def _excess(tpr: np.ndarray, fpr: np.ndarray, eps: float, delta: float) -> np.ndarray:
    e = math.exp(min(eps, 700.0))
    return np.maximum(tpr - (e * fpr + delta), (1 - fpr) - (e * (1 - tpr) + delta))


def _cautious_points(ins: np.ndarray, outs: np.ndarray, confidence: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(FPR, TPR, TPR's lower and FPR's upper Clopper-Pearson end) at every ROC point, Bonferroni over them.

    TPR at its low end and FPR at its high end favour the claim in both inequalities, so a point
    that still lies above the curve refutes it at ``confidence``.
    """
    fpr, tpr, thresholds = roc_points(ins, outs)
    conf = 1 - (1 - confidence) / max(1, len(thresholds))  # Bonferroni over the thresholds
    t_lo, _ = clopper_pearson(np.round(tpr * len(ins)), len(ins), conf)
    _, f_hi = clopper_pearson(np.round(fpr * len(outs)), len(outs), conf)
    return fpr, tpr, t_lo, f_hi


def curve_excess(in_scores: np.ndarray, out_scores: np.ndarray, *, epsilon: float, delta: float,
                 confidence: float = 0.95) -> CurveCheck:
    """How far the attack's ROC points lie above the curve an (eps, delta)-DP release allows."""
    ins, outs = np.asarray(in_scores, float), np.asarray(out_scores, float)
    fpr, tpr, t_lo, f_hi = _cautious_points(ins, outs, confidence)
    return CurveCheck(max_excess=float(np.max(_excess(tpr, fpr, epsilon, delta))),
                      significant_excess=float(np.max(_excess(t_lo, f_hi, epsilon, delta))),
                      points=len(tpr))


def crossing_epsilon(tpr: np.ndarray, fpr: np.ndarray, delta: float) -> float:
    """The largest eps whose (eps, delta)-DP region some point (FPR, TPR) lies outside of; 0 if none does.

    The region is TPR <= e^eps FPR + delta and 1 - FPR <= e^eps (1 - TPR) + delta (Kairouz et al.
    2015); both excesses fall strictly in eps, so a point is outside exactly for eps below
    ln((TPR - delta) / FPR) or ln((1 - FPR - delta) / (1 - TPR)), and on the boundary there.
    """
    tpr, fpr = np.asarray(tpr, float), np.asarray(fpr, float)
    if not (np.all((tpr >= 0) & (tpr <= 1)) and np.all((fpr >= 0) & (fpr <= 1))):
        raise ValueError("crossing_epsilon: TPR and FPR must lie in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        # num <= 0: outside of no region; den = 0 < num: outside of every region (eps = inf)
        crossings = np.r_[np.where(tpr - delta > 0, np.log(tpr - delta) - np.log(fpr), -np.inf),
                          np.where(1 - fpr - delta > 0, np.log(1 - fpr - delta) - np.log(1 - tpr), -np.inf)]
    return float(max(0.0, np.max(crossings, initial=-np.inf)))


def refutable_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, *, delta: float,
                      confidence: float = 0.95) -> float:
    """The attack's power in eps: it refutes every (eps, delta) claim with eps below this value, none at or above.

    :func:`curve_excess`'s verdict inverted for eps, in closed form (:func:`crossing_epsilon`) at the
    same cautious points: TPR at its lower and FPR at its upper Clopper-Pearson end, Bonferroni over
    the ROC's points, so ``curve_excess(..., epsilon=e).under_curve`` is False exactly when
    e < refutable_epsilon(...). 0: no cautious point lies outside even the eps = 0 region, the
    attack refutes no claim (at this sample size it cannot tell members from non-members with
    ``confidence``). This is the eps lower bound of a DP audit (Jagielski et al. 2020, Sec. 4: the
    Clopper-Pearson ends of FPR and FNR put into the DP inequality); they choose the threshold on
    held-out trials, here the Bonferroni correction over the points pays for choosing it on the
    same records.
    """
    ins, outs = np.asarray(in_scores, float), np.asarray(out_scores, float)
    _, _, t_lo, f_hi = _cautious_points(ins, outs, confidence)
    return crossing_epsilon(t_lo, f_hi, delta)

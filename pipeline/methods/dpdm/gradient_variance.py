"""Stage ``dpdm_gradient_variance``: DPDM's Fig. 3 / Theorem 1, gradient variance against noise multiplicity K.

DPDM (Dockhorn et al. 2023, Sec. 3.1 "noise multiplicity", Theorem 1, proof in App. D.1, Fig. 3) replaces each
example's one-draw denoising loss by the mean over K independent (sigma, noise) draws, formed BEFORE the gradient
is clipped:

    l_K(x) = (1/K) sum_{k=1..K} lambda(sigma_k) || D_theta(x + sigma_k n_k; sigma_k) - x ||^2,
    sigma_k ~ p(sigma), n_k ~ N(0, I) independent,

so that the example's clipped gradient still has norm <= C (the mechanism and its ledger line do not depend on K).
Theorem 1: l_K is an unbiased Monte Carlo estimate of the DM objective of x whose variance is Var[l_1] / K. The same
holds for its parameter gradient g_K = grad_theta l_K = (1/K) sum_k grad_theta l(x; sigma_k, n_k), a mean of K
i.i.d. terms: Cov[g_K] = Cov[g_1] / K (the "noise part" of the variance, over the draws for a fixed x: the part
noise multiplicity acts on). Fig. 3 shows it for a fixed MNIST image and a trained denoiser, one variance per
parameter, over repeated draws.

What this stage measures, for each K of ``K``, on ``n_images`` fixed images of the PUBLIC split with the PUBLIC
denoiser (rule pretrain_public / import_public): ``repeats`` independent draws of g_K per image, per-example
gradients from the project's DP-SGD engine (:func:`pipeline.privacy.dpsgd.per_example_gradients` of
:func:`pipeline.privacy.dpsgd.multiplicity_loss`, the very loss train_dpdm clips), and

* ``variance``: the mean over parameters of the per-parameter variance over the draws of the CLIPPED gradient
  clip_C(g_K) = g_K min(1, C / ||g_K||) (what DP-SGD sums; C = ``clip``, dpdm.clip), averaged over the images;
* ``variance_unclipped``: the same of g_K itself, the quantity Theorem 1 speaks of (clipping is not linear, so the
  clipped variance need not follow 1/K exactly; where every draw is clipped it is the variance of a direction);
* ``reference_1_over_K``: variance(K=1) / K, Theorem 1's line anchored at K = 1 (and ``reference_unclipped``);
* a bootstrap (over the draws of each image, ``bootstrap`` resamples) standard error and 95% percentile interval;
* ``clipped_fraction``: the share of the draws whose gradient norm exceeded C.

Why public data: the diagnostic reads per-example gradients in the clear, which on the private split would be an
unaccounted release. The public denoiser and the printed-digit public split are public, so the figure costs no
privacy and needs no ledger line; it characterises the estimator (the loss, the sigma distribution, the network
family), which is what Theorem 1 is about, not the private data.

The variance of each (image, K) is read from the R x R Gram matrix of its R flattened gradients,
trace Cov = (sum_r ||g_r||^2 - ||sum_r g_r||^2 / R) / (R - 1), so a bootstrap resample of the draws costs an
R x R sum instead of a pass over R x P numbers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from pipeline import seeds
from pipeline.config import schema_descriptions
from pipeline.device import resolve_device
from pipeline.models.checkpoint import load_denoiser
from pipeline.models.denoiser import VE_SIGMA
from pipeline.models.precond import PRECONDITIONERS, Parameterisation, parameterisation
from pipeline.reporting.figures import save_figure
from pipeline.reporting.tables import write_table
from pipeline.sampling.denoiser_stage import denoiser_num_classes
from pipeline.privacy import dpsgd
from pipeline.stage import PipelineError, reject_unknown_params, stage
from pipeline.training.data import load_training_split, to_model_scale

log = logging.getLogger(__name__)

STAGE = "dpdm_gradient_variance"
#: the config section the stage's settings mirror: the one source of their descriptions
SCHEMA_SECTION = ("dpdm", "gradient_variance")
#: the stage's params that are keys of :data:`SCHEMA_SECTION`
SCHEMA_KEYS = ("K", "repeats", "n_images", "bootstrap")


PARAMS_DOC = {
    # the keys of dpdm.gradient_variance: described once, in its schema
    **schema_descriptions(SCHEMA_SECTION, SCHEMA_KEYS),
    "clip": "the clip norm C of the clipped variance (dpdm.clip)",
    "micro_batch": "(sigma, noise) draws per vmap call, i.e. micro_batch // K repeats at a time: memory only",
    "seed": "seed of the draws, the image choice and the bootstrap",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads",
    "config_id": "id of the settings",
}


@dataclass(frozen=True)
class VarianceConfig:
    """The stage's params (``PARAMS_DOC``), checked."""

    K: tuple[int, ...]
    repeats: int
    n_images: int
    clip: float
    bootstrap: int = 200
    micro_batch: int = 64
    seed: int = 0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> VarianceConfig:
        reject_unknown_params(STAGE, params, PARAMS_DOC)
        missing = [k for k in ("K", "repeats", "n_images", "clip") if params.get(k) is None]
        if missing:
            raise PipelineError(f"stage {STAGE}: param {missing[0]} is required")
        ks = params["K"]
        if (not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                                      for k in ks) or len(set(ks)) != len(ks)):
            raise PipelineError(f"stage {STAGE}: param K must be a list of distinct integers >= 1, got {ks!r}")
        if 1 not in ks:
            # Theorem 1's reference line is anchored at the one-draw loss
            raise PipelineError(f"stage {STAGE}: param K must contain 1 (the 1/K line is anchored at K = 1), "
                                f"got {ks!r}")
        cfg = cls(K=tuple(sorted(ks)), repeats=params["repeats"], n_images=params["n_images"],
                  clip=float(params["clip"]), bootstrap=params.get("bootstrap", 200),
                  micro_batch=params.get("micro_batch", 64), seed=params.get("seed", 0))
        for key, low in (("repeats", 3), ("n_images", 1), ("bootstrap", 10), ("micro_batch", 1), ("seed", 0)):
            value = getattr(cfg, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PipelineError(f"stage {STAGE}: param {key} must be an integer >= {low}, got {value!r}")
        if not (math.isfinite(cfg.clip) and cfg.clip > 0):
            raise PipelineError(f"stage {STAGE}: param clip must be > 0 and finite, got {cfg.clip!r}")
        return cfg


def parameterisation_of(denoiser: nn.Module) -> Parameterisation:
    """The DPDM configuration (loss and sigma distribution) the denoiser file's preconditioner was trained with."""
    for name, cls in PRECONDITIONERS.items():
        if type(denoiser) is cls:
            return parameterisation(name)
    raise PipelineError(f"stage {STAGE}: denoiser {type(denoiser).__name__} is not one of DPDM's configurations "
                        f"({', '.join(PRECONDITIONERS)})")


def choose_images(labels: np.ndarray, n_images: int, rng: np.random.Generator) -> np.ndarray:
    """``n_images`` indices of the public split, one class after another (a random image of each class in turn)."""
    if n_images > len(labels):
        raise PipelineError(f"stage {STAGE}: param n_images {n_images} exceeds the {len(labels)} public images")
    classes = np.unique(labels)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    out: list[int] = []
    while len(out) < n_images:
        for c in classes:
            if pools[c] and len(out) < n_images:
                out.append(int(pools[c].pop()))
    return np.asarray(out)


def draw_gradients(model: nn.Module, param: Parameterisation, x: Tensor, cond: tuple[Tensor, ...], *, K: int,
                   repeats: int, micro_batch: int, generator: torch.Generator) -> Tensor:
    """``repeats`` independent gradients g_K of one image's noise-multiplicity loss, flattened: ``[repeats, P]``.

    The image is the same in every row; each row has its own K (sigma, noise) draws (:class:`dpsgd.NoiseMultiplicity`),
    and the per-row gradient comes from the engine's ``vmap(grad)`` of :func:`dpsgd.multiplicity_loss`, on
    ``micro_batch // K`` rows (``micro_batch`` draws) at a time.
    """
    loss = dpsgd.multiplicity_loss(param.draw_loss)
    multiplicity = dpsgd.NoiseMultiplicity(K, param.sigma_sampler)
    rows = []
    step = max(1, micro_batch // K)  # the network runs on step * K draws at once: memory grows with it
    for start in range(0, repeats, step):
        b = min(step, repeats - start)
        xb = x.unsqueeze(0).expand(b, *x.shape).contiguous()
        sigma, noise = multiplicity.draw(xb, generator)
        condb = tuple(c.unsqueeze(0).expand(b, *c.shape).contiguous() for c in cond)
        grads, _ = dpsgd.per_example_gradients(model, loss, (xb, sigma, noise, *condb))
        rows.append(torch.cat([g.reshape(b, -1) for g in grads.values()], dim=1).double())
    return torch.cat(rows)


def trace_variance(gram: np.ndarray, idx: np.ndarray | None = None) -> float:
    """Trace of the sample covariance of the rows whose Gram matrix is ``gram`` (rows ``idx``, with repeats)."""
    if idx is not None:
        gram = gram[np.ix_(idx, idx)]
    r = gram.shape[0]
    return float((np.trace(gram) - gram.sum() / r) / (r - 1))


@dataclass(frozen=True)
class ImageGrams:
    """One (image, K): the Gram matrices of the clipped and the raw gradients, and how many draws were clipped."""

    clipped: np.ndarray
    unclipped: np.ndarray
    clipped_fraction: float
    mean_norm: float


def grams_of(g: Tensor, clip: float) -> ImageGrams:
    """Gram matrices of ``g [R, P]`` and of its rows clipped to ``clip`` (the engine's min(1, C / ||g||))."""
    norms = g.norm(dim=1)
    factor = clip / torch.clamp(norms, min=clip)
    gc = g * factor[:, None]
    return ImageGrams(clipped=(gc @ gc.T).cpu().numpy(), unclipped=(g @ g.T).cpu().numpy(),
                      clipped_fraction=float((norms > clip).double().mean()), mean_norm=float(norms.mean()))


def summarise(grams: Mapping[int, Sequence[ImageGrams]], n_params: int, *, bootstrap: int,
              rng: np.random.Generator) -> pd.DataFrame:
    """One row per K: the mean per-parameter variance over the images (clipped and raw), bootstrap SE and 95% CI
    over each image's draws, Theorem 1's 1/K line anchored at K = 1, the clipped share and the log-log slope."""
    rows = []
    for K, per_image in sorted(grams.items()):
        row: dict[str, Any] = {"K": int(K)}
        for kind in ("clipped", "unclipped"):
            mats = [getattr(g, kind) for g in per_image]
            point = np.mean([trace_variance(m) for m in mats]) / n_params
            boot = np.empty(bootstrap)
            for b in range(bootstrap):
                # a resample's unbiased variance estimates the empirical distribution's, (R - 1) / R of the sample
                # variance: scaled back by R / (R - 1), the resamples centre on the point estimate
                boot[b] = np.mean([trace_variance(m, rng.integers(0, m.shape[0], m.shape[0])) * m.shape[0]
                                   / (m.shape[0] - 1) for m in mats]) / n_params
            suffix = "" if kind == "clipped" else "_unclipped"
            row |= {f"variance{suffix}": point, f"variance{suffix}_se": float(boot.std(ddof=1)),
                    f"variance{suffix}_ci_low": float(np.percentile(boot, 2.5)),
                    f"variance{suffix}_ci_high": float(np.percentile(boot, 97.5))}
        row |= {"clipped_fraction": float(np.mean([g.clipped_fraction for g in per_image])),
                "mean_grad_norm": float(np.mean([g.mean_norm for g in per_image]))}
        rows.append(row)
    df = pd.DataFrame(rows)
    for suffix, ref in (("", "reference_1_over_K"), ("_unclipped", "reference_unclipped")):
        v1 = float(df.loc[df["K"] == 1, f"variance{suffix}"].iloc[0])
        df[ref] = v1 / df["K"]
        df[f"ratio_to_K1{suffix}"] = df[f"variance{suffix}"] / v1
        # least-squares slope of log variance on log K: Theorem 1 says -1
        df[f"loglog_slope{suffix}"] = float(np.polyfit(np.log(df["K"]), np.log(df[f"variance{suffix}"]), 1)[0])
    return df


def variance_figure(df: pd.DataFrame, *, title: str) -> Any:
    """Measured variance against K on log-log axes with 95% bootstrap intervals and Theorem 1's 1/K line through
    K = 1: the clipped gradient (what DP-SGD sums) and the unclipped one (Theorem 1's quantity), one panel each
    (their scales differ by orders of magnitude when the norms exceed C)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.reporting.figures import readable_log_axis

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    clip = float(df["clip"].iloc[0]) if "clip" in df.columns else float("nan")
    for ax, suffix, ref, name, colour in (
            (axes[0], "", "reference_1_over_K", f"clipped to C = {clip:g} (what DP-SGD sums)", "C0"),
            (axes[1], "_unclipped", "reference_unclipped", "unclipped (Theorem 1's quantity)", "C1")):
        v = df[f"variance{suffix}"]
        err = np.vstack([v - df[f"variance{suffix}_ci_low"], df[f"variance{suffix}_ci_high"] - v]).clip(min=0)
        slope = float(df[f"loglog_slope{suffix}"].iloc[0])
        ax.errorbar(df["K"], v, yerr=err, marker="o", color=colour, capsize=3,
                    label=f"measured (95% bootstrap CI), log-log slope {slope:.2f}")
        ax.plot(df["K"], df[ref], linestyle="--", color="0.3", label="1/K through K = 1 (Theorem 1)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(df["K"].tolist())
        ax.set_xticklabels([str(k) for k in df["K"]])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        readable_log_axis(ax.yaxis)
        ax.set_xlabel("noise multiplicity K")
        ax.set_ylabel("mean per-parameter gradient variance")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


@stage(STAGE, inputs=("denoiser", "public"), outputs=("table", "figure"), params=PARAMS_DOC)
def dpdm_gradient_variance(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DPDM Fig. 3 / Theorem 1: per-parameter gradient variance against noise multiplicity K on public data, with
    the 1/K line (table + log-log figure)."""
    cfg = VarianceConfig.from_params(params)
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    t0 = time.perf_counter()
    model = load_denoiser(inputs["denoiser"], device=device, convention=VE_SIGMA)  # eval mode: no dropout draws
    param = parameterisation_of(model)
    num_classes = denoiser_num_classes(model)
    split, _ = load_training_split(inputs["public"], "public")
    resample = seeds.numpy_rng("dpdm.gradient_variance.resample", cfg.seed)
    chosen = choose_images(split.labels, cfg.n_images, resample)
    images = to_model_scale(split.images[chosen]).to(device)
    labels = torch.as_tensor(split.labels[chosen].astype(np.int64), device=device)
    for p in model.parameters():
        p.requires_grad_(True)
    n_params = sum(p.numel() for p in model.parameters())
    grams: dict[int, list[ImageGrams]] = {K: [] for K in cfg.K}
    for i in range(cfg.n_images):
        cond = (labels[i],) if num_classes > 0 else ()
        for K in cfg.K:
            gen = seeds.torch_generator("dpdm.gradient_variance.draws", cfg.seed, i, K)
            g = draw_gradients(model, param, images[i], cond, K=K, repeats=cfg.repeats,
                               micro_batch=cfg.micro_batch, generator=gen)
            grams[K].append(grams_of(g, cfg.clip))
    df = summarise(grams, n_params, bootstrap=cfg.bootstrap, rng=resample)
    df = df.assign(n_images=cfg.n_images, repeats=cfg.repeats, clip=cfg.clip, n_parameters=n_params,
                   parameterisation=param.name, data="public")
    write_table(df, outputs["table"], config_id=str(params.get("config_id", "unknown")), seed=cfg.seed)
    save_figure(variance_figure(df, title=f"DPDM Fig. 3: gradient variance vs K ({param.name}, public denoiser, "
                                          f"{cfg.n_images} public images x {cfg.repeats} draws)"), outputs["figure"])
    log.info("%s: K %s, clipped variance %s, unclipped %s (ratios to K=1 %s) in %.1f s", STAGE, list(cfg.K),
             np.round(df["variance"].to_numpy(), 8).tolist(), np.round(df["variance_unclipped"].to_numpy(), 8).tolist(),
             np.round(df["ratio_to_K1_unclipped"].to_numpy(), 3).tolist(), time.perf_counter() - t0)

"""Stages ``dp_hp``, ``dp_ntk`` and ``dp_mepf``: DP-MERF's successors on the private split, one run each.

Each is DP-MERF's pipeline (:mod:`pipeline.baselines.dp_merf`) with another feature map
(:mod:`pipeline.baselines.features`), the protocol held fixed as STRAIGHTDP App. D runs them (same
(eps, delta), replace-one PLD accounting, public-only calibration, the same generator and matching
steps, the settings of ``baselines.dp_merf``):

1. the feature map from PUBLIC data and public randomness only (DP-HP's per-pixel kernel lengths and
   pixel pairs, DP-NTK's random network, DP-MEPF's public CLIP tower);
2. the one private access: the class-conditional mean embedding, every row of norm <= 1, released by
   the Gaussian mechanism at sensitivity 2/m (:mod:`pipeline.privacy.mean_embedding`), sigma calibrated
   so the certified PLD eps meets the run's target; its ledger line;
3. DP-MERF's generator fitted to the release by DP-MERF's loop, then ``n_samples`` balanced samples
   (post-processing, no privacy cost).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import seeds
from pipeline.baselines import features as feat
from pipeline.baselines.common import baseline_setup, load_public_like
from pipeline.baselines.dp_merf import fit_generator, generate, save_generator, unit_pixels
from pipeline.io import atomic_path, save_split, write_json
from pipeline.privacy import ledger
from pipeline.privacy import mean_embedding as me
from pipeline.stage import PipelineError, stage
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, load_training_split

log = logging.getLogger(__name__)

#: each method's ledger mechanism (its random streams: EMBEDDING_FAMILY of pipeline/methods/baselines/streams.py)
MECHANISM = {"dp_hp": "dp_hp_embedding", "dp_ntk": "dp_ntk_embedding", "dp_mepf": "dp_mepf_embedding"}
#: private rows per feature batch of the release (DP-NTK's rows are ~77k wide at 16 x 16)
RELEASE_BATCH = 250


FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def feature_map(method: str, cfg: Mapping[str, Any], public: torch.Tensor, *, image_shape: tuple[int, int, int],
                clip_path: Path | None, generator: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The method's feature map (``.dim``, called on pixels ``[n, d]`` in [0, 1]) built from public data, and
    what it is (logged in the run's metrics)."""
    if method == "dp_hp":
        fm = feat.hermite_features(public, dict(cfg), generator)
        return fm, {"order": fm.order, "prod_order": fm.prod_order, "n_pairs": len(fm.pairs), "alpha": fm.alpha,
                    "rho_median": float(fm.rho.median())}
    if method == "dp_ntk":
        fm = feat.NTKFeatures(public.shape[1], int(cfg["width"]), generator)
        return fm, {"width": int(cfg["width"])}
    if clip_path is None:
        raise PipelineError("dp_mepf: input clip (the public CLIP file, rule train_clip) is required")
    from pipeline.evaluation.clip import ClipModel

    return feat.PerceptualFeatures(ClipModel(clip_path), image_shape, float(cfg["beta"])), \
        {"beta": float(cfg["beta"]), "clip": str(clip_path)}


def private_batches(x: torch.Tensor, labels: torch.Tensor, features: FeatureMap
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(phi, labels) of the private rows, RELEASE_BATCH at a time."""
    for i in range(0, len(x), RELEASE_BATCH):
        with torch.no_grad():
            yield features(x[i:i + RELEASE_BATCH]).double(), labels[i:i + RELEASE_BATCH]


def matching_loss(features: Any, mu_tilde: torch.Tensor, n_classes: int, device: torch.device) -> feat.MatchingLoss:
    """The map's own matching loss on ``device`` (DP-NTK's in inner products: its rows are never formed; the others'
    explicit). In float32, as DP-MERF's: the release is float64, the generator's fit to it needs no more."""
    return features.to(device).matching_loss(mu_tilde.to(device, torch.float32), n_classes)


def embedding_baseline(method: str, inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                       params: Mapping[str, Any]) -> None:
    """One run of ``method`` (dp_hp, dp_ntk, dp_mepf): public feature map, one Gaussian release of the
    private mean embedding, DP-MERF's generator fitted to it, samples; the samples, the ledger line, the
    run's metrics and the generator."""
    section, cfg, run, device = baseline_setup(params, method)
    generator_cfg = section["dp_merf"]  # the generator and its loop are DP-MERF's, held fixed
    start = time.perf_counter()
    m, n_classes = declared_private(params, method)
    split, sha = load_training_split(inputs["data"], "data")
    binding = ledger.binding_of(params, data_sha256=sha, stage=method)
    check_declared(split, N=m, n_classes=n_classes, stage=method)
    public = load_public_like(inputs["public"], split)
    image_shape = tuple(split.images.shape[1:])
    features, described = feature_map(method, cfg, unit_pixels(public), image_shape=image_shape,
                                       clip_path=inputs.get("clip"),
                                       generator=seeds.torch_generator(f"{method}.features", run.seed))
    try:
        plan = me.calibrate_release(MECHANISM[method], target_epsilon=run.epsilon, delta=float(section["delta"]),
                                    m=m, feature_dim=features.dim, n_classes=n_classes)
        labels = torch.from_numpy(split.labels.astype(np.int64))
        mu_tilde = me.release(private_batches(unit_pixels(split), labels, features), plan,
                              generator=seeds.torch_generator(f"{method}.mechanism_noise", run.seed))
    except me.EmbeddingError as exc:
        raise PipelineError(f"stage {method}: {exc}") from None
    entry = me.ledger_entry(plan, stage=method, config_id=str(params.get("config_id", "unknown")), seed=run.seed,
                            extra={"run": run.name, "target_epsilon": run.epsilon, "data_sha256": sha,
                                   **{k: v for k, v in described.items() if k != "clip"}})
    if entry.claimed_epsilon > run.epsilon:
        raise PipelineError(f"stage {method}: certified eps {entry.claimed_epsilon:.6g} > target {run.epsilon}")
    noise_norm = plan.noise_std * math.sqrt(mu_tilde.numel())
    # only public and released quantities are logged (never the clean embedding)
    log.info("%s %s: %d features, sigma %.4g (noise std %.3g per entry), certified eps %.4g; expected ||noise|| "
             "%.4g, ||released|| %.4g", method, run.name, features.dim, plan.sigma, plan.noise_std,
             entry.claimed_epsilon, noise_norm, float(mu_tilde.norm()))

    g_gen = seeds.torch_generator(f"{method}.generator", run.seed)
    G, losses = fit_generator(matching_loss(features, mu_tilde, n_classes, device), n_classes=n_classes,
                              out_shape=image_shape, cfg=generator_cfg, generator=g_gen, device=device,
                              desc=f"{method} generator")
    samples = generate(G, int(section["n_samples"]), generator=g_gen, device=device)
    wall_s = time.perf_counter() - start
    save_split(outputs["samples"], samples, name=f"baselines/{run.name}", source=method, seed=run.seed,
               extra={"run": run.name, "wall_s": wall_s})
    if "generator" in outputs:  # post-processing of the release: what a certified bundle ships
        save_generator(outputs["generator"], G, {"stage": method, "private": True, "run": run.name,
                                                 "epsilon": entry.claimed_epsilon, "delta": entry.delta,
                                                 "seed": run.seed, "data_sha256": sha})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    write_json(outputs["metrics"], {"run": run.name, "method": method, "epsilon_target": run.epsilon,
                                    "noise_multiplier": plan.sigma, "sensitivity": plan.sensitivity,
                                    "feature_dim": features.dim, "m": m, **described,
                                    "loss_first": losses[0], "loss_last": losses[-1],
                                    "embedding_noise_norm_expected": noise_norm,
                                    "embedding_released_norm": float(mu_tilde.norm()), "wall_s": wall_s})
    log.info("%s %s: generator loss %.4g -> %.4g, %d samples in %.1f s", method, run.name, losses[0], losses[-1],
             len(samples), wall_s)


_PARAMS = {"baselines": "the baselines section (the method's and dp_merf's generator settings)",
           "config_id": "id of the settings", "device": "auto/cpu/cuda", "threads": "CPU threads",
           "private": PRIVATE_DOC, ledger.BINDING_PARAM: ledger.BINDING_DOC}


@stage("dp_hp", inputs=("data", "public"), outputs=("samples", "ledger", "metrics"), optional_outputs=("generator",),
       params={"run": "the run's name, dp_hp_eps<eps>_seed<seed>", **_PARAMS})
def dp_hp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DP-HP: Hermite sum + product kernel features (public kernel lengths and pixel pairs), one release."""
    embedding_baseline("dp_hp", inputs, outputs, params)


@stage("dp_ntk", inputs=("data", "public"), outputs=("samples", "ledger", "metrics"),
       optional_outputs=("generator",), params={"run": "the run's name, dp_ntk_eps<eps>_seed<seed>", **_PARAMS})
def dp_ntk(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DP-NTK: normalised e-NTK features of a random one-hidden-layer ReLU network, one release."""
    embedding_baseline("dp_ntk", inputs, outputs, params)


@stage("dp_mepf", inputs=("data", "public", "clip"), outputs=("samples", "ledger", "metrics"),
       optional_outputs=("generator",), params={"run": "the run's name, dp_mepf_eps<eps>_seed<seed>", **_PARAMS})
def dp_mepf(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DP-MEPF: first and second moments of the public CLIP tower's features, one release."""
    embedding_baseline("dp_mepf", inputs, outputs, params)

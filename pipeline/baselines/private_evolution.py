"""Stage ``private_evolution``: Private Evolution (Lin et al. 2024, Alg. 1), class-conditional, one run.

The API is the public EDM denoiser this project already trains on public data (rule
``pretrain_public``): no private record ever reaches it.

* RANDOM_API(n): class-conditional samples of the public denoiser (EDM Heun sampler).
* VARIATION_API(x, s): the SDEdit move -- re-noise x to level s (x + s n) and denoise from s to 0
  with the same sampler, conditioned on the candidate's class. s shrinks geometrically from
  ``variation_sigma[0]`` at the first iteration to ``variation_sigma[1]`` at the last (the paper's
  decreasing variation degree).

Each iteration t = 1..T: every private record votes for its nearest candidate of its own class in
a PUBLIC embedding (``pixels``: the images themselves; ``clip``: the CLIP trained on the public
split), the vote histogram is released by the Gaussian mechanism and thresholded
(:mod:`pipeline.privacy.private_evolution`, sensitivity 1, add-or-remove-one), each class's
``n_per_class`` candidates are redrawn in proportion to the noisy counts (uniformly when a class's
counts are all thresholded away: the public prior again), and varied. The output is S_T.
T releases at one sigma, calibrated so their PLD composition meets the run's target eps: one
ledger line with count T.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from pipeline import seeds
from pipeline.baselines.common import baseline_setup
from pipeline.io import Split, atomic_path, save_split, write_json
from pipeline.models.checkpoint import load_denoiser
from pipeline.models.denoiser import VE_SIGMA
from pipeline.privacy import ledger
from pipeline.privacy import private_evolution as pe
from pipeline.sampling.samplers import SamplerConfig, sample, to_uint8
from pipeline.sampling.denoiser_stage import denoiser_image_shape, denoiser_num_classes
from pipeline.stage import PipelineError, stage
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, load_training_split

log = logging.getLogger(__name__)


def variation_sigmas(first: float, last: float, T: int) -> list[float]:
    """The re-noising level of iterations 1..T: geometric from ``first`` to ``last``."""
    if not (first > 0 and last > 0):
        raise PipelineError(f"baselines.pe.variation_sigma must be two levels > 0, got {[first, last]}")
    if T == 1:
        return [float(first)]
    return [float(first * (last / first) ** (t / (T - 1))) for t in range(T)]


class PublicAPI:
    """The two APIs of PE on the public denoiser: ``random`` and ``variation`` (SDEdit)."""

    def __init__(self, denoiser: torch.nn.Module, *, steps: int, guidance: float, batch_size: int,
                 generator: torch.Generator, device: torch.device) -> None:
        self.denoiser, self.steps, self.guidance, self.batch_size = denoiser, steps, guidance, batch_size
        self.generator, self.device = generator, device
        self.num_classes = denoiser_num_classes(denoiser)
        self.shape = denoiser_image_shape(denoiser)

    def _run(self, x: Tensor | None, labels: np.ndarray, sigma_max: float | None) -> Tensor:
        config = SamplerConfig(name="edm", steps=self.steps, guidance=self.guidance,
                               **({} if sigma_max is None else {"sigma_max": sigma_max}))
        out = []
        for start in range(0, len(labels), self.batch_size):
            y = torch.as_tensor(labels[start:start + self.batch_size], device=self.device)
            noise = torch.randn((len(y), *self.shape), generator=self.generator)
            # the samplers start from sigma_0 * latents: a variation starts from x + s n, i.e. x / s + n
            latents = noise if x is None else x[start:start + self.batch_size] / sigma_max + noise
            out.append(sample(self.denoiser, latents.to(self.device), y, config, num_classes=self.num_classes,
                              generator=self.generator).cpu())
        return torch.cat(out)

    def random(self, labels: np.ndarray) -> Tensor:
        """RANDOM_API: one public sample per label, data scale [-1, 1]."""
        return self._run(None, labels, None)

    def variation(self, x: Tensor, labels: np.ndarray, sigma: float) -> Tensor:
        """VARIATION_API: re-noise ``x`` (data scale) to ``sigma`` and denoise back to 0."""
        return self._run(x.clamp(-1, 1), labels, sigma)


class Embedding:
    """The public space the votes are cast in: ``pixels`` or the public ``clip`` image embedding."""

    def __init__(self, kind: str, clip_path: Path | None, device: torch.device) -> None:
        if kind not in ("pixels", "clip"):
            raise PipelineError(f"baselines.pe.embedding must be pixels or clip, got {kind!r}")
        if kind == "clip" and clip_path is None:
            raise PipelineError("baselines.pe.embedding is clip: the stage needs --in clip=<the public CLIP file>")
        self.kind = kind
        if kind == "clip":
            from pipeline.evaluation.clip import ClipModel

            self.clip = ClipModel(clip_path, device)

    def __call__(self, images: np.ndarray) -> Tensor:
        if self.kind == "pixels":
            return torch.from_numpy(images.reshape(len(images), -1).astype(np.float64) / 255.0)
        return self.clip.image_features(images).double().cpu()


def resample(noisy: np.ndarray, labels: np.ndarray, n_per_class: int, generator: np.random.Generator
             ) -> tuple[np.ndarray, int]:
    """Indices of the next population: per class, ``n_per_class`` draws with replacement in proportion
    to the class's noisy counts (uniform when they are all zero). Also the number of such classes."""
    idx, empty = [], 0
    for y in np.unique(labels):
        cols = np.flatnonzero(labels == y)
        w = noisy[cols]
        if w.sum() <= 0:
            empty += 1
            p = None
        else:
            p = w / w.sum()
        idx.append(generator.choice(cols, size=n_per_class, replace=True, p=p))
    return np.concatenate(idx), empty


def histogram_threshold(cfg: Mapping[str, Any], sigma: float) -> float:
    """H of Alg. 2: ``threshold`` noise stds, floored at ``threshold_votes`` votes (a public constant: as
    post-processing of the noisy histogram it costs no privacy)."""
    return max(float(cfg["threshold"]) * sigma, float(cfg.get("threshold_votes") or 0.0))


def output_order(labels: np.ndarray) -> np.ndarray:
    """Indices of ``labels`` with the classes interleaved (first candidate of each class, then the second,
    ...): any prefix of it is as balanced over classes as its length allows."""
    rank = np.empty(len(labels), dtype=np.int64)
    for y in np.unique(labels):
        cols = np.flatnonzero(labels == y)
        rank[cols] = np.arange(len(cols))
    return np.lexsort((labels, rank))


@stage("private_evolution", inputs=("data", "denoiser"), optional_inputs=("clip",),
       outputs=("samples", "ledger", "metrics"),
       params={"run": "the run's name, pe_eps<eps>_seed<seed>", "baselines": "the baselines section",
               "config_id": "id of the settings", "device": "auto/cpu/cuda", "threads": "CPU threads",
               "private": PRIVATE_DOC, ledger.BINDING_PARAM: ledger.BINDING_DOC})
def private_evolution(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Private Evolution over the public denoiser: T noisy nearest-neighbour vote histograms (Gaussian,
    sensitivity 1) steer random + variation API samples; write S_T, the ledger line and the run's metrics."""
    section, cfg, run, device = baseline_setup(params, "pe")
    start = time.perf_counter()
    N, n_classes = declared_private(params, "private_evolution")
    split, sha = load_training_split(inputs["data"], "data")
    binding = ledger.binding_of(params, data_sha256=sha, stage="private_evolution")
    check_declared(split, N=N, n_classes=n_classes, stage="private_evolution")
    T, n_per_class = int(cfg["iterations"]), int(cfg["n_per_class"])
    try:
        plan = pe.calibrate(target_epsilon=run.epsilon, delta=float(section["delta"]), T=T)
    except pe.PEError as exc:
        raise PipelineError(f"stage private_evolution: {exc}") from None
    threshold = histogram_threshold(cfg, plan.sigma)
    denoiser = load_denoiser(inputs["denoiser"], device=device, convention=VE_SIGMA)
    api = PublicAPI(denoiser, steps=int(cfg["sampler_steps"]), guidance=float(cfg["guidance"]),
                    batch_size=int(cfg["batch_size"]), generator=seeds.torch_generator("pe.api", run.seed),
                    device=device)
    if api.num_classes != n_classes:
        raise PipelineError(f"input denoiser: {api.num_classes} classes, the private source declares {n_classes} "
                            f"(PE's class-conditional APIs need the same labels)")
    if tuple(split.images.shape[1:]) != api.shape:
        raise PipelineError(f"input denoiser: images {list(api.shape)}, the private split's are "
                            f"{list(split.images.shape[1:])}")
    embed = Embedding(str(cfg["embedding"]), inputs.get("clip"), device)
    private_emb = embed(split.images)
    private_labels = torch.from_numpy(split.labels.astype(np.int64))
    labels = np.repeat(np.arange(n_classes), n_per_class)
    noise_rng = seeds.numpy_rng("pe.mechanism_noise", run.seed)
    resample_rng = seeds.numpy_rng("pe.resample", run.seed)
    sigmas = variation_sigmas(*[float(s) for s in cfg["variation_sigma"]], T)
    log.info("pe %s: sigma %.4g (threshold %.4g) for eps %.4g over T = %d; variation levels %s", run.name,
             plan.sigma, threshold, run.epsilon, T, [f"{s:.3g}" for s in sigmas])

    x = api.random(labels)
    trace = []
    for t in tqdm(range(T), desc=f"pe {run.name}", unit="iter"):
        candidates = to_uint8(x)
        votes = pe.nn_votes(private_emb, private_labels, embed(candidates), torch.from_numpy(labels))
        counts = pe.vote_histogram(votes, len(labels))
        noisy = pe.noisy_histogram(counts, plan, threshold=threshold, generator=noise_rng)
        idx, empty = resample(noisy, labels, n_per_class, resample_rng)
        x = api.variation(x[idx], labels, sigmas[t])
        trace.append({"iteration": t + 1, "variation_sigma": sigmas[t], "kept_mass": float(noisy.sum()),
                      "classes_uniform": empty, "distinct_parents": int(len(np.unique(idx)))})
        log.info("pe %s iteration %d: noisy mass %.1f, %d classes fell back to uniform, %d distinct parents",
                 run.name, t + 1, noisy.sum(), empty, len(np.unique(idx)))
    del private_emb, votes, counts  # nothing below reads private data

    entry = pe.ledger_entry(plan, stage="private_evolution", config_id=str(params.get("config_id", "unknown")),
                            seed=run.seed, extra={"run": run.name, "target_epsilon": run.epsilon,
                                                  "data_sha256": sha, "threshold": threshold})
    if entry.claimed_epsilon > run.epsilon:
        raise PipelineError(f"stage private_evolution: certified eps {entry.claimed_epsilon:.6g} > target "
                            f"{run.epsilon}")
    n = int(section["n_samples"])
    if n != len(labels):
        # S_T is the output (Alg. 1); another count is drawn from it (post-processing) as varied copies
        # class by class in turn, so every class keeps its share whether n is above or below |S_T|
        reps = output_order(labels)[np.arange(n) % len(labels)]
        x = api.variation(x[reps], labels[reps], sigmas[-1])
        labels = labels[reps]
    wall_s = time.perf_counter() - start
    save_split(outputs["samples"], Split(to_uint8(x), labels.astype(np.int64)), name=f"baselines/{run.name}",
               source="private_evolution", seed=run.seed, extra={"run": run.name, "wall_s": wall_s})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    write_json(outputs["metrics"], {"run": run.name, "method": "pe", "epsilon_target": run.epsilon,
                                    "noise_multiplier": plan.sigma, "threshold": threshold, "iterations": T,
                                    "gdp_mu": math.sqrt(T) / plan.sigma, "trace": trace, "wall_s": wall_s})
    log.info("pe %s: %d samples in %.1f s", run.name, len(labels), wall_s)

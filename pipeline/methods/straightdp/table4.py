"""Stage ``straightdp_table4_text``: STRAIGHTDP Table 4's question on composed-MNIST, Stage 1 only.

"How much of the Stage-1 gain survives when the finite class partition is replaced by the
cross-moment release?" (App. C.1). The private digits are composed (:mod:`pipeline.data.composed`:
a quadrant marker and a stroke thickness drawn per image, the caption's slots); for each caption
featurisation (:data:`pipeline.flow.text_conditional.FEATURISATIONS`), target eps and seed:

1. the text release (Prop. B.10; :func:`text_moments.release`) of the whitened cross moments of the
   private features (the public PCA geometry of the composed PUBLIC images) and the captions, at
   sigma calibrated to the eps by the PLD: one ``text_moment_release`` ledger line;
2. post-processing: the ridge map W (lambda from the plan alone, :func:`noise_ridge`), the Gaussian
   per caption mu(c) = m + P^T W e(c) with the covariance fitted on the public composed images;
3. ``n_samples`` images, captions cycling over all 80, and the per-attribute conditioning accuracy:
   quadrant and thickness read by the fixed rules of :mod:`pipeline.data.composed` (the thickness
   threshold fitted on the held-out evaluation split), class read by the shared eval net.

What differs from the paper's Table 4 (said in README): the samples come from the released model
itself (the ``released_only`` generator of Table 1), not from a flow trained further by DP-SGD; the
MNIST-accuracy column and the pooled-text-encoder row are not built (the embedded CLIP's text tower
knows only "a printed digit k").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline import seeds
from pipeline.data import composed
from pipeline.flow import text_conditional as tc
from pipeline.methods.straightdp.stages import section
from pipeline.images import to_uint8
from pipeline.io import Split, atomic_path, load_split
from pipeline.privacy import ledger, moments, text_moments
from pipeline.reporting.tables import write_table
from pipeline.stage import PipelineError, stage
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, manifest_sha256, to_model_scale
from pipeline.methods.straightdp.runs import table4_releases

log = logging.getLogger(__name__)


STAGE = "straightdp_table4_text"


def composed_split(split: Split, key: int) -> composed.ComposedSplit:
    """``split`` composed with its own registered stream (0 private, 1 public, 2 held-out)."""
    return composed.compose(split, seed=seeds.seed_of("straightdp.compose", 0, key))


def flat(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, 1, H, W]`` -> model-scale rows ``[N, H W]`` (float64), the release's z."""
    return to_model_scale(images).to(torch.float64).reshape(len(images), -1).numpy()


def attribute_accuracy(images: np.ndarray, slots: np.ndarray, *, threshold: float, evalnet: Any) -> dict[str, float]:
    """Fraction of ``images`` whose read class, quadrant and thickness equal their caption's ``slots``."""
    from pipeline.evaluation.fidelity import label_consistency

    return {"acc_class": float(label_consistency(evalnet, Split(images, slots[:, 0]))),
            "acc_quadrant": float(np.mean(composed.read_quadrant(images) == slots[:, 1])),
            "acc_thickness": float(np.mean(composed.read_thickness(images, threshold) == slots[:, 2]))}


def _grey(split: Split, name: str) -> None:
    if split.images.ndim != 4 or split.images.shape[1] != 1:
        raise PipelineError(f"input {name}: composed-MNIST needs grey images [N, 1, H, W], got "
                            f"{list(split.images.shape)}")


@stage(STAGE, inputs=("private", "public", "heldout", "evalnet"), outputs=("table", "ledger"),
       params={"straightdp": "the straightdp section (release, delta, table4)", "config_id": "id of the settings",
               "threads": "CPU threads", "private": PRIVATE_DOC,
               ledger.BINDING_PARAM: ledger.BINDING_DOC})
def straightdp_table4_text(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Table 4 (Stage 1 only): per featurisation, eps and seed, one text release and the per-attribute
    conditioning accuracy of its model's samples; every release on the ledger."""
    from pipeline.evaluation.evalnet import load_evalnet

    torch.set_num_threads(int(params.get("threads", 1)))
    cfg = section(params)
    t4, rel, delta = cfg["table4"], cfg["release"], float(cfg["delta"])
    config_id = str(params.get("config_id", "unknown"))
    splits = {k: load_split(inputs[k]) for k in ("private", "public", "heldout")}
    for name, split in splits.items():
        _grey(split, name)
    if len({s.images.shape[1:] for s in splits.values()}) != 1:
        raise PipelineError(f"inputs private, public, heldout: image shapes differ "
                            f"({[list(s.images.shape[1:]) for s in splits.values()]})")
    N, n_classes = declared_private(params, STAGE)
    check_declared(splits["private"], N=N, n_classes=n_classes, stage=STAGE, role="private")
    binding = ledger.binding_of(params, data_sha256=manifest_sha256(inputs["private"], "private"), stage=STAGE)
    private, public = composed_split(splits["private"], 0), composed_split(splits["public"], 1)
    shape = private.images.shape[1:]
    # the thickness reader's one threshold: fitted on held-out evaluation digits, as the eval net is
    threshold = composed.thickness_threshold(splits["heldout"], seed=seeds.seed_of("straightdp.compose", 0, 2))
    z_public = flat(public.images)
    geometry = moments.fit_public_geometry(z_public, p=int(rel["p"]), clip_quantile=float(rel["clip_quantile"]))
    V, s = tc.public_residual_covariance(geometry.features(z_public), public.slots, geometry,
                                         rank=min(int(rel["rank"]), geometry.p), floor=float(rel["floor"]))
    f_private = geometry.features(flat(private.images))
    evalnet = load_evalnet(inputs["evalnet"])
    n = int(t4["n_samples"])
    captions = tc.caption_slots()
    which = np.arange(n) % len(captions)
    asked = captions[which]  # the caption of each sample
    rows, entries = [], []
    codings: dict[str, tuple[tc.CaptionCoding, np.ndarray]] = {}
    # the releases in the order straightdp_runs.table4_releases lists them (the wiring registers their lines)
    for kind, eps, seed in table4_releases(t4):
        if kind not in codings:
            coding = tc.CaptionCoding.of(kind)
            codings[kind] = coding, coding.encode(private.slots)
        coding, e_private = codings[kind]
        start = time.perf_counter()
        try:
            plan = text_moments.calibrate_release(target_epsilon=float(eps), delta=delta, R=geometry.R,
                                                  R_txt=coding.R_txt, N=N, p=geometry.p,
                                                  q=coding.q)
        except text_moments.TextMomentsError as exc:
            raise PipelineError(f"stage {STAGE} {kind} eps {eps}: {exc}") from None
        noisy = text_moments.release(f_private, e_private, plan,
                                     generator=seeds.numpy_rng("straightdp.text_release", int(seed)))
        entry = text_moments.ledger_entry(plan, stage=STAGE, config_id=config_id, seed=int(seed),
                                          extra={"featurisation": kind, "target_epsilon": float(eps)})
        if entry.claimed_epsilon > float(eps):
            raise PipelineError(f"stage {STAGE} {kind}: certified eps {entry.claimed_epsilon:.6g} > "
                                f"target {eps}")
        entries.append(entry)
        ridge = tc.noise_ridge(plan, float(t4["ridge_scale"]))
        model = tc.text_conditional_model(text_moments.conditional_mean_map(noisy, ridge=ridge), coding,
                                          geometry, eigvecs=V, eigvals=s, floor=float(rel["floor"]))
        x = model.sample(torch.from_numpy(which),
                         seeds.torch_generator("straightdp.text_sampling", int(seed)))
        images = to_uint8(x.reshape(n, *shape).float().clamp(-1, 1))
        acc = attribute_accuracy(images, asked, threshold=threshold, evalnet=evalnet)
        rows.append({"featurisation": kind, "eps_target": float(eps), "seed": int(seed),
                     "eps_certified": entry.claimed_epsilon, "delta": delta, "sigma": plan.sigma,
                     "q": coding.q, "R_txt": coding.R_txt, "ridge": ridge, **acc, "n_samples": n,
                     "wall_s": time.perf_counter() - start})
        log.info("table 4 %s eps %g seed %d: certified eps %.4g, class %.3f quadrant %.3f thickness %.3f",
                 kind, eps, seed, entry.claimed_epsilon, acc["acc_class"], acc["acc_quadrant"],
                 acc["acc_thickness"])
    df = pd.DataFrame(rows)
    df["thickness_threshold"] = threshold
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        for entry in entries:
            ledger.append_entry(tmp, entry, binding)
    write_table(df, outputs["table"], config_id=config_id)

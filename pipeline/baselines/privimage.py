"""Stages ``privimage_query_net`` and ``privimage_select``: PrivImage's semantic-aware choice of the public data
to pretrain on (Li et al., USENIX Security 2024, Sec. 3).

PrivImage runs in four steps; the first two are here, the last two are stages every DP-SGD baseline shares:

1. ``privimage_query_net`` -- the semantic query function Q: a classifier trained on the PUBLIC pool's own
   labels, its "semantics" (ImageNet's 1,000 classes in the paper; here the public split's classes, then
   those of a second public domain when one is given: on the embedded default the ten printed digits and
   the ten printed letters, 20 semantics). No private record is read.
2. ``privimage_select`` -- the one private access before training: each private record votes for the k
   semantics Q ranks highest, in its class's row, and the class-by-semantics counts are released by the
   Gaussian mechanism (:mod:`pipeline.privacy.semantic_histogram`: sensitivity sqrt(k), add-or-remove-one,
   sigma calibrated so the query alone certifies ``query_share`` x the run's target eps). Each class keeps
   its k semantics with the largest noisy counts; the public images of the chosen semantics, labelled by
   the class that chose them, are the selected split (post-processing, :func:`selected_split`).
3. stage ``pretrain_public`` on the selected split (rule ``privimage_pretrain``): the conditional public
   denoiser, the ``pretrain`` section's network and loss (PrivImage pretrains on the chosen ImageNet
   classes with the private label space).
4. stage ``train_dpdm`` from that denoiser (every weight, DP-SGD; its input ``prior`` is this stage's
   transcript, so sigma is calibrated for the composition of the query and DP-SGD to meet the target),
   then ``sample_dpdm``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import seeds
from pipeline.baselines.common import baseline_section, baseline_setup, load_public_like, stage_device
from pipeline.evaluation.evalnet import (TrainConfig, accuracy, fit_classifier, load_evalnet, load_labelled_split,
                                         predict, save_evalnet)
from pipeline.io import Split, atomic_path, save_split, write_json
from pipeline.privacy import ledger
from pipeline.privacy import semantic_histogram as sh
from pipeline.stage import PipelineError, stage
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, load_training_split

log = logging.getLogger(__name__)

METHOD = "privimage"
QUERY_NET_STAGE = "privimage_query_net"
SELECT_STAGE = "privimage_select"


def semantic_pool(public: Split, other: Split | None) -> tuple[Split, list[str]]:
    """The public pool and its semantics: the public split's classes, then the second domain's (labels offset past
    the first's). Both label sets are public; a semantic is named ``<domain>:<label>``."""
    n_public = int(public.labels.max()) + 1
    names = [f"public:{c}" for c in range(n_public)]
    if other is None:
        return Split(public.images, public.labels.astype(np.int64)), names
    if other.images.shape[1:] != public.images.shape[1:]:
        raise PipelineError(f"input other: images {list(other.images.shape[1:])} differ from the public "
                            f"{list(public.images.shape[1:])}")
    names += [f"other:{c}" for c in range(int(other.labels.max()) + 1)]
    labels = np.concatenate([public.labels.astype(np.int64), other.labels.astype(np.int64) + n_public])
    return Split(np.concatenate([public.images, other.images]), labels), names


def _other(inputs: Mapping[str, Path]) -> Split | None:
    """The second public domain, when the pool has one (input ``other``)."""
    return load_labelled_split(inputs["other"], "other") if "other" in inputs else None


def selected_split(pool: Split, selected: np.ndarray) -> Split:
    """The pretraining set: for each private class c, the pool's images of every semantic c selected, labelled c (a
    semantic two classes chose is in both, as one list of semantics per class gives it)."""
    parts = [(np.flatnonzero(np.isin(pool.labels, row)), c) for c, row in enumerate(selected)]
    index = np.concatenate([i for i, _ in parts])
    labels = np.concatenate([np.full(len(i), c, dtype=np.int64) for i, c in parts])
    return Split(pool.images[index], labels)


_NET_PARAMS = {"baselines": "the baselines section (privimage.query_net: width, feature_dim, epochs, batch_size, lr)",
               "seed": "integer seed of the classifier's initialisation and batches", "config_id": "id of the settings",
               "device": "auto/cpu/cuda", "threads": "CPU threads"}


@stage(QUERY_NET_STAGE, inputs=("public",), optional_inputs=("other",), outputs=("model", "metrics"),
       params=_NET_PARAMS)
def privimage_query_net(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Step 1: the semantic query function, a classifier of the public pool's semantics (public data only)."""
    _, cfg = baseline_section(params, METHOD)
    seed, device = int(params.get("seed", 0)), stage_device(params)
    pool, names = semantic_pool(load_labelled_split(inputs["public"], "public"), _other(inputs))
    start = time.perf_counter()
    net = fit_classifier(pool, TrainConfig.from_mapping(cfg["query_net"]), seed=seed, device=device,
                         n_classes=len(names), desc="privimage query net")
    pool_accuracy = accuracy(net, pool)
    save_evalnet(net, outputs["model"], semantics=names, private=False, seed=seed)
    write_json(outputs["metrics"], {"stage": QUERY_NET_STAGE, "semantics": names, "n_pool": len(pool),
                                    "pool_accuracy": pool_accuracy, "wall_s": time.perf_counter() - start,
                                    "note": "trained and scored on the public pool only"})
    log.info("%s: %d semantics over %d public images, pool accuracy %.3f", QUERY_NET_STAGE, len(names), len(pool),
             pool_accuracy)


_SELECT_PARAMS = {"baselines": "the baselines section (privimage: k, query_share; delta)",
                  "run": "the run's name, privimage_eps<eps>_seed<seed>", "config_id": "id of the settings",
                  "device": "auto/cpu/cuda", "threads": "CPU threads", "private": PRIVATE_DOC,
                  ledger.BINDING_PARAM: ledger.BINDING_DOC}


@stage(SELECT_STAGE, inputs=("data", "public", "query_net"), optional_inputs=("other",),
       outputs=("selected", "ledger", "metrics"), params=_SELECT_PARAMS)
def privimage_select(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Step 2: the noisy semantic histogram of the private split (its ledger line) and the public images of the
    semantics each class chose (post-processing)."""
    section, cfg, run, device = baseline_setup(params, METHOD)
    k, share = int(cfg["k"]), float(cfg["query_share"])
    query_epsilon = share * run.epsilon  # the query's own target: DP-SGD is calibrated to the rest
    N, n_classes = declared_private(params, SELECT_STAGE)
    split, sha = load_training_split(inputs["data"], "data")
    binding = ledger.binding_of(params, data_sha256=sha, stage=SELECT_STAGE)
    check_declared(split, N=N, n_classes=n_classes, stage=SELECT_STAGE)
    pool, names = semantic_pool(load_public_like(inputs["public"], split), _other(inputs))
    net = load_evalnet(inputs["query_net"], device=device)
    if net.n_classes != len(names):
        raise PipelineError(f"input query_net: it scores {net.n_classes} semantics, the public pool has {len(names)} "
                            f"(rerun {QUERY_NET_STAGE} on the same public inputs)")
    try:
        plan = sh.calibrate(target_epsilon=query_epsilon, delta=float(section["delta"]), k=k)
        _, logits = predict(net, split.images)
        votes = sh.top_k_semantics(torch.from_numpy(logits), k).numpy()
        noisy = sh.noisy_histogram(sh.semantic_counts(votes, split.labels, n_classes=n_classes,
                                                      n_semantics=len(names)),
                                   plan, generator=seeds.numpy_rng("privimage.mechanism_noise", run.seed))
        selected = sh.select_semantics(noisy, k)
    except sh.SemanticQueryError as exc:
        raise PipelineError(f"stage {SELECT_STAGE}: {exc}") from None
    chosen = selected_split(pool, selected)
    entry = sh.ledger_entry(plan, stage=SELECT_STAGE, config_id=str(params.get("config_id", "unknown")),
                            seed=run.seed, extra={"run": run.name, "target_epsilon": query_epsilon,
                                                  "data_sha256": sha, "n_semantics": len(names)})
    if entry.claimed_epsilon > query_epsilon:
        raise PipelineError(f"stage {SELECT_STAGE}: certified eps {entry.claimed_epsilon:.6g} > the query's share "
                            f"{query_epsilon:.6g}")
    by_class = {str(c): [names[int(s)] for s in row] for c, row in enumerate(selected)}
    save_split(outputs["selected"], chosen, name=f"baselines/{run.name}/selected", source=METHOD, seed=run.seed,
               extra={"run": run.name, "semantics_by_class": by_class})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    # the noisy histogram is the release; the clean counts are never written or logged
    write_json(outputs["metrics"], {"run": run.name, "stage": SELECT_STAGE, "k": k, "query_share": share,
                                    "query_epsilon_target": query_epsilon,
                                    "query_epsilon_certified": entry.claimed_epsilon,
                                    "noise_multiplier": plan.sigma, "noise_std": plan.noise_std,
                                    "semantics": names, "semantics_by_class": by_class,
                                    "noisy_histogram": noisy.round(3).tolist(), "n_selected": len(chosen)})
    log.info("%s %s: sigma %.4g (noise std %.3g), certified eps %.4g of %.4g; %d public images selected: %s",
             SELECT_STAGE, run.name, plan.sigma, plan.noise_std, entry.claimed_epsilon, run.epsilon, len(chosen),
             by_class)

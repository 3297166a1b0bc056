"""Stage ``train_dpdm_twin``: the non-private twin of a DPDM run, the membership attacks' positive control.

The twin is the DPDM run with the mechanism taken out: the same denoiser (UNet, parameterisation,
public initialisation), the same Poisson batches (rate q = batch_size / N), the same noise
multiplicity K, label dropout, Adam learning rate and EMA, and the same normalisation of the
summed gradient by the expected batch size q N (:class:`pipeline.privacy.dpsgd.DPSGD`). What is
gone is the clip and the Gaussian noise: DP-SGD with C = infinity and sigma = 0, which is plain
mini-batch training and runs with one backward pass per batch instead of per-example gradients.

It exists only to be attacked (:mod:`pipeline.audit.mia_stage`): if the membership attacks
cannot tell its members from non-members, they are too weak to say anything about the DP runs.
It is NOT private, writes no ledger line and must never be released; nothing downstream of the
audit reads it.

At the DP runs' own budget (8 epochs over 2,500 digits on the embedded default) the twin does not
memorise: the loss attack's AUC stays within 0.50-0.54, inside its sampling interval (measured at
8 and 16 epochs). A control must be able to fail, so by default (``audit.mia.twin_train_on:
members``, given the input ``nonmembers``) the twin trains on the attacked member subset only
(:func:`pipeline.data.members.member_indices`), for ``audit.mia.twin_epochs`` passes with
``audit.mia.twin_K`` draws. Diffusion models memorise when the training set is small for the
model and each record is seen many times (Gu et al. 2023, "On Memorization in Diffusion Models";
Somepalli et al. 2023 find replication rising as the training set shrinks), so the twin takes
*fewer* members for *more* passes: ``audit.mia.twin_members`` of them (param ``members``), the
first that many of the DP runs' attacked subset (``member_indices`` is a prefix of one
permutation), so its members are DP-attacked members too. At 250 members x 100-200 passes the
strongest attack read AUC 0.566-0.575 (README), no better than on a DP model at eps = 0.3; for
about twice that cost, 2.5x fewer records each seen 5x more often is the a-priori stronger control.

When the training set is smaller than the batch (q = 1: every step is full-batch), ``epochs``
still counts passes: T = ceil(epochs * N / min(batch_size, N)) steps (DPDenoiserConfig.n_steps divides
by batch_size, which would turn 500 passes over 100 members into 196 steps).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import seeds
from pipeline.data.members import member_indices
from pipeline.device import resolve_device
from pipeline.io import Split, arrays_sha256, write_json
from pipeline.models.checkpoint import read_denoiser_meta, save_denoiser
from pipeline.models.precond import parameterisation as get_parameterisation
from pipeline.models.unet import build_unet
from pipeline.privacy import dpsgd
from pipeline.stage import PipelineError, reject_unknown_params, stage
from pipeline.training import loop
from pipeline.training.data import drop_labels, load_training_split, to_model_scale, unet_spec_for
from pipeline.training.dp_denoiser import PARAMS_DOC as DPDM_PARAMS, RESUME_INSENSITIVE, DPDenoiserConfig, \
    freeze_all_but, init_from_public

log = logging.getLogger(__name__)

STAGE = "train_dpdm_twin"
PARAMS_DOC = {k: v for k, v in DPDM_PARAMS.items() if k not in ("epsilon", "delta", "clip", "micro_batch")}
PARAMS_DOC["epochs"] = ("passes over the data: T = ceil(epochs * N / min(batch_size, N)) steps (the twin may train "
                         "longer)")
PARAMS_DOC["member_seed"] = ("with input nonmembers: the audit's seed that picks the member subset the twin "
                             "trains on (pipeline.data.members.member_indices)")
PARAMS_DOC["members"] = ("with input nonmembers: how many of the attacked members the twin trains on (the first of "
                         "the subset; at most as many as there are non-members; default: as many)")


def example_losses(draw_loss: dpsgd.ExampleLoss, model: torch.nn.Module, x: torch.Tensor, sigma: torch.Tensor,
                   noise: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
    """l_i = (1/K) sum_k draw_loss(x_i; sigma_ik, n_ik), all B K draws in one forward pass (DPDM Sec. 3, eq. 6)."""
    b, k = sigma.shape
    xk = x.unsqueeze(1).expand(b, k, *x.shape[1:]).reshape(b * k, *x.shape[1:])
    condk = tuple(c.unsqueeze(1).expand(b, k).reshape(b * k) for c in cond)
    return draw_loss(model, xk, sigma.reshape(b * k), noise.reshape(b * k, *x.shape[1:]), *condk).view(b, k).mean(1)


def twin_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, draw_loss: dpsgd.ExampleLoss,
              multiplicity: dpsgd.NoiseMultiplicity, images: torch.Tensor, labels: torch.Tensor | None,
              q: float, generator: torch.Generator) -> float:
    """DP-SGD's step without its mechanism: a Poisson batch, sum_i l_i / (q N), no clip, no noise."""
    idx = dpsgd.poisson_sample(len(images), q, generator).to(images.device)
    optimizer.zero_grad(set_to_none=True)
    if len(idx) == 0:  # DP-SGD would release pure noise here; without noise there is nothing to do
        return float("nan")
    x = images[idx]
    sigma, noise = multiplicity.draw(x, generator)
    cond = () if labels is None else (labels[idx],)
    losses = example_losses(draw_loss, model, x, sigma.to(x.device), noise.to(x.device), *cond)
    (losses.sum() / (q * len(images))).backward()
    optimizer.step()
    return float(losses.detach().mean())


@stage(STAGE, inputs=("data",), optional_inputs=("init", "nonmembers"), outputs=("model", "metrics"),
       params=PARAMS_DOC)
def train_dpdm_twin(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """The non-private twin of a DPDM run (no clip, no noise): the membership attacks' positive control."""
    reject_unknown_params(STAGE, params, sorted(PARAMS_DOC))
    # the DP run's own config class (epsilon is a required field there; the twin has none)
    cfg = DPDenoiserConfig.from_params({k: v for k, v in params.items() if k not in ("member_seed", "members")}
                                 | {"epsilon": 1.0})
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    split, data_sha = load_training_split(inputs["data"], "data")
    trained_on, members_sha = "private_train", None
    if inputs.get("nonmembers"):
        n_nonmembers = len(load_training_split(inputs["nonmembers"], "nonmembers")[0])
        n_members = n_nonmembers if params.get("members") is None else int(params["members"])
        if not 0 < n_members <= n_nonmembers:  # beyond that they would not all be among the DP runs' attacked members
            raise PipelineError(f"stage {STAGE}: members = {n_members}, but a twin trains on 1 to {n_nonmembers} "
                                "(the non-members' count) of the attacked members")
        try:
            pick = member_indices(len(split), n_members, int(params.get("member_seed", 0))).numpy()
        except ValueError as exc:
            raise PipelineError(f"stage {STAGE}: {exc}") from None
        split, trained_on = Split(split.images[pick], split.labels[pick]), f"the {n_members} attacked members"
        members_sha = arrays_sha256({"images": split.images})
    n = len(split)
    spec = unet_spec_for(cfg.unet, split, class_conditional=cfg.class_conditional)
    config = get_parameterisation(cfg.parameterisation)
    run_params = {**{k: v for k, v in params.items() if k in PARAMS_DOC}, "data_sha256": data_sha, "n_train": n,
                  "unet_spec": spec.to_json(),
                  "init": read_denoiser_meta(inputs["init"]) if inputs.get("init") else None}
    run_hash = loop.params_hash(run_params, ignore=RESUME_INSENSITIVE)
    ck_dir = Path(params["checkpoint_dir"]) if params.get("checkpoint_dir") else loop.checkpoint_dir_for(
        outputs["model"], STAGE)

    # the DP run's seeds, streams and initialisation, so the twin differs from it only by the mechanism
    seeds.seed_globals("dpdm.init", cfg.seed)
    model = config.build(build_unet(spec)).to(device)
    if inputs.get("init"):
        init_from_public(model, inputs["init"])
    freeze_all_but(model, cfg.trainable)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    gen = seeds.torch_generator("dpdm.draws", cfg.seed)
    multiplicity = dpsgd.NoiseMultiplicity(cfg.K, config.sigma_sampler)
    images = to_model_scale(split.images).to(device)
    labels = torch.from_numpy(split.labels.astype(np.int64)).to(device) if spec.num_classes else None
    q = min(1.0, cfg.batch_size / n)

    def step(i: int) -> float:
        lab = None if labels is None else drop_labels(labels, cfg.label_dropout, spec.num_classes, gen)
        return twin_step(model, optimizer, config.draw_loss, multiplicity, images, lab, q, gen)

    # full-batch when the set is smaller than the batch (q = 1), so epochs count passes of min(B, N) records
    total_steps = cfg.steps if cfg.steps is not None else max(1, math.ceil(cfg.epochs * n / min(cfg.batch_size, n)))
    res = loop.run_training(model=model, optimizer=optimizer, step_fn=step, total_steps=total_steps,
                            state_path=ck_dir / loop.STATE_FILE, run_hash=run_hash, ema_decay=cfg.ema_decay,
                            checkpoint_every_s=cfg.checkpoint_every_s, generators={"draws": gen}, desc=STAGE)
    meta = {"stage": STAGE, "private": False, "positive_control_only": True, "parameterisation": cfg.parameterisation,
            "K": cfg.K, "steps": total_steps, "epochs": cfg.epochs, "lr": cfg.lr, "ema_decay": cfg.ema_decay,
            "sampling_rate": q, "weights": "ema", "n_train": n, "trained_on": trained_on,
            "members_sha256": members_sha, "data_sha256": data_sha,
            "init": str(inputs["init"]) if inputs.get("init") else None, "seed": cfg.seed,
            "config_id": str(params.get("config_id", "unknown"))}
    save_denoiser(outputs["model"], res.ema.cpu(), unet=spec, precond=config.precond, meta=meta)
    write_json(outputs["metrics"], {"format": "dpgen-train-metrics/1", **meta, "wall_s_this_run": res.wall_s,
                                    "resumed_from": res.resumed_from, "device": str(device)})
    log.info("%s: %d non-private steps (%.3g epochs) in %.1f s", STAGE, total_steps, cfg.epochs, res.wall_s)

"""Stage ``pretrain_public``: the public EDM denoiser, trained on the public split only.

EMPDEN's hybrid sampler (Algorithm 1) finishes every trajectory with a neural denoiser trained
on public data (ImageNet32/FFHQ at paper scale; printed digits on the embedded default), and
DPDM-style DP fine-tuning may start from it. The network is a diffusers ``UNet2DModel``
inside EDM's preconditioning (:class:`pipeline.models.edm.EDMPrecond`), trained with the EDM
loss of Karras et al. 2022 (Table 1, eq. 2 and 8): ln sigma ~ N(P_mean, P_std^2) with
P_mean = -1.2, P_std = 1.2, sigma_data = 0.5 (the values DPDM App. C uses), weight
lambda(sigma) = (sigma^2 + sigma_data^2)/(sigma sigma_data)^2, optionally class-conditional
with label dropout for classifier-free guidance. No private record is read, so no ledger line.

Outputs: the ``dpgen-denoiser/1`` file (:mod:`pipeline.models.checkpoint`) with the EMA
weights, and a metrics JSON with the (smoothed) loss curve and a fixed-draw evaluation of the
EMA model's loss. Resumable through :mod:`pipeline.training.loop`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pipeline import seeds
from pipeline.config import validate_config
from pipeline.device import resolve_device
from pipeline.io import write_json
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond, edm_draw_loss, edm_sigma_sampler
from pipeline.models.precision import PARAM_DOC as PRECISION_DOC
from pipeline.models.precision import autocast, precision_of, recorded
from pipeline.models.unet import build_unet
from pipeline.stage import PipelineError, reject_unknown_params, stage
from pipeline.training import loop
from pipeline.training.accumulate import accumulate_backward
from pipeline.training.data import drop_labels, load_training_split, to_model_scale, unet_spec_for

log = logging.getLogger(__name__)

STAGE = "pretrain_public"
#: keys that change neither the mathematics nor the result on the CPU: a run resumes across them (params.batch_gpu
#: is not in the run's hash either: it changes float rounding and dropout's masks only, pipeline/training/accumulate.py)
RESUME_INSENSITIVE = ("checkpoint_every_s", "device", "threads")


def epoch_batches(n: int, batch_size: int, step: int, seed: int) -> Tensor:
    """Indices of step ``step``'s batch: epochs of a seeded permutation (a function of the step alone,
    so resuming needs no sampler state). The last partial batch of an epoch is skipped."""
    per_epoch = max(1, n // batch_size)
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=seeds.torch_generator("pretrain.batches", seed, epoch))
    return perm[k * batch_size:(k + 1) * batch_size] if n >= batch_size else perm


def smoothed_curve(losses: list[float], points: int = 100) -> dict[str, list[float]]:
    """Mean loss over ~``points`` consecutive windows (step = the window's last step)."""
    if not losses:
        return {"step": [], "loss": []}
    width = max(1, math.ceil(len(losses) / points))
    steps, means = [], []
    for start in range(0, len(losses), width):
        chunk = losses[start:start + width]
        steps.append(start + len(chunk))
        means.append(float(np.mean(chunk)))
    return {"step": steps, "loss": means}


@torch.no_grad()
def fixed_draw_loss(model: nn.Module, images: Tensor, labels: Tensor | None, *, p_mean: float, p_std: float,
                    sigma_data: float, n: int = 512, draws: int = 4, seed: int = 12345,
                    batch_size: int = 256) -> float:
    """Mean EDM loss of ``model`` on ``n`` images x ``draws`` (sigma, noise) pairs from a fixed seed.

    The same draws for every run of the same data, so values are comparable across runs (the
    training curve itself mixes weights from many steps and changing draws).
    """
    gen = seeds.torch_generator("pretrain.fixed_draws", seed)
    idx = torch.randperm(len(images), generator=gen)[:n]
    sampler = edm_sigma_sampler(p_mean, p_std)
    device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    for _ in range(draws):
        for chunk in idx.split(batch_size):
            x = to_model_scale(images[chunk.to(images.device)])
            sigma = sampler(len(chunk), gen).to(device)
            noise = torch.randn(x.shape, generator=gen).to(device)
            cond = () if labels is None else (labels[chunk],)
            total += float(edm_draw_loss(model, x, sigma, noise, *cond, sigma_data=sigma_data).sum())
            count += len(chunk)
    return total / count


def edm_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, sigma: Tensor, noise: Tensor,
             cond: tuple[Tensor, ...], *, sigma_data: float, micro_batch: int | None = None,
             precision: str = "fp32") -> float:
    """One optimiser step on the batch's mean EDM loss (Karras et al. 2022 eq. 2/8) of the drawn ``sigma`` and
    ``noise``, its forward and backward passes over micro-batches of at most ``micro_batch`` examples
    (:mod:`pipeline.training.accumulate`: the batch's draws are made once, by the caller), the forward passes in
    ``precision`` (:mod:`pipeline.models.precision`; the losses reduced in float32); returns the mean loss."""

    def losses(s: slice) -> Tensor:
        with autocast(x.device, precision):
            out = edm_draw_loss(model, x[s], sigma[s], noise[s], *(c[s] for c in cond), sigma_data=sigma_data)
        return out.float()  # float32 already: the same tensor

    optimizer.zero_grad(set_to_none=True)
    loss = accumulate_backward(losses, len(x), micro_batch)
    optimizer.step()
    return loss


PARAMS_DOC = {
    "pretrain": "the `pretrain` config section (steps, batch_size, lr, ema_decay, class_conditional, label_dropout, "
                "p_mean, p_std, sigma_data, checkpoint_every_s, unet); defaults from the schema",
    "seed": "integer seed (initialisation, batches, sigma/noise draws, label dropout)",
    "config_id": "id of the configuration (recorded in the model's meta)",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads (default 1)",
    "precision": PRECISION_DOC,
    "batch_gpu": "optional: examples per forward/backward pass; the batch is reached by gradient accumulation "
                 "(the plan's, pipeline.resources.memory_plan, when the batch does not fit slurm.gpu_mem_gb)",
    "checkpoint_dir": "optional: folder of the resumable state (default results/<exp>/checkpoints/pretrain_public/<model name>)",
}


@stage(STAGE, inputs=("public",), outputs=("model", "metrics"), params=PARAMS_DOC)
def pretrain_public(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Train the public EDM denoiser on the public split only (EDM loss, EMA; resumable)."""
    reject_unknown_params(STAGE, params, PARAMS_DOC)
    cfg = validate_config({"pretrain": dict(params.get("pretrain") or {})}, source="params")["pretrain"]
    seed, config_id = int(params.get("seed", 0)), str(params.get("config_id", "unknown"))
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    split, data_sha = load_training_split(inputs["public"], "public")
    spec = unet_spec_for(cfg["unet"], split, class_conditional=cfg["class_conditional"])
    # uint8 on the device (ImageNet32 as float32 would be 16 GB); batches are scaled on the fly
    images = torch.from_numpy(split.images).to(device)
    labels = torch.from_numpy(split.labels.astype(np.int64)).to(device) if spec.num_classes else None

    seeds.seed_globals("pretrain.init", seed)
    model = EDMPrecond(build_unet(spec), sigma_data=cfg["sigma_data"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    gen = seeds.torch_generator("pretrain.draws", seed)
    sampler = edm_sigma_sampler(cfg["p_mean"], cfg["p_std"])
    batch = min(cfg["batch_size"], len(split))

    precision = precision_of(params, STAGE)
    micro_batch = params.get("batch_gpu")
    if micro_batch is not None and not (isinstance(micro_batch, int) and micro_batch >= 1):
        raise PipelineError(f"{STAGE}: params.batch_gpu must be an integer >= 1, got {micro_batch!r}")

    def step(i: int) -> float:
        idx = epoch_batches(len(split), batch, i, seed).to(device)
        x = to_model_scale(images[idx])
        sigma = sampler(len(idx), gen).to(device)
        noise = torch.randn(x.shape, generator=gen).to(device)
        cond = () if labels is None else (drop_labels(labels[idx], cfg["label_dropout"], spec.num_classes, gen),)
        return edm_step(model, optimizer, x, sigma, noise, cond, sigma_data=cfg["sigma_data"], micro_batch=micro_batch,
                        precision=precision)

    mixed = recorded(precision)
    run_params = {"pretrain": cfg, "seed": seed, "data_sha256": data_sha, "unet": spec.to_json(), **mixed}
    run_hash = loop.params_hash(run_params, ignore=RESUME_INSENSITIVE)
    ck_dir = Path(params["checkpoint_dir"]) if params.get("checkpoint_dir") else loop.checkpoint_dir_for(
        outputs["model"], STAGE)
    res = loop.run_training(model=model, optimizer=optimizer, step_fn=step, total_steps=cfg["steps"],
                            state_path=ck_dir / loop.STATE_FILE, run_hash=run_hash, ema_decay=cfg["ema_decay"],
                            checkpoint_every_s=cfg["checkpoint_every_s"], generators={"draws": gen},
                            desc=STAGE)
    eval_loss = fixed_draw_loss(res.ema, images, labels, p_mean=cfg["p_mean"], p_std=cfg["p_std"],
                                sigma_data=cfg["sigma_data"])
    tail = res.losses[-max(1, len(res.losses) // 10):]
    # recorded only when the batch was split, so a batch that fits writes the files it wrote before accumulation
    accumulated = {} if micro_batch is None or micro_batch >= batch else {"batch_gpu": micro_batch}
    meta = {"stage": STAGE, "steps": res.steps, "data": "public", "data_sha256": data_sha, "n_train": len(split),
            "config_id": config_id, "seed": seed, "loss": "edm", "p_mean": cfg["p_mean"], "p_std": cfg["p_std"],
            "sigma_data": cfg["sigma_data"], "class_conditional": cfg["class_conditional"],
            "label_dropout": cfg["label_dropout"], "lr": cfg["lr"], "batch_size": batch,
            "ema_decay": cfg["ema_decay"], "weights": "ema", "ema_eval_loss": eval_loss, "private": False,
            **accumulated, **mixed}
    save_denoiser(outputs["model"], res.ema.cpu(), unet=spec, precond="edm",
                  precond_kwargs={"sigma_data": cfg["sigma_data"]}, meta=meta)
    log.info("%s: %d steps (resumed from %d) in %.1f s; train loss (last 10%%) %.4f, EMA fixed-draw loss %.4f",
             STAGE, res.steps, res.resumed_from, res.wall_s, float(np.mean(tail)), eval_loss)
    write_json(outputs["metrics"], {
        "format": "dpgen-train-metrics/1", "stage": STAGE, "config_id": config_id, "seed": seed,
        "steps": res.steps, "resumed_from": res.resumed_from, "wall_s_this_run": res.wall_s,
        "device": str(device), **accumulated, "n_train": len(split), "n_parameters": sum(p.numel() for p in model.parameters()),
        "final_train_loss": float(np.mean(tail)), "ema_eval_loss": eval_loss,
        "loss_units": "EDM loss lambda(sigma)||D - y||^2 summed over pixels, mean over images",
        "curve": smoothed_curve(res.losses), "data_sha256": data_sha, "unet": spec.to_json()})

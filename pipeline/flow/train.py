"""Non-private training of a velocity network: public pretraining and Stage 1 distillation onto the analytic field.

Both run their steps through :func:`pipeline.training.loop.run_training`, which already gives
what a stage needs: the EMA of the weights (sampled from), resumable wall-clock checkpoints of
model, optimiser, EMA, step and every generator (``state_path`` + ``run_hash``; bit-identical
resume on the CPU), and SIGINT/SIGTERM handling. Nothing here is private:

* :func:`pretrain_flow` -- public pretraining (STRAIGHTDP Table 9: AdamW lr 1e-4, EMA 0.999,
  p_uncond = 0.1, 20,000 steps of batch 256 on the public set): eq. 1 with t ~ U[0, 1], labels
  dropped to the null label with probability p_uncond so one network learns both branches of
  classifier-free guidance.
* :func:`distill_to_field` -- Stage 1 "Conditional distillation" (Sec. 3.1; Table 9: 3,000 steps,
  batch 256, lr 1e-4, public replay, tau <= 0.35): regress v_theta(x_t, t, y) onto the analytic
  field v̄(x_t, t, y) of the RELEASED moments (Prop. 3.1, :class:`pipeline.flow.field.GaussianMomentModel`)
  for t <= tau, with the public replay loss on t > tau so the rest of the field is not forgotten.
  It reads the release and public data only: post-processing of an already private release, no
  ledger line.

Randomness: every draw (batch indices, times, flow noise, label dropout, moment-model samples)
comes from the one ``generator`` passed in, whose state the loop checkpoints.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from pipeline.flow.field import GaussianMomentModel
from pipeline.flow.rectified import flow_loss, sample_t, x_t_from
from pipeline.models.precision import autocast
from pipeline.training import loop
from pipeline.training.accumulate import accumulate_backward, backward_in_parts
from pipeline.training.data import drop_labels


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[None]:
    # run_training always draws its tqdm bar (to stderr); a caller that wants silence (tests, a
    # stage's inner loop) gets stderr pointed at a sink for the duration.
    if show:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def _null_label(model: nn.Module, null_label: int | None) -> int:
    if null_label is not None:
        return int(null_label)
    if not hasattr(model, "null_label"):
        raise ValueError("the model has no null_label attribute: pass null_label= (the unconditional branch's label)")
    return int(model.null_label)


def _check_common(steps: int, batch_size: int, lr: float, p_uncond: float) -> None:
    if not (isinstance(steps, int) and steps >= 0):
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if not 0.0 <= p_uncond <= 1.0:
        raise ValueError(f"p_uncond must be in [0, 1], got {p_uncond}")


def _labels_or_null(labels: Tensor | None, idx: Tensor, null: int, p_uncond: float,
                    generator: torch.Generator, device: torch.device) -> Tensor:
    """The batch's labels with classifier-free label dropout; all null for an unlabelled set."""
    if labels is None:
        return torch.full((len(idx),), null, dtype=torch.long, device=device)
    return drop_labels(labels[idx.to(labels.device)].long().to(device), p_uncond, null, generator)


def _run(model: nn.Module, step_fn: Callable[[int], float], *, optimizer: torch.optim.Optimizer, steps: int,
         ema_decay: float, generator: torch.Generator, state_path: str | Path | None, run_hash: str | None,
         checkpoint_every_s: float, desc: str, progress: bool) -> loop.TrainResult:
    if state_path is not None and not run_hash:
        raise ValueError("a resumable run (state_path) needs run_hash (loop.params_hash of everything that "
                         "changes its result)")
    with _progress(progress):
        return loop.run_training(model=model, optimizer=optimizer, step_fn=step_fn, total_steps=steps,
                                 state_path=None if state_path is None else Path(state_path),
                                 run_hash=run_hash or "", ema_decay=ema_decay,
                                 checkpoint_every_s=checkpoint_every_s, generators={"flow": generator}, desc=desc)


def pretrain_flow(model: nn.Module, images: Tensor, labels: Tensor | None, *, steps: int, batch_size: int, lr: float,
                  ema_decay: float, p_uncond: float, generator: torch.Generator, progress: bool = True,
                  weight_decay: float = 0.01, null_label: int | None = None, state_path: str | Path | None = None,
                  run_hash: str | None = None, checkpoint_every_s: float = 300.0,
                  desc: str = "pretrain_flow", micro_batch: int | None = None,
                  precision: str = "fp32") -> loop.TrainResult:
    """Public pretraining of ``model`` (v(x, t, y) -> velocity) on ``images`` by eq. 1 (Table 9).

    ``images`` ``[N, ...]`` in the model's scale ([-1, 1] for pixels; any shape the model takes,
    e.g. ``[N, 2]`` for the toy), on the model's device; ``labels`` ``[N]`` or None (unlabelled:
    only the null branch is trained). Each step: a batch of ``batch_size`` indices drawn uniformly
    WITH replacement (a function of the generator alone, so resuming needs no sampler state),
    t ~ U[0, 1), xi ~ N(0, I), labels dropped to ``null_label`` (default ``model.null_label``) with
    probability ``p_uncond``; AdamW(``lr``, ``weight_decay``; torch's default 0.01) on the mean
    of :func:`~pipeline.flow.rectified.flow_loss`, its forward and backward over micro-batches of at most
    ``micro_batch`` examples (:mod:`pipeline.training.accumulate`; the step's draws made first), the forward passes
    in ``precision`` (:mod:`pipeline.models.precision`). Returns the loop's
    :class:`~pipeline.training.loop.TrainResult`: ``.ema`` is the model to sample with,
    ``.losses`` the per-step losses. ``state_path`` + ``run_hash``: resumable (see the module).
    """
    _check_common(steps, batch_size, lr, p_uncond)
    if labels is not None and labels.shape != images.shape[:1]:
        raise ValueError(f"labels must be [N={images.shape[0]}], got {tuple(labels.shape)}")
    null = _null_label(model, null_label)
    device = images.device
    n = images.shape[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(i: int) -> float:
        idx = torch.randint(n, (batch_size,), generator=generator)
        z = images[idx.to(device)]
        t = sample_t(batch_size, generator, dtype=z.dtype).to(device)
        xi = torch.randn(z.shape, generator=generator, dtype=z.dtype).to(device)
        y = _labels_or_null(labels, idx, null, p_uncond, generator, device)
        optimizer.zero_grad(set_to_none=True)
        loss = accumulate_backward(lambda s: losses(z[s], t[s], xi[s], y[s]), batch_size, micro_batch)
        optimizer.step()
        return loss

    def losses(z: Tensor, t: Tensor, xi: Tensor, y: Tensor) -> Tensor:
        with autocast(device, precision):
            out = flow_loss(model, z, t, xi, y)
        return out.float()  # float32 already: the same tensor

    return _run(model, step, optimizer=optimizer, steps=steps, ema_decay=ema_decay, generator=generator,
                state_path=state_path, run_hash=run_hash, checkpoint_every_s=checkpoint_every_s, desc=desc,
                progress=progress)


@torch.no_grad()
def field_targets(field: GaussianMomentModel, *, n: int, tau: float, p_uncond: float, null_label: int,
                  generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One distillation batch: (x_t [n, d], t [n], y [n], v̄(x_t, t, y) [n, d]) in the field's dtype.

    y ~ pi (the released priors), z ~ N(mu_y, Sigma) (:meth:`~GaussianMomentModel.sample`),
    t ~ U[0, tau), x_t = t z + (1 - t) xi. A row whose label is dropped (probability
    ``p_uncond``) gets ``null_label`` and the UNCONDITIONAL field (eq. 4) as its target, so the
    null branch of classifier-free guidance is distilled too; drawing y from pi makes x_t a draw
    of the mixture whose posterior eq. 4 is.
    """
    y = torch.multinomial(field.pi.double().cpu(), n, replacement=True, generator=generator).to(field.mu.device)
    z = field.sample(y, generator)
    t = sample_t(n, generator, 0.0, tau, dtype=z.dtype).to(z.device)
    xi = torch.randn(z.shape, generator=generator, dtype=z.dtype).to(z.device)
    x = x_t_from(z, xi, t)
    drop = (torch.rand(n, generator=generator) < p_uncond).to(z.device)
    target = torch.empty_like(x)
    keep = ~drop
    if bool(keep.any()):
        target[keep] = field.velocity(x[keep], t[keep], y[keep])
    if bool(drop.any()):
        target[drop] = field.velocity(x[drop], t[drop])
    return x, t, torch.where(drop, torch.full_like(y, null_label), y), target


def distill_to_field(model: nn.Module, field_model: GaussianMomentModel, *, tau: float, steps: int, batch_size: int,
                     lr: float, replay: tuple[Tensor, Tensor | None] | None, generator: torch.Generator,
                     distill_fraction: float = 0.5, p_uncond: float = 0.1, ema_decay: float = 0.999,
                     weight_decay: float = 0.01, null_label: int | None = None, progress: bool = True,
                     state_path: str | Path | None = None, run_hash: str | None = None,
                     checkpoint_every_s: float = 300.0, desc: str = "distill_to_field",
                     micro_batch: int | None = None) -> loop.TrainResult:
    """Stage 1 distillation (Sec. 3.1 "Conditional distillation"; Table 9): v_theta -> v̄ on t < tau, replay beyond.

    The mix, per step of ``batch_size`` examples:

    * ``round(distill_fraction * batch_size)`` distillation rows (:func:`field_targets`):
      x_t from the moment model at t ~ U[0, tau), target the analytic field v̄(x_t, t, y) of
      eq. 3 (eq. 4 for the rows dropped to the null label with probability ``p_uncond``); loss
      the mean squared error per row, averaged over coordinates like
      :func:`~pipeline.flow.rectified.flow_loss`;
    * the rest are public replay rows: ``replay = (images, labels)`` (labels None: every row
      trains the null branch, e.g. a wrong-domain public set whose labels are not the private
      classes), t ~ U[tau, 1), eq. 1 with label dropout ``p_uncond``;
    * the step's loss is the mean over all rows (each row weighs the same).

    ``model`` takes images of ``replay``'s shape; the field's d coordinates are reshaped to it
    (``field_model.dim`` must equal the product of the image dimensions). ``replay=None`` needs
    ``distill_fraction=1``. AdamW, EMA, resumable exactly as :func:`pretrain_flow`; returns the
    loop's :class:`~pipeline.training.loop.TrainResult` (``.ema`` to sample with). Only the
    release and public data are read. ``micro_batch``: the forward and backward passes of both parts over
    micro-batches of at most that many examples (gradient accumulation; the step's draws made first, in the
    one-pass order).
    """
    _check_common(steps, batch_size, lr, p_uncond)
    if not 0.0 < tau < 1.0:
        raise ValueError(f"the horizon tau must be in (0, 1), got {tau}")
    if not 0.0 <= distill_fraction <= 1.0:
        raise ValueError(f"distill_fraction must be in [0, 1], got {distill_fraction}")
    n_distill = int(round(distill_fraction * batch_size))
    n_replay = batch_size - n_distill
    if replay is None and n_replay:
        raise ValueError("distill_to_field without public replay needs distill_fraction=1")
    null = _null_label(model, null_label)
    if replay is not None:
        images, labels = replay
        if labels is not None and labels.shape != images.shape[:1]:
            raise ValueError(f"replay labels must be [N={images.shape[0]}], got {tuple(labels.shape)}")
        shape, device, dtype = tuple(images.shape[1:]), images.device, images.dtype
    else:
        images = labels = None
        p = next(model.parameters())
        shape, device, dtype = (field_model.dim,), p.device, p.dtype
    if int(torch.tensor(shape).prod()) != field_model.dim:
        raise ValueError(f"the moment model has d={field_model.dim} coordinates but the images are {shape}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def distill_losses(x: Tensor, t: Tensor, y: Tensor, target: Tensor) -> Tensor:
        v = model(x.reshape(len(x), *shape).to(device, dtype), t.to(device, dtype), y.to(device))
        return (v - target.reshape(v.shape).to(device, dtype)).pow(2).flatten(1).mean(1)

    def replay_draws() -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The replay rows (z, t ~ U[tau, 1), xi, labels or null), from the generator."""
        idx = torch.randint(images.shape[0], (n_replay,), generator=generator)
        z = images[idx.to(device)]
        t = sample_t(n_replay, generator, tau, 1.0, dtype=dtype).to(device)
        xi = torch.randn(z.shape, generator=generator, dtype=dtype).to(device)
        return z, t, xi, _labels_or_null(labels, idx, null, p_uncond, generator, device)

    def step(i: int) -> float:
        if micro_batch is not None and micro_batch < batch_size:
            return accumulated_step()
        total = torch.zeros((), device=device)
        if n_distill:
            x, t, y, target = field_targets(field_model, n=n_distill, tau=tau, p_uncond=p_uncond, null_label=null,
                                            generator=generator)
            total = total + distill_losses(x, t, y, target).sum()
        if n_replay:
            total = total + flow_loss(model, *replay_draws()).sum()
        loss = total / batch_size
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    def accumulated_step() -> float:
        # the one-pass step's draws, in its order, then its two parts over micro-batches of at most micro_batch
        # (pipeline/training/accumulate.py); a batch that fits keeps step()'s own expression above
        optimizer.zero_grad(set_to_none=True)
        drawn = field_targets(field_model, n=n_distill, tau=tau, p_uncond=p_uncond, null_label=null,
                              generator=generator) if n_distill else ()
        replay_rows = replay_draws() if n_replay else ()
        total = 0.0
        if n_distill:
            total += backward_in_parts(lambda s: distill_losses(*(d[s] for d in drawn)), n_distill, micro_batch,
                                       divisor=batch_size)
        if n_replay:
            total += backward_in_parts(lambda s: flow_loss(model, *(r[s] for r in replay_rows)), n_replay,
                                       micro_batch, divisor=batch_size)
        optimizer.step()
        return total / batch_size

    return _run(model, step, optimizer=optimizer, steps=steps, ema_decay=ema_decay, generator=generator,
                state_path=state_path, run_hash=run_hash, checkpoint_every_s=checkpoint_every_s, desc=desc,
                progress=progress)

"""DP-SGD with per-example gradients from ``torch.func`` and DPDM's noise multiplicity.

One private step (Abadi et al. 2016; STRAIGHTDP Sec. 2 "DP-SGD"; DPDM App. A):

1. **Sampling.** Poisson sampling: every record joins the logical batch independently with
   probability q, so the batch size is random and may be 0 (:func:`poisson_sample`). The
   alternative, a fixed-size batch drawn without replacement, needs the replace-one
   accountant (:meth:`DPSGDPlan.event`).
2. **Per-example gradients** g_i = grad_theta l_i(theta) with ``torch.func``: ``vmap(grad(...))``
   over a ``functional_call`` of the module (:func:`per_example_gradients`), rather than
   Opacus' hooks: no per-layer registry (any diffusers module works), noise multiplicity runs
   as an inner batch of K inside each vmapped example, while the hooks store one gradient per
   ROW (B*K rows). ``benchmarks/bench_dpsgd_step.py`` (CPU, one thread, B = 256, K = 4)
   measured Opacus ~1.6x slower than this path and at ~2x its peak memory.
3. **Clipping** clip_C(g) = g * min(1, C / ||g||) over the flattened gradient of ALL
   parameters (the sensitivity bound is on the full vector).
4. **Noise** N(0, sigma^2 C^2 I) added ONCE to the sum of clipped gradients of the logical
   batch; the physical micro-batches only bound memory and are invisible to the mechanism.
5. **Normalisation** by the EXPECTED batch size q*N, a public constant, never by the realised
   |B|: |B| depends on whether a record is present, so dividing by it would make the released
   vector a different (unaccounted) function of the data, and the noise std would vary from
   step to step. Dividing the Gaussian-mechanism output by a public constant is
   post-processing and leaves an unbiased estimate of the mean clipped gradient (E|B| = qN).
   With fixed-size batches the batch size B is public and is the divisor.

**Noise multiplicity** (DPDM Sec. 3, Theorem 1): each example's loss is the mean over K
independent (sigma, noise) draws, l_i = (1/K) sum_k l(x_i; sigma_ik, n_ik), formed BEFORE the
gradient is clipped. The example still contributes one gradient of norm <= C, so the
mechanism and its ledger line are identical for every K, while the variance of l_i falls as
1/K. The draws enter each vmapped example as an inner batch of K (:class:`NoiseMultiplicity`).

**Accounting.** sigma is calibrated BEFORE training from the whole run's event
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` with the certified (pessimistic) PLD
accountant of :mod:`pipeline.privacy.accountants` (:func:`calibrate_noise_multiplier`), and
that event is the run's ledger line (:func:`ledger_entry`), which the replay recomputes. That half
(:class:`DPSGDPlan` and the functions above) lives in the torch-free :mod:`pipeline.privacy.dpsgd_plan`.

**Plans whose mechanism varies per step.** The engine reads the plan through
:class:`StepPlan`: per step i, the clip norm ``clip_at(i)``, the std of the Gaussian added to
the clipped sum ``noise_std_at(i)``, a bucket index ``bucket_of(i)`` and the time range
``time_range_at(i)`` the step's diffusion draws must fall in (``None``: the configuration's
whole distribution). :class:`DPSGDPlan` returns its constants (one bucket, no range), so a
DPDM run is the same computation as before; STRAIGHTDP's time-heterogeneous plan
(:class:`pipeline.privacy.tha.THAPlan`, Sec. 3.2) gives bucket k its own clip C_k under one
shared noise std s. Which step is running is the engine's ``steps_taken``.

**Data parallel** (:mod:`pipeline.distributed`, N processes under torchrun): every rank draws the same
logical batch (one Poisson sample over the GLOBAL dataset from the run's one named stream) and the same
diffusion draws, in the same order as one process; rank r computes the clipped sums of micro-batches
r, r + N, r + 2N, ...; one all-reduce sums them, and rank 0 adds the Gaussian noise to its share before the
sum, so the noise is drawn once per logical step from the one mechanism stream. The released gradient is the
single process's (to float summation order), and so is the ledger line. That all-reduce is the step's only
collective: every rank's per-example norms and losses (a non-private diagnostic) are gathered, by two small tensor
collectives, only for a step that asks for them (``diagnostics=True``: STRAIGHTDP's App. D.3 quantiles). The draws
of the micro-batches a rank does not compute are still made (and discarded), to keep the stream aligned: that is
CPU work every rank repeats.
With ``draws="counter"`` (:func:`counter_generator`) each micro-batch's diffusion draws come instead from a
generator of its own on the parameters' device, keyed by (the run's seed, the step, the micro-batch's index): a
rank draws only its own micro-batches' examples, on its GPU, and the draws are the same for any number of
processes (one process's counter draws differ from its stream draws; both are public randomness, independent of
the data, so the mechanism and its ledger line are the same).

Randomness: ``torch.Generator`` (Mersenne twister) is not a cryptographically secure source;
like Opacus without ``secure_mode`` this is adequate for research reproducibility, not for a
deployment that must resist an attacker who can predict the noise.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from pipeline import distributed
# the accounting half lives torch-free in dpsgd_plan (the replay and the tables read it); its names are this
# module's too (dpsgd.DPSGDPlan, dpsgd.ledger_entry, ...)
from pipeline.privacy.dpsgd_plan import (  # noqa: F401
    DPSGD_PLD_SETTINGS, DPSGDError, DPSGDPlan, Sampling, StepPlan, _certified_epsilon, calibrate_noise_multiplier,
    composed_epsilon, configured_line, dpsgd_event, dpsgd_steps, ledger_entry, plan_for_budget)
from pipeline.privacy.ghost import GhostUnsupported, batch_mixing_modules, ghost_clip_and_sum, unsupported_parameters

log = logging.getLogger(__name__)

#: ``loss_fn(model_fn, *example) -> scalar``: the loss of ONE example (tensors without the
#: batch dimension); ``model_fn(*inputs)`` runs the module with the parameters being
#: differentiated.
ExampleLoss = Callable[..., Tensor]


# --------------------------------------------------------------------------- sampling

def poisson_sample(n: int, q: float, generator: torch.Generator | None = None) -> Tensor:
    """Indices of a Poisson sample: each of ``n`` records independently with probability ``q``.

    May be empty; the step must then still release pure noise (skipping it would reveal that
    the batch was empty, which depends on the data).
    """
    mask = torch.rand(n, generator=generator) < q
    return torch.nonzero(mask, as_tuple=False).flatten()


def fixed_size_sample(n: int, batch_size: int, generator: torch.Generator | None = None) -> Tensor:
    """A uniformly random subset of size ``batch_size`` (sampling without replacement)."""
    return torch.randperm(n, generator=generator)[:batch_size]


# --------------------------------------------------------------------------- per-example gradients

def trainable_parameters(model: nn.Module) -> dict[str, Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def per_example_gradients(model: nn.Module, loss_fn: ExampleLoss, batch: Sequence[Tensor],
                          params: Mapping[str, Tensor] | None = None) -> tuple[dict[str, Tensor], Tensor]:
    """Per-example gradients ``{name: [B, *shape]}`` and losses ``[B]`` via ``vmap(grad(...))``.

    ``loss_fn(model_fn, *example)`` sees one example (no batch dimension). Buffers are
    passed unchanged (BatchNorm running statistics would mix examples and are not allowed).
    """
    params = {k: v.detach() for k, v in (params or trainable_parameters(model)).items()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def example_loss(p: dict[str, Tensor], *example: Tensor) -> tuple[Tensor, Tensor]:
        model_fn = lambda *inputs: functional_call(model, (p, buffers), inputs)  # noqa: E731
        loss = loss_fn(model_fn, *example)
        return loss, loss.detach()

    # randomness="different": a module's own randomness (dropout) is independent per example
    grads, losses = vmap(grad(example_loss, has_aux=True), in_dims=(None,) + (0,) * len(batch),
                         randomness="different")(params, *batch)
    return grads, losses


def clip_and_sum(grads: Mapping[str, Tensor], max_grad_norm: float) -> tuple[dict[str, Tensor], Tensor]:
    """Sum over the batch of clip_C(g_i) = g_i * min(1, C/||g_i||), ||.|| over ALL parameters.

    Returns the clipped sum and the per-example norms BEFORE clipping.
    """
    first = next(iter(grads.values()))
    sq = torch.zeros(first.shape[0], device=first.device, dtype=first.dtype)
    for g in grads.values():
        sq = sq + g.reshape(g.shape[0], -1).pow(2).sum(dim=1)
    norms = sq.sqrt()
    # C / max(||g||, C): exactly 1 for small gradients; no division by zero for g = 0
    factor = max_grad_norm / torch.clamp(norms, min=max_grad_norm)
    summed = {k: torch.einsum("b,b...->...", factor, g) for k, g in grads.items()}
    return summed, norms


# --------------------------------------------------------------------------- noise multiplicity

class Augmentation(Protocol):
    """Random views of an example for augmentation multiplicity (De et al. 2022; DP-Diffusion, Ghalebikesabi et al.
    2023): each of an example's K draws sees its own random view of it.

    ``draw(b, k, generator)`` draws the views' parameters ``[b, k, P]`` from the engine's generator (public
    randomness, never the data); ``apply(x [b, ...], params [b, k, P])`` returns the views ``[b, k, ...]``, each a
    function of its own example only, so a view's gradient is still one example's and is clipped with it.
    """

    def draw(self, b: int, k: int, generator: torch.Generator | None) -> Tensor: ...

    def apply(self, x: Tensor, params: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class NoiseMultiplicity:
    """K independent (sigma, noise) draws per example (DPDM Sec. 3).

    ``sample_sigma(n, generator) -> [n]`` draws diffusion noise levels from the training
    distribution of the configuration (e.g. EDM's log-normal). The draws are made outside
    the vmapped function so that per-example gradients are reproducible and each example's
    K draws are independent of every other example's.

    "sigma" is whatever scalar indexes the diffusion path: EDM's noise level, or for a
    rectified flow the time t (STRAIGHTDP Sec. 2). A plan that trains a step on a sub-range
    only (STRAIGHTDP's time buckets, Sec. 3.2) passes ``time_range=(lo, hi)`` to
    :meth:`draw`, which then calls ``sample_sigma(n, generator, (lo, hi))`` and refuses a
    draw outside [lo, hi); without a range the sampler is called exactly as before.
    """

    K: int
    sample_sigma: Callable[[int, torch.Generator | None], Tensor]
    #: optional augmentation multiplicity: draw k of example i sees its own random view of x_i (:class:`Augmentation`)
    augment: Augmentation | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.K, int) and self.K >= 1):
            raise DPSGDError(f"noise multiplicity K must be an integer >= 1, got {self.K!r}")

    def draw(self, x: Tensor, generator: torch.Generator | None = None,
             time_range: tuple[float, float] | None = None) -> tuple[Tensor, Tensor]:
        """sigma ``[B, K]`` and standard normal noise ``[B, K, *x.shape[1:]]`` for a batch ``x``.

        With ``time_range = (lo, hi)`` every sigma lies in [lo, hi) (checked in x's dtype).
        """
        sigma, noise = self._draw(x.shape[0], x.shape[1:], x.dtype, generator, time_range)
        sigma = sigma.to(x.device, x.dtype)
        if time_range is not None and sigma.numel():
            lo, hi = time_range
            if not bool(((sigma >= lo) & (sigma < hi)).all()):
                # a draw outside the bucket would train a time the declared workload excludes
                raise DPSGDError(f"time draws must lie in the step's range [{lo}, {hi}), got "
                                 f"[{sigma.min().item()}, {sigma.max().item()}]")
        return sigma, noise.to(x.device)

    def skip(self, b: int, shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator | None = None,
             time_range: tuple[float, float] | None = None) -> None:
        """Consume the random numbers :meth:`draw` would for ``b`` examples of ``shape`` (another data-parallel
        rank's micro-batch: the stream stays aligned with one process's)."""
        self._draw(b, shape, dtype, generator, time_range)
        if self.augment is not None:
            self.augment.draw(b, self.K, generator)

    def views(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x`` itself without augmentation; with it, each example's K views ``[B, K, ...]`` (drawn after
        :meth:`draw`'s sigma and noise, from the same generator)."""
        if self.augment is None:
            return x
        params = self.augment.draw(x.shape[0], self.K, generator)
        return self.augment.apply(x, params.to(x.device))

    def _draw(self, b: int, shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator | None,
              time_range: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
        if time_range is None:
            sigma = self.sample_sigma(b * self.K, generator)
        else:
            sigma = self.sample_sigma(b * self.K, generator, time_range)
        noise = torch.randn((b, self.K, *shape), generator=generator, dtype=dtype)
        return sigma.reshape(b, self.K), noise


class MultiplicityLoss:
    """Example loss l_i = (1/K) sum_k draw_loss(x_i; sigma_ik, n_ik) (DPDM Sec. 3), per example and batched.

    ``draw_loss(model_fn, x[K,...], sigma[K], noise[K,...], *cond[K,...]) -> [K]`` is the per-draw
    diffusion loss. Called as ``loss(model_fn, x, sigma[K], noise[K,...], *cond)`` it is one example's
    loss (what ``vmap`` differentiates: the K draws run as one inner batch of the model);
    :meth:`batched` gives every example's loss from one forward over the B*K rows, example-major (what
    ghost clipping differentiates, :mod:`pipeline.privacy.ghost`). The mean is taken BEFORE the gradient
    is clipped, so the example's sensitivity stays C for any K. Under augmentation multiplicity ``x`` holds the
    example's K views (``[K, ...]``, batched ``[B, K, ...]``): draw k's loss is on view k.
    """

    def __init__(self, draw_loss: Callable[..., Tensor]) -> None:
        self.draw_loss = draw_loss

    def __call__(self, model_fn: Callable[..., Tensor], x: Tensor, sigma: Tensor, noise: Tensor,
                 *cond: Tensor) -> Tensor:
        k = sigma.shape[0]
        # x is the example, or its K augmented views [K, ...] (augmentation multiplicity)
        xk = x if x.dim() == noise.dim() else x.unsqueeze(0).expand(k, *x.shape)
        condk = tuple(c.unsqueeze(0).expand(k, *c.shape) for c in cond)
        return self.draw_loss(model_fn, xk, sigma, noise, *condk).mean()

    def batched(self, model_fn: Callable[..., Tensor], x: Tensor, sigma: Tensor, noise: Tensor,
                *cond: Tensor) -> Tensor:
        """Every example's loss ``[B]``: ``x [B,...]``, ``sigma [B, K]``, ``noise [B, K, ...]``, ``cond [B, ...]``."""
        b, k = sigma.shape
        xs = x.reshape(b * k, *x.shape[2:]) if x.dim() == noise.dim() else x.repeat_interleave(k, dim=0)
        rows = self.draw_loss(model_fn, xs, sigma.reshape(b * k),
                              noise.reshape(b * k, *noise.shape[2:]), *(c.repeat_interleave(k, dim=0) for c in cond))
        return rows.reshape(b, k).mean(1)


def multiplicity_loss(draw_loss: Callable[..., Tensor]) -> MultiplicityLoss:
    """The example loss of ``draw_loss`` under noise multiplicity (:class:`MultiplicityLoss`)."""
    return MultiplicityLoss(draw_loss)


# --------------------------------------------------------------------------- the private step

@dataclass
class StepInfo:
    """What happened in one step. NOT privatised: for tests and diagnostics only; never write
    ``batch_size`` or ``grad_norms`` to a result (they are functions of the private data).

    ``grad_norms`` and ``losses`` (on the parameters' device) are per example, in the single process's order
    (micro-batch j, then the order within it). ``complete`` says whether they cover the whole logical batch:
    always in one process; over several data-parallel processes only for a step asked for ``diagnostics``
    (:meth:`DPSGD.privatised_gradient`), else they hold this rank's own micro-batches' examples alone and
    ``complete`` is False (``batch_size`` is still the logical batch's, which every rank knows).
    """

    batch_size: int
    grad_norms: Tensor
    losses: Tensor = field(repr=False)
    #: the plan's bucket of this step and its clip norm (public: they are functions of the step)
    bucket: int = 0
    clip: float = float("nan")
    #: whether ``grad_norms`` and ``losses`` hold every example of the logical batch (see above)
    complete: bool = True


def norm_quantiles(info: StepInfo) -> dict[str, float] | None:
    """One step's per-sample gradient-norm quantiles p50 / p90 and the fraction clipped (STRAIGHTDP App. D.3).

    A NON-PRIVATE diagnostic (a function of the private batch, like :class:`StepInfo` itself): it may go
    to a run's training metrics flagged as such, never into a result that claims DP. None for an empty batch.
    Refuses an ``info`` that holds one data-parallel rank's examples only (ask the step for ``diagnostics``).
    """
    if not info.complete:
        raise DPSGDError("norm_quantiles needs every rank's gradient norms: run the step with diagnostics=True")
    norms = info.grad_norms.detach().double().cpu()
    if norms.numel() == 0:
        return None
    p50, p90 = torch.quantile(norms, torch.tensor([0.5, 0.9], dtype=torch.float64)).tolist()
    return {"bucket": int(info.bucket), "p50": p50, "p90": p90,
            "clip_fraction": float((norms > info.clip).double().mean()), "n": int(norms.numel())}


def summarise_norm_quantiles(rows: Sequence[Mapping[str, float] | None]) -> dict[str, dict[str, float]]:
    """Per bucket, the medians over steps of p50, p90 and the clip fraction, and the upper-tail ratio
    p90 / p50 of those medians (App. D.3 reads the clamp's effect off this ratio)."""
    out: dict[str, dict[str, float]] = {}
    kept = [r for r in rows if r is not None]
    for b in sorted({int(r["bucket"]) for r in kept}):
        mine = [r for r in kept if int(r["bucket"]) == b]
        med = {k: float(statistics.median(r[k] for r in mine)) for k in ("p50", "p90", "clip_fraction")}
        out[str(b)] = {**med, "p90_over_p50": med["p90"] / med["p50"] if med["p50"] > 0 else float("nan"),
                       "steps": len(mine)}
    return out


Clipping = Literal["vmap", "ghost", "auto"]
#: how the diffusion draws of a micro-batch are made: one CPU stream in one process's order, or per micro-batch from
#: a counter-keyed generator on the device (module docstring, "Data parallel")
Draws = Literal["stream", "counter"]
DRAWS = ("stream", "counter")


def counter_generator(key: int, step: int, microbatch: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` whose stream is a function of (``key``, ``step``, ``microbatch``) alone.

    Written here rather than taken from a library: torch's generators are seeded by one integer, and what is needed
    is that integer as a fixed function of the three counters (SHA-256, so that neighbouring counters give
    unrelated seeds); the generator itself is torch's (Philox on CUDA, Mersenne twister on the CPU).
    """
    digest = hashlib.sha256(f"dpsgd-draws:{key}:{step}:{microbatch}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)
CLIPPING: tuple[str, ...] = ("vmap", "ghost", "auto")


def resolve_clipping(clipping: str, model: nn.Module, loss_fn: ExampleLoss) -> str:
    """How the clipped sum is computed: ``vmap`` (per-example gradients, :func:`per_example_gradients`) or
    ``ghost`` (:mod:`pipeline.privacy.ghost`: norms and the clipped sum without them). ``auto`` takes ghost when
    every trainable parameter is of a layer it handles and the loss has a batched form, else vmap; ``ghost``
    asked for where it cannot run is a one-line error. Both give the same clipped sum: the mechanism, and so
    the ledger line, is the same. What only a forward shows (a tied weight, a sequence-first input) is checked by
    ghost clipping on each call; :class:`DPSGD` then falls back to vmap under ``auto`` (:meth:`DPSGD.clipped_sum`).

    A module that mixes examples (a BatchNorm on the batch's statistics, :func:`~pipeline.privacy.ghost.
    batch_mixing_modules`) is refused under ``auto`` and ``ghost``: no route gives it a per-example gradient (vmap would
    normalise over one example's K draws, a model other than the one that runs batched), so ``auto`` has no
    fallback that is the same mechanism on the same model."""
    if clipping not in CLIPPING:
        raise DPSGDError(f"dpsgd clipping must be one of {', '.join(CLIPPING)}, got {clipping!r}")
    if clipping == "vmap":
        return "vmap"
    if mixing := batch_mixing_modules(model):
        raise DPSGDError(f"dpsgd clipping {clipping}: module {mixing[0]}; use GroupNorm or LayerNorm, or a BatchNorm "
                         "frozen in eval mode with running statistics")
    why = ("the loss has no batched form (dpsgd.multiplicity_loss gives one)" if not hasattr(loss_fn, "batched")
           else None)
    if why is None and (bad := unsupported_parameters(model)):
        why = f"parameter {bad[0]} is of a layer it does not handle"
    if why is None:
        return "ghost"
    if clipping == "ghost":
        raise DPSGDError(f"dpsgd clipping ghost: {why}; use vmap or auto")
    return "vmap"


def clipped_sum(model: nn.Module, loss_fn: ExampleLoss, chunk: Sequence[Tensor], max_grad_norm: float, route: str,
                params: Mapping[str, Tensor] | None = None) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """One micro-batch's sum_i clip_C(g_i), the norms ||g_i|| before clipping and the losses, by ``route`` (a value of
    :func:`resolve_clipping`): ghost clipping, or per-example gradients clipped and summed."""
    if route == "ghost":
        return ghost_clip_and_sum(model, loss_fn.batched, chunk, max_grad_norm)
    grads, losses = per_example_gradients(model, loss_fn, chunk, params)
    summed, norms = clip_and_sum(grads, max_grad_norm)
    return summed, norms, losses


class DPSGD:
    """Privatised gradients for ``model`` under ``plan``, with physical micro-batching.

    ``privatised_gradient(data, indices)`` forms (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / D
    over the logical batch ``indices`` of ``data`` (a tuple of tensors indexed along dim 0),
    where D = q*N (Poisson) or B (fixed size); ``step(optimizer, data)`` samples a batch,
    writes the result into ``.grad`` and steps. Memory is bounded by ``microbatch_size``
    examples' gradients (times K draws' activations), whatever the logical batch size.
    ``multiplicity``, when given, appends each example's K (sigma, noise) draws to its inputs
    (use :func:`multiplicity_loss`); the draws fall in the step's ``plan.time_range_at(step)``.

    ``plan`` is any :class:`StepPlan`: step i (``steps_taken`` when it runs) clips at
    ``plan.clip_at(i)`` and adds noise of std ``plan.noise_std_at(i)``. ``clipping``: how the clipped sum
    is formed (:func:`resolve_clipping`; the resolved route is ``self.clipping``).

    ``world`` (default: the initialised process group, else one process): the data-parallel ranks this
    engine is one of (module docstring, "Data parallel"); every rank must construct it with the same
    arguments. Rank 0's weights are broadcast to the others here. ``draws``: ``stream`` (default) draws every
    micro-batch's diffusion draws from ``generator`` in one process's order; ``counter`` draws micro-batch j of
    step i on the data's device from :func:`counter_generator` keyed by ``generator``'s seed, so each rank draws
    only its own and any number of processes gives the single process's draws.
    """

    def __init__(self, model: nn.Module, loss_fn: ExampleLoss, plan: StepPlan, *, microbatch_size: int = 64,
                 multiplicity: NoiseMultiplicity | None = None, generator: torch.Generator | None = None,
                 noise_generator: torch.Generator | None = None, clipping: Clipping = "auto",
                 world: distributed.World | None = None, draws: Draws = "stream") -> None:
        if not (isinstance(microbatch_size, int) and microbatch_size >= 1):
            raise DPSGDError(f"micro-batch size must be an integer >= 1, got {microbatch_size!r}")
        if draws not in DRAWS:
            raise DPSGDError(f"draws must be one of {', '.join(DRAWS)}, got {draws!r}")
        self.draws = draws
        # the counters' key: the run's stream's seed (public randomness, like the stream itself)
        self.draw_key = int(generator.initial_seed()) if generator is not None else int(torch.initial_seed())
        self.model, self.loss_fn, self.plan = model, loss_fn, plan
        self.requested_clipping = clipping
        self.clipping = resolve_clipping(clipping, model, loss_fn)
        self.microbatch_size, self.multiplicity = microbatch_size, multiplicity
        self.generator = generator  # sampling and diffusion draws (CPU; the same stream on every rank)
        self.noise_generator = noise_generator  # the Gaussian mechanism's noise (on the parameters' device; rank 0)
        self.world = world or distributed.current()
        self.steps_taken = 0
        distributed.broadcast_module(model)

    def sample(self) -> Tensor:
        n = self.plan.dataset_size
        if self.plan.sampling == "poisson":
            return poisson_sample(n, self.plan.sampling_rate, self.generator)
        return fixed_size_sample(n, self.plan.batch_size, self.generator)

    def _microbatches(self, data: Sequence[Tensor], indices: Tensor,
                      time_range: tuple[float, float] | None = None) -> Iterator[tuple[int, tuple[Tensor, ...]]]:
        """This rank's micro-batches (j, chunk): j = rank, rank + N, ...; the others' draws are skipped."""
        rank, size = self.world.rank, self.world.size
        for j, start in enumerate(range(0, len(indices), self.microbatch_size)):
            idx = indices[start:start + self.microbatch_size]
            if j % size != rank:
                if self.multiplicity is not None and self.draws == "stream":
                    self.multiplicity.skip(len(idx), data[0].shape[1:], data[0].dtype, self.generator, time_range)
                continue
            chunk = tuple(t[idx.to(t.device)] for t in data)
            if self.multiplicity is not None:
                if self.draws == "stream":
                    gen, where = self.generator, contextlib.nullcontext()
                else:  # the samplers call torch's factories without a device: the data's device becomes the default
                    device = chunk[0].device
                    gen, where = counter_generator(self.draw_key, self.steps_taken, j, device), torch.device(device)
                with where:
                    sigma, noise = self.multiplicity.draw(chunk[0], gen, time_range)
                    chunk = (self.multiplicity.views(chunk[0], gen), sigma, noise, *chunk[1:])
            yield j, chunk

    def clipped_sum(self, chunk: Sequence[Tensor], clip: float, params: Mapping[str, Tensor]
                    ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """One micro-batch's clipped sum by the engine's route. Where ghost clipping finds on the call what the modules
        alone did not show (:class:`~pipeline.privacy.ghost.GhostUnsupported`, raised before anything is summed),
        ``auto`` continues by vmap for this and every later call, if vmap is right there; else a one-line error."""
        try:
            return clipped_sum(self.model, self.loss_fn, chunk, clip, self.clipping, params)
        except GhostUnsupported as e:
            if self.requested_clipping != "auto" or not e.vmap_ok:
                raise DPSGDError(f"dpsgd clipping {self.requested_clipping}: {e.reason}"
                                 + ("; use vmap or auto" if e.vmap_ok else "")) from e
            log.warning("dpsgd clipping auto: %s; per-example gradients by vmap from here on", e.reason)
            self.clipping = "vmap"
            return clipped_sum(self.model, self.loss_fn, chunk, clip, self.clipping, params)

    def privatised_gradient(self, data: Sequence[Tensor], indices: Tensor, *, diagnostics: bool = False
                            ) -> tuple[dict[str, Tensor], StepInfo]:
        """The released gradient of step ``steps_taken`` over the logical batch ``indices``, and the step's
        :class:`StepInfo`.

        ``diagnostics``: whether the caller reads the :class:`StepInfo`'s per-example norms and losses over the
        whole logical batch (STRAIGHTDP's App. D.3 quantiles). Over several data-parallel processes that costs two
        small tensor collectives per step (:func:`pipeline.distributed.gather_ordered`); without it the step's only
        collective is the gradient's all-reduce and the StepInfo holds this rank's examples alone
        (``complete=False``). In one process it changes nothing. The released gradient is the same either way.
        """
        i = self.steps_taken
        clip, std = self.plan.clip_at(i), self.plan.noise_std_at(i)
        params = trainable_parameters(self.model)
        total = {k: torch.zeros_like(p) for k, p in params.items()}
        rows: dict[int, tuple[Tensor, Tensor]] = {}  # micro-batch j: its examples' (norms, losses)
        for j, chunk in self._microbatches(data, indices, self.plan.time_range_at(i)):
            summed, norms, losses = self.clipped_sum(chunk, clip, params)
            rows[j] = norms.detach(), losses.detach()
            for k in total:
                total[k].add_(summed[k])
            del summed
        divisor = self.plan.expected_batch_size if self.plan.sampling == "poisson" else float(self.plan.batch_size)
        if self.world.main:  # the noise is drawn once per logical step, by rank 0, before the ranks' sum
            for t in total.values():
                t.add_(torch.randn(t.shape, generator=self.noise_generator, device=t.device, dtype=t.dtype), alpha=std)
        distributed.all_reduce_sum(list(total.values()))
        for t in total.values():
            t.div_(divisor)
        device = next(iter(total.values())).device if total else torch.device("cpu")
        gather = diagnostics and self.world.size > 1
        if gather:  # every rank's micro-batches, in the single process's order: the norms and losses as two columns
            dtype = next(iter(total.values())).dtype if total else torch.float32
            columns = {j: torch.stack([n.to(dtype), v.to(dtype)], 1) for j, (n, v) in rows.items()}
            both = distributed.gather_ordered(columns, n_parts=-(-len(indices) // self.microbatch_size), width=2,
                                              dtype=dtype)
            grad_norms, losses = both[:, 0].to(device), both[:, 1].to(device)
        else:  # this rank's micro-batches (in one process, all of them): nothing is communicated
            grad_norms = torch.cat([rows[j][0] for j in sorted(rows)]) if rows else torch.zeros(0, device=device)
            losses = torch.cat([rows[j][1] for j in sorted(rows)]) if rows else torch.zeros(0, device=device)
        info = StepInfo(batch_size=int(len(indices)), grad_norms=grad_norms, losses=losses,
                        bucket=self.plan.bucket_of(i), clip=float(clip), complete=gather or self.world.size == 1)
        return total, info

    def step(self, optimizer: torch.optim.Optimizer, data: Sequence[Tensor], *, diagnostics: bool = False
             ) -> StepInfo:
        """One DP-SGD step: sample, privatise, write ``.grad``, ``optimizer.step()``.

        Refuses to run past ``plan.steps``: the ledger line covers exactly T steps. ``diagnostics``: as in
        :meth:`privatised_gradient` (only a caller that reads the whole batch's norms or losses asks).
        """
        if self.steps_taken >= self.plan.steps:
            raise DPSGDError(f"the plan covers {self.plan.steps} steps; step {self.steps_taken + 1} "
                             f"would exceed the accounted budget")
        if len(data[0]) != self.plan.dataset_size:
            raise DPSGDError(f"data has {len(data[0])} records but the plan was accounted for "
                             f"N={self.plan.dataset_size}")
        grads, info = self.privatised_gradient(data, self.sample(), diagnostics=diagnostics)
        for name, p in trainable_parameters(self.model).items():
            p.grad = grads[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.steps_taken += 1
        return info

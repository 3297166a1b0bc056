"""EMPDEN samplers: full-batch private, output-wise subsampled hybrid (Algorithm 1), per-step resampling.

All private computation -- the clipped empirical denoiser, the step noise that makes each
step a Gaussian mechanism (eq. 6), and the ledger line of the run -- is done by
:mod:`pipeline.privacy.empirical_denoiser`; this module only orders the steps on the EDM grid.
Each call records exactly one ledger line (before the first private step, so a run that dies
half-way is still accounted) covering all ``n_out`` outputs of the call.

The public denoiser is any callable ``D(x, sigma) -> x0_hat`` on image-shaped tensors with a
Python float ``sigma`` (e.g. an EDM-preconditioned network trained on public data only); its
steps are post-processing and add no privacy cost (EMPDEN Sec. 6).

``public_data`` (optional, every sampler) switches the empirical denoiser's normaliser from
eq. 38's constant beta |S| alone to the public marginal Z = p_hat_pub(x_t) of
:func:`pipeline.privacy.empirical_denoiser.log_public_marginal` (eq. 37's normaliser estimated on
public records): the literal constant normaliser leaves E_hat = 0 in image dimensions. Z reads
only public data and the state, so the ledger line and eps are the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from pipeline.diffusion.schedule import EDMSchedule
from pipeline.diffusion.steps import heun_sampler
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.privacy.schedule import k_private_steps

PublicDenoiser = Callable[[torch.Tensor, float], torch.Tensor]
#: where a sampler's draws come from: one generator for every batch (a direct call), or one per batch of
#: ``batch_size`` outputs keyed by the batch's index (the stage's, so that a batch's draws do not depend on
#: which job samples it: ``sampling.shards``)
Generators = torch.Generator | Callable[[int], torch.Generator]
#: called with the number of outputs each finished batch added (e.g. a tqdm bar's ``update``)
Progress = Callable[[int], object]


def renoise(x: torch.Tensor, t0: float, t1: float, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """x + sqrt(t1^2 - t0^2) eps: moves a state at noise level t0 to level t1 >= t0 (Algorithm 1, line 8).

    Under x_t0 = x0 + t0 eps' the result is x0 + t1 eps'' (variances add), an SDEdit restart.
    """
    if not t1 >= t0 >= 0:
        raise ValueError(f"re-noising needs t1 >= t0 >= 0, got t0={t0}, t1={t1}")
    eps = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return x + math.sqrt(t1**2 - t0**2) * eps


#: Deterministic EDM Heun sampler (Karras et al. 2022, Alg. 1 with S_churn = 0) along decreasing
#: ``times``; a final 0 takes one Euler step. The public denoiser's steps (post-processing).
edm_heun = heun_sampler


def _private_block(x: torch.Tensor, data: emp.PreparedData, times: np.ndarray, *, C: float, beta: float,
                   subset_for_step: Callable[[], torch.Tensor | None], generator: torch.Generator,
                   public: emp.PreparedData | None = None) -> torch.Tensor:
    """Run the private steps times[0] -> ... -> times[-1] on flattened states x [b, d].

    With ``public`` records every step divides v by Z = p_hat_pub(x_t) (public, no privacy cost).
    """
    for t_cur, t_next in zip(times[:-1], times[1:]):
        log_z = None if public is None else emp.log_public_marginal(x, public, float(t_cur))
        x = emp.private_step(x, data, float(t_cur), float(t_next), C=C, beta=beta, subset=subset_for_step(),
                             generator=generator, log_normaliser=log_z)
    return x


def prepare_public(public_data: torch.Tensor | None, private: emp.PreparedData) -> emp.PreparedData | None:
    """The public normaliser's records, prepared like the private ones (None: eq. 38's constant normaliser)."""
    if public_data is None:
        return None
    pub = emp.prepare_records(public_data, dtype=private.x0.dtype, device=private.x0.device)
    if pub.d != private.d:
        raise ValueError(f"public normaliser records have dimension {pub.d}, the private records {private.d}")
    return pub


def _normaliser_name(public: emp.PreparedData | None) -> emp.Normaliser:
    return "constant" if public is None else "public_marginal"


def _initial_state(b: int, d: int, sigma_max: float, data: emp.PreparedData,
                   generator: torch.Generator) -> torch.Tensor:
    return sigma_max * torch.randn((b, d), generator=generator, device=data.x0.device, dtype=data.x0.dtype)


def _per_chunk(generator: Generators) -> Callable[[int], torch.Generator]:
    if isinstance(generator, torch.Generator):
        return lambda _: generator
    return generator


def _chunks(n_out: int, batch_size: int) -> list[int]:
    if n_out < 1 or batch_size < 1:
        raise ValueError(f"need n_out >= 1 and batch_size >= 1, got {n_out}, {batch_size}")
    return [min(batch_size, n_out - i) for i in range(0, n_out, batch_size)]


def sample_full_batch(data: torch.Tensor, *, n_out: int, C: float, beta: float, sink: emp.LedgerSink,
                      generator: Generators, schedule: EDMSchedule = EDMSchedule(N=50),
                      dtype: torch.dtype = torch.float64, batch_size: int = 256,
                      public_data: torch.Tensor | None = None, progress: Progress | None = None) -> torch.Tensor:
    """Full-batch private sampling from sigma_max down to sigma_min (EMPDEN Sec. 3.2, Sec. 5.1).

    Every step uses all n records (S = D); the N - 1 steps t_0 -> t_{N-1} = sigma_min are private
    and the output is the state at sigma_min (vary ``schedule.sigma_min`` for the sigma_min sweep).
    ``public_data``: public records for the public-marginal normaliser (module docstring), or None.
    ``progress`` is called with each finished batch's number of outputs.
    ``generator``: one for the whole call, or one per batch (:data:`Generators`).
    Returns [n_out, *data.shape[1:]] on the generator's device.
    """
    generator_of = _per_chunk(generator)
    device = generator_of(0).device
    prep = emp.prepare_records(data, dtype=dtype, device=device)
    pub = prepare_public(public_data, prep)
    times = schedule.times()[: schedule.N]  # t_0 .. t_{N-1} = sigma_min
    # C is the clip the sampler applies (already scaled): the block takes it as is
    block = EmpdenBlock(schedule=schedule, k=schedule.N - 1, C=C, beta=beta, B=prep.n, n=prep.n, N_out=n_out,
                        scheme="full_batch")
    emp.record_block(sink, block, normaliser=_normaliser_name(pub))
    out = []
    for c, b in enumerate(_chunks(n_out, batch_size)):
        gen = generator_of(c)
        x = _initial_state(b, prep.d, schedule.sigma_max, prep, gen)
        out.append(_private_block(x, prep, times, C=C, beta=beta, subset_for_step=lambda: None,
                                  generator=gen, public=pub))
        if progress is not None:
            progress(b)
    return torch.cat(out).reshape(n_out, *data.shape[1:])


def hybrid_times(schedule: EDMSchedule, p_percent: float, T: int) -> tuple[int, float, float]:
    """(k, t0, t1) of a hybrid run: k = ceil(p N / 100) private steps end at t0 = t_k; t1 = t_{k-T}."""
    k = k_private_steps(schedule.N, p_percent)
    if k >= schedule.N:
        raise ValueError(f"a private block of p={p_percent}% covers all {schedule.N} steps; the hybrid needs "
                         f"t0 > 0 (use sample_full_batch for fully private sampling)")
    if not 0 <= T <= k:
        raise ValueError(f"re-noising T={T} steps back up the grid must be in [0, k={k}]")
    t = schedule.times()
    return k, float(t[k]), float(t[k - T])


def sample_hybrid(data: torch.Tensor, *, n_out: int, B: int, p_percent: float, T: int,
                  public_denoiser: PublicDenoiser, C: float, beta: float, sink: emp.LedgerSink,
                  generator: Generators, schedule: EDMSchedule = EDMSchedule(N=39),
                  resample: Literal["per_output", "per_step"] = "per_output",
                  dtype: torch.dtype = torch.float64, public_dtype: torch.dtype = torch.float32,
                  batch_size: int = 256, public_data: torch.Tensor | None = None,
                  progress: Progress | None = None) -> torch.Tensor:
    """EMPDEN Algorithm 1: subsampled private block to t0, re-noise to t1, public denoiser t1 -> 0.

    ``resample="per_output"`` (Algorithm 1, accounted by Prop. 4.1) draws each output's B-subset
    once and reuses it for the whole block; ``"per_step"`` draws a fresh subset at every private
    step (accounted by Prop. C.1; EMPDEN Figure 2). The private block is the first
    k = ceil(p N / 100) steps of the N-step grid, t1 is T grid points above t0, and the public
    denoiser runs EDM Heun along the grid from t1 to 0. The private block runs in ``dtype``
    (float64: see the precision note of :mod:`pipeline.privacy.empirical_denoiser`), the public
    part in ``public_dtype`` (a network's dtype). ``public_data``: public records for the
    public-marginal normaliser (module docstring), or None for eq. 38's constant. ``progress`` is
    called with each finished batch's number of outputs. ``generator``: one for the whole call, or one per
    batch (:data:`Generators`).
    Returns [n_out, *data.shape[1:]] in ``public_dtype``.
    """
    generator_of = _per_chunk(generator)
    device = generator_of(0).device
    k, t0, t1 = hybrid_times(schedule, p_percent, T)
    prep = emp.prepare_records(data, dtype=dtype, device=device)
    pub = prepare_public(public_data, prep)
    times = schedule.times()
    if resample not in ("per_output", "per_step"):
        raise ValueError(f"resample must be per_output or per_step, got {resample!r}")
    if not 1 <= B <= prep.n:
        raise ValueError(f"subsample size B must be in [1, n={prep.n}], got {B}")
    block = EmpdenBlock(schedule=schedule, k=k, C=C, beta=beta, B=B, n=prep.n, N_out=n_out, scheme=resample)
    emp.record_block(sink, block, normaliser=_normaliser_name(pub))
    out = []
    for c, b in enumerate(_chunks(n_out, batch_size)):
        gen = generator_of(c)
        x = _initial_state(b, prep.d, schedule.sigma_max, prep, gen)
        if resample == "per_output":
            subset = emp.draw_subsets(prep.n, B, b, generator=gen, device=device)
            x = _private_block(x, prep, times[: k + 1], C=C, beta=beta, subset_for_step=lambda: subset,
                               generator=gen, public=pub)
        else:
            x = _private_block(x, prep, times[: k + 1], C=C, beta=beta, generator=gen, public=pub,
                               subset_for_step=lambda: emp.draw_subsets(prep.n, B, b, generator=gen,
                                                                        device=device))
        x = renoise(x, t0, t1, generator=gen).reshape(b, *data.shape[1:]).to(public_dtype)
        out.append(edm_heun(x, public_denoiser, times[k - T:]))
        if progress is not None:
            progress(b)
    return torch.cat(out)

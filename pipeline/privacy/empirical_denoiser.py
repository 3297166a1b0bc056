"""The clipped, publicly normalised empirical denoiser of EMPDEN and its Gaussian mechanism.

EMPDEN Sec. 3.1 (eq. 4-6) and App. E (eq. 38): for a noisy state x_t and a record x0,

    v(x0; x_t)  = x0 * p(x_t | x0),        p(x_t | x0) = N(x_t; x0, t^2 I)   (EDM kernel)
    vbar        = v / max(1, ||v|| / C)                                       (clip to norm C)
    E_hat(x_t)  = (1 / (beta |S|)) * sum_{x0 in S} vbar(x0; x_t)              (eq. 38, |S| records)

``S`` is the whole private set (full batch, S = D) or a B-subset per output (Algorithm 1).
One step of the sampler, ``x <- (1 - 2dt/t) x + (2dt/t) E_hat + sqrt(2 t dt) eps`` (eq. 1),
is, after the public rescaling by t/(2dt), the Gaussian mechanism of eq. 6 with sensitivity
2C/(beta |S|) and noise std sqrt(t^3 / (2 dt)): it is mu_t-GDP with
mu_t = (2C/(beta|S|)) sqrt(2 dt / t^3) (eq. 39). Those facts of a run (its clip, mu_t, mu_bar_B,
event) are one value, :class:`pipeline.privacy.empden_block.EmpdenBlock`; this module writes its ledger line.

How E_hat is computed without under- or overflow (any t, any dimension d)
--------------------------------------------------------------------------
The kernel alone spans hundreds of thousands of orders of magnitude: at d = 3*64*64 and
t = 0.002 its normalising constant (2 pi t^2)^(-d/2) is about e^{+65000}, at t = 80 about
e^{-65000}. Nothing is ever exponentiated before the clip has bounded it:

* log p_i  = -||x_t - x0_i||^2 / (2 t^2) - (d/2) log(2 pi t^2), the squared distance expanded
  as ||x_t||^2 - 2 x_t . x0_i + ||x0_i||^2 so that all pairs come from one matmul (``addmm``,
  the record terms folded into its bias), and a step runs near matmul speed;
* the clipped norm is ||vbar_i|| = min(p_i ||x0_i||, C), so its log is
  l_i = min(log p_i + log ||x0_i||, log C) <= log C (records with x0_i = 0 have v = 0 and
  l_i = -inf); and vbar_i = exp(l_i) * x0_i / ||x0_i||;
* with the per-output maximum m = max_i l_i (the max shift of a log-sum-exp),
  E_hat = exp(m) / (beta |S|) * sum_i exp(l_i - m) x0_i / ||x0_i||.

Every exp argument is <= 0 except exp(m) <= C, so nothing overflows for finite C; the sum is
one of at most |S| unit vectors with weights in [0, 1], so |E_hat| <= exp(m)/beta. Weights
below e * (smallest normal float) are flushed to 0 (no subnormals: they are slow and below the
resolution next to the max weight 1). The only
rounding to zero is exp(m) itself, which happens only when the true |E_hat| <= exp(m)/beta is
below the smallest positive float, i.e. E_hat is then correctly rounded to 0.

Precision: the matmul form of the distance loses absolute accuracy ~ eps_mach (||x_t||^2 +
||x0||^2) / (2 t^2) in log p to cancellation. In float64 (the default) that is < 1e-6 at
d = 3*64*64, t = 0.002 for data in [-1, 1]. In float32 it is large at small t (measured at
d = 3*64*64, data in [-1, 1]: max |log p error| ~ 100 at t = 0.002, ~ 5 at t = 0.01, ~ 0.2 at
t = 0.05, ~ 0.01 for t >= 0.2), so float32 is offered for speed experiments, not for results.
(Either way each term is clipped to norm C, up to rounding, so the sensitivity bound holds.)

The public normaliser Z(x_t, t) (``normaliser: public_marginal``)
------------------------------------------------------------------
Eq. 38 divides the kernel sum by the public constant beta |S| where the exact denoiser (eq. 37)
divides by the data-dependent marginal p_hat_t(x_t) = (1/n) sum_i p(x_t | x0_i). Read literally,
v = x0 p(x_t | x0) with the normalised kernel is inert in image dimensions: at d = 256 (16x16
digits) p(x_t | x0) <= 1e-54 at every t of the EDM grid, so E_hat rounds to 0 and the private
block adds only noise. The optional ``log_normaliser`` argument rescales every term by a per-output
1/Z(x_t, t) before the clip,

    v(x0; x_t) = x0 p(x_t | x0) / Z(x_t, t),

and :func:`log_public_marginal` supplies Z = p_hat_pub(x_t) = (1/m) sum_j N(x_t; y_j, t^2 I) over a
PUBLIC set {y_j}: eq. 37 with its normaliser estimated on public data, so that with beta = 1 and
public ~ private, E_hat ~ E[x0 | x_t]. This costs no privacy: Z depends only on x_t, t and public
data, so it is a public, adaptively chosen rescaling (like beta), and x_t is the mechanism's own
past output, whose adaptive use adaptive composition already covers. Every term is still clipped
to ||vbar|| <= C, so replacing, adding or removing one record still moves the sum by at most 2C and
the sensitivity 2C/(beta |S|) and mu_t (eq. 39) are unchanged. In the log-space computation it is
one per-output offset: the row term r_i becomes r_i - log Z_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from pipeline.diffusion.steps import eq1_noise_std, eq1_step
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger
# the block's facts (sensitivity, mu_t, mu_bar_B, event) live in one value; sensitivity re-exported
from pipeline.privacy.empden_block import GATHER_MAX_FRACTION, EmpdenBlock, sensitivity  # noqa: F401

LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- the denoiser


@dataclass(frozen=True)
class PreparedData:
    """The private set flattened to [n, d] in the working dtype, with what every step reuses.

    ``unit`` is x0/||x0|| and ``inv_norm`` 1/||x0|| (both 0 for an all-zero record, whose v is
    identically 0); ``log_norm`` is log ||x0|| (-inf for such a record).
    """

    x0: torch.Tensor
    unit: torch.Tensor
    sqnorm: torch.Tensor
    log_norm: torch.Tensor
    inv_norm: torch.Tensor

    @property
    def n(self) -> int:
        return self.x0.shape[0]

    @property
    def d(self) -> int:
        return self.x0.shape[1]


def prepare_records(data: torch.Tensor, *, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> PreparedData:
    """Flatten ``data`` [n, ...] to [n, d] in ``dtype`` on ``device`` and precompute norms and unit vectors."""
    if data.ndim < 2 or data.shape[0] < 1:
        raise ValueError(f"private data must have shape [n, ...] with n >= 1, got {tuple(data.shape)}")
    x0 = data.reshape(data.shape[0], -1).to(device=device, dtype=dtype).contiguous()
    if not torch.isfinite(x0).all():
        raise ValueError("private data contains non-finite values")
    sqnorm = (x0 * x0).sum(dim=1)
    norm = sqnorm.sqrt()
    inv_norm = torch.where(norm > 0, 1.0 / norm, torch.zeros_like(norm))
    return PreparedData(x0=x0, unit=x0 * inv_norm[:, None], sqnorm=sqnorm, log_norm=torch.log(norm),
                        inv_norm=inv_norm)


def _check_inputs(x_t: torch.Tensor, data: PreparedData, t: float, C: float | None = None) -> None:
    if not t > 0:
        raise ValueError(f"noise level t must be > 0, got {t}")
    if C is not None and not C > 0:
        raise ValueError(f"clip norm C must be > 0, got {C}")
    if x_t.ndim != 2 or x_t.shape[1] != data.d:
        raise ValueError(f"x_t must have shape [n_out, {data.d}], got {tuple(x_t.shape)}")


def _log_kernel_row_term(x_t: torch.Tensor, d: int, t: float) -> torch.Tensor:
    """r_i = -||x_t_i||^2 / (2 t^2) - (d/2) log(2 pi t^2): the part of log p that depends on the output only."""
    return (x_t * x_t).sum(dim=1).mul_(-0.5 / t**2).sub_(0.5 * d * (LOG_2PI + 2.0 * math.log(t)))


def log_gaussian_kernel(x_t: torch.Tensor, data: PreparedData, t: float) -> torch.Tensor:
    """log N(x_t; x0, t^2 I) for every (output, record) pair, shape [n_out, n] (EDM kernel).

    = x_t . x0 / t^2 - ||x0||^2 / (2 t^2) + r(x_t): the squared distance expanded, one matmul.
    """
    _check_inputs(x_t, data, t)
    out = torch.addmm((-0.5 / t**2) * data.sqnorm[None, :], x_t, data.x0.T, alpha=1.0 / t**2)
    return out.add_(_log_kernel_row_term(x_t, data.d, t)[:, None])


def _check_log_normaliser(log_normaliser: torch.Tensor | None, x_t: torch.Tensor) -> None:
    if log_normaliser is None:
        return
    if log_normaliser.shape != (x_t.shape[0],):
        raise ValueError(f"log_normaliser must have shape [n_out={x_t.shape[0]}], got {tuple(log_normaliser.shape)}")
    if not torch.isfinite(log_normaliser).all():
        raise ValueError("log_normaliser contains non-finite values")


def _row_term(x_t: torch.Tensor, d: int, t: float, log_normaliser: torch.Tensor | None) -> torch.Tensor:
    """r_i of the kernel, minus log Z_i when a public normaliser divides v (module docstring)."""
    _check_log_normaliser(log_normaliser, x_t)
    r = _log_kernel_row_term(x_t, d, t)
    return r if log_normaliser is None else r.sub_(log_normaliser.to(r.dtype))


def log_public_marginal(x_t: torch.Tensor, public: PreparedData, t: float) -> torch.Tensor:
    """log p_hat_pub(x_t) = log (1/m) sum_j N(x_t; y_j, t^2 I) over the public set {y_j}, shape [n_out].

    The public estimate of eq. 37's normaliser p_hat_t(x_t) (module docstring): passed as
    ``log_normaliser`` it makes E_hat the clipped, subsampled estimate of E[x0 | x_t]. It reads
    only x_t, t and public data, so it costs no privacy. A logsumexp of log kernels: finite at
    any t and d.
    """
    return torch.logsumexp(log_gaussian_kernel(x_t, public, t), dim=1).sub_(math.log(public.n))


def clipped_log_norms_shifted(x_t: torch.Tensor, data: PreparedData, t: float, *, C: float,
                              log_normaliser: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, r) with l = a + r[:, None] = log ||vbar(x0; x_t)|| = min(log p - log Z + log ||x0||, log C) (eq. 5-6 clip).

    a_ij = x_t_i . x0_j / t^2 - ||x0_j||^2 / (2 t^2) + log ||x0_j||, clipped at log C - r_i, comes
    out of one ``addmm`` plus one clamp; the per-output r_i is kept apart (it only moves the max
    shift, to which it is added back), which saves a pass over [n_out, n] and keeps the step near
    matmul speed. ``log_normaliser`` is log Z [n_out] of a public normaliser (None: Z = 1, eq. 38).
    """
    _check_inputs(x_t, data, t, C)
    r = _row_term(x_t, data.d, t, log_normaliser)
    col = data.log_norm - (0.5 / t**2) * data.sqnorm
    a = torch.addmm(col[None, :], x_t, data.x0.T, alpha=1.0 / t**2)
    return a.clamp_(max=(math.log(C) - r)[:, None]), r


#: elements of the gathered [outputs, B, d] block processed at once (bounds the memory).
GATHER_BLOCK_ELEMENTS = 2**24

SubsetMethod = Literal["auto", "mask", "gather"]


def clipped_sum_log_scaled(x_t: torch.Tensor, data: PreparedData, t: float, *, C: float,
                           subset: torch.Tensor | None = None, method: SubsetMethod = "auto",
                           log_normaliser: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_{x0 in S} vbar(x0; x_t) as (log_scale [n_out], direction [n_out, d]), the sum being
    exp(log_scale) * direction (eq. 5-6 clip, summed with the max shift of the module docstring).

    ``log_scale`` = max_i l_i (the largest log clipped norm, <= log C); ``direction`` =
    sum_i exp(l_i - log_scale) x0_i / ||x0_i|| has weights in [0, 1], so it never under- or
    overflows, at any t and d. ``subset`` as in :func:`clipped_empirical_denoiser`; ``method``
    picks how a subset is applied (same result): ``mask`` runs the full [n_out, n] matmuls with
    the other records at weight 0, ``gather`` works on each output's B records only, ``auto``
    gathers when B/n <= GATHER_MAX_FRACTION. ``log_normaliser``: log Z [n_out] of a public
    normaliser dividing every v (module docstring); None is eq. 38's Z = 1.
    """
    if subset is not None:
        if subset.ndim != 2 or subset.shape[0] != x_t.shape[0]:
            raise ValueError(f"subset must have shape [n_out={x_t.shape[0]}, B], got {tuple(subset.shape)}")
        if method not in ("auto", "mask", "gather"):
            raise ValueError(f"subset method must be auto, mask or gather, got {method!r}")
        if method == "gather" or (method == "auto" and subset.shape[1] <= GATHER_MAX_FRACTION * data.n):
            return _clipped_sum_gathered(x_t, data, t, C=C, subset=subset, log_normaliser=log_normaliser)
    a, r = clipped_log_norms_shifted(x_t, data, t, C=C, log_normaliser=log_normaliser)
    if subset is not None:
        # Records outside an output's subset get weight 0 (log -inf); the matmul over all n
        # records keeps the step at matmul speed on any device (the mask costs O(n_out n)).
        masked = torch.full_like(a, -math.inf)
        masked.scatter_(1, subset, a.gather(1, subset))
        a = masked
    m = _finite_or_zero(a.amax(dim=1))
    weights = _shifted_exp(a.sub_(m[:, None]))
    return m + r, weights @ data.unit


def _shifted_exp(shifted: torch.Tensor) -> torch.Tensor:
    """exp of max-shifted logs (all <= 0), in place, with results below e * the smallest normal float
    flushed to exactly 0: subnormal results put exp on a slow path (2-3x slower step measured on
    CPU), and a weight < 1e-37 next to the max weight 1 is below the dtype's resolution anyway."""
    floor = math.log(torch.finfo(shifted.dtype).tiny) + 1.0
    return torch.nn.functional.threshold(shifted, floor, -math.inf, inplace=True).exp_()


def _finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    # all weights -inf (every record is x0 = 0): the sum is 0; shift by 0 to avoid inf - inf
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _clipped_sum_gathered(x_t: torch.Tensor, data: PreparedData, t: float, *, C: float, subset: torch.Tensor,
                          log_normaliser: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`clipped_sum_log_scaled` on each output's own B records, gathered in blocks of outputs.

    The same quantities as the masked path: a_ij = x_t_i . x0_j / t^2 - ||x0_j||^2/(2t^2) +
    log ||x0_j|| clipped at log C - r_i, shifted by its per-output max, for j in S_i only (r_i less
    log Z_i with a public normaliser).
    """
    _check_inputs(x_t, data, t, C)
    r = _row_term(x_t, data.d, t, log_normaliser)
    bound = math.log(C) - r
    col = data.log_norm - (0.5 / t**2) * data.sqnorm
    rows = max(1, GATHER_BLOCK_ELEMENTS // (subset.shape[1] * data.d))
    logs, directions = [], []
    for s in range(0, x_t.shape[0], rows):
        idx, x = subset[s:s + rows], x_t[s:s + rows]
        xs = data.x0[idx]  # [b, B, d]
        a = torch.bmm(xs, x[:, :, None]).squeeze(2).mul_(1.0 / t**2).add_(col[idx])
        a = a.clamp_(max=bound[s:s + rows, None])
        m = _finite_or_zero(a.amax(dim=1))
        weights = _shifted_exp(a.sub_(m[:, None])).mul_(data.inv_norm[idx])
        logs.append(m)
        directions.append(torch.bmm(weights[:, None, :], xs).squeeze(1))
    return torch.cat(logs) + r, torch.cat(directions)


def clipped_empirical_denoiser(x_t: torch.Tensor, data: PreparedData, t: float, *, C: float, beta: float,
                               subset: torch.Tensor | None = None, method: SubsetMethod = "auto",
                               log_normaliser: torch.Tensor | None = None) -> torch.Tensor:
    """E_hat(x_t) = (1/(beta |S|)) sum_{x0 in S} vbar(x0; x_t), batched over outputs (EMPDEN eq. 38).

    ``x_t`` is [n_out, d] (flattened, in ``data``'s dtype and device). ``subset`` is None for the
    full batch (S = D) or an index tensor [n_out, B] of each output's own records (Algorithm 1,
    line 3: drawn by the caller once per output and reused). Computed in log space as described in
    the module docstring; the result is [n_out, d]. Its only rounding to 0 is exp(log_scale) when
    the true value is below the smallest float (e.g. t = 80 at d = 3*64*64 with beta = 1).
    ``log_normaliser`` (log Z [n_out], e.g. :func:`log_public_marginal`) divides every v by a public
    Z(x_t, t) before the clip; the sensitivity 2C/(beta |S|) is unchanged (module docstring).
    """
    if not beta > 0:
        raise ValueError(f"public normaliser beta must be > 0, got {beta}")
    size = data.n if subset is None else subset.shape[-1]
    log_scale, direction = clipped_sum_log_scaled(x_t, data, t, C=C, subset=subset, method=method,
                                                  log_normaliser=log_normaliser)
    return direction * (torch.exp(log_scale)[:, None] / (beta * size))


def empirical_posterior_mean(x_t: torch.Tensor, data: PreparedData, t: float) -> torch.Tensor:
    """Unclipped, exactly normalised empirical denoiser E[x0 | x_t] (EMPDEN eq. 4 / eq. 37).

    softmax_i(-||x_t - x0_i||^2 / (2 t^2)) @ x0: the Bayes denoiser of the empirical measure. Not
    private -- used for the proxy diagnostics (Table 4, Figure 1) and as a test reference.
    """
    weights = torch.softmax(log_gaussian_kernel(x_t, data, t), dim=1)
    return weights @ data.x0


def draw_subsets(n: int, B: int, n_out: int, *, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """One uniformly random B-subset of range(n) per output, as an index tensor [n_out, B].

    Fixed-size sampling without replacement (Algorithm 1, line 3); each row is a uniform subset
    because it is the first B entries of a uniform random permutation (argsort of iid uniforms).
    """
    if not 1 <= B <= n:
        raise ValueError(f"subsample size B must be in [1, n={n}], got {B}")
    if n_out < 1:
        raise ValueError(f"number of outputs must be >= 1, got {n_out}")
    keys = torch.rand(n_out, n, generator=generator, device=device or "cpu")
    return keys.argsort(dim=1)[:, :B].to(device=device)


# --------------------------------------------------------------------------- the Gaussian mechanism


def mechanism_noise_std(t: float, t_next: float) -> float:
    """Std of the Gaussian mechanism of eq. 6 (the sampler noise rescaled by t/(2 dt)): sqrt(t^3/(2 dt))."""
    return eq1_noise_std(t, t_next) * t / (2.0 * (t - t_next))


def private_step(x: torch.Tensor, data: PreparedData, t: float, t_next: float, *, C: float, beta: float,
                 subset: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 log_normaliser: torch.Tensor | None = None) -> torch.Tensor:
    """One private EDM step x_t -> x_{t_next} with the clipped empirical denoiser (eq. 1 with eq. 38).

    x <- (1 - 2dt/t) x + (2dt/t) E_hat(x) + sqrt(2 t dt) eps. The noise is the mechanism's noise
    (eq. 6): it must never be switched off or scaled down, or the step's mu_t no longer holds.
    ``log_normaliser``: log Z(x, t) [n_out] of a public normaliser (:func:`log_public_marginal`), or None.
    """
    e_hat = clipped_empirical_denoiser(x, data, t, C=C, beta=beta, subset=subset, log_normaliser=log_normaliser)
    eps = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return eq1_step(x, e_hat, t, t_next, eps)


# --------------------------------------------------------------------------- ledger lines


@dataclass(frozen=True)
class LedgerSink:
    """Where a sampler run records its ledger line, and how its eps is claimed.

    ``accountant`` is a certified accountant (``pld_pessimistic`` or ``rdp``; the full-batch
    sampler always uses exact ``gdp`` composition). ``pld`` defaults to the paper's settings
    (h = 1e-5, truncation e^-50, EMPDEN App. G).
    """

    path: Path
    stage: str
    config_id: str
    seed: int
    delta: float
    accountant: Literal["pld_pessimistic", "rdp"] = "pld_pessimistic"
    pld: acc.PLDSettings = field(default_factory=acc.PLDSettings)
    #: the run, experiment and private split the lines are bound to (the stages always give it)
    binding: ledger.Binding | None = None
    #: the position of the sink's first line in its run's transcript: a shard of a sharded cell writes line
    #: ``shard.index`` of the transcript its gather joins (pipeline.shards)
    first_seq: int = 0
    #: facts added to every line's ``extra`` (a shard's index and outputs)
    extra: dict = field(default_factory=dict)


def claim_epsilon(sink: LedgerSink, block: EmpdenBlock) -> tuple[float, dict]:
    """The eps (and the accountant's description) ``block``'s line claims under ``sink``'s settings, written
    nowhere: what :func:`record_block` claims (a sharded cell's gather states its whole block's with it). A
    full-batch block composes exactly in GDP (Sec. 3.2), the others by the sink's accountant."""
    m = block.mechanism()
    if block.scheme == "full_batch":
        return acc.gdp_epsilon(sink.delta, acc.gdp_mu_of_event(m.event)), {"name": "gdp"}
    if sink.accountant == "pld_pessimistic":
        return (acc.pld_epsilon(m.event, sink.delta, settings=sink.pld),
                {"name": "pld_pessimistic", **acc.describe(sink.pld)})
    if sink.accountant == "rdp":
        return acc.rdp_epsilon(m.event, sink.delta), {"name": "rdp"}
    raise ValueError(f"ledger accountant must be pld_pessimistic or rdp, got {sink.accountant!r}")


def _claim(sink: LedgerSink, block: EmpdenBlock, *, extra: dict) -> ledger.LedgerEntry:
    """Build, validate and append the block's ledger line; eps comes from the accountants, never from here."""
    m = block.mechanism()
    eps, accountant = claim_epsilon(sink, block)
    entry = ledger.LedgerEntry(
        stage=sink.stage, mechanism=block.mechanism_name, event=ledger.event_to_dict(m.event),
        sensitivity=m.sensitivity, noise_std=m.sensitivity / m.mu_core, sampling=block.sampling(),
        adjacency="add_or_remove_one", count=block.N_out, delta=sink.delta, claimed_epsilon=eps,
        accountant=accountant, config_id=sink.config_id, seed=sink.seed, extra={**extra, **sink.extra})
    return ledger.append_entry(sink.path, entry, sink.binding, first_seq=sink.first_seq)


#: how v is normalised: ``constant`` is eq. 38 literally (Z = 1), ``public_marginal`` divides by
#: the public estimate of eq. 37's p_hat_t(x_t) (:func:`log_public_marginal`). Neither changes the claim.
Normaliser = Literal["constant", "public_marginal"]
NORMALISERS: tuple[str, ...] = ("constant", "public_marginal")


def record_block(sink: LedgerSink, block: EmpdenBlock, *, normaliser: Normaliser = "constant") -> ledger.LedgerEntry:
    """The ledger line of a sampler run whose private part is ``block`` (its event, parameters and eps).

    * ``per_output`` (Algorithm 1, Prop. 4.1): one B-subset per output reused over the k-step
      block, one Gaussian with mu_bar_B (eq. 9) amplified once by q_B = B/n, composed over N_out;
    * ``per_step`` (Prop. C.1): a fresh B-subset at every private step, each mu_t amplified by B/n;
    * ``full_batch`` (Sec. 3.2): every step touches every record, so the k Gaussian mechanisms of
      every output compose exactly in GDP: mu = sqrt(N_out sum_i mu_ti^2).
    """
    if normaliser not in NORMALISERS:
        raise ValueError(f"normaliser must be one of {', '.join(NORMALISERS)}, got {normaliser!r}")
    extra = {**block.schedule_extra(), "normaliser": normaliser}
    if block.scheme == "full_batch":
        return _claim(sink, block, extra={**extra, "mu_total": acc.gdp_mu_of_event(block.event),
                                          "section": "EMPDEN Sec. 3.2"})
    if block.scheme == "per_output":
        return _claim(sink, block, extra={**extra, "mu_bar_B": block.mu_bar_B, "proposition": "EMPDEN Prop. 4.1"})
    return _claim(sink, block, extra={**extra, "proposition": "EMPDEN Prop. C.1"})

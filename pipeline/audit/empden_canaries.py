"""White-box one-run audit of an EMPDEN sampling-time block at a line's declared parameters.

What is audited is the mechanism an EMPDEN sampler line declares (``empden_outputwise_block``:
Algorithm 1 / Prop. 4.1; ``empden_per_step_subsampled``: Prop. C.1; ``empden_full_batch``: Sec. 3.2),
run by the code that sampled: :func:`pipeline.privacy.empirical_denoiser.private_step` (the
B-subset of each output, the clipped empirical denoiser of eq. 38, the division by beta |S|, the
eq. 1 step whose noise is the mechanism's) along the line's k-step grid for its N_out outputs.
The audit feeds it a data set of its own (Steinke, Nasr & Jagielski 2023, Sec. 7):

* ``n`` stand-ins (the line's n; random vectors, nobody's data) in ``RECORD_DIM`` coordinates of
  their own, so every output's subsets mix records of every kind as in sampling;
* ``m`` Dirac canaries, each included independently with probability 1/2: canary j is the record
  ``CANARY_NORM_FACTOR * C * e_j`` in a coordinate no stand-in touches.

The audit's public normaliser Z (any function of x_t and public data is allowed: module docstring
of :mod:`pipeline.privacy.empirical_denoiser`) is a constant so small that every record's term
v = x0 p(x_t | x0) / Z is clipped, i.e. every included canary in an output's subset adds exactly
C e_j / (beta |S|) to that output's denoiser at every step: the largest contribution the clip
allows. With n stand-ins plus the included canaries the data set is never smaller than the line's n,
so each record's subsampling rate is at most the declared B/n.

The attacker (white box) sees every step's release, Y = E_hat + N(0, s_t^2) with s_t the
mechanism's std (:func:`~pipeline.privacy.empirical_denoiser.mechanism_noise_std`; Y is read
back from x_t and x_{t_next} exactly as eq. 1 wrote them), and scores canary j by
``sum over outputs and steps of Y[j] / s_t^2`` (the likelihood-ratio weight; it does not know
which outputs' subsets held the canary). The one-run bound turns the scores into eps_lb. A correct
sampler gives eps_lb <= the certified eps (with probability >= 95%; in practice far below); a
sampler without its noise shows an eps_lb above it (tests/audit/test_empden_canaries.py).

The audit reads no private data: no privacy cost, no ledger line.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.audit.one_run import AuditError, CanaryAudit, canary_audit, check_canaries
from pipeline.audit.hooks import AuditResult, register_audit
from pipeline.privacy import rebuild
from pipeline.privacy.empden_block import MECHANISM_NAMES
from pipeline.privacy.ledger import LedgerEntry
from pipeline.stage import PipelineError
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.empden_block import EmpdenBlock

#: width of a stand-in record
RECORD_DIM = 16
#: canary norm over the clip C (any norm works: the audit's normaliser makes every term clip)
CANARY_NORM_FACTOR = 10.0
#: log Z of the audit's public normaliser: every v = x0 p / Z is then far above any clip
LOG_Z = -1.0e6
#: outputs run at once (memory: [outputs, n + m] weights)
BATCH_SIZE = 256

Step = Callable[..., torch.Tensor]


def _dataset(n: int, canary_ids: torch.Tensor, m: int, canary_norm: float, generator: torch.Generator) -> torch.Tensor:
    """n stand-ins (last RECORD_DIM coordinates) then the included canaries (canary j: canary_norm e_j)."""
    x0 = torch.zeros(n + len(canary_ids), m + RECORD_DIM, dtype=torch.float64)
    x0[:n, m:] = torch.randn(n, RECORD_DIM, generator=generator, dtype=torch.float64)
    x0[n + torch.arange(len(canary_ids)), canary_ids] = canary_norm
    return x0


def audit_block(block: EmpdenBlock, *, certified_epsilon: float, delta: float, m: int = 1000, seed: int = 0,
                significance: float = 0.05, step: Step = emp.private_step) -> CanaryAudit:
    """Run the block's k private steps for its N_out outputs over stand-ins and the included canaries.

    ``step`` is the private step under audit (tests pass a broken one to show the audit catches it).
    """
    check_canaries(m)
    if block.k < 1:
        raise AuditError("an EMPDEN block of 0 private steps releases nothing to audit")
    gen = torch.Generator().manual_seed(seed)
    included = torch.rand(m, generator=gen) < 0.5
    C = block.C_eff
    data = emp.prepare_records(_dataset(block.n, torch.nonzero(included).flatten(), m, CANARY_NORM_FACTOR * C, gen))
    times = block.schedule.times()[: block.k + 1]
    scores = torch.zeros(m, dtype=torch.float64)
    for start in range(0, block.N_out, BATCH_SIZE):
        b = min(BATCH_SIZE, block.N_out - start)
        x = block.schedule.sigma_max * torch.randn((b, data.d), generator=gen, dtype=torch.float64)
        log_z = torch.full((b,), LOG_Z, dtype=torch.float64)
        subset = emp.draw_subsets(data.n, block.B, b, generator=gen) if block.scheme == "per_output" else None
        for t, t_next in zip(times[:-1].tolist(), times[1:].tolist()):
            if block.scheme == "per_step":
                subset = emp.draw_subsets(data.n, block.B, b, generator=gen)
            x_next = step(x, data, t, t_next, C=C, beta=block.beta, subset=subset, generator=gen, log_normaliser=log_z)
            two_dt_over_t = 2.0 * (t - t_next) / t
            # eq. 1 read backwards: Y = E_hat + N(0, s_t^2), the step's Gaussian mechanism
            released = (x_next - (1.0 - two_dt_over_t) * x) / two_dt_over_t
            scores += released[:, :m].sum(dim=0) / emp.mechanism_noise_std(t, t_next) ** 2
            x = x_next
    return canary_audit(scores.numpy(), included.numpy(), delta=delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=block.k, canary_norm=CANARY_NORM_FACTOR * C)


@register_audit(*MECHANISM_NAMES.values())
def audit_empden_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """An EMPDEN sampler line: the private sampler step for the block's k steps and N_out outputs. The accounting
    tables' configuration claims (App. G: no sampler ran) are not audited."""
    if entry.extra.get("source") == "given":
        if entry.extra.get("kind") != "configuration_claim":
            # a sampler's line is audited as the block its parameters declare; "given" would skip exactly that
            raise PipelineError(f"stage audit_one_run: {entry.stage} line ({entry.mechanism}) carries a mu_bar_B "
                                f"given directly, which only the accounting tables' configuration claims may")
        return f"{entry.mechanism} configuration claims (no sampler ran)"
    block = rebuild.empden_block(entry)
    audit = audit_block(block, certified_epsilon=entry.claimed_epsilon, delta=entry.delta, m=m,
                        significance=significance, seed=seed)
    return audit, {"sampling_rate": block.mechanism().q, "attack": "white-box Dirac canaries in the denoiser"}

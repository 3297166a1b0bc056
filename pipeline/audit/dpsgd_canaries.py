"""White-box one-run audit of the DP-SGD engine at a run's declared plan (Steinke et al. 2023, Sec. 7).

What is audited is the mechanism a DP-SGD ledger line declares, run by the code that trained
the model: :class:`pipeline.privacy.dpsgd.DPSGD` samples the batch, clips every example's
gradient, sums, adds the plan's Gaussian noise and divides, step after step, exactly as in
training. The audit feeds it a data set of its own:

* ``N`` stand-in records (the plan's N; random vectors, nobody's data) whose loss is a small
  least-squares fit, so batches mix records of every kind as in training;
* ``m`` Dirac canaries (Steinke et al. Sec. 7, "gradient space"), each included independently
  with probability 1/2. Canary j's loss is ``g * theta_c[j]`` for a parameter vector
  ``theta_c`` that no stand-in touches, so its gradient is ``g e_j`` with ``g`` well above every
  clip (the clip must bring it down to ``C_t``).

The attacker sees every released gradient (white box) and scores canary j by
``sum_t w_t D_t ghat_t[j]`` with ``w_t = C_t / s_t^2`` (the likelihood-ratio weight of a step
with clip ``C_t`` and noise std ``s_t``; constant for plain DP-SGD) and ``D_t`` the step's
public divisor. Scores of included canaries are "in", the others "out"; the one-run bound
(:mod:`pipeline.audit.one_run`) turns them into eps_lb at 95% confidence. A correct engine
gives eps_lb <= the certified eps (with probability >= 95%; the bound is loose, so in practice
far below); an engine that drops the noise, skips the clip or samples more than q shows an
eps_lb above it (tests/audit/test_dpsgd_canaries.py).

The audit never reads private data, so it spends no privacy budget and writes no ledger line.
The model does not move (no optimizer step): the guarantee of DP-SGD holds for any, adaptively
chosen, sequence of models, so a fixed one audits the same mechanism.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pipeline.audit.one_run import AuditError, CanaryAudit, canary_audit, check_canaries
from pipeline.audit.hooks import AuditResult, register_audit
from pipeline.privacy import ledger, rebuild, tha
from pipeline.privacy import dpsgd

#: width of a stand-in record
RECORD_DIM = 16
#: canary gradient norm over the largest clip of the plan: any per-example clip brings it down
CANARY_NORM_FACTOR = 10.0


class _AuditModel(nn.Module):
    """A least-squares head for the stand-ins and one coordinate per canary."""

    def __init__(self, m: int, canary_norm: float, generator: torch.Generator) -> None:
        super().__init__()
        self.head = nn.Parameter(torch.randn(RECORD_DIM, generator=generator) / math.sqrt(RECORD_DIM))
        self.theta_c = nn.Parameter(torch.zeros(m))
        self.canary_norm = canary_norm

    def forward(self, x: Tensor, target: Tensor, canary: Tensor) -> Tensor:
        """One record's loss: the fit for a stand-in (canary = -1), ``g theta_c[j]`` for canary j."""
        fit = 0.5 * ((x * self.head).sum(-1) - target) ** 2
        # a comparison, not F.one_hot: one_hot reads its index as a Python int, which vmap forbids
        one_hot = (torch.arange(self.theta_c.shape[0], device=x.device) == canary).to(x.dtype)
        dirac = self.canary_norm * (one_hot * self.theta_c).sum(-1)
        return torch.where(canary >= 0, dirac, fit)


def _example_loss(model_fn: Callable[..., Tensor], x: Tensor, target: Tensor, canary: Tensor) -> Tensor:
    return model_fn(x, target, canary)


def with_dataset_size(plan: dpsgd.StepPlan, n: int) -> dpsgd.StepPlan:
    """``plan`` over a data set of ``n`` records: same q, clips, noise and T (the same eps under Poisson
    sampling, whose accounting does not involve N); only the public divisor q N changes."""
    return dataclasses.replace(plan, dataset_size=n)  # type: ignore[type-var]


def auditable(plan: dpsgd.StepPlan) -> bool:
    """Whether the one-run audit applies: Poisson sampling (add/remove), where a canary is simply in or out."""
    return getattr(plan, "sampling", "poisson") == "poisson"


def audit_plan(plan: dpsgd.StepPlan, *, certified_epsilon: float, m: int = 1000, seed: int = 0,
               significance: float = 0.05, microbatch_size: int = 256,
               engine_factory: Callable[..., dpsgd.DPSGD] = dpsgd.DPSGD) -> CanaryAudit:
    """Run the engine for ``plan.steps`` steps over N stand-ins and the included canaries; bound eps.

    ``engine_factory`` is the engine class (tests pass a broken one to show the audit catches it).
    Only Poisson plans (add/remove adjacency: a canary is in the data or not) are audited.
    """
    if not auditable(plan):
        raise AuditError(f"the one-run canary audit needs a Poisson plan (add/remove), got {plan.sampling!r}")
    check_canaries(m)
    gen = torch.Generator().manual_seed(seed)
    included = torch.rand(m, generator=gen) < 0.5
    in_ids = torch.nonzero(included).flatten()
    n_base = int(plan.dataset_size)
    n = n_base + len(in_ids)
    audited = with_dataset_size(plan, n)

    # stand-ins with norms around the clips: some clipped, some not, as in training
    x = torch.randn(n, RECORD_DIM, generator=gen)
    target = torch.randn(n, generator=gen)
    canary = torch.full((n,), -1, dtype=torch.long)
    canary[n_base:] = in_ids
    max_clip = max(audited.clip_at(t) for t in range(audited.steps))
    canary_norm = CANARY_NORM_FACTOR * max_clip
    model = _AuditModel(m, canary_norm, gen)
    engine = engine_factory(model, _example_loss, audited, microbatch_size=microbatch_size, generator=gen,
                            noise_generator=torch.Generator().manual_seed(seed + 1))
    divisor = audited.expected_batch_size
    scores = torch.zeros(m, dtype=torch.float64)
    for t in range(audited.steps):
        engine.steps_taken = t
        grads, _ = engine.privatised_gradient((x, target, canary), engine.sample())
        clip, std = audited.clip_at(t), audited.noise_std_at(t)
        weight = clip / std ** 2 if std > 0 else 1.0 / clip
        scores += weight * divisor * grads["theta_c"].detach().to(torch.float64)
    return canary_audit(scores.numpy(), included.numpy(), delta=audited.delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=audited.steps, canary_norm=canary_norm)


#: mechanism name -> the plan its ledger line declares (the code the replay rebuilds it with)
STEP_PLANS: dict[str, Callable[[ledger.LedgerEntry], dpsgd.StepPlan]] = {
    "dpsgd": rebuild.dpsgd_plan,
    tha.MECHANISM: tha.plan_from_entry,
}


@register_audit(*STEP_PLANS)
def audit_dpsgd_line(entry: ledger.LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A DP-SGD line (``dpsgd``: DPDM; ``tha_dpsgd``: STRAIGHTDP's Stage 2): the training engine for the plan's T
    steps. Fixed-size (replace-one) batches are not audited: the canary audit needs Poisson sampling."""
    plan = STEP_PLANS[entry.mechanism](entry)
    if not auditable(plan):
        return f"{entry.mechanism} with fixed-size batches"
    audit = audit_plan(plan, certified_epsilon=entry.claimed_epsilon, m=m, significance=significance, seed=seed)
    return audit, {"sampling_rate": plan.sampling_rate, "attack": "white-box Dirac gradient canaries"}

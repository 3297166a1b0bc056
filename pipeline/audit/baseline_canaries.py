"""White-box one-run audits of the baselines' releases: DP-MERF's mean embedding (and its successors',
DP-HP, DP-NTK and DP-MEPF: :func:`audit_embedding`, the same canaries) and Private Evolution's vote
histograms, each at a line's declared parameters (Steinke, Nasr & Jagielski 2023).

**DP-MERF** (``dp_merf_embedding``; :func:`pipeline.privacy.dp_merf.release`, replace-one over a
public m). The release is run once over m records: ``plan.m - n_canaries`` stand-ins (unit feature
rows in ``RECORD_DIM`` coordinates of their own) and one slot per canary. Replace-one is audited
with paired canaries (the one-run theorem needs only that the two choices of a slot are
neighbours): slot j holds the record whose feature is ``+e_j`` ("in") or the one whose feature is
``-e_j`` ("out"), both of norm 1 like every random-Fourier row, with label ``j mod Y``; the pair
moves the embedding by 2/m, the declared sensitivity. The release's sensitivity does not depend on
the number of features D, so the audit runs at one feature coordinate per canary. Canary j's score
is its released coordinate ``mu~[j, j mod Y]``. The random-Fourier map itself is not rerun: the
release's own check that every row has norm 1 is what its sensitivity rests on.

**Private Evolution** (``pe_nn_histogram``; :func:`~pipeline.privacy.private_evolution.nn_votes`,
``vote_histogram`` and ``noisy_histogram``, add-or-remove-one). T rounds of the histogram over n
stand-ins (the line does not declare n: the embedded private split's 2,500) voting among stand-in
candidates, plus each included canary, which sits exactly on a candidate of its own (so it votes
for it: one vote, the declared sensitivity 1). The threshold is 0 (thresholding is
post-processing; a positive one only hides votes from the attacker). Canary j's score is the sum
over rounds of its candidate's released count.

**PrivImage** (``privimage_semantic_histogram``; :func:`~pipeline.privacy.semantic_histogram.semantic_counts`
and ``noisy_histogram``, add-or-remove-one). One release over n stand-ins voting among stand-in semantics, plus each
included canary j, which votes for k semantics of its own (``j k .. j k + k - 1``) in row ``j mod Y``: k cells moved
by 1, the declared sensitivity sqrt(k). Canary j's score is the sum of its k cells' released counts.

A correct release gives eps_lb <= the certified eps (with probability >= 95%); one without its
noise shows an eps_lb above it (tests/audit/test_baseline_canaries.py). No private data is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from pipeline.audit.one_run import AuditError, CanaryAudit, canary_audit, check_canaries
from pipeline.audit.hooks import AuditResult, register_audit
from pipeline.privacy.ledger import LedgerEntry
from pipeline.privacy import dp_merf, mean_embedding
from pipeline.privacy import private_evolution as pe
from pipeline.privacy import semantic_histogram as sh

#: width of a stand-in record's block of coordinates
RECORD_DIM = 16
#: private records of the PE audit (its line declares no n; the embedded private split's size)
PE_STANDINS = 2500
#: stand-in candidates per class of the PE audit
PE_CANDIDATES_PER_CLASS = 8
#: classes of the PE audit's stand-ins and canaries
PE_CLASSES = 10

MerfRelease = Callable[..., torch.Tensor]
Histogram = Callable[..., np.ndarray]
SemanticRelease = Callable[..., np.ndarray]


def _feature_canaries(n_records: int, m: int, n_classes: int, dim: int, gen: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phi [n_records, dim], labels, included [m]): stand-in unit rows in RECORD_DIM coordinates of their own, then
    m paired canary slots, slot j holding +e_j ("in") or -e_j ("out") with label j mod Y."""
    included = torch.rand(m, generator=gen) < 0.5
    n_base = n_records - m
    phi = torch.zeros(n_records, dim, dtype=torch.float64)
    standin = torch.randn(n_base, RECORD_DIM, generator=gen, dtype=torch.float64)
    phi[:n_base, m:m + RECORD_DIM] = standin / standin.norm(dim=1, keepdim=True)
    j = torch.arange(m)
    phi[n_base + j, j] = torch.where(included, 1.0, -1.0).to(torch.float64)
    labels = torch.cat([torch.randint(0, n_classes, (n_base,), generator=gen), j % n_classes])
    return phi, labels, included


def audit_merf(plan: dp_merf.MerfReleasePlan, *, certified_epsilon: float, m: int = 1000, seed: int = 0,
               significance: float = 0.05, release: MerfRelease = dp_merf.release) -> CanaryAudit:
    """DP-MERF's release once over stand-ins and m paired canary slots (``release`` is what is audited)."""
    check_canaries(m)
    if m >= plan.m:
        raise AuditError(f"the DP-MERF audit puts its {m} canaries among the line's m = {plan.m} records: "
                         f"use fewer canaries (audit.canaries)")
    gen = torch.Generator().manual_seed(seed)
    n_features = -(-(m + RECORD_DIM) // 2)
    audited = dataclasses.replace(plan, n_features=n_features)
    phi, labels, included = _feature_canaries(plan.m, m, plan.n_classes, 2 * n_features, gen)
    released = release(phi, labels, audited, generator=gen)
    j = torch.arange(m)
    return canary_audit(released[j, j % plan.n_classes].numpy(), included.numpy(), delta=plan.delta,
                        significance=significance, certified_epsilon=certified_epsilon, steps=1, canary_norm=1.0)


def audit_embedding(plan: mean_embedding.EmbeddingReleasePlan, *, certified_epsilon: float, m: int = 1000,
                    seed: int = 0, significance: float = 0.05,
                    release: MerfRelease = mean_embedding.release) -> CanaryAudit:
    """A DP-HP, DP-NTK or DP-MEPF release (:func:`pipeline.privacy.mean_embedding.release`) once over stand-ins and
    m paired canary slots, as DP-MERF's: the sensitivity 2/m holds for any rows of norm <= 1, so the audit runs
    at one feature coordinate per canary whatever the method's map."""
    check_canaries(m)
    if m >= plan.m:
        raise AuditError(f"the {plan.mechanism} audit puts its {m} canaries among the line's m = {plan.m} records: "
                         f"use fewer canaries (audit.canaries)")
    gen = torch.Generator().manual_seed(seed)
    audited = dataclasses.replace(plan, feature_dim=m + RECORD_DIM)
    phi, labels, included = _feature_canaries(plan.m, m, plan.n_classes, audited.feature_dim, gen)
    released = release([(phi, labels)], audited, generator=gen)
    j = torch.arange(m)
    return canary_audit(released[j, j % plan.n_classes].numpy(), included.numpy(), delta=plan.delta,
                        significance=significance, certified_epsilon=certified_epsilon, steps=1, canary_norm=1.0)


def audit_pe(plan: pe.PEHistogramPlan, *, certified_epsilon: float, m: int = 1000, seed: int = 0,
             significance: float = 0.05, histogram: Histogram = pe.noisy_histogram) -> CanaryAudit:
    """PE's T histogram rounds over stand-ins and the included canaries (``histogram`` is what is audited)."""
    check_canaries(m)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    included = torch.rand(m, generator=gen) < 0.5
    dim = m + RECORD_DIM
    # candidates: one per canary (canary j sits on candidate j), then the stand-ins' candidates
    n_stand_cand = PE_CANDIDATES_PER_CLASS * PE_CLASSES
    candidates = torch.zeros(m + n_stand_cand, dim, dtype=torch.float64)
    candidates[torch.arange(m), torch.arange(m)] = 1.0
    candidates[m:, m:] = torch.randn(n_stand_cand, RECORD_DIM, generator=gen, dtype=torch.float64)
    candidate_labels = torch.cat([torch.arange(m) % PE_CLASSES, torch.arange(n_stand_cand) % PE_CLASSES])
    ids = torch.nonzero(included).flatten()
    private = torch.zeros(PE_STANDINS + len(ids), dim, dtype=torch.float64)
    private[:PE_STANDINS, m:] = torch.randn(PE_STANDINS, RECORD_DIM, generator=gen, dtype=torch.float64)
    # stand-ins sit in their own coordinates, far from every canary's candidate (distance >= 1)
    private[:PE_STANDINS, m:] += 10.0
    candidates[m:, m:] += 10.0
    private[PE_STANDINS + torch.arange(len(ids)), ids] = 1.0
    private_labels = torch.cat([torch.randint(0, PE_CLASSES, (PE_STANDINS,), generator=gen), ids % PE_CLASSES])
    counts = pe.vote_histogram(pe.nn_votes(private, private_labels, candidates, candidate_labels), len(candidates))
    scores = np.zeros(m)
    for _ in range(plan.T):
        scores += histogram(counts, plan, threshold=0.0, generator=rng)[:m]
    return canary_audit(scores, included.numpy(), delta=plan.delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=plan.T, canary_norm=1.0)


def audit_semantic_histogram(plan: sh.SemanticQueryPlan, *, certified_epsilon: float, m: int = 1000, seed: int = 0,
                             significance: float = 0.05, histogram: SemanticRelease = sh.noisy_histogram
                             ) -> CanaryAudit:
    """PrivImage's semantic histogram over stand-ins and the included canaries (``histogram`` is what is audited)."""
    check_canaries(m)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    included = (torch.rand(m, generator=gen) < 0.5).numpy()
    k = plan.k
    n_standin_semantics = PE_CANDIDATES_PER_CLASS + k
    n_semantics = m * k + n_standin_semantics  # the canaries' own semantics, then the stand-ins'
    # each stand-in's k distinct votes: the first k of a random order of the stand-ins' semantics
    standin = m * k + np.argsort(rng.random((PE_STANDINS, n_standin_semantics)), axis=1)[:, :k]
    ids = np.flatnonzero(included)
    canary_votes = ids[:, None] * k + np.arange(k)[None, :]
    votes = np.concatenate([standin, canary_votes])
    labels = np.concatenate([rng.integers(0, PE_CLASSES, size=PE_STANDINS), ids % PE_CLASSES])
    released = histogram(sh.semantic_counts(votes, labels, n_classes=PE_CLASSES, n_semantics=n_semantics), plan,
                         generator=rng)
    j = np.arange(m)
    scores = released[(j % PE_CLASSES)[:, None], j[:, None] * k + np.arange(k)[None, :]].sum(axis=1)
    return canary_audit(scores, included, delta=plan.delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=1, canary_norm=plan.sensitivity)


@register_audit(dp_merf.MECHANISM)
def audit_merf_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A DP-MERF line: the mean-embedding release over the line's m records."""
    plan = dp_merf.plan_from_entry(entry)
    # the canaries are slots among the line's m records (replace-one): at most half of them
    audit = audit_merf(plan, certified_epsilon=entry.claimed_epsilon, m=min(m, plan.m // 2),
                       significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box paired feature canaries (replace-one)"}


@register_audit(*mean_embedding.MECHANISMS)
def audit_embedding_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A DP-HP, DP-NTK or DP-MEPF line: the mean-embedding release over the line's m records."""
    plan = mean_embedding.plan_from_entry(entry)
    audit = audit_embedding(plan, certified_epsilon=entry.claimed_epsilon, m=min(m, plan.m // 2),
                            significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box paired feature canaries (replace-one)"}


@register_audit(pe.MECHANISM)
def audit_pe_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A Private Evolution line: its T vote histograms."""
    audit = audit_pe(pe.plan_from_entry(entry), certified_epsilon=entry.claimed_epsilon, m=m,
                     significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box vote canaries"}


@register_audit(sh.MECHANISM)
def audit_semantic_histogram_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A PrivImage semantic-query line: its one histogram release."""
    audit = audit_semantic_histogram(sh.plan_from_entry(entry), certified_epsilon=entry.claimed_epsilon, m=m,
                                     significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box semantic-vote canaries"}

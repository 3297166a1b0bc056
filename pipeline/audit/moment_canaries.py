"""White-box one-run audit of STRAIGHTDP's moment release (Prop. B.9) at a line's declared plan.

What is audited is the mechanism a ``moment_release`` ledger line declares, run by the code that
released the moments: records pass through :meth:`pipeline.privacy.moments.PublicGeometry.features`
(projection and the clip to the R-ball) and :func:`pipeline.privacy.moments.release` (the whitened
class statistic u and the second moment M2, each plus its Gaussian noise), with the line's sigma,
R, N and Y. The audit feeds it a data set of its own (Steinke, Nasr & Jagielski 2023, Sec. 7):

* ``RECORD_DIM``-dimensional stand-ins (random vectors, nobody's data), ``N`` of them, some inside
  the ball and some clipped, living in feature coordinates no canary touches;
* ``m`` Dirac canaries, each included independently with probability 1/2: canary j is the record
  ``CANARY_NORM_FACTOR * R * e_j`` in a coordinate of its own, so the clip must bring it down to
  ``R e_j``; its class is ``j mod Y``.

The release's privacy does not depend on the PCA rank p (the sensitivities 2 and 2R^2/N hold for
every p), so the audit runs the plan at ``p = m + RECORD_DIM``, one coordinate per canary. The
attacker (white box: it knows the stand-ins, which touch none of the canary coordinates) scores
canary j by the likelihood-ratio statistic of its two coordinates,
``(1/2) u~[y_j, j] / std_u^2 + (R^2/N) M2~[j, j] / std_M2^2`` (an included canary moves the
whitened sum by 1/2 and the diagonal of M2 by R^2/N). The one-run bound turns the scores into
eps_lb. A correct release gives eps_lb <= the certified eps (with probability >= 95%; the bound is
loose, and a canary moves the release by less than the declared worst case, so in practice far
below); a release without its noise, or whose noise is far below the declared std, shows an eps_lb
above it (tests/audit/test_moment_canaries.py).

The text-conditional release (Prop. B.10, a ``text_moment_release`` line) is audited the same way by
:func:`audit_text_release`: canary j is the image feature ``CANARY_NORM_FACTOR * R * e_j`` (clipped to
``R e_j``) in a coordinate of its own with the caption ``R_txt * e_0``, so an included canary moves the
whitened cross moment M_zc / (R R_txt) at [j, 0] by exactly 1/N, and nothing else touches that entry;
the score is that noisy entry over its noise variance. (M_cc's caption coordinates are shared by every
record, so they carry no per-canary signal and are not scored.)

The audit reads no private data: no privacy cost, no ledger line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pipeline.audit.one_run import CanaryAudit, canary_audit, check_canaries
from pipeline.audit.hooks import AuditResult, register_audit
from pipeline.privacy.ledger import LedgerEntry
from pipeline.privacy import moments, text_moments

#: width of a stand-in record's feature block
RECORD_DIM = 16
#: canary norm over the clip radius R: the feature clip must bring every canary down to R
CANARY_NORM_FACTOR = 10.0

Release = Callable[..., moments.NoisyMoments]
TextRelease = Callable[..., text_moments.NoisyCrossMoments]


def feature_records(n_base: int, canary_ids: np.ndarray, *, m: int, R: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Stand-in and canary feature rows ``[n, m + RECORD_DIM]``: stand-ins in the last RECORD_DIM coordinates
    (norms spread around R: some inside the ball, some clipped, as in a release), canary j at
    ``CANARY_NORM_FACTOR * R`` on coordinate j, which nothing else touches."""
    p = m + RECORD_DIM
    standins = np.zeros((n_base, p))
    standins[:, m:] = rng.normal(size=(n_base, RECORD_DIM)) * (R / np.sqrt(RECORD_DIM))
    canaries = np.zeros((len(canary_ids), p))
    canaries[np.arange(len(canary_ids)), canary_ids] = CANARY_NORM_FACTOR * R
    return standins, canaries


def audit_release(plan: moments.MomentReleasePlan, *, certified_epsilon: float, m: int = 1000, seed: int = 0,
                  significance: float = 0.05, release: Release = moments.release) -> CanaryAudit:
    """Run ``release`` once over ``plan.N`` stand-ins and the included canaries; bound eps.

    ``release`` is the mechanism under audit (tests pass a broken one to show the audit catches it).
    """
    check_canaries(m)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    p = m + RECORD_DIM
    audited = dataclasses.replace(plan, p=p)
    geometry = moments.PublicGeometry(mean=np.zeros(p), basis=np.eye(p), R=plan.R)

    n_base = int(plan.N)
    canary_ids = np.flatnonzero(included)
    standins, canaries = feature_records(n_base, canary_ids, m=m, R=plan.R, rng=rng)
    z = np.concatenate([standins, canaries])
    y = np.concatenate([rng.integers(0, plan.n_classes, n_base), canary_ids % plan.n_classes]).astype(np.int64)

    noisy = release(geometry.features(z), y, audited, generator=rng)
    j = np.arange(m)
    u = noisy.u.reshape(plan.n_classes, 1 + p)
    # the clean value of both coordinates is 0 without the canary (no stand-in touches them)
    scores = (0.5 * u[j % plan.n_classes, 1 + j] / audited.std_u ** 2
              + audited.R ** 2 / audited.N * noisy.M2[j, j] / audited.std_M2 ** 2)
    return canary_audit(scores, included, delta=plan.delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=1, canary_norm=CANARY_NORM_FACTOR * plan.R)


def audit_text_release(plan: text_moments.TextReleasePlan, *, certified_epsilon: float, m: int = 1000,
                       seed: int = 0, significance: float = 0.05,
                       release: TextRelease = text_moments.release) -> CanaryAudit:
    """Run ``release`` (the text release under audit) once over ``plan.N`` stand-ins and the included
    canaries (module docstring); bound eps. The sensitivity 2 sqrt(2)/N holds for every p: p is widened."""
    check_canaries(m)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    p = m + RECORD_DIM
    audited = dataclasses.replace(plan, p=p)

    n_base = int(plan.N)
    canary_ids = np.flatnonzero(included)
    f_standins, f_canaries = feature_records(n_base, canary_ids, m=m, R=plan.R, rng=rng)
    e_standins = rng.normal(size=(n_base, plan.q)) * (plan.R_txt / np.sqrt(plan.q))
    e_canaries = np.zeros((len(canary_ids), plan.q))
    e_canaries[:, 0] = plan.R_txt
    # the same clip the release's callers apply (geometry.features clips f to R; captions to R_txt)
    f = text_moments.clip_rows(np.concatenate([f_standins, f_canaries]), plan.R)
    e = text_moments.clip_rows(np.concatenate([e_standins, e_canaries]), plan.R_txt)

    noisy = release(f, e, audited, generator=rng)
    whitened = noisy.M_zc[np.arange(m), 0] / (plan.R * plan.R_txt)
    # an included canary moves the entry by 1/N; the clean value is 0 without it
    scores = whitened / plan.N / audited.noise_std ** 2
    return canary_audit(scores, included, delta=plan.delta, significance=significance,
                        certified_epsilon=certified_epsilon, steps=1, canary_norm=CANARY_NORM_FACTOR * plan.R)


@register_audit(moments.MECHANISM)
def audit_moment_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A ``moment_release`` line (STRAIGHTDP's Stage 1): the feature clip and the release, once."""
    audit = audit_release(moments.plan_from_entry(entry), certified_epsilon=entry.claimed_epsilon, m=m,
                          significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box Dirac feature canaries"}


@register_audit(text_moments.MECHANISM)
def audit_text_moment_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """A ``text_moment_release`` line (STRAIGHTDP's Table 4): the cross-moment release, once."""
    audit = audit_text_release(text_moments.plan_from_entry(entry), certified_epsilon=entry.claimed_epsilon, m=m,
                               significance=significance, seed=seed)
    return audit, {"sampling_rate": 1.0, "attack": "white-box Dirac cross-moment canaries"}

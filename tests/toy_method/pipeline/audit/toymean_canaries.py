"""The toy mechanism's one-run audit (tests/test_method_plugin.py): Dirac canaries in their own coordinates."""

from __future__ import annotations

import numpy as np

from pipeline.audit.hooks import AuditResult, register_audit
from pipeline.audit.one_run import canary_audit, check_canaries
from pipeline.privacy import toymean
from pipeline.privacy.ledger import LedgerEntry


@register_audit(toymean.MECHANISM)
def audit_toymean_line(entry: LedgerEntry, *, m: int, significance: float, seed: int) -> AuditResult:
    """Canary j (norm CLIP on coordinate j) is included with probability 1/2; the release of the included
    canaries is run with the line's plan, and canary j's score is coordinate j."""
    check_canaries(m)
    plan = toymean.plan_from_entry(entry)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    x = np.eye(m)[included] * toymean.CLIP
    released = toymean.release(x, np.zeros(len(x), dtype=int), 1, plan, rng)[0]
    audit = canary_audit(released, included, delta=plan.delta, significance=significance,
                         certified_epsilon=entry.claimed_epsilon, steps=1, canary_norm=toymean.CLIP)
    return audit, {"sampling_rate": 1.0, "attack": "white-box Dirac canaries (toy)"}

"""Theoretical membership-inference success bound (EMPDEN App. L, Triastcyn & Faltings 2020).

With a uniform prior over two neighbouring datasets, an (eps, delta)-DP release bounds the
attacker's success probability by

    ASR <= (e^eps + delta) / (1 + e^eps),

which is 1/(1 + e^-eps) at delta = 0 (73.1% at eps = 1, 99.33% at eps = 5).
"""

from __future__ import annotations

import math


def asr_bound(eps: float, delta: float = 0.0) -> float:
    """Upper bound on membership-inference success, min(1, (e^eps + delta) / (1 + e^eps))."""
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if math.isinf(eps):
        return 1.0
    # Divide through by e^eps so eps in the hundreds does not overflow.
    e = math.exp(-eps)
    return min(1.0, (1.0 + delta * e) / (e + 1.0))

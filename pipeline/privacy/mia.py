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


#: EMPDEN Table 13's stopping points t = s T, as the fraction s of the T-step grid still to go (App. L)
STOPPING_POINTS = {"T": 1.0, "3T/4": 0.75, "T/2": 0.5, "T/4": 0.25}


def stop_index(s: float, N: int) -> int:
    """The grid index i of stopping at t = s T on an N-step EDM grid (sigma_t = t_i, t_0 = sigma_max).

    The private block before the stop covers steps 0..i-1, i = max(1, round((1 - s) N)): at t = T
    the sampler has taken one private step.
    """
    return max(1, round((1 - s) * N))

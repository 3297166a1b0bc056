"""The EDM noise grid t_0 = sigma_max > ... > t_{N-1} = sigma_min, t_N = 0 (Karras et al. 2022, eq. 5).

One grid for every sampler: EMPDEN's private and public steps (whose per-step GDP parameters
:mod:`pipeline.privacy.schedule` derives from it) and DPDM's samplers
(:func:`pipeline.sampling.samplers.edm_sigmas`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EDMSchedule:
    """EDM rho-schedule (Karras et al. 2022, eq. 5), the paper's symbols."""

    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    N: int = 39

    def __post_init__(self) -> None:
        if not 0 < self.sigma_min < self.sigma_max:
            raise ValueError(f"EDM schedule needs 0 < sigma_min < sigma_max, got "
                             f"sigma_min={self.sigma_min}, sigma_max={self.sigma_max}")
        if self.rho <= 0:
            raise ValueError(f"EDM schedule needs rho > 0, got {self.rho}")
        if self.N < 2:
            raise ValueError(f"EDM schedule needs N >= 2 steps, got {self.N}")

    def times(self) -> np.ndarray:
        """t_0 > ... > t_{N-1} = sigma_min, then t_N = 0 (the EDM sampler's final step).

        t_i = (sigma_max^{1/rho} + i/(N-1) (sigma_min^{1/rho} - sigma_max^{1/rho}))^rho.
        """
        i = np.arange(self.N, dtype=np.float64)
        a, b = self.sigma_max ** (1 / self.rho), self.sigma_min ** (1 / self.rho)
        t = (a + i / (self.N - 1) * (b - a)) ** self.rho
        return np.append(t, 0.0)

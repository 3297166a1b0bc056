"""SENSGEO: exact sensitivity geometry and optimal Gaussian noise for the ideal denoiser.

Do & Alabi, "Diffusion Sensitivity Geometry and Strong Duality for Optimal Privacy-Utility
Tradeoffs" (``shared/papers/001_0bd0cfc0c1c02a80.txt``), one module per section:

* :mod:`.geometry` -- Sec. II-III: the ideal denoiser m_g(D), the exact deletion shift s_k,
  the add/remove and replacement sensitivity sets, the two-record generators t_g(x, y)
  (Theorem 1), the uniform-query Mahalanobis worst case (Corollary 1), rho_*(Sigma), Fig. 1.
* :mod:`.guarantees` -- Sec. IV: exact RDP / zCDP / GDP / (eps, delta) from rho_* (Theorem 2,
  Balle & Wang's analytic Gaussian) and the generic RDP -> DP conversions they replace.
* :mod:`.sdp` -- Sec. V: the covariance SDP, its conic dual and a numpy-checked duality-gap
  certificate (Theorem 3), and the best isotropic covariance for comparison.
* :mod:`.midp` -- Sec. VI: MI-DP of binary records as the capacity of the binary-input
  Gaussian channel, strictly increasing in SNR (I-MMSE), and the calibration it implies.
* :mod:`.bridge` -- one empirical-denoiser sampler step (EMPDEN Sec. 3.1): SENSGEO's exact
  rho_* next to EMPDEN's clipped bound 2C/(beta |D|).

Like all of :mod:`pipeline.privacy`, nothing here imports evaluation or reporting code.
"""

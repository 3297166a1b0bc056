"""Diffusion formulas every method shares, written once: the EDM noise grid, eq. 1, Heun.

Neutral ground: :mod:`pipeline.privacy` (whose mechanisms are steps of these samplers), the
samplers in :mod:`pipeline.sampling` and the diagnostics all import from here, and this package
imports nothing from the rest of ``pipeline`` (``tests/test_imports.py`` holds it to that).

* :mod:`.schedule` -- :class:`~.schedule.EDMSchedule`, the rho-schedule (Karras et al. 2022, eq. 5).
* :mod:`.steps` -- :func:`~.steps.eq1_step` (EMPDEN eq. 1, the stochastic EDM update) and
  :func:`~.steps.heun_step` / :func:`~.steps.heun_sampler` (Karras et al. 2022, Alg. 1/2).
"""

"""Privacy accounting shared by every method: ledger, accountants, Edgeworth, schedules.

This package imports nothing from :mod:`pipeline.evaluation` or :mod:`pipeline.reporting`
(SPEC, Methods/Accounting): a privacy claim never depends on how results are shown.

* :mod:`.ledger` -- one JSON line per private mechanism execution (a serialised
  ``dp_accounting`` event plus its claim); the replay feeds the events to fresh accountants.
* :mod:`.rebuild` -- per mechanism, the line's event rebuilt from the mechanism parameters on
  the same line; the replay refuses a line whose event differs, or an unknown mechanism.
* :mod:`.accountants` -- PLD (pessimistic = certified eps_u, optimistic = eps_l, NOT a bound),
  exact GDP, RDP and the GDP CLT estimate.
* :mod:`.edgeworth` -- the degree-2 Edgeworth estimate of EMPDEN eq. 25 with the App. D
  diagnostics.
* :mod:`.schedule` -- the EDM time grid and the per-step GDP parameters mu_t of EMPDEN Sec. 3.
* :mod:`.mia` -- the theoretical membership-inference bound of EMPDEN App. L.
* :mod:`.fast_pld` -- dp_accounting's Gaussian PLD construction, vectorised (same PMF).
* :mod:`.cli` -- ``python -m pipeline account``: what does this mechanism cost?
* :mod:`.empirical_denoiser` -- EMPDEN's clipped empirical denoiser (eq. 4-6, log space) and
  its ledger lines.
* :mod:`.dpsgd` -- DP-SGD with per-example gradients (torch.func), Poisson or fixed-size
  batches, noise multiplicity K (DPDM Sec. 3) and PLD-calibrated noise.

Paper-specific mathematics lives in sub-packages (e.g. :mod:`.sensgeo`).
"""

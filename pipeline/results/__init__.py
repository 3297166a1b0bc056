"""Result stages: each method's tables and figures, built from its outputs and the accountants.

* :mod:`.empden_accounting` -- EMPDEN's sampling-time accounting: ``empden_blocks`` accounts
  every private block of the paper's grid once (mu_bar_B, q_B, eps from every accountant) and
  writes the claims to the ledger; the table stages turn it into Tables 7, 8/9 (eps columns),
  11, 12 and Table 13 (theoretical ASR).
* :mod:`.empden_accounting_figures` -- EMPDEN Figures 4 (left, middle), 5 and 7 (GDP, exact).
* :mod:`.empden_results` -- the sampled EMPDEN cells joined with their metrics and eps (Tables 8
  grid, 2, 3, 10; Figures 3, 4 right).
* :mod:`.sensgeo` -- SENSGEO's exact-geometry tables and figures.

Numbers come from :mod:`pipeline.privacy` and the method's samples; these modules only arrange
and write them. The ledger replay, an audit of the claims, is :mod:`pipeline.privacy.replay`.
"""

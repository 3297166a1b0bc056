"""Accounting stages: EMPDEN's sampling-time accounting tables and figures, and the replay.

* :mod:`.empden` -- ``empden_blocks`` computes every private block of the config (mu_bar_B,
  q_B and eps from every accountant) once, writes the claims to the ledger, and the table
  stages turn it into Tables 7, 8/9 (eps columns), 11, 12; Table 13 (theoretical ASR).
* :mod:`.figures` -- Figures 4 (left, middle), 5 and 7 from the EDM schedule (GDP, exact).
* :mod:`.replay` -- recompute every ledger claim from the transcripts alone.

Other papers' accounting stages sit beside these (e.g. :mod:`.sensgeo`). Numbers come from
:mod:`pipeline.privacy`; this package only arranges and writes them.
"""

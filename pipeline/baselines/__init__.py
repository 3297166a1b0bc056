"""Baselines under the same protocol as the papers' methods (STRAIGHTDP Table 1, EMPDEN Table 2):
DP-MERF (:mod:`.dp_merf`) and Private Evolution (:mod:`.private_evolution`). Their mechanisms and
ledger lines live in :mod:`pipeline.privacy.dp_merf` and :mod:`pipeline.privacy.private_evolution`;
runs and their names in :mod:`.runs`."""

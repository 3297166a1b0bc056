"""SENSGEO's random stream (:mod:`pipeline.seeds`): one per table or figure, keyed by the output's salt
(``default_rng([seed, salt])``, the derivation its released outputs were drawn with)."""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # SENSGEO result stages (pipeline.methods.sensgeo.tables): one stream per output, keyed by a salt
    Stream("sensgeo.output", "one table/figure's draws (key: the output's salt)", lambda seed, salt: [seed, salt]),
)

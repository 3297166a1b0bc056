"""EMPDEN's random streams (:mod:`pipeline.seeds`): its sampling cells, the public-marginal normaliser, Figure 2.

Declared in EMPDEN's folder so that :func:`pipeline.seeds.stream` finds them without the caller importing a stage
module; the derivations are the ones its released tables were drawn with.
"""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # EMPDEN sampling (pipeline.methods.empden.sample_stage)
    Stream("empden.chunk", "initial states, subsets, mechanism and re-noising noise of one batch of a cell "
           "(key: the batch's index in the cell's run; pipeline.shards)"),
    Stream("empden.normaliser_subset", "the fixed public subset of the public-marginal normaliser "
           "(a constant: every cell divides by the same Z)", lambda seed: 0),
    Stream("empden.figure2", "x_T of Figure 2's trajectories (each scheme starts from the same states)",
           lambda seed: seed),
)

"""The EMPDEN proxy diagnostics' random streams (:mod:`pipeline.seeds`).

They were SeedSequence streams before the seed scheme (``[seed, *keys, k]``, ``[seed, k, *keys]``), and keep
those derivations so the diagnostics' numbers do not move; declared here so that :func:`pipeline.seeds.stream`
finds them without the caller importing pipeline.methods.empden_diagnostics.proxy.
"""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # EMPDEN proxy diagnostics (pipeline.methods.empden_diagnostics.proxy): already SeedSequence streams
    Stream("empden_proxy.start", "x_T of a trajectory batch (keys: batch keys)", lambda seed, *k: [seed, *k, 1]),
    Stream("empden_proxy.steps", "the N step noises of a batch (keys: batch keys)", lambda seed, *k: [seed, *k, 2]),
    Stream("empden_proxy.redraw", "re-drawn step noise of a window (keys: chunk, window)",
           lambda seed, *k: [seed, 3, *k]),
    Stream("empden_proxy.subset", "the B-subsets of a chunk (key: chunk)", lambda seed, *k: [seed, 4, *k]),
)

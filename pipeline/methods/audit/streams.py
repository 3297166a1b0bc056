"""The audits' random streams (:mod:`pipeline.seeds`): the one-run canary audit and the membership attacks.

Declared in the audits' folder so that :func:`pipeline.seeds.stream` finds them without the caller importing a stage
module (``audit.mia`` is drawn by DPDM's non-private twin as well as by the attacks: the same member subset).
"""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # the one-run canary audit (pipeline.audit.stage)
    Stream("audit.canaries", "a line's canary coins, stand-ins, batches and noise (keys: transcript, line)"),
    # the members of the membership attacks (pipeline.data.members)
    Stream("audit.mia", "the member subset and the loss attack's noise draws (keys: none)"),
)

"""The toy method's random stream (:mod:`pipeline.seeds`)."""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    Stream("toymean.noise", "the Gaussian noise on the per-class means (pipeline.privacy.toymean.release)"),
)

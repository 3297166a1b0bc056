"""The one error of a bundle that does not verify (its own module: the card and the bundle both raise it)."""

from __future__ import annotations

from pipeline.stage import PipelineError


class BundleError(PipelineError):
    """A bundle that does not verify: one line saying which file or claim failed."""

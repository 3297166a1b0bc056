"""The bundle sampler of DP-MERF and its successors (DP-HP, DP-NTK, DP-MEPF): ``sampling.json``'s
``sampler: dp_merf``, which :mod:`pipeline.bundles.sample` dispatches to.

The generator samples from a fresh ``<method>.generator`` stream of the seed: the run drew its own samples from that
stream after training had advanced it, so a bundle draws new ones rather than redrawing those. Imports are deferred
to the call: resolving the declaration (``METHOD.bundle_samplers``) stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.io import Split


def generator_stream(settings: dict[str, Any], seed: int) -> Any:
    """The torch generator a DP-MERF-family bundle samples from: its run's ``<method>.generator`` stream (DP-MERF's
    when the settings name none). :func:`pipeline.seeds.stream` finds the successors' streams in the baselines'
    declaration, so a process that ran no stage samples a successor's bundle too."""
    from pipeline import seeds

    return seeds.torch_generator(str(settings.get("stream", "dp_merf.generator")), seed)


def sample(root: Path, settings: dict[str, Any], n: int, *, seed: int, batch: int, device: Any) -> Split:
    """``n`` labelled samples of the generator in ``weights/`` (``batch`` is unused: the generator draws all ``n``
    at once, as the run's stage does)."""
    from pipeline.baselines.dp_merf import generate, load_generator
    from pipeline.bundles.weights import GENERATOR_FILE

    G, _ = load_generator(root / "weights" / GENERATOR_FILE, device)
    return generate(G, n, generator=generator_stream(settings, seed), device=device)

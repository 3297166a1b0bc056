"""The bundles of DP-MERF and its successors (DP-HP, DP-NTK, DP-MEPF): their generator's export into a bundle
(``METHOD.bundle_exports``: a ``.safetensors`` model file, which :func:`pipeline.bundles.weights.export_weights`
dispatches to) and their sampler, ``sampling.json``'s ``sampler: dp_merf``, which :mod:`pipeline.bundles.sample`
dispatches to.

The generator samples from a fresh ``<method>.generator`` stream of the seed: the run drew its own samples from that
stream after training had advanced it, so a bundle draws new ones rather than redrawing those. Imports are deferred
to the call: resolving the declaration (``METHOD.bundle_samplers``) stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.io import Split

#: the generator's file in a bundle's ``weights/``
GENERATOR_FILE = "generator.safetensors"


def export_generator(model_file: Path, out_dir: Path) -> dict[str, Any]:
    """Copy a generator file (already safetensors, :func:`pipeline.baselines.dp_merf.save_generator`) into a bundle's
    ``weights/`` as :data:`GENERATOR_FILE`, with ``generator.json`` beside it: its format, file and metadata
    (architecture and training facts). The generator's own loader checks the file first (it refuses any other)."""
    import json
    import shutil

    from pipeline.baselines.dp_merf import GENERATOR_FORMAT, load_generator
    from pipeline.bundles.weights import GENERATOR_DESCRIPTION

    _, meta = load_generator(model_file)  # refuses any other file
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, out_dir / GENERATOR_FILE)
    spec = {"format": GENERATOR_FORMAT, "file": GENERATOR_FILE, "meta": meta}
    (out_dir / GENERATOR_DESCRIPTION).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return spec


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

    G, _ = load_generator(root / "weights" / GENERATOR_FILE, device)
    return generate(G, n, generator=generator_stream(settings, seed), device=device)

"""DPDM's bundle sampler (``sampling.json``'s ``sampler: dpdm``), which :mod:`pipeline.bundles.sample` dispatches to.

It is rule sample_dpdm's own sampler (:func:`pipeline.sampling.samplers.generate`) with the run's settings, seed and
batch size, so a bundle redraws its run's ``samples.npz``. Imports are deferred to the call: resolving the
declaration (``METHOD.bundle_samplers``) stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.io import Split


def sample(root: Path, settings: dict[str, Any], n: int, *, seed: int, batch: int, device: Any) -> Split:
    """``n`` labelled samples of the bundle at ``root`` (its denoiser in ``weights/``)."""
    from pipeline.bundles.weights import load_weights
    from pipeline.images import to_uint8
    from pipeline.sampling.samplers import SamplerConfig, generate
    from pipeline.sampling.denoiser_stage import denoiser_image_shape, denoiser_num_classes

    model, _ = load_weights(root / "weights", device)
    x, labels = generate(model, n, shape=denoiser_image_shape(model), config=SamplerConfig.from_params(
        settings["settings"]), num_classes=denoiser_num_classes(model), seed=seed, batch_size=batch, device=device)
    return Split(to_uint8(x), labels)

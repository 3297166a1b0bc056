"""STRAIGHTDP's bundle sampler (``sampling.json``'s ``sampler: straightdp_flow``), which :mod:`pipeline.bundles.sample`
dispatches to.

It is rule sample_straightdp's own sampler (:func:`pipeline.methods.straightdp.stages.draw_samples`: Euler steps with
classifier-free guidance) over what the bundle ships, so a bundle redraws its run's ``samples.npz``. Imports are
deferred to the call: resolving the declaration (``METHOD.bundle_samplers``) stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.io import Split


def sample(root: Path, settings: dict[str, Any], n: int, *, seed: int, batch: int, device: Any) -> Split:
    """``n`` labelled samples of the bundle at ``root``: the trained flow (``weights/``) or the public flow
    (``public/flow/``), the release (``release/moments.npz``), the latent variant's decoder
    (``public/autoencoder/``), whichever it ships."""
    from pipeline.bundles.weights import load_autoencoder, load_weights
    from pipeline.flow.backbone import FlowSpec
    from pipeline.methods.straightdp.stages import draw_samples
    from pipeline.privacy.moments import ReleasedMoments

    model = spec = None
    for folder in (root / "weights", root / "public" / "flow"):
        if folder.is_dir():
            model, described = load_weights(folder, device)
            spec = FlowSpec.from_json(described["spec"])
            break
    release, decoder = root / "release" / "moments.npz", root / "public" / "autoencoder"
    released = ReleasedMoments.load(release) if release.is_file() else None
    shape = tuple(int(v) for v in settings["shape"]) if "shape" in settings else None
    t0 = float(settings["t0"]) if "t0" in settings else None
    return draw_samples(str(settings.get("samples_from", "model")), n, seed=seed, steps=int(settings["steps"]),
                        guidance=float(settings["guidance"]), batch_size=batch, device=device, model=model, spec=spec,
                        released=released, shape=shape, t0=t0,
                        decoder=load_autoencoder(decoder) if decoder.is_dir() else None)

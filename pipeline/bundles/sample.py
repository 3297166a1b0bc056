"""Samples from a model bundle, offline: the run's own sampler, settings and generator stream (``sampling.json``).

With the run's seed, ``n``, batch size and CPU threads this redraws the run's own samples (the shipped
``samples.npz``), on the device they were drawn on: the DPDM samplers of :func:`pipeline.sampling.dpdm.generate`
and STRAIGHTDP's Euler sampler with classifier-free guidance (:func:`pipeline.flow.straightdp.flow_samples`).
STRAIGHTDP's bundles ship what that sampler reads: the trained flow, or the release and the public flow it guides, or
the release alone, and in latent space the public decoder. DP-MERF's generator (and its successors': DP-HP,
DP-NTK, DP-MEPF) samples from a fresh ``<method>.generator`` stream of the seed: the run drew its own samples from
that stream after training had advanced it, so a bundle draws new ones rather than redrawing those. Sampling is post-processing of what the run released: it
spends no privacy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.bundles.bundle import BundleError, read_certificate, verify
from pipeline.bundles.weights import load_weights
from pipeline.io import Split

#: sampling.json's ``sampler``: the run's sampling code
SAMPLERS = ("dpdm", "straightdp_flow", "dp_merf")


def sampling_settings(root: Path) -> dict[str, Any]:
    path = root / "sampling.json"
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: not readable ({exc})") from None
    if settings.get("sampler") not in SAMPLERS:
        raise BundleError(f"{path}: sampler must be one of {', '.join(SAMPLERS)}, got {settings.get('sampler')!r}")
    return settings


def generator_stream(settings: dict[str, Any], seed: int) -> Any:
    """The torch generator a DP-MERF-family bundle samples from: its run's ``<method>.generator`` stream (DP-MERF's
    when the settings name none). The successors' streams register with their stage module, imported here."""
    import importlib

    from pipeline import seeds

    for module in ("pipeline.baselines.dp_merf", "pipeline.baselines.embedding_family"):
        importlib.import_module(module)  # their stage modules register the generator streams
    return seeds.torch_generator(str(settings.get("stream", "dp_merf.generator")), seed)


def sample(path: str | Path, n: int, *, seed: int | None = None, batch_size: int | None = None,
           device: str = "cpu", threads: int | None = None, check: bool = True) -> Split:
    """``n`` labelled samples (uint8 images, balanced labels) of a verified model bundle; ``seed``, ``batch_size``
    and the torch CPU ``threads`` default to the run's own (another thread count may round a pixel differently)."""
    import torch

    from pipeline.device import resolve_device
    from pipeline.images import to_uint8

    root = Path(path)
    certificate = verify(root) if check else read_certificate(root)
    if certificate["kind"] != "model":
        raise BundleError(f"{root}: a synthetic-set bundle: its private output is samples.npz itself (drawing more "
                          f"would be a new release, not post-processing)")
    if n < 1:
        raise BundleError(f"--n: expected an integer >= 1, got {n}")
    settings = sampling_settings(root)
    seed = int(settings["seed"] if seed is None else seed)
    batch = int(settings["batch_size"] if batch_size is None else batch_size)
    torch.set_num_threads(int(settings.get("threads", 1) if threads is None else threads))
    dev = resolve_device(device)
    if settings["sampler"] == "dp_merf":
        from pipeline.baselines.dp_merf import generate as merf_generate
        from pipeline.baselines.dp_merf import load_generator
        from pipeline.bundles.weights import GENERATOR_FILE

        G, _ = load_generator(root / "weights" / GENERATOR_FILE, dev)
        return merf_generate(G, n, generator=generator_stream(settings, seed), device=dev)
    if settings["sampler"] == "dpdm":
        from pipeline.sampling.dpdm import SamplerConfig, generate
        from pipeline.sampling.dpdm_stage import denoiser_image_shape, denoiser_num_classes

        model, _ = load_weights(root / "weights", dev)
        x, labels = generate(model, n, shape=denoiser_image_shape(model), config=SamplerConfig.from_params(
            settings["settings"]), num_classes=denoiser_num_classes(model), seed=seed, batch_size=batch, device=dev)
        return Split(to_uint8(x), labels)
    return _straightdp(root, settings, n, seed=seed, batch=batch, device=dev)


def _straightdp(root: Path, settings: dict[str, Any], n: int, *, seed: int, batch: int, device: Any) -> Split:
    """STRAIGHTDP's sampler (:func:`pipeline.flow.straightdp.draw_samples`, rule sample_straightdp's) over what the
    bundle ships: the trained flow (``weights/``) or the public flow (``public/flow/``), the release
    (``release/moments.npz``), the latent variant's decoder (``public/autoencoder/``)."""
    from pipeline.bundles.weights import load_autoencoder
    from pipeline.flow.backbone import FlowSpec
    from pipeline.flow.straightdp import draw_samples
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

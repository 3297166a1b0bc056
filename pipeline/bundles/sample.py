"""Samples from a model bundle, offline: the run's own sampler, settings and generator stream (``sampling.json``).

With the run's seed, ``n``, batch size and CPU threads this redraws the run's own samples (the shipped
``samples.npz``), on the device they were drawn on. ``sampling.json``'s ``sampler`` names the run's sampling code: a
method declares the samplers its bundles name (:attr:`pipeline.plugins.Method.bundle_samplers`, each a function in its
folder, ``pipeline/methods/<method>/bundle.py``), and this module reads the declarations, so it keeps no list of
samplers and a new method's bundles sample without an edit here. Sampling is post-processing of what the run released:
it spends no privacy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.bundles.bundle import BundleError, read_certificate, verify
from pipeline.io import Split
from pipeline.plugins import methods, resolve


def samplers() -> dict[str, str]:
    """``sampling.json``'s sampler name -> ``"module:function"`` of its code, from every method's declaration (in
    method order); a name two methods declare is a programming error (a bundle's sampler would be ambiguous)."""
    found: dict[str, str] = {}
    owner: dict[str, str] = {}
    for method, declared in methods().items():
        for name, target in declared.bundle_samplers:
            if name in found:
                raise RuntimeError(f"bundle sampler {name!r} of method {method!r} is already declared by "
                                   f"method {owner[name]!r}")
            found[name], owner[name] = target, method
    return found


def sampling_settings(root: Path) -> dict[str, Any]:
    path = root / "sampling.json"
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: not readable ({exc})") from None
    names = samplers()
    if settings.get("sampler") not in names:
        raise BundleError(f"{path}: sampler must be one of {', '.join(names)}, got {settings.get('sampler')!r}")
    return settings


def sample(path: str | Path, n: int, *, seed: int | None = None, batch_size: int | None = None,
           device: str = "cpu", threads: int | None = None, check: bool = True) -> Split:
    """``n`` labelled samples (uint8 images, balanced labels) of a verified model bundle; ``seed``, ``batch_size``
    and the torch CPU ``threads`` default to the run's own (another thread count may round a pixel differently)."""
    import torch

    from pipeline.device import resolve_device

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
    draw = resolve(samplers()[settings["sampler"]])
    return draw(root, settings, n, seed=seed, batch=batch, device=dev)

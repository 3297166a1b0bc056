"""What one example costs a network's training step: saved activation bytes and FLOPs, counted, not guessed.

The GPU-memory side of the cost models (:mod:`pipeline.resources`) needs, for the real network a rule
builds from the configuration, how many bytes autograd keeps per example between the forward and the
backward pass: that is what grows with the batch and what runs a GPU out of memory (issue #55: the
cifar10 preset's public UNet keeps ~205 MiB per 32x32 image, ~100 GiB at its batch of 512). It is
counted here by running the training loss's forward once at batch 1 and once at batch 2 on PyTorch's
``meta`` device (shapes only: no memory, no arithmetic, a few seconds even for a paper-size UNet)
under :func:`torch.autograd.graph.saved_tensors_hooks`, each saved storage counted once and the
parameters (saved by every convolution, but held anyway) left out; the per-example bytes are the
difference of the two counts. :class:`torch.utils.flop_counter.FlopCounterMode` counts the same pass's
FLOPs (forward and backward) per example, which the runtime side reads.

Counting needs torch and a few seconds, and the workflow's cost models run whenever Snakemake parses
the DAG (without torch). So each count is kept by the hash of what it depends on (the workload kind, the
architecture, the example's shape): :data:`CACHE_FILE` in the repository holds every network of the
embedded default and the paper presets (a test keeps it equal to a fresh count), and a configuration
with another network is counted once and kept in the user's cache (:func:`user_cache_file`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import atomic_path

log = logging.getLogger(__name__)

CACHE_FILE = Path(__file__).with_name("footprints.json")
#: /2: the forward-only peak (a cache of /1 holds no such count and is read as empty, so it is counted again)
FORMAT = "dpgen-footprints/2"


@dataclass(frozen=True)
class Footprint:
    """One network workload's counts (bytes and FLOPs; float32 unless stated)."""

    #: every parameter of the network (the trained networks train all of theirs; Inception-V3's are frozen weights)
    params: int
    saved_bytes_per_example: float
    saved_bytes_fixed: float
    train_flops_per_example: float
    forward_flops_per_example: float
    #: a gradient-free forward's activations at their peak (sampling, feature extraction), per example and fixed
    forward_peak_bytes_per_example: float
    forward_peak_bytes_fixed: float

    def activation_bytes(self, micro_batch: int) -> float:
        """Bytes autograd keeps for one micro-batch of ``micro_batch`` examples (parameters not included)."""
        return self.saved_bytes_fixed + micro_batch * self.saved_bytes_per_example

    def forward_peak_bytes(self, batch: int) -> float:
        """The live activations' peak of a gradient-free forward of ``batch`` examples (parameters not included)."""
        return self.forward_peak_bytes_fixed + batch * self.forward_peak_bytes_per_example


def workload_key(kind: str, spec: Mapping[str, Any]) -> str:
    """The cache key of a workload: its kind and a hash of its canonical description."""
    blob = json.dumps({"kind": kind, **spec}, sort_keys=True, separators=(",", ":"))
    return f"{kind}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


# ----------------------------------------------------------------------------- the workloads counted


def _edm_unet(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """The EDM-preconditioned UNet2DModel (rule pretrain_public; DPDM's denoiser) and its loss (eq. 2/8 of Karras
    et al. 2022) on a batch of ``b`` examples, every tensor on the meta device."""
    import torch

    from pipeline.models.edm import EDMPrecond, edm_draw_loss
    from pipeline.models.unet import UNetSpec, build_unet

    unet = UNetSpec.from_json(dict(spec["unet"]))
    model = EDMPrecond(build_unet(unet), sigma_data=0.5)

    def loss(b: int) -> Any:
        x = torch.zeros(b, unet.channels, unet.image_size, unet.image_size)
        cond = (torch.zeros(b, dtype=torch.long),) if unet.num_classes else ()
        return edm_draw_loss(model, x, torch.ones(b), torch.zeros_like(x), *cond, sigma_data=0.5).sum()

    return model, loss


def _flow_mmdit(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """STRAIGHTDP's class-conditional MM-DiT (pipeline/flow/backbone.py ``flow_spec`` of the ``flow`` section on
    examples of ``shape`` [C, H, W]) and its rectified-flow loss (eq. 1) on a batch of ``b`` examples."""
    from types import SimpleNamespace

    import torch

    from pipeline.flow.backbone import build_flow_model
    from pipeline.flow.rectified import flow_loss
    from pipeline.flow.backbone import flow_spec

    c, h, w = (int(v) for v in spec["shape"])
    # flow_spec reads only the split's image shape
    model = build_flow_model(flow_spec({"flow": dict(spec["flow"])}, SimpleNamespace(images=np.empty((1, c, h, w))),
                                       int(spec["num_classes"])))

    def loss(b: int) -> Any:
        z = torch.zeros(b, c, h, w)
        return flow_loss(model, z, torch.full((b,), 0.5), torch.zeros_like(z), torch.zeros(b, dtype=torch.long)).sum()

    return model, loss


def _evalnet(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """The evaluation CNN (pipeline/evaluation/evalnet.py: the evaluation network and the downstream CNN, which shares
    its architecture) on examples of ``shape``, and its cross-entropy on a batch of ``b``."""
    import torch

    from pipeline.evaluation.evalnet import EvalNet

    shape = tuple(int(v) for v in spec["shape"])
    model = EvalNet(shape, int(spec["n_classes"]), width=int(spec["width"]), feature_dim=int(spec["feature_dim"]))

    def loss(b: int) -> Any:
        logits = model(torch.zeros(b, *shape))
        return torch.nn.functional.cross_entropy(logits, torch.zeros(b, dtype=torch.long), reduction="sum")

    return model, loss


def inception_architecture() -> Any:
    """torch-fidelity's Inception-V3 feature network with random weights: its constructor reads a weights file,
    which machines here do not have and nothing may download; the cost of a forward pass is its architecture's."""
    from unittest import mock

    import torch
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with mock.patch.object(torch, "load", return_value={}), \
            mock.patch.object(FeatureExtractorInceptionV3, "load_state_dict"):
        return FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="-")


def _inception_v3(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """torch-fidelity's Inception-V3 feature network (``inception-v3-compat``, random weights: its architecture is the
    cost) on uint8 images of ``shape``, which it resizes to 299x299 itself; forward only (:data:`FORWARD_ONLY`)."""
    import torch

    shape = tuple(int(v) for v in spec["shape"])
    model = inception_architecture().eval()
    return model, lambda b: model(torch.zeros(b, *shape, dtype=torch.uint8))


def clip_architecture(clip: Mapping[str, Any]) -> tuple[Any, int]:
    """The CLIP a ``dpgen-clip/1`` file holds (pipeline/evaluation/clip.py ``build_clip``, random weights: its
    architecture is the cost) and the image size its tower reads: open_clip's named model (``open_clip_name``, what
    rule import_clip imports) or the small CLIP rule train_clip trains (``small_clip_config`` of ``image_size``,
    ``width``, ``layers``, ``embed_dim``, ``patch_size``). open_clip's ``create_model`` moves a named model to its
    ``device`` argument (the CPU unless given), which a meta tensor cannot reach: it is given the default device."""
    from unittest import mock

    import open_clip
    import torch

    from pipeline.evaluation.clip import build_clip, small_clip_config

    if clip.get("open_clip_name"):
        create = open_clip.create_model
        with mock.patch.object(open_clip, "create_model",
                               lambda *a, **k: create(*a, **{**k, "device": torch.get_default_device()})):
            model = build_clip({"open_clip_name": str(clip["open_clip_name"])})
        size = model.visual.image_size
        return model, int(size[0] if isinstance(size, (tuple, list)) else size)
    config = small_clip_config(int(clip["image_size"]), width=int(clip["width"]), layers=int(clip["layers"]),
                               embed_dim=int(clip["embed_dim"]), patch_size=int(clip["patch_size"]))
    return build_clip(config), int(config["vision_cfg"]["image_size"])


def _clip(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """A CLIP's image embedding as the stages run it (pipeline/evaluation/clip.py ``ClipModel.image_features``:
    open_clip's preprocessing of uint8 images of ``shape``, then ``encode_image``) on the CLIP of ``clip``
    (:func:`clip_architecture`); its parameters are the whole CLIP's, the text tower's too (``ClipModel`` moves every
    weight to the device); forward only (:data:`FORWARD_ONLY`)."""
    import torch

    from pipeline.evaluation.clip import preprocess

    shape = tuple(int(v) for v in spec["shape"])
    model, size = clip_architecture(spec["clip"])
    model.eval()
    return model, lambda b: model.encode_image(preprocess(torch.zeros(b, *shape, dtype=torch.uint8), size),
                                               normalize=True)


def _dp_merf_generator(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """DP-MERF's generator G(z, y) (pipeline/baselines/dp_merf.py ``Generator``: ``z_dim``, ``n_classes``, ``hidden``,
    ``out_shape``; DP-HP, DP-NTK and DP-MEPF fit the same) alone, on a batch of ``b`` draws: its parameters, and its
    forward's peak (``generate``'s). In eval mode: BatchNorm1d refuses a training batch of one example, and its
    per-example saved tensors are the same in both modes (the batch statistics are per feature)."""
    import torch

    from pipeline.baselines.dp_merf import Generator

    n_classes = int(spec["n_classes"])
    G = Generator(int(spec["z_dim"]), n_classes, int(spec["hidden"]), tuple(int(v) for v in spec["out_shape"])).eval()
    return G, lambda b: G(torch.zeros(b, G.z_dim), torch.zeros(b, dtype=torch.long)).sum()


def _embedding_fit(spec: Mapping[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """Steps of the generator's fit to a released mean embedding, as stage ``dp_merf`` and its successors
    (pipeline/baselines/embedding_family.py) run them on the device, an example being one step of ``draws`` draws (the
    configured batch): G(z, y) on ``b`` x ``draws`` draws (:func:`_dp_merf_generator`'s ``generator``), then the
    matching loss of ``method``'s feature map against the release mu_tilde (zeros of its shape, float32). Counted per
    step, not per draw: the tensors of the release's size a step also makes (the loss's difference, DP-NTK's class
    blocks) outweigh a few draws' activations, so the forward's peak at one and two draws would not show a step's.

    The maps are built by the stages' own code from ``features``: DP-MERF's random Fourier features (``n_features``
    frequencies; ``train_generator``'s loss), DP-HP's Hermite features (``order``, ``prod_order``, ``n_pairs`` pixel
    pairs when ``alpha`` > 0, at most as many as the stage draws: the map's size; the kernel lengths and which pairs,
    read off public data, do not change it), DP-NTK's e-NTK map of a random network of ``width`` (its inner-product
    loss), DP-MEPF's perceptual features (``beta``) of the CLIP ``clip`` (:func:`clip_architecture`). The model's
    parameters: the generator's, and frozen, what the fit holds beside them (the release, DP-MERF's float32
    frequencies, DP-NTK's float64 network, DP-MEPF's whole CLIP), so the saved tensors counted are the steps' own."""
    import math
    from types import SimpleNamespace
    from unittest import mock

    import torch
    from torch import nn

    from pipeline.baselines import embedding_family
    from pipeline.baselines import features as feat
    from pipeline.privacy import dp_merf as merf

    G, _ = _dp_merf_generator(spec["generator"])
    method, f, n_classes = str(spec["method"]), spec["features"], G.n_classes
    d = math.prod(G.out_shape)
    model = nn.Module()
    model.generator = G

    def frozen(t: Any) -> Any:
        return nn.Parameter(t, requires_grad=False)

    if method == "dp_merf":
        model.frequencies = frozen(torch.zeros(int(f["n_features"]), d))
        fmap, dim = (lambda x: merf.rff_features(x, model.frequencies)), 2 * int(f["n_features"])
    elif method == "dp_hp":
        n_pairs = int(f["n_pairs"]) if float(f["alpha"]) > 0 else 0
        fmap = feat.HermiteFeatures(rho=torch.full((d,), 0.5), order=int(f["order"]),
                                    pairs=torch.zeros((n_pairs, 2), dtype=torch.long),
                                    prod_order=int(f["prod_order"]), alpha=float(f["alpha"]))
        dim = fmap.dim
    elif method == "dp_ntk":
        fmap = feat.NTKFeatures(d, int(f["width"]), torch.Generator().manual_seed(0))
        model.ntk = nn.ParameterList([frozen(t) for t in (fmap.W, fmap.b, fmap.v, fmap.c)])  # float64, held
        dim = fmap.dim
    elif method == "dp_mepf":
        clip, size = clip_architecture(f["clip"])
        model.clip = clip.eval().requires_grad_(False)
        fmap = feat.PerceptualFeatures(SimpleNamespace(model=model.clip, image_size=size), G.out_shape,
                                       float(f["beta"]))
        dim = fmap.dim
    else:
        raise ValueError(f"no generator fit of method {method!r}")
    model.release = frozen(torch.zeros(dim, n_classes))
    if method == "dp_merf":
        loss_fn = feat.explicit_matching_loss(model.release, fmap, n_classes)
    else:
        loss_fn = embedding_family.matching_loss(fmap, model.release, n_classes, torch.get_default_device())

    truth = torch.Tensor.__bool__

    def loss(b: int) -> Any:
        n = b * int(spec["draws"])
        y = torch.zeros(n, dtype=torch.long)
        # the release's label range check (pipeline/privacy/dp_merf.py mean_embedding) branches on the labels' values,
        # which a meta tensor does not have: there it reads False (the labels are in range)
        with mock.patch.object(torch.Tensor, "__bool__", lambda t: False if t.is_meta else truth(t)):
            return loss_fn(G(torch.zeros(n, G.z_dim), y), y)

    return model, loss


#: kind -> (spec) -> (model on the current default device, loss of a batch of b examples)
BUILDERS: dict[str, Callable[[Mapping[str, Any]], tuple[Any, Callable[[int], Any]]]] = {
    "edm_unet": _edm_unet, "flow_mmdit": _flow_mmdit, "evalnet": _evalnet, "inception_v3": _inception_v3,
    "clip": _clip, "dp_merf_generator": _dp_merf_generator, "embedding_fit": _embedding_fit}
#: kinds that are never trained here: only their forward is counted (their training counts are 0)
FORWARD_ONLY = frozenset({"inception_v3", "clip"})


def _forward_peak(model: Any, forward: Callable[[], Any]) -> float:
    """The peak bytes of the activations live during a gradient-free ``forward()`` of ``model`` (its parameters and
    buffers not included), by torch's own memory tracker (``torch.distributed._tools.mem_tracker``, which follows
    every storage's allocation and release, on the meta device as on a real one; tests/test_footprint.py checks it
    against the CPU)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    # the tracker hooks every parameter's gradient, which a frozen one refuses: unfreeze them while it watches
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad():
            forward()
    finally:
        for p in frozen:
            p.requires_grad_(False)
    peak = tracker.get_tracker_snapshot("peak")
    kinds = ("Activation", "Temp")  # the tracker's categories of what is neither parameter, buffer nor gradient
    return float(sum(v for dev in peak.values() for k, v in dev.items() if getattr(k, "value", k) in kinds))


def count(kind: str, spec: Mapping[str, Any]) -> Footprint:
    """Count ``kind``'s footprint for ``spec`` on the meta device (batch 1 and 2; see the module)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model, loss_of = BUILDERS[kind](spec)
        held = {p.untyped_storage()._cdata for p in model.parameters()}
        counts = []
        for b in (1, 2):
            storages: dict[int, int] = {}

            def pack(t: Any) -> Any:
                # a storage saved by several operations is held once; the parameters are held anyway
                s = t.untyped_storage()
                if s._cdata not in held:
                    storages[s._cdata] = s.nbytes()
                return t

            with FlopCounterMode(display=False) as flops:
                with torch.no_grad():
                    loss_of(b)
                forward = flops.get_total_flops()
            peak = _forward_peak(model, lambda: loss_of(b))
            if kind in FORWARD_ONLY:
                counts.append((0, 0, forward, peak))
                continue
            with FlopCounterMode(display=False) as flops:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    value = loss_of(b)
                value.backward()
            model.zero_grad(set_to_none=True)
            counts.append((sum(storages.values()), flops.get_total_flops(), forward, peak))
    (s1, f1, g1, p1), (s2, f2, g2, p2) = counts
    return Footprint(params=sum(p.numel() for p in model.parameters()),
                     saved_bytes_per_example=float(s2 - s1), saved_bytes_fixed=float(max(0, 2 * s1 - s2)),
                     train_flops_per_example=float(f2 - f1), forward_flops_per_example=float(g2 - g1),
                     forward_peak_bytes_per_example=float(max(0.0, p2 - p1)),
                     forward_peak_bytes_fixed=float(max(0.0, 2 * p1 - p2)))


# ----------------------------------------------------------------------------- the caches


def user_cache_file() -> Path:
    """Counts of networks the repository's file does not hold: ``$DPGEN_FOOTPRINT_CACHE``, else
    ``$XDG_CACHE_HOME/dpgen/footprints.json`` (``~/.cache`` when unset)."""
    if os.environ.get("DPGEN_FOOTPRINT_CACHE"):
        return Path(os.environ["DPGEN_FOOTPRINT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpgen" / "footprints.json"


def read_cache(path: Path) -> dict[str, Footprint]:
    """Every count in ``path`` ({} when it does not exist or is not a footprints file)."""
    try:
        blob = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(blob, Mapping) or blob.get("format") != FORMAT:
        return {}
    return {key: Footprint(**value["footprint"]) for key, value in (blob.get("workloads") or {}).items()}


def write_cache(path: Path, entries: Mapping[str, tuple[Mapping[str, Any], Footprint]]) -> None:
    """Add ``entries`` (key -> (what was counted, its footprint)) to ``path``, atomically, keeping the others."""
    try:
        blob = json.loads(path.read_text())
        workloads = dict(blob.get("workloads") or {}) if blob.get("format") == FORMAT else {}
    except (OSError, ValueError):
        workloads = {}
    for key, (spec, fp) in entries.items():
        workloads[key] = {"spec": dict(spec), "footprint": asdict(fp)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps({"format": FORMAT, "workloads": dict(sorted(workloads.items()))}, indent=1,
                                        sort_keys=True) + "\n")


@functools.lru_cache(maxsize=256)
def _footprint(kind: str, spec_json: str) -> Footprint:
    spec = json.loads(spec_json)
    key = workload_key(kind, spec)
    for path in (CACHE_FILE, user_cache_file()):
        hit = read_cache(path).get(key)
        if hit is not None:
            return hit
    log.info("counting the footprint of %s (a network not in %s; kept in %s)", key, CACHE_FILE.name, user_cache_file())
    fp = count(kind, spec)
    try:
        write_cache(user_cache_file(), {key: (spec, fp)})
    except OSError as exc:  # a read-only home: the count is kept for this process only
        log.warning("footprint cache not written (%s)", exc)
    return fp


def footprint(kind: str, spec: Mapping[str, Any]) -> Footprint:
    """``kind``'s footprint for ``spec``: from the repository's file, the user's cache, or counted now."""
    return _footprint(kind, json.dumps(spec, sort_keys=True))

"""Stage ``dp_merf``: DP-MERF (Harder, Adamczewski & Park 2021) on the private split, one run.

1. The kernel length scale l from PUBLIC data only (the median pairwise distance of public
   images, the usual median heuristic; DP-MERF tunes it on the private data, which would cost
   privacy), and D random frequencies from a public stream.
2. The one private access: the class-conditional mean embedding released by the Gaussian
   mechanism at its exact replace-one sensitivity 2/m (:mod:`pipeline.privacy.dp_merf`), sigma
   calibrated so the certified PLD eps meets the run's target; its ledger line.
3. A generator G(z, y) trained to match the released embedding (DP-MERF eq. 6: the squared
   distance between the released and the generated mean embedding of a balanced batch), then
   ``n_samples`` balanced (image, label) pairs drawn from it: post-processing, no privacy cost.

Labels: the generator draws classes uniformly, which matches the released embedding when the
private split is class-balanced (it is stratified by construction in every preset; an
unbalanced split would want its class counts released too, at a privacy cost).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pipeline import seeds
from pipeline.baselines.common import baseline_setup, load_public_like
from pipeline.baselines.features import MatchingLoss, explicit_matching_loss
from pipeline.io import Split, atomic_path, save_split, write_json
from pipeline.privacy import dp_merf as merf
from pipeline.privacy import ledger
from pipeline.sampling.samplers import balanced_labels
from pipeline.stage import PipelineError, stage
from pipeline.training.data import PRIVATE_DOC, check_declared, declared_private, load_training_split

log = logging.getLogger(__name__)


#: at most this many public images enter the median heuristic (n^2 / 2 distances)
MEDIAN_SUBSET = 1000


def unit_pixels(split: Split) -> torch.Tensor:
    """Images as float64 rows in [0, 1], ``[n, d]``: the space the kernel and the generator share."""
    return torch.from_numpy(split.images.reshape(len(split), -1).astype(np.float64) / 255.0)


def median_length_scale(public: torch.Tensor, generator: torch.Generator) -> float:
    """The median pairwise L2 distance of (a subset of) the public images: the kernel bandwidth l."""
    idx = torch.randperm(len(public), generator=generator)[:MEDIAN_SUBSET]
    d = torch.pdist(public[idx])
    scale = float(d.median()) if len(d) else 0.0
    if not scale > 0:
        raise PipelineError("dp_merf: the public images are all equal; the median heuristic gives no length scale")
    return scale


class Generator(nn.Module):
    """G(z, y): a two-hidden-layer MLP on [z, one-hot y] to pixels in [0, 1] (DP-MERF's MNIST generator
    is a small fully connected network of this kind)."""

    def __init__(self, z_dim: int, n_classes: int, hidden: int, out_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.z_dim, self.n_classes, self.out_shape = z_dim, n_classes, out_shape
        out = int(np.prod(out_shape))
        self.net = nn.Sequential(nn.Linear(z_dim + n_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2 * hidden), nn.BatchNorm1d(2 * hidden), nn.ReLU(),
                                 nn.Linear(2 * hidden, out), nn.Sigmoid())

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, nn.functional.one_hot(y, self.n_classes).to(z.dtype)], dim=1))


def fit_generator(loss_fn: MatchingLoss, *, n_classes: int, out_shape: tuple[int, int, int], cfg: Mapping[str, Any],
                  generator: torch.Generator, device: torch.device, desc: str = "dp_merf generator"
                  ) -> tuple[Generator, list[float]]:
    """Fit G(z, y) to a released embedding by Adam on ``loss_fn`` of balanced-in-expectation batches (DP-MERF
    eq. 6's loop; DP-HP, DP-NTK and DP-MEPF share it with their own matching loss, the same generator and the
    same settings, ``baselines.dp_merf``)."""
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))  # the MLP's initialisation
    G = Generator(int(cfg["z_dim"]), n_classes, int(cfg["hidden"]), out_shape).to(device)
    opt = torch.optim.Adam(G.parameters(), lr=float(cfg["lr"]))
    b = int(cfg["batch_size"])
    losses = []
    for _ in tqdm(range(int(cfg["steps"])), desc=desc, unit="step", mininterval=5):
        z = torch.randn((b, G.z_dim), generator=generator).to(device)
        y = torch.randint(0, n_classes, (b,), generator=generator).to(device)
        loss = loss_fn(G(z, y), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return G.eval(), losses


def train_generator(mu_tilde: torch.Tensor, W: torch.Tensor, *, n_classes: int, out_shape: tuple[int, int, int],
                    cfg: Mapping[str, Any], generator: torch.Generator,
                    device: torch.device) -> tuple[Generator, list[float]]:
    """Fit G to the released embedding: min ||mu_tilde - mean_b phi(G(z_b, y_b)) e_{y_b}^T||_F^2 (DP-MERF eq. 6)."""
    W32, target = W.to(device, torch.float32), mu_tilde.to(device, torch.float32)
    return fit_generator(explicit_matching_loss(target, lambda x: merf.rff_features(x, W32), n_classes),
                         n_classes=n_classes, out_shape=out_shape, cfg=cfg, generator=generator, device=device)


@torch.no_grad()
def generate(G: Generator, n: int, *, generator: torch.Generator, device: torch.device) -> Split:
    """``n`` balanced (image, label) pairs from G, uint8."""
    labels = balanced_labels(n, G.n_classes)
    z = torch.randn((n, G.z_dim), generator=generator).to(device)
    x = G(z, torch.from_numpy(labels).to(device)).cpu()
    images = np.clip(np.rint(x.numpy() * 255.0), 0, 255).astype(np.uint8).reshape(n, *G.out_shape)
    return Split(images, labels)


#: the generator file (safetensors; its spec and training facts in the metadata): a certified bundle's weights. /2
#: keeps them under one metadata key: safetensors writes its metadata map in a per-process order, so /1's three keys
#: made two runs' files (and their bundles' certificates) differ byte for byte with equal contents
GENERATOR_FORMAT = "dpgen-dp-merf-generator/2"
#: /1's layout (the keys format, spec and meta), still read
GENERATOR_FORMAT_1 = "dpgen-dp-merf-generator/1"
#: the one metadata key of a /2 file
GENERATOR_KEY = "dpgen"


def save_generator(path: str | Path, G: Generator, meta: Mapping[str, Any]) -> None:
    """G's weights as safetensors (no pickle), its architecture and ``meta`` in the file's metadata: one key holding
    sorted JSON, so the file is the same bytes whichever process writes it."""
    from safetensors.torch import save_file

    spec = {"z_dim": G.z_dim, "n_classes": G.n_classes, "hidden": G.net[0].out_features,
            "out_shape": list(G.out_shape)}
    described = json.dumps({"format": GENERATOR_FORMAT, "spec": spec, "meta": dict(meta)}, sort_keys=True)
    with atomic_path(path, suffix=".safetensors") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in G.state_dict().items()}, str(tmp),
                  metadata={GENERATOR_KEY: described})


def _described(header: Mapping[str, str]) -> dict[str, Any] | None:
    """(format, spec, meta) of a generator file's metadata, /2 or /1; None for another file."""
    if GENERATOR_KEY in header:
        try:
            described = json.loads(header[GENERATOR_KEY])
        except ValueError:
            return None
        return described if described.get("format") == GENERATOR_FORMAT else None
    if header.get("format") == GENERATOR_FORMAT_1:
        return {"format": GENERATOR_FORMAT_1, "spec": json.loads(header["spec"]), "meta": json.loads(header["meta"])}
    return None


def load_generator(path: str | Path, device: torch.device | str = "cpu") -> tuple[Generator, dict[str, Any]]:
    """The generator of :func:`save_generator` in eval mode, and its meta; a one-line error for another file."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
    except Exception as exc:  # noqa: BLE001 -- any unreadable file is the same one-line refusal
        raise PipelineError(f"{path}: not a safetensors file ({exc})") from None
    described = _described(header)
    if described is None:
        raise PipelineError(f"{path}: not a {GENERATOR_FORMAT} file")
    spec = described["spec"]
    G = Generator(int(spec["z_dim"]), int(spec["n_classes"]), int(spec["hidden"]), tuple(spec["out_shape"]))
    G.load_state_dict(load_file(str(path)))
    return G.to(device).eval(), dict(described["meta"])


@stage("dp_merf", inputs=("data", "public"), outputs=("samples", "ledger", "metrics"), optional_outputs=("generator",),
       params={"run": "the run's name, dp_merf_eps<eps>_seed<seed>", "baselines": "the baselines section",
               "config_id": "id of the settings", "device": "auto/cpu/cuda", "threads": "CPU threads",
               "private": PRIVATE_DOC, ledger.BINDING_PARAM: ledger.BINDING_DOC})
def dp_merf(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """DP-MERF: release the class-conditional RFF mean embedding once (Gaussian, sensitivity 2/m), train a
    generator to match it, sample; write the samples, the ledger line and the run's metrics."""
    section, cfg, run, device = baseline_setup(params, "dp_merf")
    start = time.perf_counter()
    m, n_classes = declared_private(params, "dp_merf")
    split, sha = load_training_split(inputs["data"], "data")
    binding = ledger.binding_of(params, data_sha256=sha, stage="dp_merf")
    check_declared(split, N=m, n_classes=n_classes, stage="dp_merf")
    public = load_public_like(inputs["public"], split)
    D = int(cfg["n_features"])
    g_feat = seeds.torch_generator("dp_merf.features", run.seed)
    x_pub = unit_pixels(public)
    length_scale = (median_length_scale(x_pub, g_feat) if cfg["length_scale"] == "median_public"
                    else float(cfg["length_scale"]))
    W = merf.rff_frequencies(x_pub.shape[1], D, length_scale, g_feat)

    try:
        plan = merf.calibrate_release(target_epsilon=run.epsilon, delta=float(section["delta"]), m=m,
                                      n_features=D, n_classes=n_classes)
        phi = merf.rff_features(unit_pixels(split), W)
        mu_tilde = merf.release(phi, torch.from_numpy(split.labels.astype(np.int64)), plan,
                                generator=seeds.torch_generator("dp_merf.mechanism_noise", run.seed))
    except merf.MerfError as exc:
        raise PipelineError(f"stage dp_merf: {exc}") from None
    entry = merf.ledger_entry(plan, stage="dp_merf", config_id=str(params.get("config_id", "unknown")),
                              seed=run.seed, extra={"run": run.name, "target_epsilon": run.epsilon,
                                                    "data_sha256": sha, "length_scale": length_scale})
    if entry.claimed_epsilon > run.epsilon:
        raise PipelineError(f"stage dp_merf: certified eps {entry.claimed_epsilon:.6g} > target {run.epsilon}")
    # only public and released quantities are logged (never the clean embedding)
    log.info("dp_merf %s: sigma %.4g (noise std %.3g per entry, sensitivity 2/m = %.3g), certified eps %.4g; "
             "expected ||noise|| %.4g, ||released|| %.4g", run.name, plan.sigma, plan.noise_std, plan.sensitivity,
             entry.claimed_epsilon, plan.noise_std * math.sqrt(mu_tilde.numel()), float(mu_tilde.norm()))
    del phi  # nothing below reads private data

    g_gen = seeds.torch_generator("dp_merf.generator", run.seed)
    G, losses = train_generator(mu_tilde, W, n_classes=n_classes, out_shape=tuple(split.images.shape[1:]), cfg=cfg,
                                generator=g_gen, device=device)
    samples = generate(G, int(section["n_samples"]), generator=g_gen, device=device)
    wall_s = time.perf_counter() - start
    save_split(outputs["samples"], samples, name=f"baselines/{run.name}", source="dp_merf", seed=run.seed,
               extra={"run": run.name, "wall_s": wall_s})
    if "generator" in outputs:  # post-processing of the release: what a certified bundle ships
        save_generator(outputs["generator"], G, {"stage": "dp_merf", "private": True, "run": run.name,
                                                 "epsilon": entry.claimed_epsilon, "delta": entry.delta,
                                                 "seed": run.seed, "data_sha256": sha})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    write_json(outputs["metrics"], {"run": run.name, "method": "dp_merf", "epsilon_target": run.epsilon,
                                    "noise_multiplier": plan.sigma, "sensitivity": plan.sensitivity,
                                    "length_scale": length_scale, "n_features": D, "m": m,
                                    "loss_first": losses[0], "loss_last": losses[-1],
                                    "embedding_noise_norm_expected": plan.noise_std * math.sqrt(mu_tilde.numel()),
                                    "wall_s": wall_s})
    log.info("dp_merf %s: generator loss %.4g -> %.4g, %d samples in %.1f s", run.name, losses[0], losses[-1],
             len(samples), wall_s)

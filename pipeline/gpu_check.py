"""``make gpu-check``: measure this machine's device rates and print them against the cost models' predictions.

Each workload of :func:`pipeline.rates.workloads` is the inner loop of one of the heaviest rules of a paper preset,
built from that preset's config (``configs/<preset>.yaml`` over ``config.yaml``) at its resolution and
network width, with the code the rule runs, on random data of the right shape (the cost of a step does
not depend on what the pixels are). Each is declared in one shape, :class:`pipeline.rates.MeasuredWorkload` (its
preset, its measurement function, its tiny-run sizes, how its FLOPs are counted): the house's own here
(:data:`HOUSE`), a method's in ``pipeline/methods/<method>/workloads.py``, which its declaration names
(:attr:`pipeline.plugins.Method.workloads`) and :func:`pipeline.rates.declared_workloads` loads by module path, so a
new method's workloads are measured without an edit here. The house's:

* ``pretrain_public`` (configs/cifar10.yaml, rule pretrain_public): the public EDM UNet's loss, backward
  and Adam step on a batch of ``pretrain.batch_size`` images;
* ``features`` (rule evaluate_*): torch-fidelity's Inception-V3 forward at 299x299 (its architecture; the
  weights do not change its cost and are not downloaded, so they are random here);
* ``unet_sample`` (configs/cifar10.yaml, the samplers that step the public denoiser): one evaluation of the public
  EDM UNet (no gradient) on a batch of images, a sampler's step;
* ``evalnet_train`` (configs/mnist.yaml, rules train_evalnet, evaluate_*): the evaluation CNN's training step.

Each runs one warm-up step and ``--steps`` timed ones (synchronised on CUDA), and reports seconds per unit,
the same at the workload's reference side (the rate the cost models scale by image area), what the
configured entry predicts, and the peak memory (CUDA: the allocator's peak for the workload; CPU: the
process' peak resident set so far). Each workload's FLOPs per unit are counted as its cost model counts them
(:class:`pipeline.rates.MeasuredWorkload`: the network's training step or forward pass by pipeline/footprint.py, x
the workload's factor; or the workload's own count, for work that is no network pass), so the share of the device's
peak it reached, its **efficiency**, is those FLOPs / (seconds x the peak of the dtype it runs in). The peaks are a
named GPU entry's (``--peaks``; by default the entry whose name matches the device's, e.g. ``h100-80gb`` on an
H100): a cost model that counts FLOPs then runs each workload at its measured efficiency. ``--tiny`` shrinks every
network and batch to run in seconds on a CPU (the tests run it; each workload's own sizes over the house's
:data:`TINY`); its numbers are not rates of any paper workload. ``--write NAME``
stores the measured rates, peaks and efficiencies as entry NAME of ``pipeline/device_rates.yaml``
(``slurm.device_rates: NAME`` then uses them).

    python -m pipeline gpu_check [--device auto] [--steps 5] [--peaks h100-80gb] [--write h100-measured]
    make gpu-check [WRITE=h100-measured] [PEAKS=h100-80gb]
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import rates
from pipeline.config import deep_merge, load_config
from pipeline.footprint import inception_architecture
from pipeline.resources import image_channels
from pipeline.stage import PipelineError

REPO = Path(__file__).resolve().parents[1]

#: --tiny: every workload at a size a CPU runs in seconds (the tests' mode; not a paper workload): the house's sections,
#: under each workload's own :attr:`pipeline.rates.MeasuredWorkload.tiny`
TINY = {
    "data": {"image_size": 16},
    "pretrain": {"batch_size": 4, "unet": {"block_out_channels": [16, 16], "attention": [False, True],
                                           "layers_per_block": 1, "norm_num_groups": 8}},
    "evaluation": {"batch_size": 2, "evalnet": {"width": 8, "feature_dim": 16, "batch_size": 4}},
}
#: images per timed step, at most: a rate is per unit and one GPU's throughput saturates well below the presets'
#: global batches (EDM's 512 was spread over 8 GPUs), which on one GPU could run out of memory
MAX_BATCH = {"pretrain_public": 128, "features": 250, "unet_sample": 250}
#: the check stops starting workloads after this long (the issue's bound: 8 minutes on one GPU)
BUDGET_S = 480.0


@dataclass(frozen=True)
class Measurement:
    """One workload's timing: ``units`` units of work per timed step at image side ``side``, and the FLOPs per unit
    the cost models count for it (:func:`flops_per_unit`)."""

    workload: str
    preset: str
    side: int
    units: float
    step_s: float
    peak_mem_mb: float
    flops_per_unit: float = float("nan")

    @property
    def seconds_per_unit(self) -> float:
        return self.step_s / self.units

    @property
    def rate(self) -> float:
        """Seconds per unit at the workload's reference side (the cost models scale rates by image area)."""
        ref = rates.workloads()[self.workload].reference_side
        return self.seconds_per_unit if ref is None else self.seconds_per_unit / (self.side / ref) ** 2

    def efficiency(self, peak_tflops: Mapping[str, float]) -> float:
        """The share of the peak of the workload's dtype its counted FLOPs ran at (FLOPs / seconds / peak)."""
        dtype = rates.workloads()[self.workload].dtype
        return self.flops_per_unit / self.seconds_per_unit / (peak_tflops[dtype] * 1e12)

    def predicted_per_unit(self, entry: rates.DeviceRates) -> float | None:
        """What ``entry`` predicts one unit at this side costs, before headroom: the counted FLOPs at its peak x
        efficiency where it counts FLOPs and the workload's rules do (:attr:`Workload.cost_model` or a network);
        else its rate scaled by area (None: no rate for it there)."""
        if entry.counts_flops and math.isfinite(self.flops_per_unit):
            return entry.workload_seconds(self.flops_per_unit, self.workload)
        if self.workload not in entry.rates:
            return None
        ref = rates.workloads()[self.workload].reference_side
        return entry.rates[self.workload] * (1.0 if ref is None else (self.side / ref) ** 2)


# ----------------------------------------------------------------------------- the workloads


def preset_config(preset: str, *, tiny: bool, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config.yaml`` + ``configs/<preset>.yaml`` (validated, defaults filled), shrunk in tiny mode by :data:`TINY`
    and then ``overrides`` (a workload's own tiny sizes)."""
    config = load_config(REPO / "config.yaml", REPO / "configs" / f"{preset}.yaml")
    return deep_merge(deep_merge(config, TINY), dict(overrides or {})) if tiny else config


def random_split(n: int, config: Mapping[str, Any], seed: int = 0) -> Any:
    import numpy as np

    from pipeline.io import Split

    rng = np.random.default_rng(seed)
    side = int(config["data"]["image_size"])
    return Split(rng.integers(0, 256, (n, image_channels(config), side, side), dtype=np.uint8),
                 (np.arange(n) % 10).astype(np.int64))


def _pretrain_public(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.models.edm import EDMPrecond, edm_draw_loss, edm_sigma_sampler
    from pipeline.models.unet import build_unet
    from pipeline.training.data import to_model_scale, unet_spec_for

    cfg = config["pretrain"]
    batch = min(int(cfg["batch_size"]), MAX_BATCH["pretrain_public"])
    split = random_split(batch, config)
    spec = unet_spec_for(cfg["unet"], split, class_conditional=cfg["class_conditional"])
    torch.manual_seed(0)
    model = EDMPrecond(build_unet(spec), sigma_data=cfg["sigma_data"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    x = to_model_scale(split.images).to(device)
    cond = (torch.from_numpy(split.labels).to(device),) if spec.num_classes else ()
    sampler, gen = edm_sigma_sampler(cfg["p_mean"], cfg["p_std"]), torch.Generator().manual_seed(0)

    def step() -> None:
        sigma = sampler(batch, gen).to(device)
        noise = torch.randn(x.shape, generator=gen).to(device)
        loss = edm_draw_loss(model, x, sigma, noise, *cond, sigma_data=cfg["sigma_data"]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch


def per_example_step(model: Any, loss_fn: Any, x: Any, multiplicity: Any, cond: tuple, clip: float,
                      clipping: str = "auto") -> Callable[[], None]:
    """One micro-batch of a DP-SGD step: K draws per example, each example's gradient clipped and summed, by the
    route the engine takes for ``clipping`` (:func:`pipeline.privacy.dpsgd.resolve_clipping`)."""
    import torch

    from pipeline.privacy import dpsgd

    params = dpsgd.trainable_parameters(model)
    gen = torch.Generator().manual_seed(0)
    route = dpsgd.resolve_clipping(clipping, model, loss_fn)

    def step() -> None:
        sigma, noise = multiplicity.draw(x, gen)
        dpsgd.clipped_sum(model, loss_fn, (x, sigma, noise, *cond), clip, route, params)

    return step


def _features(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    b = min(int(config["evaluation"]["batch_size"]), MAX_BATCH["features"])
    side = int(config["data"]["image_size"])
    net = inception_architecture().to(device).eval()
    images = torch.randint(0, 256, (b, 3, side, side), dtype=torch.uint8, device=device)

    def step() -> None:
        with torch.no_grad():
            net(images)

    return step, b


def _unet_sample(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.models.edm import EDMPrecond
    from pipeline.models.unet import build_unet
    from pipeline.training.data import unet_spec_for

    cfg = config["pretrain"]
    batch = min(int(config["evaluation"]["batch_size"]), MAX_BATCH["unet_sample"])
    split = random_split(batch, config)
    spec = unet_spec_for(cfg["unet"], split, class_conditional=cfg["class_conditional"])
    torch.manual_seed(0)
    model = EDMPrecond(build_unet(spec), sigma_data=cfg["sigma_data"]).to(device).eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(split.images.shape, generator=gen).to(device)
    sigma = torch.full((batch,), 1.0, device=device)
    cond = (torch.from_numpy(split.labels).to(device),) if spec.num_classes else ()

    def step() -> None:
        with torch.no_grad():
            model(x, sigma, *cond)

    return step, batch


def _evalnet_train(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.evaluation.evalnet import EvalNet
    from pipeline.training.data import to_model_scale

    ev = config["evaluation"]["evalnet"]
    batch = int(ev["batch_size"])
    split = random_split(batch, config)
    torch.manual_seed(0)
    model = EvalNet(tuple(split.images.shape[1:]), 10, width=int(ev["width"]),
                    feature_dim=int(ev["feature_dim"])).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x, y = to_model_scale(split.images).to(device), torch.from_numpy(split.labels).to(device)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch


def _features_network(config: Mapping[str, Any]) -> Mapping[str, Any]:
    side = int(config["data"]["image_size"])
    return {"shape": [3, side, side]}


def _pretrain_network(config: Mapping[str, Any]) -> Mapping[str, Any]:
    from pipeline import resources

    return resources.pretrain_network(config)


def _evalnet_network(config: Mapping[str, Any]) -> Mapping[str, Any]:
    from pipeline import resources

    return resources.evalnet_network(config)


#: the house's workloads and how each is measured (:data:`pipeline.rates.HOUSE_WORKLOADS`); the methods' are theirs
HOUSE: dict[str, rates.MeasuredWorkload] = {
    "pretrain_public": rates.MeasuredWorkload(rates.HOUSE_WORKLOADS["pretrain_public"], "cifar10", _pretrain_public,
                                              network=_pretrain_network),
    "features": rates.MeasuredWorkload(rates.HOUSE_WORKLOADS["features"], "cifar10", _features,
                                       network=_features_network, side=299),
    # a sampler's batch: the evaluation's batch size, 8 in tiny mode (the samplers' tiny batch)
    "unet_sample": rates.MeasuredWorkload(rates.HOUSE_WORKLOADS["unet_sample"], "cifar10", _unet_sample,
                                          tiny={"evaluation": {"batch_size": 8}}, network=_pretrain_network),
    "evalnet_train": rates.MeasuredWorkload(rates.HOUSE_WORKLOADS["evalnet_train"], "mnist", _evalnet_train,
                                            network=_evalnet_network),
}


def workloads() -> dict[str, rates.MeasuredWorkload]:
    """Every workload gpu-check measures: the house's (:data:`HOUSE`), then each method's
    (:func:`pipeline.rates.declared_workloads`), the same names as :func:`pipeline.rates.workloads`."""
    return {**HOUSE, **rates.declared_workloads()}


def workload_config(workload: str, *, tiny: bool) -> dict[str, Any]:
    """The config ``workload`` is built from: its preset's, shrunk in tiny mode by :data:`TINY` and its own sizes."""
    entry = workloads()[workload]
    return preset_config(entry.preset, tiny=tiny, overrides=entry.tiny)


# ----------------------------------------------------------------------------- the FLOPs the cost models count


def flops_per_unit(workload: str, config: Mapping[str, Any]) -> float:
    """The FLOPs the cost models count for one unit of ``workload`` (:func:`pipeline.rates.workloads`) on the network
    ``config`` builds: :func:`pipeline.resources.workload_flops` of its footprint (pipeline/footprint.py, counted
    afresh, :attr:`pipeline.rates.MeasuredWorkload.network`); a workload whose pass is its own: its own count
    (:attr:`pipeline.rates.MeasuredWorkload.flops`)."""
    from pipeline import footprint
    from pipeline.resources import workload_flops

    entry = workloads()[workload]
    if entry.flops is not None:
        return float(entry.flops(config))
    assert entry.network is not None  # MeasuredWorkload checks that one of the two is declared
    return workload_flops(workload, footprint.count(str(entry.workload.network), entry.network(config)))


# ----------------------------------------------------------------------------- measuring


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mb(device: Any) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def measure(workload: str, *, device: Any, steps: int, tiny: bool) -> Measurement:
    """Time ``steps`` steps of ``workload`` (after one warm-up step) on ``device``."""
    import torch

    entry = workloads()[workload]
    config = workload_config(workload, tiny=tiny)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step, units = entry.measure(config, device)
    step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    elapsed = (time.perf_counter() - start) / steps
    side = entry.side or int(config["data"]["image_size"])
    return Measurement(workload, entry.preset, side, units, elapsed, _peak_mb(device), flops_per_unit(workload, config))


def device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def peaks_entry_for(device: str, entries: Mapping[str, rates.DeviceRates]) -> str | None:
    """The named GPU entry whose published peaks are ``device``'s (by the device's name: ``NVIDIA H100 80GB HBM3``
    -> ``h100-80gb``), or None (a CPU, an unknown GPU: pass ``--peaks``)."""
    name = device.lower().replace(" ", "")
    for entry, e in entries.items():
        if not e.peak_tflops:
            continue
        model, _, memory = entry.partition("-")
        if model in name and (not memory or memory in name):
            return entry
    return None


def render(measured: Sequence[Measurement], entry: rates.DeviceRates, *, device: str, tiny: bool,
           peaks: rates.DeviceRates | None = None) -> str:
    """The measurements beside ``entry``'s predictions, as a Markdown table; with ``peaks`` (a named GPU entry), the
    share of its peak each workload's counted FLOPs reached."""
    head = [f"gpu-check on {device}{' (tiny mode: not a paper workload)' if tiny else ''}; predictions from "
            f"entry {entry.name!r} ({entry.kind}, before its headroom)"
            + (f"; efficiency: counted FLOPs / s over entry {peaks.name!r}'s peaks" if peaks else ""), "",
            "| workload | preset | side | s per unit | predicted s per unit | measured / predicted | rate (s per unit at "
            "reference side) | counted GFLOP per unit | dtype | efficiency | peak memory (MB) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for m in measured:
        pred = m.predicted_per_unit(entry)
        ratio = "" if pred is None else f"{m.seconds_per_unit / pred:.3g}"
        eff = f"{m.efficiency(peaks.peak_tflops):.3g}" if peaks else ""
        head.append(f"| {m.workload} | {m.preset} | {m.side} | {m.seconds_per_unit:.3g} | "
                    f"{'not in the cost models' if pred is None else f'{pred:.3g}'} | {ratio} | {m.rate:.3g} | "
                    f"{m.flops_per_unit / 1e9:.4g} | {rates.workloads()[m.workload].dtype} | {eff} | "
                    f"{m.peak_mem_mb:,.0f} |")
    return "\n".join(head)


def measured_entry(name: str, measured: Sequence[Measurement], *, device: str, tiny: bool,
                   peaks: rates.DeviceRates | None = None) -> rates.DeviceRates:
    """The rates-file entry of these measurements; with ``peaks`` (a named GPU entry) also its peaks, headroom and
    each workload's measured efficiency (the entry's own efficiency, for any workload it lacks: the least of them)."""
    import torch

    note = (f"make gpu-check, torch {torch.__version__}" + (" (tiny mode: networks and batches shrunk, not paper "
                                                            "workloads)" if tiny else ""))
    flops: dict[str, Any] = {}
    if peaks is not None:
        effs = {m.workload: float(f"{m.efficiency(peaks.peak_tflops):.4g}") for m in measured}
        note += f"; efficiencies against entry {peaks.name}'s peaks"
        flops = dict(peak_tflops=dict(peaks.peak_tflops), headroom=peaks.headroom,
                     efficiency=min(1.0, min(effs.values())), efficiencies=effs)
    return rates.DeviceRates(name=name, kind="measured", note=note, measured_on=device,
                             date=datetime.date.today().isoformat(),
                             rates={m.workload: m.rate for m in measured},
                             peak_mem_mb={m.workload: round(m.peak_mem_mb, 1) for m in measured}, **flops)


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.device import resolve_device

    parser = argparse.ArgumentParser(prog="python -m pipeline gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (CUDA when visible), cpu, cuda or cuda:N")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per workload after one warm-up (default 5)")
    parser.add_argument("--tiny", action="store_true", help="shrunk networks and batches (seconds on a CPU; tests)")
    known = list(workloads())
    parser.add_argument("--workloads", nargs="+", default=known, choices=known, metavar="W",
                        help=f"which to run (default all: {', '.join(known)})")
    parser.add_argument("--entry", default=rates.DEFAULT_ENTRY, help="the rates entry to compare with (default "
                        f"{rates.DEFAULT_ENTRY})")
    parser.add_argument("--peaks", metavar="ENTRY", help="the named GPU entry whose published peaks the efficiencies "
                        "are shares of (default: the entry matching the device's name; none on a CPU)")
    parser.add_argument("--write", metavar="NAME", help="store the measured rates as entry NAME of the rates file")
    parser.add_argument("--rates-file", type=Path, default=rates.RATES_FILE, help="default pipeline/device_rates.yaml")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"start no workload after this many seconds "
                        f"(default {BUDGET_S:g})")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    device = resolve_device(args.device)
    try:
        entries = rates.load_rates(args.rates_file)
    except PipelineError as exc:
        parser.error(str(exc))
    if args.entry not in entries:
        parser.error(f"--entry {args.entry}: no such entry in {args.rates_file} (entries: {', '.join(sorted(entries))})")
    import torch

    name = device_name(device)
    peaks_name = args.peaks or peaks_entry_for(name, entries)
    if peaks_name is not None and not (peaks_name in entries and entries[peaks_name].counts_flops):
        parser.error(f"--peaks {peaks_name}: not an entry with peak_tflops, efficiency and headroom in "
                     f"{args.rates_file} (entries with peaks: "
                     f"{', '.join(sorted(k for k, e in entries.items() if e.counts_flops))})")
    peaks = entries[peaks_name] if peaks_name else None
    measured, skipped, start = [], [], time.perf_counter()
    for workload in args.workloads:
        if time.perf_counter() - start > args.budget_s:
            skipped.append(f"{workload} (the {args.budget_s:g} s budget was spent)")
            continue
        t0 = time.perf_counter()
        try:
            m = measure(workload, device=device, steps=args.steps, tiny=args.tiny)
        except torch.OutOfMemoryError:
            skipped.append(f"{workload} (out of memory on {name})")
            continue
        print(f"gpu-check: {workload} ({m.preset}) {m.seconds_per_unit:.3g} s per unit, "
              f"{time.perf_counter() - t0:.1f} s in all", file=sys.stderr, flush=True)
        measured.append(m)
    print(render(measured, entries[args.entry], device=name, tiny=args.tiny, peaks=peaks))
    if peaks is None:
        print(f"gpu-check: no efficiencies: no entry's peaks match {name!r} (pass --peaks ENTRY)")
    for line in skipped:
        print(f"gpu-check: not measured: {line}")
    missing = sorted(set(rates.workloads()) - {m.workload for m in measured})
    if args.write and missing:
        # an entry the cost models read must hold every rate they ask for
        print(f"gpu-check: entry {args.write!r} not written: not measured: {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.write:
        path = rates.write_entry(measured_entry(args.write, measured, device=name, tiny=args.tiny, peaks=peaks),
                                 args.rates_file)
        print(f"\ngpu-check: wrote entry {args.write!r} to {path} (use it: slurm.device_rates: {args.write})")
    return 0 if all(math.isfinite(m.step_s) for m in measured) else 1

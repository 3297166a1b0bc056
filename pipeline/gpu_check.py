"""``make gpu-check``: measure this machine's device rates and print them against the cost models' predictions.

Each workload of :data:`pipeline.rates.WORKLOADS` is the inner loop of one of the heaviest rules of a paper preset,
built from that preset's config (``configs/<preset>.yaml`` over ``config.yaml``) at its resolution and
network width, with the code the rule runs, on random data of the right shape (the cost of a step does
not depend on what the pixels are):

* ``pretrain_public`` (configs/cifar10.yaml, rule pretrain_public): the public EDM UNet's loss, backward
  and Adam step on a batch of ``pretrain.batch_size`` images;
* ``dpdm_dpsgd`` (configs/mnist.yaml, rule train_dpdm): DP-SGD's per-example gradients of ``dpdm.K``
  draws each (:func:`pipeline.privacy.dpsgd.per_example_gradients`), clipped and summed, over one
  micro-batch of ``dpdm.micro_batch`` examples;
* ``empden_sample`` (configs/cifar10.yaml, rules empden_sample_*): one private step of the clipped
  empirical denoiser (:func:`pipeline.privacy.empirical_denoiser.private_step`, eq. 38 with the public
  normaliser of ``empden.normaliser_n`` records) for ``empden.batch_size`` outputs over the declared
  private set size, times ``accounting.N`` steps per output;
* ``straightdp_dpsgd`` (configs/straightdp_kmnist.yaml, rule train_straightdp): the flow loss's
  per-example gradients of ``dpsgd.noise_multiplicity`` time draws on the preset's MM-DiT, clipped and
  summed, over one micro-batch;
* ``features`` (rule evaluate_*): torch-fidelity's Inception-V3 forward at 299x299 (its architecture; the
  weights do not change its cost and are not downloaded, so they are random here);
* ``unet_sample`` (configs/cifar10.yaml, rules empden_sample_*, sample_dpdm): one evaluation of the public EDM UNet
  (no gradient) on a batch of images, a sampler's step;
* ``flow_train`` and ``flow_sample`` (configs/straightdp_kmnist.yaml, rules pretrain_straightdp, train_straightdp's
  distillation, sample_straightdp): the MM-DiT's rectified-flow loss, backward and Adam step; its forward alone;
* ``evalnet_train`` (configs/mnist.yaml, rules train_evalnet, evaluate_*): the evaluation CNN's training step.

Each runs one warm-up step and ``--steps`` timed ones (synchronised on CUDA), and reports seconds per unit,
the same at the workload's reference side (the rate the cost models scale by image area), what the
configured entry predicts, and the peak memory (CUDA: the allocator's peak for the workload; CPU: the
process' peak resident set so far). Each workload's FLOPs per unit are counted as its cost model counts them
(:data:`pipeline.rates.WORKLOADS`: the network's training step or forward pass by pipeline/footprint.py, x the
workload's factor; EMPDEN's private steps by its cost model), so the share of the device's peak it reached, its
**efficiency**, is those FLOPs / (seconds x the peak of the dtype it runs in). The peaks are a named GPU entry's
(``--peaks``; by default the entry whose name matches the device's, e.g. ``h100-80gb`` on an H100): a cost model
that counts FLOPs then runs each workload at its measured efficiency. ``--tiny`` shrinks every network and batch to
run in seconds on a CPU (the tests run it); its numbers are not rates of any paper workload. ``--write NAME``
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

#: the preset each workload is built from: one paper preset that runs the rule (a rate is per unit at a reference
#: side and the cost models scale it by image area, so the other presets' jobs are predicted from the same rate)
PRESET_OF = {"pretrain_public": "cifar10", "dpdm_dpsgd": "mnist", "empden_sample": "cifar10",
             "straightdp_dpsgd": "straightdp_kmnist", "features": "cifar10", "unet_sample": "cifar10",
             "flow_train": "straightdp_kmnist", "flow_sample": "straightdp_kmnist", "evalnet_train": "mnist"}
#: --tiny: every workload at a size a CPU runs in seconds (the tests' mode; not a paper workload)
TINY = {
    "data": {"image_size": 16},
    "pretrain": {"batch_size": 4, "unet": {"block_out_channels": [16, 16], "attention": [False, True],
                                           "layers_per_block": 1, "norm_num_groups": 8}},
    "dpdm": {"micro_batch": 2, "K": 2, "unet": {"block_out_channels": [16, 16], "attention": [False, True],
                                                "layers_per_block": 1, "norm_num_groups": 8}},
    "empden": {"batch_size": 8, "normaliser_n": 64},
    "evaluation": {"batch_size": 2, "evalnet": {"width": 8, "feature_dim": 16, "batch_size": 4}},
    "accounting": {"n": 256, "N": 4},
    "straightdp": {"dpsgd": {"micro_batch": 2, "noise_multiplicity": 2},
                   "flow": {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8,
                            "joint_attention_dim": 8, "caption_tokens": 2},
                   "pretrain": {"batch_size": 4}},
}
#: images per timed step, at most: a rate is per unit and one GPU's throughput saturates well below the presets'
#: global batches (EDM's 512 was spread over 8 GPUs), which on one GPU could run out of memory
MAX_BATCH = {"pretrain_public": 128, "features": 250, "unet_sample": 250, "flow_train": 128, "flow_sample": 250}
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
        ref = rates.WORKLOADS[self.workload].reference_side
        return self.seconds_per_unit if ref is None else self.seconds_per_unit / (self.side / ref) ** 2

    def efficiency(self, peak_tflops: Mapping[str, float]) -> float:
        """The share of the peak of the workload's dtype its counted FLOPs ran at (FLOPs / seconds / peak)."""
        return self.flops_per_unit / self.seconds_per_unit / (peak_tflops[rates.WORKLOADS[self.workload].dtype] * 1e12)

    def predicted_per_unit(self, entry: rates.DeviceRates) -> float | None:
        """What ``entry`` predicts one unit at this side costs, before headroom: the counted FLOPs at its peak x
        efficiency where it counts FLOPs and the workload's rules do (:attr:`Workload.cost_model` or a network);
        else its rate scaled by area (None: no rate for it there)."""
        if entry.counts_flops and math.isfinite(self.flops_per_unit):
            return entry.workload_seconds(self.flops_per_unit, self.workload)
        if self.workload not in entry.rates:
            return None
        ref = rates.WORKLOADS[self.workload].reference_side
        return entry.rates[self.workload] * (1.0 if ref is None else (self.side / ref) ** 2)


# ----------------------------------------------------------------------------- the workloads


def preset_config(preset: str, *, tiny: bool) -> dict[str, Any]:
    """``config.yaml`` + ``configs/<preset>.yaml`` (validated, defaults filled), shrunk by :data:`TINY` in tiny mode."""
    config = load_config(REPO / "config.yaml", REPO / "configs" / f"{preset}.yaml")
    return deep_merge(config, TINY) if tiny else config


def _random_split(n: int, config: Mapping[str, Any], seed: int = 0) -> Any:
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
    split = _random_split(batch, config)
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


def _per_example_step(model: Any, loss_fn: Any, x: Any, multiplicity: Any, cond: tuple, clip: float,
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


def _dpdm_dpsgd(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.models.precond import parameterisation
    from pipeline.models.unet import build_unet
    from pipeline.privacy import dpsgd
    from pipeline.training.data import to_model_scale, unet_spec_for

    d = config["dpdm"]
    b, K = int(d["micro_batch"]), int(d["K"])
    split = _random_split(b, config)
    spec = unet_spec_for(d["unet"], split, class_conditional=d["class_conditional"], num_classes=10)
    param = parameterisation(d["parameterisation"])
    torch.manual_seed(0)
    model = param.build(build_unet(spec)).to(device)
    cond = (torch.from_numpy(split.labels).to(device),) if spec.num_classes else ()
    step = _per_example_step(model, dpsgd.multiplicity_loss(param.draw_loss), to_model_scale(split.images).to(device),
                             dpsgd.NoiseMultiplicity(K, param.sigma_sampler), cond, float(d["clip"]),
                             str(d.get("clipping", "auto")))
    return step, b * K


def _empden_sample(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], float]:
    import torch

    from pipeline.methods.empden import costs as empden_costs
    from pipeline.privacy import empirical_denoiser as emp

    e, acc = config["empden"], config["accounting"]
    n = empden_costs.private_records(config)
    side, ch = int(config["data"]["image_size"]), image_channels(config)
    d, b, m = ch * side * side, int(e["batch_size"]), int(e["normaliser_n"] or 10000)
    gen = torch.Generator(device=device).manual_seed(0)
    records = emp.prepare_records(torch.rand((n, d), generator=gen, device=device, dtype=torch.float64) * 2 - 1)
    public = emp.prepare_records(torch.rand((m, d), generator=gen, device=device, dtype=torch.float64) * 2 - 1)
    x = torch.randn((b, d), generator=gen, device=device, dtype=torch.float64)
    steps_per_output = int(acc["N"])

    def step() -> None:
        # one step of every output of the batch; the per-output figure multiplies by the N steps each takes
        t, t_next = 1.0, 0.9
        log_z = emp.log_public_marginal(x, public, t)
        emp.private_step(x, records, t, t_next, C=1.0, beta=1.0, generator=gen, log_normaliser=log_z)

    return step, b / steps_per_output  # a timed step is 1/N of the work of each of its b outputs


def _straightdp_dpsgd(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.flow.backbone import build_flow_model
    from pipeline.flow.rectified import flow_loss
    from pipeline.flow.straightdp import flow_spec
    from pipeline.privacy import dpsgd, tha
    from pipeline.training.data import to_model_scale

    s = config["straightdp"]
    b, K = int(s["dpsgd"]["micro_batch"]), int(s["dpsgd"]["noise_multiplicity"])
    split = _random_split(b, config)
    torch.manual_seed(0)
    model = build_flow_model(flow_spec(s, split, 10)).to(device)
    step = _per_example_step(model, dpsgd.multiplicity_loss(flow_loss), to_model_scale(split.images).to(device),
                             dpsgd.NoiseMultiplicity(K, tha.uniform_time_sampler),
                             (torch.from_numpy(split.labels).to(device),), float(s["dpsgd"]["clip_ref"]),
                             str(s["dpsgd"].get("clipping", "auto")))
    return step, b * K


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
    batch = min(int(config["empden"]["batch_size"]), MAX_BATCH["unet_sample"])
    split = _random_split(batch, config)
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


def _flow_model(config: Mapping[str, Any], batch: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    from pipeline.flow.backbone import build_flow_model
    from pipeline.flow.straightdp import flow_spec
    from pipeline.training.data import to_model_scale

    split = _random_split(batch, config)
    torch.manual_seed(0)
    model = build_flow_model(flow_spec(config["straightdp"], split, 10)).to(device)
    return model, to_model_scale(split.images).to(device), torch.from_numpy(split.labels).to(device)


def _flow_train(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.flow.rectified import flow_loss

    p = config["straightdp"]["pretrain"]
    batch = min(int(p["batch_size"]), MAX_BATCH["flow_train"])
    model, z, labels = _flow_model(config, batch, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(p["lr"]))
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        t, xi = torch.rand(batch, generator=gen).to(device), torch.randn(z.shape, generator=gen).to(device)
        loss = flow_loss(model, z, t, xi, labels).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch


def _flow_sample(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    batch = min(int(config["evaluation"]["batch_size"]), MAX_BATCH["flow_sample"])
    model, z, labels = _flow_model(config, batch, device)
    model.eval()
    t = torch.full((batch,), 0.5, device=device)

    def step() -> None:
        with torch.no_grad():
            model(z, t, labels)

    return step, batch


def _evalnet_train(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    import torch

    from pipeline.evaluation.evalnet import EvalNet
    from pipeline.training.data import to_model_scale

    ev = config["evaluation"]["evalnet"]
    batch = int(ev["batch_size"])
    split = _random_split(batch, config)
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


BUILDERS: dict[str, Callable[[Mapping[str, Any], Any], tuple[Callable[[], None], float]]] = {
    "pretrain_public": _pretrain_public, "dpdm_dpsgd": _dpdm_dpsgd, "empden_sample": _empden_sample,
    "straightdp_dpsgd": _straightdp_dpsgd, "features": _features, "unet_sample": _unet_sample,
    "flow_train": _flow_train, "flow_sample": _flow_sample, "evalnet_train": _evalnet_train,
}


# ----------------------------------------------------------------------------- the FLOPs the cost models count


def _network_of(workload: str, config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The footprint spec (pipeline/footprint.py) of the network ``workload`` runs, as its cost models form it."""
    from pipeline import resources
    from pipeline.methods.dpdm import costs as dpdm_costs
    from pipeline.methods.straightdp import costs as straightdp_costs

    if workload in ("pretrain_public", "unet_sample"):
        return resources.pretrain_network(config)
    if workload == "dpdm_dpsgd":
        return dpdm_costs.network(config)
    if workload in ("straightdp_dpsgd", "flow_train", "flow_sample"):
        return straightdp_costs.pixel_network(config)
    if workload == "evalnet_train":
        return resources.evalnet_network(config)
    if workload == "features":
        side = int(config["data"]["image_size"])
        return {"shape": [3, side, side]}
    raise KeyError(workload)


def flops_per_unit(workload: str, config: Mapping[str, Any]) -> float:
    """The FLOPs the cost models count for one unit of ``workload`` (:data:`pipeline.rates.WORKLOADS`) on the network
    ``config`` builds: :func:`pipeline.resources.workload_flops` of its footprint (pipeline/footprint.py, counted
    afresh); EMPDEN's: accounting.N private steps of one output over n records and the m normaliser
    records (:data:`pipeline.methods.empden.costs.PRIVATE_FLOPS_PER_ENTRY`)."""
    from pipeline import footprint

    w = rates.WORKLOADS[workload]
    if w.pass_ == "empden_private":
        from pipeline.methods.empden import costs as empden_costs

        per_record, per_public = empden_costs.PRIVATE_FLOPS_PER_ENTRY
        e, acc = config["empden"], config["accounting"]
        n = empden_costs.private_records(config)
        d = image_channels(config) * int(config["data"]["image_size"]) ** 2
        return float(acc["N"]) * d * (per_record * n + per_public * int(e["normaliser_n"] or 10000))
    from pipeline.resources import workload_flops

    return workload_flops(workload, footprint.count(str(w.network), _network_of(workload, config)))


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

    preset = PRESET_OF[workload]
    config = preset_config(preset, tiny=tiny)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step, units = BUILDERS[workload](config, device)
    step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    elapsed = (time.perf_counter() - start) / steps
    side = 299 if workload == "features" else int(config["data"]["image_size"])
    return Measurement(workload, preset, side, units, elapsed, _peak_mb(device), flops_per_unit(workload, config))


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
                    f"{m.flops_per_unit / 1e9:.4g} | {rates.WORKLOADS[m.workload].dtype} | {eff} | "
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
    parser.add_argument("--workloads", nargs="+", default=list(BUILDERS), choices=list(BUILDERS), metavar="W",
                        help=f"which to run (default all: {', '.join(BUILDERS)})")
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
    missing = sorted(set(rates.WORKLOADS) - {m.workload for m in measured})
    if args.write and missing:
        # an entry the cost models read must hold every rate they ask for
        print(f"gpu-check: entry {args.write!r} not written: not measured: {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.write:
        path = rates.write_entry(measured_entry(args.write, measured, device=name, tiny=args.tiny, peaks=peaks),
                                 args.rates_file)
        print(f"\ngpu-check: wrote entry {args.write!r} to {path} (use it: slurm.device_rates: {args.write})")
    return 0 if all(math.isfinite(m.step_s) for m in measured) else 1

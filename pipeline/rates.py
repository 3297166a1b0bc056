"""Device rates: the seconds one unit of each heavy workload costs on a device, read by the cost models.

``pipeline/device_rates.yaml`` holds one entry per device (``estimate``, the default, is not a
measurement: see its note); ``slurm.device_rates`` names the entry a configuration's runtime requests
and plan use (:mod:`pipeline.resources`). ``make gpu-check`` (:mod:`pipeline.gpu_check`) measures the
same workloads on the machine it runs on and writes a ``measured`` entry. Each rate is seconds per unit
at the workload's reference image side; the cost models scale it by image area, as the measurements
are converted to it. Pure Python (no torch, no Snakemake).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline import plugins
from pipeline.io import atomic_path
from pipeline.stage import PipelineError

RATES_FILE = Path(__file__).with_name("device_rates.yaml")
FORMAT = "dpgen-device-rates/1"
#: the entry every rates file holds: the rates of the workloads no FLOP count grounds yet (named GPU entries copy them)
BASE_ENTRY = "estimate"
#: the entry a config that names none uses (the schema's default of slurm.device_rates): the GPU slurm.gpu_mem_gb's
#: default of 40 GB describes, its requests from counted FLOPs at an assumed efficiency (an estimate until measured)
DEFAULT_ENTRY = "a100-40gb"
KINDS = ("estimate", "measured")
#: the number formats a peak may be stated for: what the code runs (the UNets' convolutions in TF32, cuDNN's default;
#: the transformers' matmuls in FP32, torch's default; a kernel written in float64 in FP64)
DTYPES = ("fp64", "fp32", "tf32", "bf16")
HEADER = """\
# Device rates: what one unit of each heavy workload costs on a device (seconds), the numbers behind every
# runtime request of the slurm profile and the plan (pipeline/resources.py, python -m pipeline plan).
# slurm.device_rates names the entry a run uses (default: a100-40gb). `make gpu-check` measures an entry on the
# machine it runs on and, with WRITE=name, stores it here (pipeline/rates.py; units and sizes: rates.workloads()).
# An entry with peak_tflops (a named GPU's published dense peaks), efficiency and headroom grounds the runtimes of
# the rules whose networks are counted (pipeline/footprint.py) in FLOPs / (peak x efficiency) x headroom, each
# workload at its measured share of the peak where the entry holds one (efficiencies); the other rules read its
# rates.
"""


#: a DP-SGD step's FLOPs over a non-private step's on the same draws (the per-example norms and clipped sums: ghost
#: clipping's second backward, or vmap's per-example weight gradients): ASSUMED, not counted (Bu et al. 2023 report
#: 1.1-1.5x for ghost clipping); a measured entry's efficiency of a DP-SGD workload is stated against this count, so
#: the assumption cancels out of the requests of a measured entry
DPSGD_FLOP_FACTOR = 1.5
#: what a workload's FLOPs per unit are counted from: a network's training step or forward pass (pipeline/footprint.py,
#: times the workload's flop_factor), or its own count (work that is no network pass, e.g. a kernel written in float64:
#: :attr:`MeasuredWorkload.flops`), so that a method's own kind of work needs no pass named here
PASSES = ("train", "forward", "own")


@dataclass(frozen=True)
class Workload:
    """One workload ``make gpu-check`` measures: what its unit is, the image side its rate is stated at, the cost model
    reading that rate (``module:function``; ``None``: measured, read by no rate), and how its FLOPs are counted:
    ``network`` (the footprint kind, pipeline/footprint.py) and ``pass_`` (:data:`PASSES`) x ``flop_factor``, run in
    ``dtype`` (whose peak a device entry reads). A measured entry's efficiency of the workload is its counted FLOPs /
    (seconds x that peak); the cost models that count FLOPs name the workload whose efficiency they run at."""

    unit: str
    reference_side: int | None
    cost_model: str | None
    dtype: str
    network: str | None
    pass_: str
    flop_factor: float = 1.0


#: a run's config, as the measurement functions read it
Config = Mapping[str, Any]


@dataclass(frozen=True)
class MeasuredWorkload:
    """A workload and how ``make gpu-check`` (:mod:`pipeline.gpu_check`) measures it: the one shape in which the house
    (:data:`pipeline.gpu_check.HOUSE`) and each method (``pipeline/methods/<method>/workloads.py``, named by
    :attr:`pipeline.plugins.Method.workloads`) declare theirs, so that the house reads every workload alike and keeps
    no list of the methods' ones.

    ``preset``: the paper preset it is built from (``configs/<preset>.yaml``; a rate is per unit at a reference side and
    the cost models scale it by image area, so the other presets' jobs are predicted from the same rate); ``measure``:
    ``measure(config, device) -> (step, units)``, one timed step of the inner loop of the rule, built from that config
    with the code the rule runs, and the units of work it does; ``tiny``: what ``--tiny`` merges over the house's
    shrunk sizes (:data:`pipeline.gpu_check.TINY`) so the step runs in seconds on a CPU; ``network``:
    ``network(config)``, the footprint spec of the network it runs, as its cost model forms it (pass ``train`` or
    ``forward``); ``flops``: ``flops(config)``, its FLOPs per unit where its pass is ``own``; ``side``: the image side
    it runs at when it is not the preset's ``data.image_size``."""

    workload: Workload
    preset: str
    measure: Callable[[Config, Any], tuple[Callable[[], None], float]]
    tiny: Mapping[str, Any] = field(default_factory=dict)
    network: Callable[[Config], Mapping[str, Any]] | None = None
    flops: Callable[[Config], float] | None = None
    side: int | None = None

    def __post_init__(self) -> None:
        if (self.workload.pass_ == "own") != (self.flops is not None) or (self.network is None) != (
                self.workload.network is None):
            raise ValueError("a workload counted by its own pass declares flops; one counted on a network, network")


#: the house's workloads (the shared public pretraining and evaluation); each method declares its own
#: (:attr:`pipeline.plugins.Method.workloads`), and :func:`workloads` holds them all
HOUSE_WORKLOADS: dict[str, Workload] = {
    "pretrain_public": Workload("image: EDM loss forward, backward and Adam step of the public UNet", 32,
                                "pipeline.resources:pretrain_runtime_min", "tf32", "edm_unet", "train"),
    "features": Workload("image: the evaluation's feature network forward at 299x299 (Inception-V3)", None, None,
                         "tf32", "inception_v3", "forward"),
    "unet_sample": Workload("image: one evaluation of the public EDM UNet (a sampler's step on the public "
                            "denoiser)", None, None, "tf32", "edm_unet", "forward"),
    "evalnet_train": Workload("image: cross-entropy forward, backward and Adam step of the evaluation CNN (the "
                              "evaluation net, the downstream CNN)", None, None, "tf32", "evalnet", "train"),
}


@functools.cache
def declared_workloads() -> dict[str, MeasuredWorkload]:
    """Every method's declared workloads (:attr:`pipeline.plugins.Method.workloads`), name -> entry, loaded once; a
    name declared twice (by two methods, or by a method and the house) is a programming error."""
    out: dict[str, MeasuredWorkload] = {}
    owner = {name: "the house" for name in HOUSE_WORKLOADS}
    for method, declared in plugins.methods().items():
        if declared.workloads is None:
            continue
        for name, entry in plugins.resolve(declared.workloads).items():
            if not isinstance(entry, MeasuredWorkload):
                raise RuntimeError(f"workload {name!r} of method {method!r} is not a rates.MeasuredWorkload")
            if name in owner:
                raise RuntimeError(f"workload {name!r} of method {method!r} is already declared by {owner[name]}")
            out[name], owner[name] = entry, f"method {method!r}"
    return out


@functools.cache
def workloads() -> dict[str, Workload]:
    """Every workload a rate or an efficiency may be given for: the house's (:data:`HOUSE_WORKLOADS`), then each
    method's (:func:`declared_workloads`)."""
    return {**HOUSE_WORKLOADS, **{name: e.workload for name, e in declared_workloads().items()}}


@dataclass(frozen=True)
class DeviceRates:
    """One entry of the rates file."""

    name: str
    kind: str
    note: str
    rates: dict[str, float]
    measured_on: str | None = None
    date: str | None = None
    peak_mem_mb: dict[str, float] = field(default_factory=dict)
    #: a GPU's published dense peak, TFLOP/s per dtype (:data:`DTYPES`): the entry then grounds the runtimes of the
    #: rules whose FLOPs are counted (pipeline/footprint.py) in FLOPs / (peak x efficiency) x headroom
    peak_tflops: dict[str, float] = field(default_factory=dict)
    #: the share of the peak the workloads are assumed to reach (a measured entry: the least of its workloads')
    efficiency: float | None = None
    #: per workload (:func:`workloads`), the share of its dtype's peak measured by ``make gpu-check`` (its counted FLOPs
    #: per second over the peak); a workload not listed runs at :attr:`efficiency`
    efficiencies: dict[str, float] = field(default_factory=dict)
    #: the factor a runtime request asks for over the FLOP estimate at that efficiency
    headroom: float | None = None

    @property
    def counts_flops(self) -> bool:
        """Whether the entry grounds runtimes in FLOPs (it states a peak, an efficiency and a headroom)."""
        return bool(self.peak_tflops) and self.efficiency is not None and self.headroom is not None

    def efficiency_of(self, workload: str) -> float:
        """The share of its dtype's peak ``workload`` runs at on this entry: measured, else the entry's."""
        return self.efficiencies.get(workload, float(self.efficiency))

    def workload_seconds(self, flops: float, workload: str) -> float:
        """Seconds ``flops`` of ``workload`` (:func:`workloads`) take: its dtype's peak x its efficiency (no
        headroom)."""
        dtype = workloads()[workload].dtype
        if dtype not in self.peak_tflops:
            raise PipelineError(f"config error at slurm.device_rates: entry {self.name!r} of {RATES_FILE.name} states "
                                f"no {dtype} peak (peak_tflops: {', '.join(self.peak_tflops) or 'none'})")
        return flops / (self.peak_tflops[dtype] * 1e12 * self.efficiency_of(workload))

    def rate(self, workload: str) -> float:
        """Seconds per unit of ``workload`` at its reference side."""
        if workload not in self.rates:
            raise PipelineError(f"config error at slurm.device_rates: entry {self.name!r} of {RATES_FILE.name} has no "
                                f"rate for {workload} (run make gpu-check WRITE={self.name}, or pick another entry)")
        return self.rates[workload]

    def describe(self) -> str:
        """One line for the plan: what the rates are and where they come from."""
        peaks = ", ".join(f"{k} {v:g}" for k, v in self.peak_tflops.items())
        if not self.counts_flops:
            flops = ""
        elif self.efficiencies:
            measured = ", ".join(f"{k} {v:.3g}" for k, v in self.efficiencies.items())
            flops = (f"; the rules whose networks are counted: FLOPs at the measured share of its peaks ({peaks} "
                     f"TFLOP/s: {measured}; any other workload {self.efficiency:.3g}) x {self.headroom:g}")
        else:
            flops = (f"; the rules whose networks are counted: FLOPs at {self.efficiency:g} of its peaks ({peaks} "
                     f"TFLOP/s) x {self.headroom:g}, an ESTIMATE until gpu-check measures the efficiency")
        if self.kind == "measured":
            return f"rates: measured on {self.measured_on} ({self.date}, make gpu-check; entry {self.name}){flops}"
        return (f"rates: estimates, not a GPU measurement (entry {self.name} of pipeline/{RATES_FILE.name}: "
                f"{self.note.strip()}){flops}")

    def to_json(self) -> dict[str, Any]:
        blob = {"kind": self.kind, "measured_on": self.measured_on, "date": self.date, "note": self.note,
                "rates": dict(self.rates), "peak_mem_mb": dict(self.peak_mem_mb)}
        if self.peak_tflops:
            blob.update(peak_tflops=dict(self.peak_tflops), efficiency=self.efficiency, headroom=self.headroom)
        if self.efficiencies:
            blob["efficiencies"] = dict(self.efficiencies)
        return blob


def _entry(name: str, blob: Any, where: str) -> DeviceRates:
    if not isinstance(blob, Mapping):
        raise PipelineError(f"{where}: entry {name!r} must be a mapping")
    if blob.get("kind") not in KINDS:
        raise PipelineError(f"{where}: entry {name!r}: kind must be one of {', '.join(KINDS)}, got {blob.get('kind')!r}")
    rates = blob.get("rates")
    if not isinstance(rates, Mapping) or not rates:
        raise PipelineError(f"{where}: entry {name!r}: rates must be a non-empty mapping of workload to seconds")
    for workload, value in rates.items():
        if workload not in workloads():
            raise PipelineError(f"{where}: entry {name!r}: unknown workload {workload!r} "
                                f"(known: {', '.join(workloads())})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise PipelineError(f"{where}: entry {name!r}: rate of {workload} must be seconds > 0, got {value!r}")
    if blob["kind"] == "measured" and not (blob.get("measured_on") and blob.get("date")):
        raise PipelineError(f"{where}: entry {name!r}: a measured entry names its device (measured_on) and date")
    peaks = blob.get("peak_tflops") or {}
    if not isinstance(peaks, Mapping) or any(k not in DTYPES for k in peaks) or not all(
            _positive(v) for v in peaks.values()):
        raise PipelineError(f"{where}: entry {name!r}: peak_tflops must map dtypes ({', '.join(DTYPES)}) to TFLOP/s "
                            f"> 0, got {peaks!r}")
    if peaks:
        eff, head = blob.get("efficiency"), blob.get("headroom")
        if not (_positive(eff) and eff <= 1):
            raise PipelineError(f"{where}: entry {name!r}: efficiency must be a share of the peak in (0, 1], "
                                f"got {eff!r}")
        if not (_positive(head) and head >= 1):
            raise PipelineError(f"{where}: entry {name!r}: headroom must be a factor >= 1, got {head!r}")
    effs = blob.get("efficiencies") or {}
    if effs and not peaks:
        raise PipelineError(f"{where}: entry {name!r}: efficiencies are shares of peak_tflops, which it does not state")
    # a measured efficiency may exceed 1 where the count overstates what the kernels do (e.g. DP-SGD's assumed factor)
    if not isinstance(effs, Mapping) or any(k not in workloads() for k in effs) or not all(
            _positive(v) for v in effs.values()):
        raise PipelineError(f"{where}: entry {name!r}: efficiencies must map workloads ({', '.join(workloads())}) to "
                            f"shares > 0, got {effs!r}")
    return DeviceRates(name=name, kind=blob["kind"], note=str(blob.get("note") or ""),
                       rates={k: float(v) for k, v in rates.items()}, measured_on=blob.get("measured_on"),
                       date=None if blob.get("date") is None else str(blob["date"]),
                       peak_mem_mb={k: float(v) for k, v in (blob.get("peak_mem_mb") or {}).items()},
                       peak_tflops={k: float(v) for k, v in peaks.items()},
                       efficiency=float(blob["efficiency"]) if peaks else None,
                       headroom=float(blob["headroom"]) if peaks else None,
                       efficiencies={k: float(v) for k, v in effs.items()})


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int) -> dict[str, DeviceRates]:
    where = str(path)
    try:
        blob = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PipelineError(f"{where}: not a readable YAML rates file ({str(exc).splitlines()[0]})") from None
    if not isinstance(blob, Mapping) or blob.get("format") != FORMAT:
        raise PipelineError(f"{where}: not a device rates file (expected format: {FORMAT})")
    devices = blob.get("devices")
    if not isinstance(devices, Mapping) or BASE_ENTRY not in devices:
        raise PipelineError(f"{where}: devices must be a mapping holding at least the {BASE_ENTRY!r} entry")
    return {str(name): _entry(str(name), entry, where) for name, entry in devices.items()}


def load_rates(path: str | Path | None = None) -> dict[str, DeviceRates]:
    """Every entry of the rates file (default :data:`RATES_FILE`), checked."""
    p = Path(path) if path is not None else RATES_FILE
    return _load(p, p.stat().st_mtime_ns if p.exists() else 0)


def entry_name(config: Mapping[str, Any]) -> str:
    """The entry ``config`` uses: ``slurm.device_rates``, else :data:`DEFAULT_ENTRY`."""
    return str((config.get("slurm") or {}).get("device_rates") or DEFAULT_ENTRY)


def device_rates(config: Mapping[str, Any], path: str | Path | None = None) -> DeviceRates:
    """The entry ``config`` names; a one-line config error when the file has none of that name."""
    entries = load_rates(path)
    name = entry_name(config)
    if name not in entries:
        raise PipelineError(f"config error at slurm.device_rates: no entry {name!r} in {RATES_FILE.name} "
                            f"(entries: {', '.join(sorted(entries))}; make gpu-check WRITE={name} measures one)")
    return entries[name]


def write_entry(entry: DeviceRates, path: str | Path | None = None) -> Path:
    """Add or replace ``entry`` in the rates file (atomically; the other entries kept)."""
    p = Path(path) if path is not None else RATES_FILE
    entries = load_rates(p) if p.exists() else {}
    entries[entry.name] = entry
    if BASE_ENTRY not in entries:
        raise PipelineError(f"{p}: a rates file needs the {BASE_ENTRY!r} entry; write into a copy of {RATES_FILE}")
    blob = {"devices": {name: e.to_json() for name, e in entries.items()}, "format": FORMAT}
    with atomic_path(p, suffix=".yaml") as tmp:
        tmp.write_text(HEADER + yaml.safe_dump(blob, sort_keys=False, width=110))
    return p

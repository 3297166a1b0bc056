"""What a job costs: the shared arithmetic of runtimes (minutes), memory (MB) and threads, and the house's requests.

Each method's cost model lives with the method: ``pipeline/methods/<method>/costs.py`` holds its functions and its
table of rule -> :class:`Request`. Here is what several methods or the house's own stages share: the image size, the
device rates and counted FLOPs (:func:`rate`, :func:`flop_minutes`), torch threads, the data stage, the evaluation
core, the shared public pretraining, the GPU-memory plans (the shared DP-SGD engine's :func:`dpsgd_memory`
included), the cluster's time limit (segments and retries), and the house's own rules' requests
(:data:`HOUSE_REQUESTS`). A rule reads its whole ``resources:`` from its method's wiring, the house's rules from
``HOUSE``: ``resources: **X.resources("rule")`` (:func:`resources`), so no rule file holds a number. This
module imports no method. Every function is a pure function of the validated config (defaults filled). The models are
rough and deliberately generous (x4 headroom where a job runs on a shared CPU): a job that
hits its SLURM time limit is killed and loses its work, one that asks for too much only queues
a little longer. Pure Python (no Snakemake; no torch at import: a GPU-memory plan of a network that the footprint
caches do not hold counts it once with torch, pipeline/footprint.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import rates
from pipeline.config import RGB_SOURCES, schema_defaults
from pipeline.stage import PipelineError

Config = Mapping[str, Any]


def image_side(config: Config) -> int:
    """The side (pixels) of every split's square images: data.image_size."""
    return int(config["data"]["image_size"])


def image_channels(config: Config) -> int:
    """Colour channels of the private images: 3 for an RGB source (pipeline.config.RGB_SOURCES), else 1."""
    return 3 if config["data"]["private"]["source"] in RGB_SOURCES else 1


# the cost models below read them by their short private names
_side = image_side
_channels = image_channels


def rate(config: Config, workload: str) -> float:
    """Seconds per unit of ``workload`` (:func:`pipeline.rates.workloads`) on the device entry ``slurm.device_rates``
    names in ``pipeline/device_rates.yaml`` (default ``estimate``)."""
    return rates.device_rates(config).rate(workload)


def workload_flops(workload: str, fp: Any) -> float:
    """FLOPs of one unit of ``workload`` (:func:`pipeline.rates.workloads`) on a network of footprint ``fp``
    (pipeline/footprint.py): its training step's or its forward's per example, x the workload's factor (DP-SGD's
    :data:`pipeline.rates.DPSGD_FLOP_FACTOR`). ``make gpu-check`` measures a workload's efficiency against this
    count."""
    w = rates.workloads()[workload]
    per = fp.train_flops_per_example if w.pass_ == "train" else fp.forward_flops_per_example
    return float(per) * w.flop_factor


def flop_minutes(config: Config, units: float, workload: str, network: Callable[[], Mapping[str, Any]]
                 ) -> float | None:
    """Minutes to ask for ``units`` units of ``workload`` (:func:`pipeline.rates.workloads`: an example's training
    step or forward pass through ``network()``, a footprint spec formed only when needed) on the entry
    ``slurm.device_rates`` names, when it grounds runtimes in FLOPs (:attr:`pipeline.rates.DeviceRates.counts_flops`):
    the counted FLOPs (:func:`workload_flops`) / (the peak of the workload's dtype x the entry's efficiency of the
    workload, measured or assumed) x headroom. None on an entry of rates only: the cost model then uses its rate, and
    no network is counted."""
    entry = rates.device_rates(config)
    if not entry.counts_flops:
        return None
    fp = _counted(str(rates.workloads()[workload].network), network())
    return float(entry.headroom) * entry.workload_seconds(units * workload_flops(workload, fp), workload) / 60


def _counted(kind: str, network: Mapping[str, Any]) -> Any:
    """The counted footprint of ``network`` (pipeline/footprint.py), for a runtime grounded in FLOPs."""
    return footprint_of("runtime", kind, network)


def counted_forward_flops(kind: str, network: Mapping[str, Any]) -> float:
    """FLOPs of one example's forward pass through ``network`` (a footprint spec), counted (pipeline/footprint.py)."""
    return float(_counted(kind, network).forward_flops_per_example)


#: a footprint spec formed only when a runtime is counted (pipeline/footprint.py)
Network = Callable[[], Mapping[str, Any]]


def torch_threads(config: Config) -> int:
    """Threads for small CPU models: more than one only pays off above 16x16."""
    return 1 if _side(config) <= 16 else 4


# ----------------------------------------------------------------------------- core


def prepare_data_mem_mb(config: Config) -> int:
    """CelebA's 200k aligned JPEGs are decoded and resized in memory; every other source is small."""
    return 16000 if config["data"]["private"]["source"] == "celeba" else 4000


def prepare_data_runtime_min(config: Config) -> int:
    return 120 if config["data"]["private"]["source"] == "celeba" else 20


def evalnet_network(config: Config) -> dict[str, Any]:
    """The footprint spec of the evaluation CNN (pipeline/evaluation/evalnet.py; the downstream CNN shares it)."""
    from pipeline.config import declared_private

    ev = config["evaluation"]["evalnet"]
    side = _side(config)
    return {"shape": [_channels(config), side, side], "n_classes": int(declared_private(config)["n_classes"]),
            "width": int(ev["width"]), "feature_dim": int(ev["feature_dim"])}


def evalnet_runtime_min(config: Config) -> int:
    """Training the evaluation net: epochs x n_eval_train images. On an entry with peaks (:func:`flop_minutes`) the
    CNN's counted training FLOPs in TF32; else ~2 ms per 16x16 image-epoch on one CPU core, x4 headroom."""
    ev = config["evaluation"]["evalnet"]
    n = config["data"]["private"]["n_eval_train"]
    counted = flop_minutes(config, ev["epochs"] * n, "evalnet_train", lambda: evalnet_network(config))
    if counted is not None:
        return max(10, int(counted) + 5)
    return max(10, int(4 * ev["epochs"] * n * (_side(config) / 16) ** 2 * 2e-3 / 60) + 5)


def clip_runtime_min(config: Config) -> int:
    """The small CLIP: steps x groups x classes images through a 2-layer ViT (~0.25 s per step of 16 x 10 16x16
    images on one CPU core), x4 headroom."""
    c = config["evaluation"]["clip"]
    return max(5, int(4 * c["steps"] * c["groups"] * 10 * (_side(config) / 16) ** 2 * 1.6e-3 / 60) + 5)


# The evaluation's host (CPU) work, measured on one core of the 2-core development machine (2026-12-07; a cluster
# node's core is assumed no slower): numpy's float64 covariance of [20000, 2048] features (torch-fidelity's FID
# statistics) ran at 105 GFLOP/s, scipy's sqrtm of a 2048x2048 covariance took 11 s (8.5 s on 2 cores), and
# scikit-learn's fits at the cost models' FLOP counts (below) took 1.8e-11 s (the MLP, 56 GFLOP/s) and 5.1e-10 s
# (lbfgs logistic regression, whose line searches and float64 copies dominate) per FLOP.
HOST_COV_FLOPS_PER_S = 1.0e11
SQRTM_S_AT_2048 = 11.0
SKLEARN_S_PER_FLOP = {"mlp": 1.8e-11, "logreg": 5.1e-10}
#: scikit-learn's iteration caps of the downstream classifiers (pipeline/evaluation/downstream.py: a fit that does
#: not converge stops there, so the cap bounds the work)
SKLEARN_MAX_ITER = {"logreg": 500, "mlp": 200}
#: torch-fidelity's Inception-V3 pool features
INCEPTION_FEATURE_DIM = 2048


def _feature_network(config: Config) -> tuple[str, Mapping[str, Any], int]:
    """(footprint kind, spec, feature dimension) of the configured feature extractor."""
    if config["evaluation"]["feature_extractor"] == "evalnet":
        net = evalnet_network(config)
        return "evalnet", net, int(net["feature_dim"])
    side = _side(config)
    # grey images reach Inception as RGB (pipeline/evaluation/fidelity.py repeats the channel)
    return "inception_v3", {"shape": [3, side, side]}, INCEPTION_FEATURE_DIM


def evaluation_seconds(config: Config, n_samples: int, *, features_only: bool = False
                       ) -> tuple[dict[str, float], float]:
    """({workload: GPU FLOPs}, host seconds) of scoring ``n_samples`` samples (pipeline/evaluation/stage.py
    ``evaluate``). Forward passes (workload ``features``): the feature extractor's over the samples (twice: FID against
    test and against val), test and val; the evaluation net's over the samples (label consistency); the downstream
    CNN's scoring. Training (workload ``evalnet_train``): the downstream CNN's (cnn_epochs x repeats over the samples).
    On the host: the FID covariances (whole sets and per class) and their matrix square roots, and scikit-learn's
    classifiers at their iteration caps. ``features_only``: a sharded cell's feature job, the extractor's forward over
    its samples alone."""
    from pipeline.config import declared_private

    private = config["data"]["private"]
    kind, net, dim = _feature_network(config)
    extract = counted_forward_flops(kind, net)
    if features_only:
        return {"features": n_samples * extract}, 0.0
    n_test, n_val = int(private["n_test"]), int(private.get("n_val") or 0)
    ev = _counted("evalnet", evalnet_network(config))
    down = config["evaluation"]["downstream"]
    repeats = int(down["repeats"])
    forward = (2 * n_samples + n_test + n_val) * extract + n_samples * ev.forward_flops_per_example
    train = 0.0
    if "cnn" in down["classifiers"]:
        forward += repeats * (n_test + n_val) * ev.forward_flops_per_example
        train = repeats * down["cnn_epochs"] * n_samples * workload_flops("evalnet_train", ev)
    n_classes = int(declared_private(config)["n_classes"])
    cov_flops = 2 * (2 * (n_samples + n_test) + (n_samples + n_val)) * dim**2
    host = cov_flops / HOST_COV_FLOPS_PER_S + (2 + n_classes) * SQRTM_S_AT_2048 * (dim / 2048) ** 3
    pixels = _channels(config) * _side(config) ** 2
    per_iter = {"logreg": 4 * n_samples * pixels * n_classes,
                "mlp": 6 * n_samples * (pixels * down["mlp_hidden"] + down["mlp_hidden"] * n_classes)}
    for kind_ in ("logreg", "mlp"):
        if kind_ in down["classifiers"]:
            host += repeats * SKLEARN_MAX_ITER[kind_] * per_iter[kind_] * SKLEARN_S_PER_FLOP[kind_]
    return {"features": float(forward), "evalnet_train": float(train)}, float(host)


#: a scoring job's start before any work: the interpreter, torch, torch-fidelity and scikit-learn imported (21 s on
#: this 2-core machine under a load of 4), the splits and the feature network's weights read; counted with the work,
#: so the request is headroom x (start + work) rather than a fixed margin over it
EVALUATION_STARTUP_S = 60.0


def evaluation_runtime_min(config: Config, n_samples: int | None = None, *, features_only: bool = False) -> int:
    """Scoring one sample set of ``n_samples`` (default: the test split's size).

    On an entry with peaks: :func:`evaluation_seconds`, each workload's network FLOPs at the entry's peak x its
    efficiency, the host work at its measured rates and the job's start (:data:`EVALUATION_STARTUP_S`), x headroom,
    at least 5 minutes. Else (the ``estimate`` entry): features + 3 downstream classifiers, each repeated, on the test
    split at ~2 ms per 16x16 image-epoch on one CPU core, x4.
    """
    entry = rates.device_rates(config)
    if entry.counts_flops:
        n = int(config["data"]["private"]["n_test"] if n_samples is None else n_samples)
        flops, host = evaluation_seconds(config, n, features_only=features_only)
        gpu = sum(entry.workload_seconds(f, workload) for workload, f in flops.items())
        return max(5, math.ceil(entry.headroom * (gpu + host + EVALUATION_STARTUP_S) / 60))
    n = config["data"]["private"]["n_test"]
    down = config["evaluation"]["downstream"]
    epochs = down["cnn_epochs"] * down["repeats"]
    return max(10, int(4 * epochs * n * (_side(config) / 16) ** 2 * 2e-3 / 60) + 10)


def pretrain_runtime_min(config: Config) -> int:
    """The public EDM denoiser (rule pretrain_public).

    On an entry with peaks (:func:`flop_minutes`): the UNet's counted training FLOPs per image, in TF32. Else: at
    <= 16x16 it runs on one CPU core at ~0.3 s per step of 64 images (x4 headroom for a shared machine); paper
    presets run on one GPU at the device rate ``pretrain_public`` per 32x32 image (the estimate: EDM's DDPM++ at
    ~4e-4 GPU-s, Karras et al. 2022 App. F), x1.5 headroom.
    """
    images = config["pretrain"]["steps"] * config["pretrain"]["batch_size"]
    counted = flop_minutes(config, images, "pretrain_public", lambda: pretrain_network(config))
    if counted is not None:
        return 10 + int(counted)
    side = _side(config)
    if side <= 16:
        return 10 + int(4 * images / 64 * 0.3 / 60)
    return 10 + int(1.5 * images * (side / 32) ** 2 * rate(config, "pretrain_public") / 60)


def pretrain_mem_mb(config: Config) -> int:
    return 4000 if _side(config) <= 16 else 16000


# ----------------------------------------------------------------------------- GPU memory
# A GPU training job holds its training state (weights, gradients, optimiser moments, EMA) and one micro-batch's
# activations; a configured batch whose activations do not fit is reached by gradient accumulation over
# micro-batches that do (pipeline/training/accumulate.py), as EDM's batch_gpu. The activations per example are
# counted on the real network (pipeline/footprint.py), not assumed.

#: bytes per trainable parameter of public training: float32 weights, gradient, Adam's two moments, the EMA copy
TRAIN_STATE_BYTES_PER_PARAM = 20
#: what a training step allocates beyond the saved tensors autograd counts (the backward's activation gradients,
#: kernels' workspaces, the allocator's fragmentation over many micro-batches), as a factor on the counted bytes:
#: measured on the CPU for the cifar10 preset's public UNet at 1.0 for one pass of 16 images and 1.39 for a batch of
#: 512 accumulated over 31 micro-batches of 17 (tests/training/test_accumulate.py; docs/measurements.md), rounded up
TRANSIENT_FACTOR = 1.5
#: the CUDA context, cuDNN/cuBLAS workspaces and the caching allocator's fragmentation: a share of the GPU's
#: memory kept free, and a fixed amount on top
GPU_USABLE_FRACTION = 0.9
GPU_RESERVE_BYTES = 1.5 * 2**30
#: a class-conditional public denoiser's classes are those of the public images, which the configuration does not
#: declare: its footprint is counted with ImageNet's 1000 (the embedding, 4 MB at the presets' width, is the only
#: part they change, so this bounds every public set of at most 1000 classes)
PUBLIC_CLASSES_BOUND = 1000


def gpu_mem_gb_limit(config: Config) -> float:
    """``slurm.gpu_mem_gb`` as configured (the plan's limit; the schema's default where a partial config has none)."""
    gb = (config.get("slurm") or {}).get("gpu_mem_gb")
    return float(schema_defaults("slurm")["gpu_mem_gb"] if gb is None else gb)


def gpu_mem_bytes(config: Config) -> float:
    """The memory one job may use on one GPU: ``slurm.gpu_mem_gb`` less what the driver and allocator keep."""
    return gpu_mem_gb_limit(config) * 2**30 * GPU_USABLE_FRACTION - GPU_RESERVE_BYTES


def pretrain_network(config: Config, unet: Mapping[str, Any] | None = None,
                     shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """The footprint spec of a public EDM denoiser (stage pretrain_public): ``unet`` (default ``pretrain.unet``) on
    ``shape`` = (channels, side) examples (default the images'; DP-LDM's latent denoiser passes its codes')."""
    section = dict(config["pretrain"]["unet"] if unet is None else unet)
    channels, side = shape if shape is not None else (_channels(config), _side(config))
    classes = PUBLIC_CLASSES_BOUND if config["pretrain"]["class_conditional"] else 0
    return {"unet": {**section, "image_size": int(side), "channels": int(channels), "num_classes": classes}}


def footprint_of(rule: str, kind: str, network: Mapping[str, Any]) -> Any:
    """The network's footprint (pipeline/footprint.py: cached, else counted with torch); a network that cannot be built
    on its examples (e.g. more levels than the size allows) is a one-line config error naming ``rule``."""
    from pipeline import footprint

    try:
        return footprint.footprint(kind, network)
    except ValueError as exc:
        raise PipelineError(f"config error: rule {rule}'s network: {exc}") from None


def _train_state_bytes(fp: Any) -> float:
    """What a training job holds whatever its micro-batch: the training state per parameter and the activations that
    do not grow with the batch."""
    return fp.params * TRAIN_STATE_BYTES_PER_PARAM + TRANSIENT_FACTOR * fp.saved_bytes_fixed


@dataclass(frozen=True)
class MemoryPlan:
    """A GPU training job's micro-batch and the GPU memory it is predicted to use (bytes)."""

    batch: int
    micro_batch: int
    predicted_bytes: float
    state_bytes: float
    per_example_bytes: float

    @property
    def micro_batches(self) -> int:
        return -(-self.batch // self.micro_batch)

    @property
    def predicted_mb(self) -> int:
        return int(math.ceil(self.predicted_bytes / 2**20))


def memory_plan(config: Config, rule: str, network: Mapping[str, Any], batch: int, *,
                kind: str = "edm_unet") -> MemoryPlan:
    """The largest micro-batch of ``network``'s training (``batch`` examples per step) that fits ``slurm.gpu_mem_gb``,
    and the job's predicted GPU memory with it; a one-line config error naming ``rule`` when not one example fits."""
    fp = footprint_of(rule, kind, network)
    state = _train_state_bytes(fp)
    per_example = TRANSIENT_FACTOR * fp.saved_bytes_per_example
    budget = gpu_mem_bytes(config)
    fits = int((budget - state) // per_example) if budget > state else 0
    if fits < 1:
        need = (state + per_example + GPU_RESERVE_BYTES) / GPU_USABLE_FRACTION / 2**30
        raise PipelineError(f"config error at slurm.gpu_mem_gb: rule {rule} needs about {need:.1f} GB of GPU memory "
                            f"for one example (training state {state / 2**30:.1f} GB, {per_example / 2**20:,.0f} MB "
                            f"per example), more than the {gpu_mem_gb_limit(config):g} GB declared")
    micro = min(batch, fits)
    # the accumulation splits the batch evenly: its largest micro-batch is ceil(batch / micro-batches)
    largest = -(-batch // -(-batch // micro))
    return MemoryPlan(batch, micro, state + largest * per_example + GPU_RESERVE_BYTES, state, per_example)


def accumulation_params(plan: MemoryPlan) -> dict[str, int]:
    """A public training stage's ``batch_gpu`` param (EDM's name: examples per forward/backward pass), only when the
    batch is split (so a batch that fits keeps its params, and its job is not rerun for a key that changes nothing)."""
    return {"batch_gpu": plan.micro_batch} if plan.micro_batch < plan.batch else {}


#: per-example gradients the vmap route holds per example of a micro-batch, in parameter copies: the gradients and
#: their clipped, scaled copy before the sum (pipeline/privacy/dpsgd.py clip_and_sum)
PER_EXAMPLE_GRAD_COPIES = 2


def dpsgd_memory(network: Mapping[str, Any], micro_batch: int, K: int, *, kind: str = "edm_unet") -> MemoryPlan:
    """A DP-SGD job's GPU memory (pipeline/privacy/dpsgd.py): the training state, one physical micro-batch's
    ``micro_batch`` x ``K`` example-draws of activations and, by the vmap route, its examples' per-example gradients
    (ghost clipping holds none; the bound is the vmap route's, which ``auto`` may fall back to). The micro-batch is the
    configured one: it is part of the run's configuration, since it orders the diffusion draws."""
    fp = footprint_of("DP-SGD", kind, network)
    state = _train_state_bytes(fp)
    per_example = K * TRANSIENT_FACTOR * fp.saved_bytes_per_example + PER_EXAMPLE_GRAD_COPIES * 4 * fp.params
    return MemoryPlan(micro_batch, micro_batch, state + micro_batch * per_example + GPU_RESERVE_BYTES, state,
                      per_example)


def forward_memory(rule: str, kind: str, network: Mapping[str, Any], batch: int, *, held_bytes: float = 0.0
                   ) -> MemoryPlan:
    """A gradient-free job's GPU memory (sampling, feature extraction): ``network``'s float32 weights, ``held_bytes``
    the job keeps beside it on the GPU (e.g. a private block's records), and one batch of ``batch`` examples'
    activations at their forward peak (counted, pipeline/footprint.py) x :data:`TRANSIENT_FACTOR`."""
    fp = footprint_of(rule, kind, network)
    state = 4 * fp.params + held_bytes + TRANSIENT_FACTOR * fp.forward_peak_bytes_fixed
    per_example = TRANSIENT_FACTOR * fp.forward_peak_bytes_per_example
    return MemoryPlan(batch, batch, state + batch * per_example + GPU_RESERVE_BYTES, state, per_example)


def public_denoiser_gpu_mem_mb(wiring: Any, plan: Callable[[Any], MemoryPlan]) -> Value | None:
    """``gpu_mem_mb`` of a job that runs the public denoiser: ``plan(wildcards)``'s prediction, a function so that it
    is counted only for a DAG that runs the job; None where the public denoiser is a folder the user brings
    (``pretrain.source`` diffusers), whose network the configuration does not describe."""
    if wiring.house.imports_public_denoiser:
        return None
    return lambda wildcards: plan(wildcards).predicted_mb


def evaluation_memory(config: Config, rule: str = "evaluate", n_samples: int | None = None) -> MemoryPlan:
    """One job of the evaluation core: the larger of its feature extraction (the configured extractor's forward over
    ``evaluation.batch_size`` images) and the downstream CNN's training on its ``n_samples`` synthetic images
    (:func:`evalnet_memory`)."""
    kind, net, _ = _feature_network(config)
    features = forward_memory(rule, kind, net, int(config["evaluation"]["batch_size"]))
    return max(features, evalnet_memory(config, rule, n_samples), key=lambda plan: plan.predicted_bytes)


def training_memory(rule: str, kind: str, network: Mapping[str, Any], batch: int, *, held_bytes: float = 0.0
                    ) -> MemoryPlan:
    """A public training job that runs its whole ``batch`` in one pass (no accumulation): the training state, the
    saved activations of ``batch`` examples and ``held_bytes`` the job keeps beside them on the GPU (its data)."""
    fp = footprint_of(rule, kind, network)
    state, per_example = _train_state_bytes(fp) + held_bytes, TRANSIENT_FACTOR * fp.saved_bytes_per_example
    return MemoryPlan(batch, batch, state + batch * per_example + GPU_RESERVE_BYTES, state, per_example)


def evalnet_memory(config: Config, rule: str = "train_evalnet", n_images: int | None = None) -> MemoryPlan:
    """Training the evaluation CNN (pipeline/evaluation/evalnet.py ``fit_classifier``: rule train_evalnet, and the
    downstream CNN of every evaluation job, the same architecture): ``evaluation.evalnet.batch_size`` images a step,
    its ``n_images`` uint8 training images held on the GPU (default ``data.private.n_eval_train``)."""
    n = int(config["data"]["private"]["n_eval_train"] if n_images is None else n_images)
    return training_memory(rule, "evalnet", evalnet_network(config), int(config["evaluation"]["evalnet"]["batch_size"]),
                           held_bytes=n * _channels(config) * _side(config) ** 2)


def pretrain_memory(config: Config, rule: str = "pretrain_public", unet: Mapping[str, Any] | None = None,
                    shape: tuple[int, int] | None = None) -> MemoryPlan:
    """The public denoiser's memory plan (rule pretrain_public, and the methods' own public pretraining that reads
    the same section)."""
    return memory_plan(config, rule, pretrain_network(config, unet, shape), int(config["pretrain"]["batch_size"]))


def folder_mb(path: str | None) -> float:
    """MB of every file under the folder ``path`` (0 when it is not one: the input check names that)."""
    folder = Path(os.path.expanduser(str(path or "")))
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20 if folder.is_dir() else 0


def import_public_mem_mb(config: Config) -> int:
    """Loading the user's public UNet2DModel (rule import_public): the weights in memory about three times over
    (diffusers' load, the state dict copied out, torch.save's buffer) and 2 GB for torch and diffusers."""
    return 2000 + int(3 * folder_mb(config["pretrain"].get("path")))


# ----------------------------------------------------------------------------- the cluster's time limit

#: the house's training rules that checkpoint and resume (pipeline/training/loop.py): their runtime and retries come
#: from :func:`segment_runtime_min` and :func:`segment_retries`, so over the limit they run in segments (a method's
#: own are its :attr:`pipeline.plugins.Method.resumable_rules`)
HOUSE_RESUMABLE_RULES = ("pretrain_public",)
#: one resubmission for a transient failure (node failure, preemption), as the slurm profile's `retries: 1`
TRANSIENT_RETRIES = 1


def max_job_minutes(config: Config) -> int | None:
    """The partition's time limit in minutes (``slurm.max_job_hours``), or None for no limit."""
    hours = (config.get("slurm") or {}).get("max_job_hours")
    return None if hours is None else max(1, int(hours * 60))


def segments(config: Config, minutes: int) -> int:
    """How many submissions of at most the limit cover a resumable job predicted to take ``minutes``."""
    limit = max_job_minutes(config)
    return 1 if limit is None else max(1, -(-int(minutes) // limit))


def segment_runtime_min(config: Config, minutes: int) -> int:
    """The runtime a resumable training job asks for: its prediction, or the limit when it does not fit.

    The training loop (pipeline/training/loop.py) saves its resumable state on SLURM's SIGTERM at the
    limit and every ``checkpoint_every_s``; the resubmission (:func:`segment_retries`) resumes from it.
    """
    limit = max_job_minutes(config)
    return int(minutes) if limit is None else min(int(minutes), limit)


def segment_retries(config: Config, minutes: int) -> int | None:
    """A resumable job's Snakemake ``retries``: one per extra segment plus the transient-failure one; None without a
    limit (the rule then takes Snakemake's own ``--retries``: 0 locally, the slurm profile's 1)."""
    if max_job_minutes(config) is None:
        return None
    return segments(config, minutes) - 1 + TRANSIENT_RETRIES


# ----------------------------------------------------------------------------- each rule's request

#: a resource's value: a number, or a function of a job's wildcards where the jobs of one rule differ (Snakemake
#: calls it per job; a function also defers a count, e.g. a GPU-memory plan, to the DAGs that run the rule)
Value = int | Callable[..., int]


@dataclass(frozen=True)
class Request:
    """What each job of one rule asks the cluster for: the rule's ``resources:``.

    ``mem_mb`` host memory (MB) and ``runtime`` (minutes); ``gpu`` GPUs (None: a CPU job); ``gpu_mem_mb`` the predicted
    GPU memory per process, which the plan checks against ``slurm.gpu_mem_gb`` (pipeline/plan.py); ``tasks`` SLURM
    tasks (a data-parallel job's processes share one).
    """

    mem_mb: Value
    runtime: Value
    gpu: Value | None = None
    gpu_mem_mb: Value | None = None
    tasks: int | None = None

    def resources(self) -> dict[str, Any]:
        """The rule's ``resources:`` (``resources: **X.resources("rule")`` in its rule file): the keys asked for, in
        the order gpu, gpu_mem_mb, tasks, mem_mb, runtime."""
        keys = {"gpu": self.gpu, "gpu_mem_mb": self.gpu_mem_mb, "tasks": self.tasks, "mem_mb": self.mem_mb,
                "runtime": self.runtime}
        return {k: v for k, v in keys.items() if v is not None}


#: a table or figure read from a few small files (the accountants' blocks, a ledger, the index): 1 GB, 5 minutes
LIGHT_JOB = Request(mem_mb=1000, runtime=5)
#: a table or figure joining many runs' metrics and ledgers: 2 GB, 10 minutes
TABLE_JOB = Request(mem_mb=2000, runtime=10)
#: a figure or grid of samples drawn from a few sample sets: 2 GB, 5 minutes
FIGURE_JOB = Request(mem_mb=2000, runtime=5)
#: host memory of one job of the evaluation core: the sample set, the test and val splits, the feature network
EVALUATION_MEM_MB = 6000


def evaluation_request(config: Config, n_samples: int | None = None, *, features_only: bool = False) -> Request:
    """One job of the evaluation core on one GPU scoring ``n_samples`` samples (:func:`evaluation_runtime_min`; a
    sharded cell's feature job with ``features_only``), its GPU memory :func:`evaluation_memory`."""
    return Request(gpu=1, gpu_mem_mb=lambda wildcards: evaluation_memory(config, n_samples=n_samples).predicted_mb,
                   mem_mb=EVALUATION_MEM_MB,
                   runtime=evaluation_runtime_min(config, n_samples, features_only=features_only))


#: a rule's entry in its owner's table: its request, or a function of the configuration and the owner's wiring (the
#: object the rule file asks, which knows its runs and paths) that forms it when the rule file is read
Requested = Request | Callable[[Config, Any], Request]

#: the house's own rules (rules/data.smk, evaluate.smk, pretrain.smk, report.smk, review.smk, bundles.smk): each
#: method's are in pipeline/methods/<method>/costs.py
HOUSE_REQUESTS: dict[str, Requested] = {
    "prepare_data": lambda c, _: Request(mem_mb=prepare_data_mem_mb(c), runtime=prepare_data_runtime_min(c)),
    "train_evalnet": lambda c, _: Request(gpu=1, gpu_mem_mb=lambda wildcards: evalnet_memory(c).predicted_mb,
                                          mem_mb=4000, runtime=evalnet_runtime_min(c)),
    # the small CLIP trains on the CPU (pipeline/evaluation/clip.py train_clip moves nothing to a device): no GPU, so
    # its job goes to slurm.cpu_partition
    "train_clip": lambda c, _: Request(mem_mb=3000, runtime=clip_runtime_min(c)),
    "import_clip": Request(mem_mb=8000, runtime=10),
    "evaluate_reference_real": lambda c, _: evaluation_request(c, c["data"]["private"]["n_reference"]),
    "import_public": lambda c, _: Request(mem_mb=import_public_mem_mb(c), runtime=10),
    # the GPU-memory plan a function: a job's micro-batch and GPU memory are counted only for a DAG that runs it
    "pretrain_public": lambda c, _: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: pretrain_memory(c).predicted_mb, mem_mb=pretrain_mem_mb(c),
        runtime=segment_runtime_min(c, pretrain_runtime_min(c))),
    "reference_real": LIGHT_JOB,
    "data_samples": FIGURE_JOB,
    "index_html": LIGHT_JOB,
    "all_runs_table": Request(mem_mb=4000, runtime=30),
    "privacy_utility_figure": FIGURE_JOB,
    "runtime_table": LIGHT_JOB,
    "runtime_figure": FIGURE_JOB,
    "report_tables": TABLE_JOB,
    "export_bundle": Request(mem_mb=4000, runtime=15),
}


def resources(requests: Mapping[str, Requested], rule: str, config: Config, wiring: Any = None) -> dict[str, Any]:
    """``rule``'s ``resources:`` from its owner's table of requests (:data:`HOUSE_REQUESTS`, a method's
    ``costs.REQUESTS``), formed with ``config`` and the asking ``wiring``; a rule the table lacks is a KeyError naming
    it and the rules it has."""
    try:
        request = requests[rule]
    except KeyError:
        raise KeyError(f"no request for rule {rule!r} (the table has {', '.join(sorted(requests))})") from None
    return (request if isinstance(request, Request) else request(config, wiring)).resources()

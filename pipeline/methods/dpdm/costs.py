"""What DPDM's jobs cost: its denoiser's footprint spec, its DP-SGD runs' runtime and memory (host and GPU), its
samplers', the task-specific DP-SGD classifier's and Fig. 3's runtimes, and each of its rules' request
(:data:`REQUESTS`, read by :meth:`pipeline.methods.dpdm.wiring.Wiring.resources`).

A DP-SGD run counts T steps x B x K example-draws, each with its per-example gradient; on a device entry with peaks
the UNet's counted FLOPs (pipeline/footprint.py) at the entry's efficiency, else the entry's rates
(:func:`pipeline.resources.rate`). The DP-SGD baselines (DP-PROMISE's phase 1, the DP-SGD baseline, their samplers)
run this engine and read these costs. Pure functions of the validated config; no torch at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.resources import FIGURE_JOB, LIGHT_JOB, TABLE_JOB, Request, Requested
from pipeline.methods.dpdm.runs import DpdmRun

Config = Mapping[str, Any]


def network(config: Config) -> dict[str, Any]:
    """The footprint spec of DPDM's denoiser (dpdm.unet on the private images; the declared classes when
    class-conditional). Its preconditioning (EDM or v-prediction) wraps the same UNet: counted as EDM's."""
    from pipeline.config import declared_private

    d = config["dpdm"]
    classes = declared_private(config)["n_classes"] if d["class_conditional"] else 0
    return {"unet": {**d["unet"], "image_size": cost.image_side(config), "channels": cost.image_channels(config),
                     "num_classes": classes}}


def train_gpu_mem_mb(config: Config, K: int) -> int:
    """One DPDM run's predicted GPU memory per process (rule train_dpdm; its K from the run name): the shared DP-SGD
    engine's plan (:func:`pipeline.resources.dpsgd_memory`) of dpdm.micro_batch examples x K draws."""
    return cost.dpsgd_memory(network(config), int(config["dpdm"]["micro_batch"]), K).predicted_mb


def train_runtime_min(config: Config, K: int | None = None) -> int:
    """One DP-SGD run: T steps x B x K example-draws (``K`` the run's, default dpdm.K).

    On an entry with peaks (:func:`pipeline.resources.flop_minutes`): the counted training FLOPs of DPDM's UNet per
    example-draw x :data:`pipeline.rates.DPSGD_FLOP_FACTOR`, in TF32. Else the device rate ``dpdm_dpsgd`` per
    16x16 example-draw with its per-example gradient (the estimate: 2e-5 s on one GPU; ~1e-2 s on one CPU core), x4
    headroom.
    """
    d = config["dpdm"]
    n = config["data"]["private"]["n_private_train"] or 60000
    steps = -(-int(d["epochs"] * n) // d["batch_size"])
    work = steps * d["batch_size"] * (d["K"] if K is None else K)
    counted = cost.flop_minutes(config, work, "dpdm_dpsgd", lambda: network(config))
    if counted is not None:
        return max(30, int(counted) + 10)
    return max(30, int(4 * work * (cost.image_side(config) / 16) ** 2 * cost.rate(config, "dpdm_dpsgd") / 60) + 10)


def train_mem_mb(config: Config) -> int:
    """Host memory of one run: data, model and one micro-batch x K draws of activations (~0.5 MB each at 16x16)."""
    d = config["dpdm"]
    return 4000 + int(d["micro_batch"] * d["K"] * (cost.image_side(config) / 16) ** 2 * 0.5)


def sample_runtime_min(config: Config) -> int:
    """One sample set: n_samples x network evaluations of the costliest sampler (on an entry with peaks the UNet's
    counted forward FLOPs in TF32; else ~1 ms per 16x16 image-NFE on CPU)."""
    s = config["dpdm"]["sampling"]
    steps = max(2 * c.get("steps", 50) * (2 if c.get("guidance", 0) else 1) for c in s["samplers"].values())
    counted = cost.flop_minutes(config, s["n_samples"] * steps, "unet_sample", lambda: network(config))
    if counted is not None:
        return max(10, int(counted) + 10)
    return max(10, int(4 * s["n_samples"] * steps * (cost.image_side(config) / 16) ** 2 * 1e-3 / 60) + 10)


def sample_memory(config: Config) -> cost.MemoryPlan:
    """One sample set's GPU memory: the denoiser's forward over ``dpdm.sampling.batch_size`` images, twice that where a
    sampler guides (pipeline/sampling/samplers.py evaluates the conditional and unconditional halves as one batch)."""
    s = config["dpdm"]["sampling"]
    guided = any(c.get("guidance", 0) for c in s["samplers"].values())
    return cost.forward_memory("sample_dpdm", "edm_unet", network(config), int(s["batch_size"]) * (2 if guided else 1))


def classifier_runtime_min(config: Config) -> int:
    """One task-specific DP-SGD classifier run (rule train_dpsgd_classifier): epochs x N examples' clipped
    gradients of the downstream CNN, ~0.3 ms each at 16x16 on one CPU core (measured 8 CPU-s for 12,500 with
    ghost clipping), x4 headroom."""
    c = config["dpdm"].get("dpsgd_classifier") or {}
    n = config["data"]["private"]["n_private_train"] or 60000
    examples = float(c.get("epochs", 0)) * n
    return max(10, int(4 * examples * (cost.image_side(config) / 16) ** 2 * 3e-4 / 60) + 5)


def gradient_variance_runtime_min(config: Config) -> int:
    """DPDM Fig. 3 (rule dpdm_gradient_variance): n_images x repeats x sum(K) per-example denoiser gradients,
    ~9 ms each at 16x16 on one CPU core (measured 20 CPU-s for 2,232), x4 headroom."""
    g = config["dpdm"].get("gradient_variance") or {}
    draws = g.get("n_images", 0) * g.get("repeats", 0) * sum(g.get("K", []))
    return max(5, int(4 * draws * (cost.image_side(config) / 16) ** 2 * 9e-3 / 60) + 5)


def classifier_memory(config: Config) -> cost.MemoryPlan:
    """One task-specific DP-SGD classifier run's GPU memory (rule train_dpsgd_classifier): the shared DP-SGD engine's
    plan (:func:`pipeline.resources.dpsgd_memory`, K = 1) of the downstream CNN (evaluation.evalnet's architecture,
    what pipeline/methods/dpdm/dpsgd_classifier.py trains) at the section's
    micro_batch. The linear ``logreg`` holds less
    (one weight matrix, no hidden activations): the CNN's plan bounds both."""
    from pipeline.config import schema_defaults

    c = config["dpdm"].get("dpsgd_classifier") or schema_defaults("dpdm", "dpsgd_classifier")
    return cost.dpsgd_memory(cost.evalnet_network(config), int(c["micro_batch"]), 1, kind="evalnet")


#: draws per vmap call of Fig. 3's per-example gradients (pipeline/methods/dpdm/gradient_variance.py's micro_batch,
#: which the wiring leaves at the stage's default)
VARIANCE_MICRO_BATCH = 64


def gradient_variance_memory(config: Config) -> cost.MemoryPlan:
    """DPDM Fig. 3's GPU memory (rule dpdm_figure3_gradient_variance), the largest over its K: the engine's
    per-example gradients (:func:`pipeline.resources.dpsgd_memory`) of the public denoiser on ``64 // K`` rows of K
    draws at a time, and the image's ``repeats`` flattened gradients it keeps in float64 (twice: the rows and their
    concatenation)."""
    from pipeline.config import schema_defaults

    g = config["dpdm"].get("gradient_variance") or schema_defaults("dpdm", "gradient_variance")
    network = cost.pretrain_network(config)
    plans = [cost.dpsgd_memory(network, max(1, VARIANCE_MICRO_BATCH // int(K)), int(K)) for K in g["K"]]
    plan = max(plans, key=lambda p: p.predicted_bytes)
    params = cost.footprint_of("dpdm_figure3_gradient_variance", "edm_unet", network).params
    held = 2 * int(g["repeats"]) * params * 8
    return cost.MemoryPlan(plan.batch, plan.micro_batch, plan.predicted_bytes + held, plan.state_bytes + held,
                           plan.per_example_bytes)


def run_K(wildcards: Any) -> int:
    """The noise multiplicity K of a training job's run (its ``run`` wildcard, :class:`DpdmRun`)."""
    return DpdmRun.from_name(wildcards.run).K


#: each rule of rules/dpdm.smk -> its request (``w`` the asking wiring, :class:`pipeline.methods.dpdm.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    # dpdm.gpus data-parallel processes in one SLURM task (torchrun starts them: pipeline/distributed.py), each holding
    # the data, the model and its micro-batch; each job at its own run's K (the K ablation's K = 1 run asks for 1/32
    # of K = 32's work where the entry counts FLOPs), within the cluster's time limit (resumable: segments)
    "train_dpdm": lambda c, w: Request(
        gpu=w.train_gpus, gpu_mem_mb=lambda wildcards: train_gpu_mem_mb(c, run_K(wildcards)), tasks=1,
        mem_mb=train_mem_mb(c) * w.train_gpus,
        runtime=lambda wildcards: cost.segment_runtime_min(c, train_runtime_min(c, run_K(wildcards)))),
    "sample_dpdm": lambda c, w: Request(gpu=1, gpu_mem_mb=lambda wildcards: sample_memory(c).predicted_mb, mem_mb=4000,
                                        runtime=sample_runtime_min(c)),
    "evaluate_dpdm": lambda c, w: cost.evaluation_request(c, c["dpdm"]["sampling"]["n_samples"]),
    "dpdm_select_sampler": LIGHT_JOB,
    "dpdm_table_main": TABLE_JOB,
    "dpdm_table_noise_multiplicity": TABLE_JOB,
    "dpdm_table_samplers": TABLE_JOB,
    "dpdm_table_configurations": TABLE_JOB,
    "dpdm_samples_by_epsilon": FIGURE_JOB,
    "dpdm_samples_by_sampler": FIGURE_JOB,
    "train_dpsgd_classifier": lambda c, w: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: classifier_memory(c).predicted_mb, mem_mb=3000,
        runtime=classifier_runtime_min(c)),
    "dpdm_table_dpsgd_classifier": TABLE_JOB,
    # the public denoiser's network: not counted where it is a folder the user brings
    "dpdm_figure3_gradient_variance": lambda c, w: Request(
        gpu=1, gpu_mem_mb=cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: gradient_variance_memory(c)),
        mem_mb=3000, runtime=gradient_variance_runtime_min(c)),
}

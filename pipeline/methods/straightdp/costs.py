"""What STRAIGHTDP's jobs cost: its MM-DiT's footprint spec, the runtimes of public flow pretraining, of a Stage 2
run (distillation and DP-SGD) and of sampling, the memory of importing the user's flow, and each of its rules'
request (:data:`REQUESTS`, read by :meth:`pipeline.methods.straightdp.wiring.Wiring.resources`).

On a device entry with peaks the MM-DiT's counted FLOPs (pipeline/footprint.py) in FP32, at the entry's efficiency;
else scaled by image area and work from 2-CPU-core measurements at the embedded size (16x16, the schema's small
MM-DiT), x4 headroom. The GPU-memory plans need the arms' sections and live in the wiring
(:meth:`~pipeline.methods.straightdp.wiring.Wiring.pretrain_memory`). Pure functions of the validated config; no
torch at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.resources import FIGURE_JOB, TABLE_JOB, Request, Requested

Config = Mapping[str, Any]


def pixel_network(config: Config) -> dict[str, Any]:
    """The footprint spec of STRAIGHTDP's main MM-DiT in pixel space (the straightdp section's flow on the images, the
    declared classes). The rules pass their wiring's ``flow_network`` instead (pipeline/methods/straightdp), which
    also knows the latent variant's codes; the two agree in pixel space (tested)."""
    from pipeline.config import declared_private

    side = cost.image_side(config)
    return {"flow": dict(config["straightdp"]["flow"]), "shape": [cost.image_channels(config), side, side],
            "num_classes": int(declared_private(config)["n_classes"])}


def pretrain_runtime_min(config: Config, network: cost.Network | None = None) -> int:
    """Public flow pretraining: steps x batch image-passes (on an entry with peaks the MM-DiT's counted FLOPs in FP32;
    else ~2e-3 s per 16x16 image forward+backward on CPU)."""
    p = config["straightdp"]["pretrain"]
    counted = cost.flop_minutes(config, p["steps"] * p["batch_size"], "flow_train",
                                network or (lambda: pixel_network(config)))
    if counted is not None:
        return max(10, int(counted) + 5)
    return max(10, int(4 * p["steps"] * p["batch_size"] * (cost.image_side(config) / 16) ** 2 * 2e-3 / 60) + 5)


def train_runtime_min(config: Config, network: cost.Network | None = None) -> int:
    """One Stage 2 run: distillation passes + DP-SGD example-draws with per-example gradients: on an entry with peaks
    the MM-DiT's counted training FLOPs in FP32, the DP-SGD draws as workload ``straightdp_dpsgd`` (x
    :data:`pipeline.rates.DPSGD_FLOP_FACTOR`) and the distillation's as ``flow_train``; else at the device rate
    ``straightdp_dpsgd`` per 16x16 example-draw (the estimate: ~1e-2 s on one CPU core)."""
    s = config["straightdp"]
    dpsgd_draws = s["dpsgd"]["steps"] * s["dpsgd"]["batch_size"] * s["dpsgd"]["noise_multiplicity"]
    distilled = s["distill"]["steps"] * s["distill"]["batch_size"]
    flow = network or (lambda: pixel_network(config))
    counted = cost.flop_minutes(config, dpsgd_draws, "straightdp_dpsgd", flow)
    if counted is not None:
        return max(10, int(counted + cost.flop_minutes(config, distilled, "flow_train", flow)) + 10)
    work = dpsgd_draws + distilled // 5
    return max(10, int(4 * work * (cost.image_side(config) / 16) ** 2 * cost.rate(config, "straightdp_dpsgd") / 60)
               + 10)


def sample_runtime_min(config: Config, network: cost.Network | None = None) -> int:
    """One sample set: n_samples x Euler steps x 2 (guidance) network evaluations (on an entry with peaks the MM-DiT's
    counted forward FLOPs in FP32; else ~1 ms per 16x16 image-NFE)."""
    s = config["straightdp"]["sampling"]
    counted = cost.flop_minutes(config, s["n_samples"] * s["steps"] * 2, "flow_sample",
                                network or (lambda: pixel_network(config)))
    if counted is not None:
        return max(5, int(counted) + 5)
    return max(5, int(4 * s["n_samples"] * s["steps"] * 2 * (cost.image_side(config) / 16) ** 2 * 1e-3 / 60) + 5)


def sample_memory(config: Config, network: Mapping[str, Any]) -> cost.MemoryPlan:
    """One sample set's GPU memory: the flow's forward over ``straightdp.sampling.batch_size`` images (classifier-free
    guidance evaluates the conditional and unconditional velocities as two calls: pipeline/flow/rectified.py
    ``guided_velocity``)."""
    return cost.forward_memory("sample_straightdp", "flow_mmdit", network,
                               int(config["straightdp"]["sampling"]["batch_size"]))


def import_mem_mb(config: Config) -> int:
    """Loading the user's SD3Transformer2DModel (rule import_straightdp): diffusers' fp32 load, the backbone it is
    copied into and torch.save's buffer, each up to twice a half-precision folder's size, and 2 GB for the libraries."""
    return 2000 + int(6 * cost.folder_mb(config["straightdp"]["pretrain"].get("path")))


#: each rule of rules/straightdp.smk -> its request (``w`` the asking wiring,
#: :class:`pipeline.methods.straightdp.wiring.Wiring`, whose ``flow_network`` also knows the latent variant's codes)
REQUESTS: dict[str, Requested] = {
    # the wrong-domain public set is prepared like the data stage's splits
    "straightdp_public": lambda c, w: Request(mem_mb=cost.prepare_data_mem_mb(c),
                                              runtime=cost.prepare_data_runtime_min(c)),
    "train_autoencoder": Request(mem_mb=3000, runtime=20),
    "encode_split": Request(mem_mb=2000, runtime=5),
    "straightdp_geometry": Request(mem_mb=4000, runtime=10),
    # the arms' variant (pretrain_straightdp_arm) inherits it: each job's GPU memory plan is its own arm's
    "pretrain_straightdp": lambda c, w: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: w.pretrain_gpu_mem_mb(getattr(wildcards, "arm", "")), mem_mb=4000,
        runtime=cost.segment_runtime_min(c, pretrain_runtime_min(c, w.flow_network))),
    "import_straightdp": lambda c, w: Request(mem_mb=import_mem_mb(c), runtime=10),
    "release_moments": Request(mem_mb=4000, runtime=10),
    # straightdp.gpus data-parallel processes in one SLURM task (torchrun starts them: pipeline/distributed.py), 6 GB
    # of host memory each (data, flow, distillation and one micro-batch)
    "train_straightdp": lambda c, w: Request(
        gpu=w.train_gpus, gpu_mem_mb=w.train_gpu_mem_mb, tasks=1, mem_mb=6000 * w.train_gpus,
        runtime=cost.segment_runtime_min(c, train_runtime_min(c, w.flow_network))),
    "sample_straightdp": lambda c, w: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: sample_memory(c, w.flow_network(w.run(wildcards).arm)).predicted_mb,
        mem_mb=4000, runtime=sample_runtime_min(c, w.flow_network)),
    "evaluate_straightdp": lambda c, w: cost.evaluation_request(c, c["straightdp"]["sampling"]["n_samples"]),
    "straightdp_table": TABLE_JOB,
    "straightdp_table2": TABLE_JOB,
    "straightdp_figure_accuracy": TABLE_JOB,
    "straightdp_figure6_toy": Request(mem_mb=2000, runtime=30),
    "straightdp_figure_horizon": FIGURE_JOB,
    "straightdp_figure_samples": FIGURE_JOB,
    "straightdp_table4_text": TABLE_JOB,
}

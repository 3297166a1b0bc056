"""What the baselines' jobs cost: one baseline run's runtime (DP-MERF's generator and its successors', Private
Evolution's passes of the public denoiser) and each of the baselines' rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.baselines.wiring.Wiring.resources`). The baselines that run a shared engine ask for its costs:
PrivImage's and DP-LDM's public pretraining the house's (:func:`pipeline.resources.pretrain_runtime_min`), the DP-SGD
baselines and their samplers DPDM's (:mod:`pipeline.methods.dpdm.costs`), the query and the scoring the evaluation
core's. Pure functions of the validated config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.methods.dpdm import costs as dpdm_costs
from pipeline.resources import TABLE_JOB, Request, Requested

Config = Mapping[str, Any]


def run_runtime_min(config: Config) -> int:
    """One baseline run: DP-MERF's generator (steps x batch through an MLP and the RFF map; its successors' through
    their maps, up to ~6x slower per step: DP-MEPF's CLIP tower) or Private Evolution's T + 1 passes of the public
    denoiser over n_per_class x 10 images (measured on one CPU thread at 16 x 16: ~1-3 min each), x4 headroom at
    larger images."""
    b = config["baselines"]
    successors = 6.0 if set(b["methods"]) - {"dp_merf", "pe"} else 1.0
    work = max(successors * b["dp_merf"]["steps"] / 2000, (b["pe"]["iterations"] + 1) * b["pe"]["n_per_class"] / 250)
    return max(10, int(12 * work * (cost.image_side(config) / 16) ** 2) + 5)


def _public_pretraining(c: Config, gpu_mem_mb: cost.Value) -> Request:
    """A public denoiser's pretraining (stage pretrain_public; resumable: within the cluster's time limit, in
    segments), ``gpu_mem_mb`` its memory plan, a function so that a job's plan is counted only for a DAG that runs
    it."""
    return Request(gpu=1, gpu_mem_mb=gpu_mem_mb, mem_mb=cost.pretrain_mem_mb(c),
                   runtime=cost.segment_runtime_min(c, cost.pretrain_runtime_min(c)))


def _dpsgd_gpu_mem_mb(w: Any) -> cost.Value | None:
    """A DP-SGD baseline job's predicted GPU memory (its run from its wildcards: the wiring's ``dpsgd_memory``); None
    where the public denoiser is a folder the user brings, whose network is not counted."""
    if w.house.imports_public_denoiser:
        return None
    return lambda wildcards: w.dpsgd_memory(wildcards.run).predicted_mb


#: each rule of rules/baselines.smk -> its request (``w`` the asking wiring,
#: :class:`pipeline.methods.baselines.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    "dp_merf": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=run_runtime_min(c)),
    "embedding_baseline": lambda c, w: Request(gpu=1, mem_mb=6000, runtime=run_runtime_min(c)),
    "private_evolution": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=run_runtime_min(c)),
    "privimage_query_net": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=cost.evaluation_runtime_min(c)),
    "privimage_select": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=cost.evaluation_runtime_min(c)),
    "privimage_pretrain": lambda c, w: _public_pretraining(
        c, lambda wildcards: cost.pretrain_memory(c, "privimage_pretrain").predicted_mb),
    "dp_ldm_autoencoder": Request(mem_mb=3000, runtime=20),
    "dp_ldm_encode": Request(mem_mb=2000, runtime=5),
    "dp_ldm_pretrain": lambda c, w: _public_pretraining(c, lambda wildcards: w.ldm_pretrain_memory.predicted_mb),
    "dp_promise_phase1": lambda c, w: Request(gpu=1, gpu_mem_mb=_dpsgd_gpu_mem_mb(w), mem_mb=dpdm_costs.train_mem_mb(c),
                                              runtime=dpdm_costs.train_runtime_min(c)),
    "dpsgd_baseline": lambda c, w: Request(gpu=1, gpu_mem_mb=_dpsgd_gpu_mem_mb(w), mem_mb=dpdm_costs.train_mem_mb(c),
                                           runtime=dpdm_costs.train_runtime_min(c)),
    "sample_baseline": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=dpdm_costs.sample_runtime_min(c)),
    "sample_dp_ldm": lambda c, w: Request(gpu=1, mem_mb=3000, runtime=dpdm_costs.sample_runtime_min(c)),
    "dp_ldm_decode": Request(mem_mb=2000, runtime=5),
    "evaluate_baseline": lambda c, w: cost.evaluation_request(c, c["baselines"]["n_samples"]),
    "baselines_table": TABLE_JOB,
}

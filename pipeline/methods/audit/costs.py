"""What the audits' jobs cost: the one-run canary audit (from how many ledger lines it reruns), DPDM's non-private
twin, the membership attacks on one model, and each of the audit's rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.audit.wiring.Wiring.resources`). Measured on CPU cores and scaled by image area and work,
x4 headroom. The GPU memory of the twin's training (:func:`twin_memory`) and of the attacks (:func:`mia_memory`)
from the attacked denoiser's footprint (pipeline/footprint.py) and the records they hold on the GPU. Pure functions
of the validated config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.methods.dpdm import costs as dpdm_costs
from pipeline.privacy.mia import STOPPING_POINTS
from pipeline.resources import LIGHT_JOB, MemoryPlan, Request, Requested

Config = Mapping[str, Any]


def one_run_runtime_min(config: Config, n_lines: int, n_empden_lines: int = 0) -> int:
    """The one-run audit of ``n_lines`` ledger lines, ``n_empden_lines`` of them EMPDEN sampler blocks, x4 headroom.
    Any other line is costed as a DP-SGD line, T engine steps over the expected batch and the sampled canaries on a
    16-wide model (~5e-3 s per 64 records on one CPU core; 0.4 s for DPDM's embedded 79 steps), at the largest T
    and batch of DPDM and STRAIGHTDP (a release line costs far less); an EMPDEN line, the full grid's steps for
    N_out outputs over n + m records of m + 16 coordinates (~4 GFLOP/s on one CPU core: 12 s for an embedded
    hybrid block, 20 s full batch)."""
    d, s = config["dpdm"], config["straightdp"]["dpsgd"]
    n = config["data"]["private"]["n_private_train"] or 60000
    steps = max(-(-int(d["epochs"] * n) // d["batch_size"]), s["steps"])
    m = config["audit"]["canaries"]
    batch = max(d["batch_size"], s["batch_size"]) + m * max(d["batch_size"], 64) / n
    dpsgd_s = steps * max(batch, 64) / 64 * 5e-3
    n_out = config["empden"]["n_out"] or config["accounting"]["N_out"]
    empden_s = 2 * n_out * (n + m) * (m + 16) * config["accounting"]["N"] * 2.5e-10
    return max(5, int(4 * ((n_lines - n_empden_lines) * dpsgd_s + n_empden_lines * empden_s) / 60) + 5)


def twin_runtime_min(config: Config) -> int:
    """DPDM's non-private twin: T steps of one backward pass over B x K example-draws (no per-example
    gradients: ~5e-4 s per 16x16 draw on two CPU cores, ~1e-5 s on one GPU; x4 headroom on the GPU rate)."""
    d, m = config["dpdm"], config["audit"]["mia"]
    p = config["data"]["private"]
    n = (p["n_reference"] or 500) if m["twin_train_on"] == "members" else (p["n_private_train"] or 60000)
    batch = min(d["batch_size"], n)
    steps = -(-int(m["twin_epochs"] * n) // batch)
    return max(10, int(4 * steps * batch * m["twin_K"] * (cost.image_side(config) / 16) ** 2 * 1e-5 / 60) + 10)


def mia_runtime_min(config: Config) -> int:
    """Membership attacks on one model: (loss draws x sigmas + SecMI's inversion) forward passes over
    2 x n_reference records (~1e-4 s per 16x16 record-pass on two CPU cores), x4 headroom."""
    m = config["audit"]["mia"]
    n = 2 * (config["data"]["private"]["n_reference"] or 500)
    passes = m["loss_draws"] * len(m["loss_sigmas"]) + m["secmi_inversion_steps"] + 8
    return max(5, int(4 * passes * n * (cost.image_side(config) / 16) ** 2 * 1e-4 / 60) + 5)


def _record_bytes(config: Config) -> int:
    """GPU bytes of one private record as the attacks and the twin hold it: its float32 pixels (model scale) and its
    int64 label."""
    return 4 * cost.image_channels(config) * cost.image_side(config) ** 2 + 8


#: the twin's Poisson batch (q < 1) is bounded at its expected size plus this many standard deviations
#: (P < 3e-7 a step of exceeding it)
POISSON_SDS = 5


def twin_batch(config: Config) -> tuple[int, int]:
    """(records the twin trains on, the largest batch it is counted at): audit.mia.twin_members of the attacked
    members (or as many as the non-members: data.private.n_reference) when twin_train_on is members, else the
    declared private split; each step's Poisson batch at rate q = min(1, dpdm.batch_size / n), every record when
    q = 1, else its mean q n plus :data:`POISSON_SDS` standard deviations."""
    from pipeline.config import declared_private

    m, p = config["audit"]["mia"], config["data"]["private"]
    n = int((m["twin_members"] or p["n_reference"]) if m["twin_train_on"] == "members"
            else declared_private(config)["N"])
    q = min(1.0, int(config["dpdm"]["batch_size"]) / n)
    return n, n if q >= 1 else min(n, math.ceil(q * n + POISSON_SDS * math.sqrt(q * n * (1 - q))))


def twin_memory(config: Config) -> MemoryPlan:
    """DPDM's non-private twin's GPU memory (stage train_dpdm_twin, pipeline/methods/audit/twin.py): DPDM's denoiser
    (:func:`pipeline.methods.dpdm.costs.network`) and its training state (every weight counted trainable, an upper
    bound where dpdm.trainable freezes some), its whole training set on the GPU (:func:`twin_batch`'s n records), and
    one step's saved tensors: the whole Poisson batch x audit.mia.twin_K draws in one forward and backward pass (no
    micro-batches, no per-example gradients), the batch at :func:`twin_batch`'s bound."""
    rule = "train_dpdm_twin"
    fp = cost.footprint_of(rule, "edm_unet", dpdm_costs.network(config))
    n, batch = twin_batch(config)
    state = (cost.TRAIN_STATE_BYTES_PER_PARAM * fp.params + cost.TRANSIENT_FACTOR * fp.saved_bytes_fixed
             + n * _record_bytes(config))
    per_example = int(config["audit"]["mia"]["twin_K"]) * cost.TRANSIENT_FACTOR * fp.saved_bytes_per_example
    return MemoryPlan(batch, batch, state + batch * per_example + cost.GPU_RESERVE_BYTES, state, per_example)


#: records per forward of the attacks (pipeline/audit/mia.py: ``loss_scores``' and ``secmi_scores``' default batch)
MIA_BATCH = 250
#: batch-sized float32 tensors SecMI's walk keeps beside the network's forward (pipeline/audit/mia.py
#: ``secmi_scores``): the walk's state, one per stopping point, the DDIM step's output and its two temporaries
ATTACK_STATE_TENSORS = len(STOPPING_POINTS) + 4


def mia_memory(config: Config, kind: str, network: Mapping[str, Any]) -> MemoryPlan:
    """Membership attacks on one model (stage audit_mia): the attacked network's (footprint ``kind``, spec
    ``network``) weights and forward over :data:`MIA_BATCH` records, gradient-free, beside what the stage keeps on the
    GPU: the whole private split (the members it picks from: its declared N records) and the non-members
    (data.private.n_reference), the picked members and the loss attack's noise of the set it scores (each at most as
    many as the non-members: an upper bound), and SecMI's walk (:data:`ATTACK_STATE_TENSORS` batches)."""
    from pipeline.config import declared_private

    n, n_ref = int(declared_private(config)["N"]), int(config["data"]["private"]["n_reference"])
    records = _record_bytes(config)
    held = (n + 3 * n_ref) * records + ATTACK_STATE_TENSORS * MIA_BATCH * (records - 8)
    return cost.forward_memory("audit_mia", kind, network, MIA_BATCH, held_bytes=held)


def mia_network(w: Any, wildcards: Any) -> tuple[str, dict[str, Any]]:
    """(footprint kind, spec) of the model one audit_mia job attacks: DPDM's denoiser for a DPDM run and for its twin
    (the same architecture: pipeline/methods/audit/wiring.py ``twin_params``), a STRAIGHTDP run's MM-DiT (its arm's,
    as sample_straightdp counts it)."""
    if wildcards.method == "straightdp":
        return "flow_mmdit", w.straightdp.flow_network(w.straightdp.run(wildcards).arm)
    return "edm_unet", dpdm_costs.network(w.house.config)


def _mia_gpu_mem_mb(w: Any) -> cost.Value | None:
    """audit_mia's predicted GPU memory per job (:func:`mia_memory` of the model its wildcards name); None where
    STRAIGHTDP's attacked runs fine-tune a public flow the user brings (straightdp.pretrain.source diffusers), whose
    network the configuration does not describe."""
    if "straightdp" in w.chosen and w.straightdp.imports_public_flow:
        return None
    return lambda wildcards: mia_memory(w.house.config, *mia_network(w, wildcards)).predicted_mb


#: each rule of rules/audit.smk -> its request (``w`` the asking wiring, :class:`pipeline.methods.audit.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    # a function: the audited transcripts are the chosen methods' registered ones, known once every rule file is read
    "audit_one_run": lambda c, w: Request(mem_mb=2000, runtime=lambda wildcards: w.one_run_runtime_min()),
    # resumable: within the cluster's time limit, in segments
    "train_dpdm_twin": lambda c, w: Request(gpu=1, gpu_mem_mb=lambda wildcards: twin_memory(c).predicted_mb,
                                            mem_mb=4000, runtime=cost.segment_runtime_min(c, twin_runtime_min(c))),
    # each job the model its wildcards name
    "audit_mia": lambda c, w: Request(gpu=1, gpu_mem_mb=_mia_gpu_mem_mb(w), mem_mb=3000, runtime=mia_runtime_min(c)),
    "audit_mia_table": LIGHT_JOB,
    "empden_table13": LIGHT_JOB,
}

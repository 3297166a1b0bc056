"""What the baselines' jobs cost: one baseline run's runtime (DP-MERF's generator and its successors', Private
Evolution's passes of the public denoiser) and each of the baselines' rules' request (:data:`REQUESTS`, read by
:meth:`pipeline.methods.baselines.wiring.Wiring.resources`). The baselines that run a shared engine ask for its costs:
PrivImage's and DP-LDM's public pretraining the house's (:func:`pipeline.resources.pretrain_runtime_min`), the DP-SGD
baselines and their samplers DPDM's (:mod:`pipeline.methods.dpdm.costs`), the query and the scoring the evaluation
core's. Pure functions of the validated config.

GPU memory (issue #55, :data:`REQUESTS`' ``gpu_mem_mb``): each private stage's own networks, counted on the meta
device (pipeline/footprint.py) from the same specs the stages build them from: DP-MERF's generator fit and its
successors' feature maps (:func:`embedding_memory`), Private Evolution's passes of the public denoiser and its
public CLIP (:func:`pe_memory`), the DP-SGD baselines' samplers (:func:`sample_memory`) and PrivImage's query
classifier (:func:`query_net_memory`, :func:`select_memory`). A stage that runs a public denoiser the user brings (a
folder the configuration does not describe) gets no prediction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline import resources as cost
from pipeline.baselines.runs import BaselineRun
from pipeline.methods.dpdm import costs as dpdm_costs
from pipeline.resources import TABLE_JOB, MemoryPlan, Request, Requested

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


# ----------------------------------------------------------------------------- GPU memory


def _image_shape(config: Config) -> list[int]:
    side = cost.image_side(config)
    return [cost.image_channels(config), side, side]


def _n_classes(config: Config) -> int:
    from pipeline.config import declared_private

    return int(declared_private(config)["n_classes"])


def clip_network(config: Config) -> dict[str, Any]:
    """The footprint spec (pipeline/footprint.py ``clip``) of the public CLIP Private Evolution embeds in and DP-MEPF
    matches features of (the evaluation's CLIP file): rule train_clip's small CLIP (evaluation.clip's width, layers,
    embed_dim, patch_size on the images' side) or rule import_clip's named open_clip model (pretrained_model), on the
    images it embeds."""
    c = config["evaluation"]["clip"]
    if c["source"] == "trained":
        clip = {"image_size": cost.image_side(config), **{k: int(c[k]) for k in ("width", "layers", "embed_dim",
                                                                                  "patch_size")}}
    else:
        clip = {"open_clip_name": str(c["pretrained_model"])}
    return {"clip": clip, "shape": _image_shape(config)}


def generator_network(config: Config) -> dict[str, Any]:
    """The footprint spec of DP-MERF's generator (pipeline/footprint.py ``dp_merf_generator``): baselines.dp_merf's
    z_dim and hidden, the declared classes, the images' shape; DP-HP, DP-NTK and DP-MEPF fit the same."""
    g = config["baselines"]["dp_merf"]
    return {"z_dim": int(g["z_dim"]), "hidden": int(g["hidden"]), "n_classes": _n_classes(config),
            "out_shape": _image_shape(config)}


#: each embedding method's settings that size its feature map (pipeline/baselines/features.py)
FEATURE_KEYS = {"dp_merf": ("n_features",), "dp_hp": ("order", "prod_order", "n_pairs", "alpha"), "dp_ntk": ("width",),
                "dp_mepf": ("beta",)}


def fit_network(config: Config, method: str) -> dict[str, Any]:
    """The footprint spec of ``method``'s generator fit (pipeline/footprint.py ``embedding_fit``, counted per step of
    baselines.dp_merf.batch_size draws): the generator, the method's feature-map settings (:data:`FEATURE_KEYS`) and,
    for DP-MEPF, the public CLIP (:func:`clip_network`)."""
    own = config["baselines"][method]
    features = {k: own[k] for k in FEATURE_KEYS[method]}
    if method == "dp_mepf":
        features["clip"] = clip_network(config)["clip"]
    return {"method": method, "generator": generator_network(config), "features": features,
            "draws": int(config["baselines"]["dp_merf"]["batch_size"])}


def embedding_memory(config: Config, method: str, rule: str = "embedding_baseline") -> MemoryPlan:
    """One DP-MERF, DP-HP, DP-NTK or DP-MEPF run's GPU memory (stage dp_merf, pipeline/baselines/embedding_family.py):
    the release is computed on the CPU; on the GPU the generator's fit, baselines.dp_merf.batch_size draws a step, then
    its ``n_samples`` samples drawn in one batch.

    The fit holds the generator's training state (:data:`pipeline.resources.TRAIN_STATE_BYTES_PER_PARAM` a parameter:
    its weights, gradients and Adam's moments; it keeps no EMA, so an upper bound), what the feature map and the
    release keep (counted as frozen parameters of the fit: DP-MEPF's whole CLIP in float32, every other one at 8 bytes
    an element, an upper bound of the release's and the frequencies' float32 and DP-NTK's float64 network), and one
    step's activations, counted on the real fit at the configured batch: its saved tensors x
    :data:`pipeline.resources.TRANSIENT_FACTOR` and beside them the forward's temporaries at their gradient-free peak
    (the maps are elementwise: cos and sin of every frequency, Hermite's recurrence, the CLIP's resized images are
    larger than what autograd keeps of them; an upper bound). The sampling: the generator's weights and the gradients
    its last step left, the same held tensors (an upper bound: the release is freed by then) and its forward over the
    ``n_samples`` draws at its peak. The larger of the two."""
    b = config["baselines"]
    gen = cost.footprint_of(rule, "dp_merf_generator", generator_network(config))
    fit = cost.footprint_of(rule, "embedding_fit", fit_network(config, method))
    clip = cost.footprint_of(rule, "clip", clip_network(config)).params if method == "dp_mepf" else 0
    held = 4 * clip + 8 * (fit.params - gen.params - clip)
    batch, n = int(b["dp_merf"]["batch_size"]), int(b["n_samples"])
    state = cost.TRAIN_STATE_BYTES_PER_PARAM * gen.params + held
    step = cost.TRANSIENT_FACTOR * fit.activation_bytes(1) + fit.forward_peak_bytes(1)  # one example: one step
    train = MemoryPlan(batch, batch, state + step + cost.GPU_RESERVE_BYTES, state, step / batch)
    weights = 2 * 4 * gen.params + held + cost.TRANSIENT_FACTOR * gen.forward_peak_bytes_fixed
    sample = MemoryPlan(n, n, weights + n * cost.TRANSIENT_FACTOR * gen.forward_peak_bytes_per_example
                        + cost.GPU_RESERVE_BYTES, weights, cost.TRANSIENT_FACTOR * gen.forward_peak_bytes_per_example)
    return max(train, sample, key=lambda plan: plan.predicted_bytes)


#: images per call of ``ClipModel.image_features`` (pipeline/evaluation/clip.py: its default, which Private
#: Evolution's embedding keeps)
CLIP_EMBED_BATCH = 512


def pe_memory(config: Config) -> MemoryPlan:
    """One Private Evolution run's GPU memory (pipeline/baselines/private_evolution.py): the public denoiser's forward
    over baselines.pe.batch_size candidates (twice that where pe.guidance guides: the conditional and unconditional
    halves run as one batch) and, with the ``clip`` embedding, the public CLIP's over :data:`CLIP_EMBED_BATCH` images;
    both networks' weights are held throughout, the two forwards run one after the other (the larger counts). The
    votes are cast on the CPU."""
    pe = config["baselines"]["pe"]
    unet = cost.pretrain_network(config)
    batch = int(pe["batch_size"]) * (2 if float(pe["guidance"] or 0) else 1)
    if pe["embedding"] != "clip":
        return cost.forward_memory("private_evolution", "edm_unet", unet, batch)
    tower = clip_network(config)
    unet_weights = 4 * cost.footprint_of("private_evolution", "edm_unet", unet).params
    clip_weights = 4 * cost.footprint_of("private_evolution", "clip", tower).params
    return max(cost.forward_memory("private_evolution", "edm_unet", unet, batch, held_bytes=clip_weights),
               cost.forward_memory("private_evolution", "clip", tower, CLIP_EMBED_BATCH, held_bytes=unet_weights),
               key=lambda plan: plan.predicted_bytes)


def sample_memory(config: Config, w: Any, run: str, rule: str = "sample_baseline") -> MemoryPlan:
    """One DP-SGD baseline run's sample set (rules sample_baseline and sample_dp_ldm: stage sample_dpdm): its
    denoiser's forward (the wiring's ``dpsgd_network``: the public denoiser's architecture, DP-LDM's latent UNet on its
    codes) over baselines.n_samples images, the batch its params give the stage (one batch), twice that where the
    method's sampler guides."""
    method = BaselineRun.from_name(run).method
    b = config["baselines"]
    guided = bool(b[method]["sampler"].get("guidance", 0))
    return cost.forward_memory(rule, "edm_unet", w.dpsgd_network(method), int(b["n_samples"]) * (2 if guided else 1))


def query_net_network(config: Config) -> dict[str, Any]:
    """The footprint spec of PrivImage's query classifier (pipeline/footprint.py ``evalnet``: the evaluation CNN's
    architecture at baselines.privimage.query_net's width and feature_dim): its semantics are the public pool's
    classes, which the configuration does not declare, counted as :data:`pipeline.resources.PUBLIC_CLASSES_BOUND` per
    public domain (the head is the only part they change)."""
    p = config["baselines"]["privimage"]
    domains = 2 if p["second_domain"] else 1
    q = _query_net_section(config)
    return {"shape": _image_shape(config), "n_classes": cost.PUBLIC_CLASSES_BOUND * domains,
            "width": int(q["width"]), "feature_dim": int(q["feature_dim"])}


def _query_net_section(config: Config) -> dict[str, Any]:
    """baselines.privimage.query_net over its schema defaults, as the stage reads it (pipeline/baselines/common.py
    ``baseline_section``)."""
    from pipeline.config import schema_defaults

    return {**schema_defaults("baselines", "privimage", "query_net"), **config["baselines"]["privimage"]["query_net"]}


#: images per forward of ``pipeline.evaluation.evalnet.predict`` (its default, which PrivImage's stages keep)
PREDICT_BATCH = 256


def pool_images(config: Config) -> int:
    """PrivImage's public pool (pipeline/baselines/privimage.py ``semantic_pool``): the public split's data.public.n
    images, and straightdp.public.n of the second domain where baselines.privimage.second_domain; at most that many."""
    second = config["baselines"]["privimage"]["second_domain"]
    return int(config["data"]["public"]["n"]) + (int(config["straightdp"]["public"]["n"]) if second else 0)


def query_net_memory(config: Config) -> MemoryPlan:
    """Training PrivImage's query classifier (stage privimage_query_net: ``fit_classifier`` on the public pool), the
    larger of its training and its scoring of the pool: the training state, the whole pool on the GPU (uint8 images and
    int64 labels, :func:`pool_images`) and the saved tensors of query_net.batch_size images
    (:func:`pipeline.resources.training_memory`, as the evaluation CNN's own training); then the classifier's forward
    over :data:`PREDICT_BATCH` images (the pool freed)."""
    rule, net = "privimage_query_net", query_net_network(config)
    pixels = cost.image_channels(config) * cost.image_side(config) ** 2
    training = cost.training_memory(rule, "evalnet", net, int(_query_net_section(config)["batch_size"]),
                                    held_bytes=pool_images(config) * (pixels + 8))
    return max(training, cost.forward_memory(rule, "evalnet", net, PREDICT_BATCH),
               key=lambda plan: plan.predicted_bytes)


def select_memory(config: Config) -> MemoryPlan:
    """PrivImage's semantic query (stage privimage_select): the query classifier's forward over the private images,
    :data:`PREDICT_BATCH` at a time (the counts and the release are on the CPU)."""
    return cost.forward_memory("privimage_select", "evalnet", query_net_network(config), PREDICT_BATCH)


def _dpsgd_gpu_mem_mb(w: Any) -> cost.Value | None:
    """A DP-SGD baseline job's predicted GPU memory (its run from its wildcards: the wiring's ``dpsgd_memory``); None
    where the public denoiser is a folder the user brings, whose network is not counted."""
    return cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: w.dpsgd_memory(wildcards.run))


#: each rule of rules/baselines.smk -> its request (``w`` the asking wiring,
#: :class:`pipeline.methods.baselines.wiring.Wiring`)
REQUESTS: dict[str, Requested] = {
    # each GPU-memory plan a function: counted only for a DAG that runs the rule
    "dp_merf": lambda c, w: Request(gpu=1, gpu_mem_mb=lambda wildcards: embedding_memory(c, "dp_merf", "dp_merf")
                                    .predicted_mb, mem_mb=3000, runtime=run_runtime_min(c)),
    # each job its own run's method (DP-HP, DP-NTK or DP-MEPF)
    "embedding_baseline": lambda c, w: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: embedding_memory(c, BaselineRun.from_name(wildcards.run).method)
        .predicted_mb, mem_mb=6000, runtime=run_runtime_min(c)),
    # the public denoiser's network: not counted where it is a folder the user brings
    "private_evolution": lambda c, w: Request(
        gpu=1, gpu_mem_mb=cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: pe_memory(c)),
        mem_mb=3000, runtime=run_runtime_min(c)),
    "privimage_query_net": lambda c, w: Request(gpu=1, gpu_mem_mb=lambda wildcards: query_net_memory(c).predicted_mb,
                                                mem_mb=3000, runtime=cost.evaluation_runtime_min(c)),
    "privimage_select": lambda c, w: Request(gpu=1, gpu_mem_mb=lambda wildcards: select_memory(c).predicted_mb,
                                             mem_mb=3000, runtime=cost.evaluation_runtime_min(c)),
    "privimage_pretrain": lambda c, w: _public_pretraining(
        c, lambda wildcards: cost.pretrain_memory(c, "privimage_pretrain").predicted_mb),
    "dp_ldm_autoencoder": Request(mem_mb=3000, runtime=20),
    "dp_ldm_encode": Request(mem_mb=2000, runtime=5),
    "dp_ldm_pretrain": lambda c, w: _public_pretraining(c, lambda wildcards: w.ldm_pretrain_memory.predicted_mb),
    "dp_promise_phase1": lambda c, w: Request(gpu=1, gpu_mem_mb=_dpsgd_gpu_mem_mb(w), mem_mb=dpdm_costs.train_mem_mb(c),
                                              runtime=dpdm_costs.train_runtime_min(c)),
    "dpsgd_baseline": lambda c, w: Request(gpu=1, gpu_mem_mb=_dpsgd_gpu_mem_mb(w), mem_mb=dpdm_costs.train_mem_mb(c),
                                           runtime=dpdm_costs.train_runtime_min(c)),
    # DP-Diffusion and DP-Promise sample a fine-tuned copy of the public denoiser: not counted where the user brings it
    "sample_baseline": lambda c, w: Request(
        gpu=1, gpu_mem_mb=cost.public_denoiser_gpu_mem_mb(w, lambda wildcards: sample_memory(c, w, wildcards.run)),
        mem_mb=3000, runtime=dpdm_costs.sample_runtime_min(c)),
    # DP-LDM's latent denoiser is its own (baselines.dp_ldm.unet): always counted
    "sample_dp_ldm": lambda c, w: Request(
        gpu=1, gpu_mem_mb=lambda wildcards: sample_memory(c, w, wildcards.run, "sample_dp_ldm").predicted_mb,
        mem_mb=3000, runtime=dpdm_costs.sample_runtime_min(c)),
    "dp_ldm_decode": Request(mem_mb=2000, runtime=5),
    "evaluate_baseline": lambda c, w: cost.evaluation_request(c, c["baselines"]["n_samples"]),
    "baselines_table": TABLE_JOB,
}
